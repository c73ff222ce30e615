package kvxfer

import (
	"fmt"

	"kvxfer.dev/kvxfer/internal/capi"
)

// LatencyBuckets is the number of buckets of Stats.LatencyBuckets.
const LatencyBuckets = capi.KVX_STATS_LATENCY_BUCKETS

// Stats are the telemetry counters of a transport or of one peer
// (kvx_get_stats): transfers and their bytes by how they ended, what is in
// flight, connects, and the latency of done transfers (from WriteBlocks to
// the moment the library learnt the bytes landed) as percentiles and as a
// histogram of fixed log buckets (LatencyBucketBounds).
type Stats struct {
	TransfersDone, TransfersFailed, TransfersCancelled uint64
	BytesDone, BytesFailed, BytesCancelled             uint64
	TransfersInflight, BytesInflight                   uint64
	Peers, PeersConnecting                             uint64
	Connects, ConnectFailures                          uint64
	ConnectNsTotal, ConnectNsMax, ConnectNsLast        uint64
	LatencyCount                                       uint64
	LatencyNsP50, LatencyNsP90, LatencyNsP99           uint64
	LatencyNsP999, LatencyNsMax                        uint64
	LatencyBuckets                                     [LatencyBuckets]uint64
	// TransfersFailed by cause (since 0.9), as PollResults reports each
	// failure; they add up to TransfersFailed: CodeTimeout (the stall
	// timeout), CodeConnReset (the peer's connection failed), CodeCanceled
	// (the peer was removed or replaced, or the transport closed), any
	// other code.
	TransfersFailedTimeout, TransfersFailedConnection uint64
	TransfersFailedRemoved, TransfersFailedOther      uint64
	// LatencyNsSum is the latencies of LatencyCount added up, in ns (since
	// 0.10): exact, unlike a sum of the buckets.
	LatencyNsSum uint64
}

// statsScalars is the number of uint64 fields of kvx_stats before the
// histogram, the size field included; statsCauses the number after it
// (transfers_failed_timeout and the three after it, then latency_ns_sum).
const (
	statsScalars = 22
	statsCauses  = 5
)

// Stats returns the counters of the transport (peer "": every peer it ever
// had) or of one peer (since it was first added; RemoveRemotePeer forgets
// them). Errors: ErrUnknownPeer, ErrNotSupported (library built without
// telemetry), ErrClosed (Close destroys the C transport, counters included).
func (t *Transport) Stats(peer string) (Stats, error) {
	const op = "Stats"
	var s Stats
	if err := checkPeerID(op, peer, true); err != nil {
		return s, err
	}
	raw := make([]uint64, statsScalars+LatencyBuckets+statsCauses)
	raw[0] = uint64(len(raw) * 8)
	if err := t.do(op, func(h uintptr) int { return capi.Kvx_get_stats(raw, h, peer) }); err != nil {
		return s, err
	}
	f := raw[1:statsScalars]
	s = Stats{
		TransfersDone: f[0], TransfersFailed: f[1], TransfersCancelled: f[2],
		BytesDone: f[3], BytesFailed: f[4], BytesCancelled: f[5],
		TransfersInflight: f[6], BytesInflight: f[7],
		Peers: f[8], PeersConnecting: f[9], Connects: f[10], ConnectFailures: f[11],
		ConnectNsTotal: f[12], ConnectNsMax: f[13], ConnectNsLast: f[14],
		LatencyCount: f[15], LatencyNsP50: f[16], LatencyNsP90: f[17], LatencyNsP99: f[18],
		LatencyNsP999: f[19], LatencyNsMax: f[20],
	}
	copy(s.LatencyBuckets[:], raw[statsScalars:statsScalars+LatencyBuckets])
	c := raw[statsScalars+LatencyBuckets:]
	s.TransfersFailedTimeout, s.TransfersFailedConnection = c[0], c[1]
	s.TransfersFailedRemoved, s.TransfersFailedOther = c[2], c[3]
	s.LatencyNsSum = c[4]
	return s, nil
}

// LatencyBucketBounds returns the latencies in ns that bucket i of
// Stats.LatencyBuckets holds, as the C library records them
// (kvx_stats_bucket_lower_ns): [lo, hi); hi is 0 for the last bucket, which
// has no upper bound. It panics if i is not in [0, LatencyBuckets).
func LatencyBucketBounds(i int) (lo, hi uint64) {
	if i < 0 || i >= LatencyBuckets {
		panic(fmt.Sprintf("kvxfer: latency bucket %d is not in [0, %d)", i, LatencyBuckets))
	}
	if i+1 < LatencyBuckets {
		hi = capi.Kvx_stats_bucket_lower_ns(int64(i + 1))
	}
	return capi.Kvx_stats_bucket_lower_ns(int64(i)), hi
}

// RailNameLen is the most bytes of RailStats.Name, with the C string's NUL.
const RailNameLen = capi.KVX_RAIL_NAME_LEN

// RailStats is one rail of a peer (kvx_peer_rails): a local RDMA port paired
// with one of the peer's (option verbs.devices), over which the peer's
// transfers are striped.
type RailStats struct {
	// Name is "local device:port -> the peer's rdma_cm address", e.g.
	// "rxe0:1 -> 198.18.0.1:20049" (at most RailNameLen-1 bytes).
	Name string
	// Up is true while the rail carries transfers; false once taken out
	// (failed, or never connected). A rail taken out does not come back
	// for this peer.
	Up bool
	// Bytes and Parts count the parts of transfers the rail completed.
	Bytes, Parts uint64
	// Failures counts the times the rail was taken out (0 or 1 today).
	Failures uint32
	// ChangedNs is when the rail last changed state (connected, taken out),
	// in ns since the epoch (CLOCK_REALTIME).
	ChangedNs int64
}

// PeerRails returns the rails a registered peer's transfers are striped
// over, in rail order. Only verbs has rails: a peer on tcp or shm has none
// (an empty slice, no error). The counters are a snapshot; they never go
// back while the peer is registered.
//
// Errors: ErrUnknownPeer (not registered, or still connecting), ErrInvalid,
// ErrClosed.
func (t *Transport) PeerRails(id string) ([]RailStats, error) {
	const op = "PeerRails"
	if err := checkPeerID(op, id, false); err != nil {
		return nil, err
	}
	fields := int(capi.KVX_GO_RAIL_FIELDS)
	n := make([]uint64, 1)
	var names []byte
	var raw []uint64
	for {
		c := len(raw) / fields
		err := t.do(op, func(h uintptr) int { return capi.Kvx_go_peer_rails(names, raw, n, h, id, int64(c)) })
		if err != nil {
			return nil, err
		}
		if n[0] <= uint64(c) {
			break
		}
		// Ask again with room for every rail (again if the peer was
		// replaced meanwhile by one with more rails).
		names = make([]byte, int(n[0])*RailNameLen)
		raw = make([]uint64, int(n[0])*fields)
	}
	rails := make([]RailStats, n[0])
	for i := range rails {
		f := raw[i*fields : (i+1)*fields]
		rails[i] = RailStats{
			Name:      cString(names[i*RailNameLen : (i+1)*RailNameLen]),
			Up:        f[0] != 0,
			Bytes:     f[1],
			Parts:     f[2],
			Failures:  uint32(f[3]),
			ChangedNs: int64(f[4]), // the bits of kvx_rail_stats.changed_ns
		}
	}
	return rails, nil
}
