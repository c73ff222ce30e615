package kvxfer

import (
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"kvxfer.dev/kvxfer/internal/capi"
)

// LogLevel is the level of the library's messages (kvx_log_level).
type LogLevel int

// The levels, from none to the most verbose.
const (
	LogOff   LogLevel = -1 // nothing (a level to set, never a record's)
	LogError LogLevel = 0  // the library failed at something nobody asked for
	LogWarn  LogLevel = 1  // a peer broke, a path fell back, a peer was refused
	LogInfo  LogLevel = 2  // choices made: paths, addresses, codes
	LogDebug LogLevel = 3  // per-transfer detail
)

// String returns "off", "error", "warn", "info" or "debug".
func (l LogLevel) String() string {
	switch l {
	case LogOff:
		return "off"
	case LogError:
		return "error"
	case LogWarn:
		return "warn"
	case LogInfo:
		return "info"
	case LogDebug:
		return "debug"
	}
	return fmt.Sprintf("LogLevel(%d)", int(l))
}

// LogRecord is one message of the library, a copy the handler may keep.
type LogRecord struct {
	Level   LogLevel // LogError..LogDebug
	Message string   // one line, no newline
	// Component is the part of the library that logged it: "core",
	// "handshake", "shm", "tcp" or "verbs".
	Component string
	// PeerID is the peer it is about, or "" when it is not about one peer
	// (the core's messages about a peer carry it; a backend's name it in the
	// message).
	PeerID string
	// Time is when it was logged (CLOCK_REALTIME).
	Time time.Time
	// Suppressed counts the messages of the same call site the rate limit
	// dropped since one last passed (a burst of 20, then one a second).
	Suppressed uint64
	// Dropped counts the messages of any site dropped since the previous
	// record because the handler fell behind (more than 4,096 waiting).
	Dropped uint64
	// ThreadID is the kernel tid of the thread that logged it.
	ThreadID int
}

// String formats the record as the library's stderr line does, without its
// "kvxfer[PID] " prefix: "warn: peer 'x': refused: ... (3 more like this
// suppressed)".
func (r LogRecord) String() string {
	s := r.Level.String() + ": " + r.Message
	if r.Suppressed > 0 {
		s += fmt.Sprintf(" (%d more like this suppressed)", r.Suppressed)
	}
	if r.Dropped > 0 {
		s += fmt.Sprintf(" (%d earlier messages dropped: the log handler fell behind)", r.Dropped)
	}
	return s
}

var logMu sync.Mutex      // serializes SetLogHandler and SetLogLevel
var logRouted atomic.Bool // a handler is set

// SetLogHandler routes the library's messages to h, from level on
// (kvx_set_log_handler): LogOff for none, LogError to LogDebug; it replaces
// KVX_LOG's level. A nil h sends them back to stderr, where they go by
// default ("kvxfer[PID] warn: ..."; warnings and errors unless KVX_LOG says
// otherwise).
//
// h is called on one thread of the library's own, one record at a time, in
// the order they were logged, never with a library lock held: it may call
// any function of this package (SetLogLevel and SetLogHandler included). A
// slow h delays only the delivery; once 4,096 records wait, the library
// drops (and counts, LogRecord.Dropped) what comes. When SetLogHandler
// returns, a call of the previous handler in progress has returned and no
// other will start. h must not panic.
//
// Errors: ErrInvalid (level out of range).
func SetLogHandler(h func(LogRecord), level LogLevel) error {
	const op = "SetLogHandler"
	if level < LogOff || level > LogDebug {
		return newError(op, CodeInvalid, fmt.Sprintf("log level %d is not LogOff (-1) to LogDebug (3)", level))
	}
	if !capi.OnLogHandler() {
		logMu.Lock()
		defer logMu.Unlock()
	}
	if h == nil {
		if err := call(op, func() int { return capi.SetLogHandler(false, int(level)) }); err != nil {
			return err
		}
		capi.SetLogSink(nil) // no call in progress, none to come
		logRouted.Store(false)
		return nil
	}
	capi.SetLogSink(func(r capi.LogRecord) {
		h(LogRecord{
			Level: LogLevel(r.Level), Message: r.Message, Component: r.Component, PeerID: r.PeerID,
			Time: time.Unix(0, r.TimeNs), Suppressed: r.Suppressed, Dropped: r.Dropped, ThreadID: r.ThreadID,
		})
	})
	if err := call(op, func() int { return capi.SetLogHandler(true, int(level)) }); err != nil {
		return err
	}
	logRouted.Store(true)
	return nil
}

// SetLogLevel sets the level of the library's messages, LogOff to LogDebug,
// keeping where they go (the handler of SetLogHandler, or stderr).
// Messages above it cost the library one compare. Errors: ErrInvalid.
func SetLogLevel(level LogLevel) error {
	const op = "SetLogLevel"
	if level < LogOff || level > LogDebug {
		return newError(op, CodeInvalid, fmt.Sprintf("log level %d is not LogOff (-1) to LogDebug (3)", level))
	}
	if !capi.OnLogHandler() {
		logMu.Lock()
		defer logMu.Unlock()
	}
	routed := logRouted.Load()
	return call(op, func() int { return capi.SetLogHandler(routed, int(level)) })
}

// GetLogLevel returns the library's level: as set by SetLogHandler or
// SetLogLevel, else by the environment variable KVX_LOG (default LogWarn).
func GetLogLevel() LogLevel { return LogLevel(capi.Kvx_get_log_level()) }

// LogFlush waits until every message logged before the call has been handed
// to the handler and that call returned (at once with stderr), for at most
// timeout (negative: no limit). Errors: ErrTimeout (some still wait),
// ErrBusy (called from the handler: it would wait for itself).
func LogFlush(timeout time.Duration) error {
	ms := -1
	if timeout >= 0 {
		ms = int(timeout.Milliseconds())
		if ms > 1<<30 {
			ms = 1 << 30
		}
	}
	return call("LogFlush", func() int { return capi.Kvx_log_flush(ms) })
}

// StdLogger returns a handler for SetLogHandler that prints each record on
// l (log.Default() when nil) as "kvxfer warn: message", followed by the
// component and the peer id: `kvxfer warn: peer 'p1': refused: ...
// [core peer="p1"]`. The line carries l's own time stamp, not the record's.
func StdLogger(l *log.Logger) func(LogRecord) {
	if l == nil {
		l = log.Default()
	}
	return func(r LogRecord) {
		tag := r.Component
		if r.PeerID != "" {
			tag += fmt.Sprintf(" peer=%q", r.PeerID)
		}
		l.Printf("kvxfer %s [%s]", r.String(), tag)
	}
}
