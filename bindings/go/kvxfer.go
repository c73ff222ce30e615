package kvxfer

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"

	"kvxfer.dev/kvxfer/internal/capi"
)

// PeerIDMax is the longest peer id accepted, in bytes.
const PeerIDMax = 255

// FingerprintLen is the length of a config fingerprint in hex characters.
const FingerprintLen = 16

// Version returns the version ("MAJOR.MINOR.PATCH") of the C library loaded
// at run time.
func Version() string { return capi.Kvx_version_string() }

// Backends returns the names of the backends built into the C library, in
// order of preference ("shm", "verbs", "tcp"): each is a value WithBackend
// accepts. A backend is listed whether or not it is usable on this host
// (verbs needs an RDMA device); "auto" serves on the usable ones.
func Backends() []string {
	list := capi.Kvx_backends()
	if list == "" {
		return nil
	}
	return strings.Split(list, ",")
}

// Fingerprint computes the config fingerprint of a JSON object text, exactly
// as NewTransport does: the first 16 hex characters of the sha256 of
// Python's json.dumps(fields, sort_keys=True, separators=(",", ":")).
// "", "null" and "{}" give "" (no fingerprint, compatible with every peer).
// Invalid JSON or a non-object fails with ErrConfig.
func Fingerprint(configJSON string) (string, error) {
	if strings.IndexByte(configJSON, 0) >= 0 {
		return "", newError("Fingerprint", CodeConfig, "config JSON contains a NUL byte")
	}
	buf := make([]byte, FingerprintLen+1)
	if err := call("Fingerprint", func() int { return capi.Kvx_config_fingerprint(buf, configJSON) }); err != nil {
		return "", err
	}
	return cString(buf), nil
}

// FingerprintOf computes the fingerprint of config fields given as Go values
// (encoded with ConfigJSON). A nil or empty map gives "".
func FingerprintOf(fields map[string]any) (string, error) {
	text, err := ConfigJSON(fields)
	if err != nil {
		return "", newError("FingerprintOf", CodeConfig, err.Error())
	}
	return Fingerprint(text)
}

func cString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// CancelMode selects what Cancel does with transfers already on the wire.
type CancelMode int

const (
	// CancelImmediate forgets the ids: they are never reported by Poll.
	// Bytes of a transfer already on the wire may still land in the
	// peer's region afterwards.
	CancelImmediate CancelMode = 0
	// CancelWait releases what can be released (not started, or finished
	// but not yet polled: never reported); the ids still on the wire are
	// returned and will surface in Poll as done or failed.
	CancelWait CancelMode = 1
)

// String returns "immediate" or "wait".
func (m CancelMode) String() string {
	switch m {
	case CancelImmediate:
		return "immediate"
	case CancelWait:
		return "wait"
	}
	return fmt.Sprintf("CancelMode(%d)", int(m))
}

// PollResult lists the transfers that finished since the previous Poll.
// Every transfer id appears exactly once over all polls (Poll and
// PollResults), in Done or Failed. PollResults also says why each failed.
type PollResult struct {
	Done   []uint64 // the bytes are in the peer's region
	Failed []uint64 // error, timeout, peer removed; no statement about which bytes landed
}

// Transport is one local region, its remote peers and transfers: the
// DataTransport of vLLM's KV offloading, over the kvxfer C library.
//
// A Transport is safe for concurrent use by multiple goroutines, Close
// included: the C library allows every call concurrently except destroy,
// and Close waits for calls in progress before destroying the handle. After
// Close every method fails with ErrClosed, except the properties (BaseAddr,
// NumBlocks, BlockLen, ConfigFingerprint, Backend, Region), which stay
// readable.
type Transport struct {
	mu     sync.RWMutex // read: a C call is using h; write: destroying h
	h      uintptr      // kvx_transport *, 0 once closed
	region *Region

	baseAddr    uint64
	numBlocks   uint64
	blockLen    uint64
	fingerprint string
	backend     string
	backends    []string
}

