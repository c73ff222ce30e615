package kvxfer

import (
	"fmt"

	"kvxfer.dev/kvxfer/internal/capi"
)

// PeerLink says where a registered peer's connection stands (kvx_peer_link).
type PeerLink int

const (
	// PeerUp: connected; writes go out on PeerBackend's path.
	PeerUp PeerLink = 0
	// PeerReconnecting: its connection failed and it reconnects in the
	// background (option peer_redial_ms). WriteBlocks fails at once with
	// ErrPeerBroken meanwhile.
	PeerReconnecting PeerLink = 1
	// PeerBroken: its connection failed and it does not reconnect
	// (peer_redial_ms=0): remove and re-add it.
	PeerBroken PeerLink = 2
	// PeerConnecting: being added (AddRemotePeer or AddRemotePeerAsync under
	// way); only in Peers (since 0.10).
	PeerConnecting PeerLink = 3
)

// String returns "up", "reconnecting", "broken" or "connecting".
func (l PeerLink) String() string {
	switch l {
	case PeerUp:
		return "up"
	case PeerReconnecting:
		return "reconnecting"
	case PeerBroken:
		return "broken"
	case PeerConnecting:
		return "connecting"
	}
	return fmt.Sprintf("PeerLink(%d)", int(l))
}

// PeerReasonLen is the most bytes of PeerState.Reason, with the C string's
// NUL.
const PeerReasonLen = capi.KVX_PEER_REASON_LEN

// PeerState is the state of a registered peer's connection
// (kvx_get_peer_state).
type PeerState struct {
	// Link is PeerUp, PeerReconnecting or PeerBroken.
	Link PeerLink
	// Error is the code of what took the connection down (CodeTimeout: the
	// stall timeout; CodeConnReset: the connection failed), then of the
	// last failed reconnection attempt; CodeOK while it never failed.
	Error Code
	// Backend and Path are its path, as PeerBackend says.
	Backend, Path string
	// InFlight counts its transfers submitted and not yet reported by Poll.
	InFlight uint64
	// SinceNs is when it entered this state, in ns since the epoch
	// (CLOCK_REALTIME).
	SinceNs int64
	// NextAttemptNs is, while PeerReconnecting, when the next attempt
	// starts (ns since the epoch); 0 while one runs, and in the other states.
	NextAttemptNs int64
	// Reconnects counts the times it reconnected since it was added.
	Reconnects uint32
	// Attempts counts the failed attempts since it went down (0 when up).
	Attempts uint32
	// Reason says why it is not up ("" when up): the message of Error (at
	// most PeerReasonLen-1 bytes).
	Reason string
	// LastProgressNs is when it last made progress (a transfer of it ended,
	// or it got work while it had none in flight), in ns since the epoch; 0
	// before its first transfer. The stall timeout counts from here (since
	// 0.10).
	LastProgressNs int64
}

// PeerState returns the state of a registered peer's connection: up, or
// reconnecting after a failure (option peer_redial_ms), or broken. A peer
// stays registered through a failure: only RemoveRemotePeer (or a replacing
// add) ends it. A reconnection authenticates anew and takes the first path
// both sides offer that connects, so PeerBackend may name another backend
// afterwards. The state is a snapshot: it may change right after.
//
// Errors: ErrUnknownPeer (not registered, or still connecting), ErrInvalid,
// ErrClosed.
func (t *Transport) PeerState(id string) (PeerState, error) {
	const op = "PeerState"
	if err := checkPeerID(op, id, false); err != nil {
		return PeerState{}, err
	}
	b := make([]byte, capi.KVX_GO_NAME_LEN)
	p := make([]byte, capi.KVX_GO_NAME_LEN)
	reason := make([]byte, PeerReasonLen)
	f := make([]uint64, capi.KVX_GO_PEER_STATE_FIELDS)
	if err := t.do(op, func(h uintptr) int { return capi.Kvx_go_peer_state(b, p, reason, f, h, id) }); err != nil {
		return PeerState{}, err
	}
	return peerState(b, p, reason, f), nil
}

// peerState of kvx_go_peer_state's (or kvx_go_list_peers') copies.
func peerState(b, p, reason []byte, f []uint64) PeerState {
	return PeerState{
		Link:           PeerLink(int64(f[0])),
		Error:          Code(int64(f[1])), // the bits of kvx_peer_state.error
		Backend:        cString(b),
		Path:           cString(p),
		InFlight:       f[2],
		SinceNs:        int64(f[3]),
		NextAttemptNs:  int64(f[4]),
		Reconnects:     uint32(f[5]),
		Attempts:       uint32(f[6]),
		Reason:         cString(reason),
		LastProgressNs: int64(f[7]),
	}
}

// PeerInfo is one peer of Peers: its id and its state.
type PeerInfo struct {
	ID string
	// State is as PeerState gives it, or, while the peer is being added,
	// Link PeerConnecting with SinceNs the add's start and every other field
	// zero.
	State PeerState
}

// Peers returns every peer of the transport (kvx_list_peers), sorted by id
// (byte order): the registered ones (up, reconnecting or broken) and those
// being added (PeerConnecting). A removed peer is not listed; a peer being
// replaced is listed once, connecting. A snapshot taken at one instant.
//
// Errors: ErrClosed.
func (t *Transport) Peers() ([]PeerInfo, error) {
	const op = "Peers"
	const idLen = PeerIDMax + 1
	fields := int(capi.KVX_GO_PEER_STATE_FIELDS)
	nameLen := int(capi.KVX_GO_NAME_LEN)
	n := make([]uint64, 1)
	var ids, backends, paths, reasons []byte
	var raw []uint64
	for {
		c := len(raw) / fields
		err := t.do(op, func(h uintptr) int {
			return capi.Kvx_go_list_peers(ids, backends, paths, reasons, raw, n, h, int64(c))
		})
		if err != nil {
			return nil, err
		}
		if n[0] <= uint64(c) {
			break
		}
		// Ask again with room for every peer and some more (again if peers
		// were added meanwhile).
		c = int(n[0]) + 16
		ids = make([]byte, c*idLen)
		backends = make([]byte, c*nameLen)
		paths = make([]byte, c*nameLen)
		reasons = make([]byte, c*PeerReasonLen)
		raw = make([]uint64, c*fields)
	}
	peers := make([]PeerInfo, n[0])
	for i := range peers {
		peers[i] = PeerInfo{
			ID: cString(ids[i*idLen : (i+1)*idLen]),
			State: peerState(backends[i*nameLen:(i+1)*nameLen], paths[i*nameLen:(i+1)*nameLen],
				reasons[i*PeerReasonLen:(i+1)*PeerReasonLen], raw[i*fields:(i+1)*fields]),
		}
	}
	return peers, nil
}
