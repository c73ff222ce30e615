package capi

// The log handler: a cgo export, which the library calls on its log thread
// through kvx_go_log_trampoline (loghandler.go). A file with an //export
// may only declare in its preamble.

/*
#include <kvxfer.h>
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// LogRecord is a copy of one kvx_log_record (the library's strings are
// valid only during the call).
type LogRecord struct {
	Level              int
	Message, Component string
	PeerID             string // "" when the record is not about one peer (NULL)
	TimeNs             int64
	Suppressed         uint64
	Dropped            uint64
	ThreadID           int
}

// logSink holds the func(LogRecord) records go to; nil drops them (only
// while SetLogHandler switches to stderr).
var logSink atomic.Value

type sinkBox struct{ f func(LogRecord) }

// SetLogSink sets the function kvxGoLog hands each record to (nil: none).
func SetLogSink(f func(LogRecord)) { logSink.Store(sinkBox{f}) }

//export kvxGoLog
func kvxGoLog(r *C.kvx_log_record, user unsafe.Pointer) {
	box, _ := logSink.Load().(sinkBox)
	if box.f == nil {
		return
	}
	rec := LogRecord{
		Level:     int(r.level),
		Message:   goStringOrEmpty(r.message),
		Component: goStringOrEmpty(r.component),
		PeerID:    goStringOrEmpty(r.peer_id),
		TimeNs:    int64(r.time_ns),
	}
	// fields a library may lack: only those below its size
	if uintptr(r.size) >= unsafe.Offsetof(r.thread_id)+unsafe.Sizeof(r.thread_id) {
		rec.Suppressed = uint64(r.suppressed)
		rec.Dropped = uint64(r.dropped)
		rec.ThreadID = int(r.thread_id)
	}
	box.f(rec)
}

func goStringOrEmpty(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}