// NewTransport creates a transport over region, which must come from
// AllocRegion, MapRegionFile or RegionFromMmap and stay allocated until the
// transport is closed (Region.Free refuses while it is open). Options select the backend, the config whose
// fingerprint peers must share, timeouts and backend options.
//
// Errors: ErrInvalid (nil, freed or foreign region, bad option value),
// ErrConfig (invalid config JSON), ErrNotSupported (backend not available
// here), ErrBackend (listen or device failure), ErrNoMemory.
func NewTransport(region *Region, opts ...Option) (*Transport, error) {
	const op = "NewTransport"
	var s settings
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.err != nil {
		return nil, s.err
	}
	if strings.IndexByte(s.config, 0) >= 0 {
		return nil, newError(op, CodeConfig, "config JSON contains a NUL byte")
	}
	for i, k := range s.keys {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(s.values[i], 0) >= 0 {
			return nil, newError(op, CodeInvalid, fmt.Sprintf("option %q contains a NUL byte", k))
		}
	}
	base, err := region.acquire(op)
	if err != nil {
		return nil, err
	}
	h, err := create(op, base, region, &s)
	if err != nil {
		region.release()
		return nil, err
	}
	t := &Transport{h: h, region: region}
	out := make([]uint64, 1)
	capi.Kvx_transport_base_addr(out, h)
	t.baseAddr = out[0]
	capi.Kvx_transport_num_blocks(out, h)
	t.numBlocks = out[0]
	capi.Kvx_transport_block_len(out, h)
	t.blockLen = out[0]
	fp := make([]byte, FingerprintLen+1)
	capi.Kvx_transport_config_fingerprint(fp, h)
	t.fingerprint = cString(fp)
	t.backend = capi.Kvx_transport_backend(h)
	t.backends = strings.Split(capi.Kvx_transport_backends(h), ",")
	// A transport dropped without Close is closed by the garbage collector;
	// it keeps its Region reachable until then.
	runtime.SetFinalizer(t, (*Transport).Close)
	return t, nil
}

func create(op string, base uintptr, region *Region, s *settings) (uintptr, error) {
	var opts uintptr
	if len(s.keys) > 0 {
		out := make([]uintptr, 1)
		if err := call(op, func() int { return capi.Kvx_options_create(out) }); err != nil {
			return 0, err
		}
		opts = out[0]
		defer capi.Kvx_options_destroy(opts)
		for i, k := range s.keys {
			v := s.values[i]
			if err := call(op, func() int { return capi.Kvx_options_set(opts, k, v) }); err != nil {
				return 0, err
			}
		}
	}
	out := make([]uintptr, 1)
	err := call(op, func() int {
		return capi.Kvx_transport_create(out, base, region.numBlocks, region.blockLen, s.config, opts)
	})
	if err != nil {
		return 0, err
	}
	return out[0], nil
}

// do runs f on the live handle, or fails with ErrClosed.
func (t *Transport) do(op string, f func(h uintptr) int) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.h == 0 {
		return newError(op, CodeClosed, "transport is closed")
	}
	h := t.h
	return call(op, func() int { return f(h) })
}

// BaseAddr returns the base address of the local region, which peers pass
// to AddRemotePeer.
func (t *Transport) BaseAddr() uint64 { return t.baseAddr }

// NumBlocks returns the number of blocks of the local region.
func (t *Transport) NumBlocks() uint64 { return t.numBlocks }

// BlockLen returns the bytes per block.
func (t *Transport) BlockLen() uint64 { return t.blockLen }

// ConfigFingerprint returns the config fingerprint (16 lowercase hex
// characters), or "" when the transport was created without a config.
func (t *Transport) ConfigFingerprint() string { return t.fingerprint }

// Backend returns the most preferred backend the transport serves on:
// "shm", "verbs" or "tcp". It may serve on several (Backends); PeerBackend
// says which one a given peer uses.
func (t *Transport) Backend() string { return t.backend }

// Backends returns every backend the transport serves on, in order of
// preference (since 0.8): what its metadata offers, so the paths its peers
// can take. With backend "auto", every backend usable on this host.
func (t *Transport) Backends() []string { return append([]string(nil), t.backends...) }

