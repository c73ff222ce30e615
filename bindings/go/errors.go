package kvxfer

import (
	"fmt"
	"runtime"
	"syscall"

	"kvxfer.dev/kvxfer/internal/capi"
)

// Code is a kvxfer error code: 0 or a negative value, exactly as the C
// library returns it. Codes above -1000 are negated errno values.
type Code int

// The error codes of include/kvxfer.h (KVX_E*).
const (
	CodeOK              Code = 0
	CodePermission      Code = -1    // KVX_EPERM: operation not permitted
	CodeUnknownPeer     Code = -2    // KVX_ENOENT: unknown peer id
	CodeNoMemory        Code = -12   // KVX_ENOMEM: out of memory
	CodeBusy            Code = -16   // KVX_EBUSY: resource busy
	CodePeerExists      Code = -17   // KVX_EEXIST: peer id already registered
	CodeInvalid         Code = -22   // KVX_EINVAL: invalid argument
	CodeOutOfRange      Code = -34   // KVX_ERANGE: block index out of range
	CodeOverflow        Code = -75   // KVX_EOVERFLOW: size arithmetic overflows
	CodeNotSupported    Code = -95   // KVX_ENOTSUP: backend or option not supported
	CodeConnReset       Code = -104  // KVX_ECONNRESET: peer connection lost
	CodeBufferTooSmall  Code = -105  // KVX_ENOBUFS: caller's buffer too small
	CodeTimeout         Code = -110  // KVX_ETIMEDOUT: connect or transfer timed out
	CodeConnRefused     Code = -111  // KVX_ECONNREFUSED: peer refused the connection
	CodeHostUnreachable Code = -113  // KVX_EHOSTUNREACH: no route to the peer
	CodeCanceled        Code = -125  // KVX_ECANCELED: cancelled: the peer was removed or re-added (a registration; a transfer, see PollResults)
	CodeClosed          Code = -1001 // KVX_ECLOSED: transport was closed
	CodeBadMetadata     Code = -1002 // KVX_EBADMETA: agent metadata truncated, corrupt or forged
	CodeVersion         Code = -1003 // KVX_EVERSION: metadata/wire major version unsupported
	CodeFingerprint     Code = -1004 // KVX_EFINGERPRINT: config fingerprints differ
	CodeGeometry        Code = -1005 // KVX_EGEOMETRY: block_len/base_addr/num_blocks mismatch
	CodePeerBroken      Code = -1006 // KVX_EPEERBROKEN: peer connection failed earlier
	CodeAuth            Code = -1007 // KVX_EAUTH: authentication of a connection failed
	CodeConfig          Code = -1008 // KVX_ECONFIG: config JSON invalid or unsupported
	CodeBackend         Code = -1009 // KVX_EBACKEND: backend failure (device, socket)
	CodeInternal        Code = -1010 // KVX_EINTERNAL: bug in kvxfer
)

// errnoLimit is KVX_ERRNO_OFFSET: codes above it are negated errno values.
const errnoLimit Code = -1000

// String returns the C library's short description of the code
// ("unknown peer"), also for codes this package does not name.
func (c Code) String() string { return capi.Kvx_strerror(int(c)) }

// Scope tells what recovery fits a failure (kvx_error_scope).
type Scope int

const (
	// ScopeNone belongs to CodeOK only.
	ScopeNone Scope = 0
	// ScopeRequest: this call was wrong; fix the arguments and retry.
	ScopeRequest Scope = 1
	// ScopePeer: one peer is unusable until removed and re-added.
	ScopePeer Scope = 2
	// ScopeTransport: the transport is unusable; close it and create a new one.
	ScopeTransport Scope = 3
)

