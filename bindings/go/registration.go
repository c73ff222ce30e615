package kvxfer

import (
	"context"
	"runtime"
	"time"

	"kvxfer.dev/kvxfer/internal/capi"
)

// A Registration is a peer registration in progress, started by
// AddRemotePeerAsync: the connection is made on a thread of the C library
// (kvx_add_remote_peer_async) and its outcome arrives on Done.
//
// A registration is cancelled by RemoveRemotePeer of its peer id (or
// Cancel), superseded by a later add of the same id with replace, and cut
// short by Close: it then fails with ErrCanceled (ErrClosed) and never
// registers the peer. All methods are safe for concurrent use.
type Registration struct {
	t    *Transport
	peer string
	id   uint64
	done chan struct{}
	err  error // set before done is closed
}

// waitSlice bounds each wait in C, so that Close never waits for a goroutine
// blocked in kvx_registration_status.
const waitSlice = 100 * time.Millisecond

// AddRemotePeerAsync starts registering a peer and returns at once; the
// arguments are those of AddRemotePeer, and are checked (with the metadata)
// before it returns. With replace, a peer registered under id, or a
// registration of it in progress, is replaced instead of failing with
// ErrPeerExists: the old peer's transfers in flight fail, as on
// RemoveRemotePeer.
//
// Errors returned at once: ErrInvalid, ErrPeerExists, ErrBadMetadata,
// ErrVersion, ErrGeometry, ErrFingerprint, ErrNotSupported, ErrClosed.
// Connection errors (ErrConnRefused, ErrTimeout, ErrHostUnreachable,
// ErrAuth, ErrConnReset) come through Done/Err, within the connect timeout.
func (t *Transport) AddRemotePeerAsync(id string, meta []byte, baseAddr, numBlocks, blockLen uint64,
	replace bool) (*Registration, error) {
	const op = "AddRemotePeerAsync"
	if err := checkPeerID(op, id, false); err != nil {
		return nil, err
	}
	var flags uint
	if replace {
		flags = uint(capi.KVX_PEER_REPLACE)
	}
	out := make([]uint64, 1)
	err := t.do(op, func(h uintptr) int {
		return capi.Kvx_add_remote_peer_async(out, h, id, meta, int64(len(meta)), baseAddr, numBlocks, blockLen, flags)
	})
	if err != nil {
		return nil, err
	}
	r := &Registration{t: t, peer: id, id: out[0], done: make(chan struct{})}
	go r.wait()
	return r, nil
}

// AddRemotePeerContext registers a peer like AddRemotePeer, but returns when
// ctx is done too: the registration is then cancelled (the peer id is
// removed, as by RemoveRemotePeer) and ctx.Err() returned.
func (t *Transport) AddRemotePeerContext(ctx context.Context, id string, meta []byte, baseAddr, numBlocks,
	blockLen uint64) error {
	r, err := t.AddRemotePeerAsync(id, meta, baseAddr, numBlocks, blockLen, false)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// Peer returns the peer id being registered.
func (r *Registration) Peer() string { return r.peer }

// Done is closed when the outcome is known; Err then tells it.
func (r *Registration) Done() <-chan struct{} { return r.done }

// Err returns nil while the registration is pending or when the peer is
// registered, else why it failed (an *Error).
func (r *Registration) Err() error {
	select {
	case <-r.done:
		return r.err
	default:
		return nil
	}
}

// Pending reports whether the outcome is still unknown.
func (r *Registration) Pending() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Wait blocks until the outcome is known, and returns Err; or until ctx is
// done, which cancels the registration (Cancel) and returns ctx.Err().
func (r *Registration) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		r.Cancel()
		return ctx.Err()
	}
}

// Cancel cancels the registration if it is still pending, by removing its
// peer id (RemoveRemotePeer): it then fails with ErrCanceled.
func (r *Registration) Cancel() {
	if r.Pending() {
		_ = r.t.RemoveRemotePeer(r.peer)
	}
}

var errRegistrationUnknown = newError("AddRemotePeerAsync", CodeInternal, "registration outcome lost")

// wait collects the outcome from C, in slices, then closes done.
func (r *Registration) wait() {
	defer close(r.done)
	for {
		state, err := r.status(int(waitSlice / time.Millisecond))
		if err != nil || state != int32(capi.KVX_REGISTRATION_PENDING) {
			r.err = err
			return
		}
	}
}

// status asks C once (waiting up to ms): the state, or the failure as an
// error (a failed registration's message is thread-local in C).
func (r *Registration) status(ms int) (int32, error) {
	const op = "AddRemotePeerAsync"
	r.t.mu.RLock()
	defer r.t.mu.RUnlock()
	if r.t.h == 0 {
		return 0, newError(op, CodeClosed, "transport is closed")
	}
	state, code := make([]int32, 1), make([]int32, 1)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := capi.Kvx_registration_status(state, code, r.t.h, r.id, ms); rc != 0 {
		if Code(rc) == CodeUnknownPeer {
			return 0, errRegistrationUnknown
		}
		return 0, newError(op, Code(rc), capi.Kvx_last_error_message())
	}
	if state[0] == int32(capi.KVX_REGISTRATION_FAILED) {
		return state[0], newError(op, Code(code[0]), capi.Kvx_last_error_message())
	}
	return state[0], nil
}