// PeerBackend says which path a registered peer's transfers take: the
// backend ("shm", "verbs", "tcp") and, for shm, how ("mapped": the peer's
// region is mapped here and copied into directly; "process_vm_writev": the
// kernel copies into the peer's private memory; "staged": through the
// peer's staging ring, see shm.private; "" for other backends).
// Backend() names the transport's most preferred backend; a transport
// serves on several and picks one per peer when it is added.
//
// Errors: ErrUnknownPeer (not registered, or still connecting), ErrInvalid,
// ErrClosed.
func (t *Transport) PeerBackend(id string) (backend, path string, err error) {
	const op = "PeerBackend"
	if err := checkPeerID(op, id, false); err != nil {
		return "", "", err
	}
	b := make([]byte, capi.KVX_GO_NAME_LEN)
	p := make([]byte, capi.KVX_GO_NAME_LEN)
	if err := t.do(op, func(h uintptr) int { return capi.Kvx_go_peer_backend(b, p, h, id) }); err != nil {
		return "", "", err
	}
	return cString(b), cString(p), nil
}

// Region returns the region the transport was created over.
func (t *Transport) Region() *Region { return t.region }

// AgentMetadata returns the opaque bytes a peer passes to its AddRemotePeer
// to reach this transport.
//
// Security: the metadata contains the secret that lets its holder write into
// this transport's region; hand it only to peers that may do so.
func (t *Transport) AgentMetadata() ([]byte, error) {
	const op = "AgentMetadata"
	buf := make([]byte, 1024)
	n := make([]uint64, 1)
	for {
		err := t.do(op, func(h uintptr) int { return capi.Kvx_get_agent_metadata(n, h, buf, int64(len(buf))) })
		if err == nil {
			return buf[:n[0]], nil
		}
		if !errors.Is(err, ErrBufferTooSmall) || n[0] <= uint64(len(buf)) {
			return nil, err
		}
		buf = make([]byte, n[0])
	}
}

// checkPeerID refuses what C would misread: a NUL truncates the C string,
// and "" becomes NULL (which the C library reports as "peer_id is NULL").
func checkPeerID(op, id string, allowEmpty bool) error {
	if id == "" && !allowEmpty {
		return newError(op, CodeInvalid, "empty peer id")
	}
	if strings.IndexByte(id, 0) >= 0 {
		return newError(op, CodeInvalid, fmt.Sprintf("peer id %q contains a NUL byte", id))
	}
	return nil
}

// AddRemotePeer registers the peer id (1..PeerIDMax bytes) and connects to
// it, authenticated, within the connect timeout. meta is the peer's
// AgentMetadata (untrusted, fully validated); baseAddr, numBlocks and
// blockLen are the peer's geometry, which must equal the metadata's, and
// blockLen must equal ours. On failure nothing is registered.
//
// Errors: ErrInvalid (bad id), ErrPeerExists (registered, or being
// registered), ErrBadMetadata, ErrVersion, ErrGeometry, ErrFingerprint,
// ErrNotSupported, ErrConnRefused, ErrTimeout, ErrHostUnreachable, ErrAuth,
// ErrClosed. It blocks up to the connect timeout; other calls proceed
// meanwhile. AddRemotePeerAsync and AddRemotePeerContext do not block.
func (t *Transport) AddRemotePeer(id string, meta []byte, baseAddr, numBlocks, blockLen uint64) error {
	const op = "AddRemotePeer"
	if err := checkPeerID(op, id, false); err != nil {
		return err
	}
	return t.do(op, func(h uintptr) int {
		return capi.Kvx_add_remote_peer(h, id, meta, int64(len(meta)), baseAddr, numBlocks, blockLen)
	})
}