// String returns "none", "request", "peer" or "transport".
func (s Scope) String() string {
	switch s {
	case ScopeNone:
		return "none"
	case ScopeRequest:
		return "request"
	case ScopePeer:
		return "peer"
	case ScopeTransport:
		return "transport"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// Scope returns the recovery scope of the code, as the C library defines it
// (ScopeTransport for codes it does not know).
func (c Code) Scope() Scope { return Scope(capi.Kvx_error_scope_of(int(c))) }

// Error is the error type of every failing call of this package.
//
// Compare with errors.Is against the sentinels (ErrClosed, ErrUnknownPeer,
// ...): an *Error matches every *Error of the same Code, and errno-based
// codes also match the corresponding syscall.Errno (errors.Is(err,
// syscall.ECONNREFUSED)). Use errors.As to read Code, Scope and Message.
type Error struct {
	Op      string // the method or function that failed, e.g. "AddRemotePeer"; "" for sentinels
	Code    Code   // the kvxfer error code
	Scope   Scope  // what recovery fits (see Scope)
	Message string // context naming the bad value, from the C library or this package; may be ""
}

// Error formats "kvxfer: Op: description: message".
func (e *Error) Error() string {
	s := "kvxfer: "
	if e.Op != "" {
		s += e.Op + ": "
	}
	s += e.Code.String()
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is reports whether target is an *Error with the same Code (the sentinels
// are such errors), or a syscall.Errno equal to an errno-based Code.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *Error:
		return t != nil && t.Code == e.Code
	case syscall.Errno:
		return e.Code < 0 && e.Code > errnoLimit && syscall.Errno(-e.Code) == t
	}
	return false
}

func sentinel(c Code) *Error { return &Error{Code: c, Scope: c.Scope()} }

// Sentinel errors, one per code, for errors.Is. They carry no Op or Message.
var (
	ErrPermission      = sentinel(CodePermission)
	ErrUnknownPeer     = sentinel(CodeUnknownPeer)
	ErrNoMemory        = sentinel(CodeNoMemory)
	ErrBusy            = sentinel(CodeBusy)
	ErrPeerExists      = sentinel(CodePeerExists)
	ErrInvalid         = sentinel(CodeInvalid)
	ErrOutOfRange      = sentinel(CodeOutOfRange)
	ErrOverflow        = sentinel(CodeOverflow)
	ErrNotSupported    = sentinel(CodeNotSupported)
	ErrConnReset       = sentinel(CodeConnReset)
	ErrBufferTooSmall  = sentinel(CodeBufferTooSmall)
	ErrTimeout         = sentinel(CodeTimeout)
	ErrConnRefused     = sentinel(CodeConnRefused)
	ErrHostUnreachable = sentinel(CodeHostUnreachable)
	ErrCanceled        = sentinel(CodeCanceled)
	ErrClosed          = sentinel(CodeClosed)
	ErrBadMetadata     = sentinel(CodeBadMetadata)
	ErrVersion         = sentinel(CodeVersion)
	ErrFingerprint     = sentinel(CodeFingerprint)
	ErrGeometry        = sentinel(CodeGeometry)
	ErrPeerBroken      = sentinel(CodePeerBroken)
	ErrAuth            = sentinel(CodeAuth)
	ErrConfig          = sentinel(CodeConfig)
	ErrBackend         = sentinel(CodeBackend)
	ErrInternal        = sentinel(CodeInternal)
)

// newError builds the error of a failed call.
func newError(op string, c Code, msg string) *Error {
	return &Error{Op: op, Code: c, Scope: c.Scope(), Message: msg}
}

// call runs one C call and turns a non-zero return into an *Error carrying
// kvx_last_error_message(). That message is thread-local in C, so the
// goroutine stays on its OS thread from the call until the message is read.
func call(op string, f func() int) error {
	runtime.LockOSThread()
	rc := f()
	var msg string
	if rc != 0 {
		msg = capi.Kvx_last_error_message()
	}
	runtime.UnlockOSThread()
	if rc == 0 {
		return nil
	}
	return newError(op, Code(rc), msg)
}