// RemoveRemotePeer unregisters a peer: its transfers in flight fail (they
// surface in Poll's Failed list), its connections close, and a registration
// of it in progress (AddRemotePeerAsync) is cancelled. The id may be added
// again afterwards. Errors: ErrUnknownPeer, ErrInvalid, ErrClosed.
func (t *Transport) RemoveRemotePeer(id string) error {
	const op = "RemoveRemotePeer"
	if err := checkPeerID(op, id, false); err != nil {
		return err
	}
	return t.do(op, func(h uintptr) int { return capi.Kvx_remove_remote_peer(h, id) })
}

// WriteBlocks submits a one-sided WRITE of local block local[i] into the
// peer's block remote[i], for every i, and returns the transfer id (never
// 0), which surfaces exactly once in Poll. It never blocks on the network.
// Empty lists make a valid transfer, done at the next Poll.
//
// Errors: ErrInvalid (lists of different lengths, a remote index repeated,
// bad peer id), ErrOutOfRange (an index >= the number of blocks on either
// side), ErrUnknownPeer, ErrPeerBroken (the peer's connection failed: it
// reconnects in the background, see PeerState, or remove and re-add it),
// ErrClosed. The seed API's "None" result maps to any error here.
func (t *Transport) WriteBlocks(peer string, local, remote []uint64) (uint64, error) {
	const op = "WriteBlocks"
	if len(local) != len(remote) {
		return 0, newError(op, CodeInvalid, fmt.Sprintf("%d local indexes but %d remote indexes", len(local), len(remote)))
	}
	if err := checkPeerID(op, peer, false); err != nil {
		return 0, err
	}
	id := make([]uint64, 1)
	err := t.do(op, func(h uintptr) int {
		return capi.Kvx_write_blocks(id, h, peer, local, remote, int64(len(local)))
	})
	if err != nil {
		return 0, err
	}
	return id[0], nil
}

// Wait sleeps until Poll has something to report, or timeout passes (a
// negative timeout: no limit; 0: only look), and returns how many ids Poll
// would report now (0: the time ran out). It returns at once when ids are
// ready already. The calling goroutine holds its OS thread while it sleeps
// (a cgo call). Errors: ErrClosed, also when Close is called meanwhile: it
// wakes every waiter (kvx_wait(3)).
func (t *Transport) Wait(timeout time.Duration) (int, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
		if ms > math.MaxInt32 {
			ms = math.MaxInt32
		}
	}
	ready := make([]uint64, 1)
	err := t.do("Wait", func(h uintptr) int { return capi.Kvx_wait(ready, h, ms) })
	return int(ready[0]), err
}

// CompletionFD returns a file descriptor that is readable while Poll has
// something to report, for event loops (epoll, poll): level-triggered,
// readable until Poll has taken every ready id, and readable for good once
// the transport is closed. The transport owns it: never read, write or close
// it; Close closes it (kvx_completion_fd(3)). Errors: ErrClosed.
func (t *Transport) CompletionFD() (int, error) {
	fd := make([]int32, 1)
	err := t.do("CompletionFD", func(h uintptr) int { return capi.Kvx_completion_fd(fd, h) })
	return int(fd[0]), err
}

// pollBatch is how many ids one kvx_poll call may return per list.
const pollBatch = 256

// Poll collects the transfers that finished: of peer only, or of all peers
// when peer is "" (an unknown peer yields nothing: it may just have been
// removed). Progress does not depend on polling: backends run on their own
// threads. The lists are nil when empty. On error, the ids collected before
// it are returned with it. Errors: ErrClosed.
func (t *Transport) Poll(peer string) (PollResult, error) {
	const op = "Poll"
	var res PollResult
	if err := checkPeerID(op, peer, true); err != nil {
		return res, err
	}
	done := make([]uint64, pollBatch)
	failed := make([]uint64, pollBatch)
	nDone := make([]uint64, 1)
	nFailed := make([]uint64, 1)
	for {
		err := t.do(op, func(h uintptr) int {
			return capi.Kvx_poll(nDone, nFailed, h, peer, done, pollBatch, failed, pollBatch)
		})
		if err != nil {
			return res, err
		}
		res.Done = append(res.Done, done[:nDone[0]]...)
		res.Failed = append(res.Failed, failed[:nFailed[0]]...)
		if nDone[0] < pollBatch && nFailed[0] < pollBatch {
			return res, nil
		}
	}
}

// Result is a finished transfer, as PollResults reports it.
type Result struct {
	// ID is the transfer id WriteBlocks returned.
	ID uint64
	// Err is nil when the transfer is done (its bytes are in the peer's
	// region), else why it failed: an *Error (Op "PollResults") whose Code
	// is CodeTimeout (errors.Is(err, ErrTimeout): the peer made no progress
	// for the transfer timeout, the stall timeout), CodeConnReset
	// (ErrConnReset: the peer's connection failed), CodeCanceled
	// (ErrCanceled: the peer was removed or replaced), or another code (a
	// backend's own failure, e.g. CodePermission, CodeBackend).
	Err error
}

// PollResults collects the transfers that finished, as Poll does, with the
// reason of each failure (kvx_poll_results): one Result per transfer, Err
// nil when it is done, else an *Error with its Code (CodeTimeout: the stall
// timeout; CodeConnReset: the peer's connection failed; CodeCanceled: the
// peer was removed or replaced; another code: a backend's own failure).
// Poll and PollResults take from the same queues: each id is reported
// exactly once, by one of them. peer "" means all peers; an unknown peer
// yields nothing. PeerState tells what the peer went through meanwhile. The
// slice is nil when nothing finished. On error, the results collected
// before it are returned with it. Errors: ErrClosed.
func (t *Transport) PollResults(peer string) ([]Result, error) {
	const op = "PollResults"
	if err := checkPeerID(op, peer, true); err != nil {
		return nil, err
	}
	ids := make([]uint64, pollBatch)
	status := make([]int32, pollBatch)
	n := make([]uint64, 1)
	var res []Result
	for {
		err := t.do(op, func(h uintptr) int {
			return capi.Kvx_go_poll_results(ids, status, n, h, peer, pollBatch)
		})
		if err != nil {
			return res, err
		}
		for i := uint64(0); i < n[0]; i++ {
			r := Result{ID: ids[i]}
			if status[i] != 0 {
				msg := fmt.Sprintf("transfer %d failed", ids[i])
				if peer != "" {
					msg = fmt.Sprintf("transfer %d to peer %q failed", ids[i], peer)
				}
				r.Err = newError(op, Code(status[i]), msg)
			}
			res = append(res, r)
		}
		if n[0] < pollBatch {
			return res, nil
		}
	}
}

// Cancel cancels transfers; unknown or already reported ids are ignored.
// With CancelImmediate it returns nil; with CancelWait it returns the ids
// still on the wire, which will surface in Poll. Errors: ErrInvalid (bad
// mode), ErrClosed.
func (t *Transport) Cancel(ids []uint64, mode CancelMode) ([]uint64, error) {
	const op = "Cancel"
	var inflight []uint64
	if mode == CancelWait {
		inflight = make([]uint64, len(ids))
	}
	n := make([]uint64, 1)
	err := t.do(op, func(h uintptr) int {
		return capi.Kvx_cancel(n, h, ids, int64(len(ids)), int(mode), inflight)
	})
	if err != nil || n[0] == 0 {
		return nil, err
	}
	return inflight[:n[0]], nil
}

// Close closes the transport: transfers in flight fail (and are reported by
// nothing), peers are disconnected, the C library's threads stop, and when
// Close returns nothing writes into the region any more (it may then be
// freed). Close waits for calls in progress on other goroutines. It is
// idempotent and always returns nil for a transport created by NewTransport.
func (t *Transport) Close() error {
	// Close first without exclusive access: the C close is safe alongside
	// other calls and makes them fail fast instead of delaying destroy.
	t.mu.RLock()
	if t.h != 0 {
		capi.Kvx_transport_close(t.h)
	}
	t.mu.RUnlock()

	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h == 0 {
		return nil
	}
	capi.Kvx_transport_destroy(t.h)
	t.h = 0
	t.region.release()
	runtime.SetFinalizer(t, nil)
	return nil
}
