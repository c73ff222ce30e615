package capi

// kvx_set_log_handler with the cgo export kvxGoLog (logcb.go) as handler.

/*
#include <stddef.h>
#include <kvxfer.h>

extern void kvxGoLog(kvx_log_record *r, void *user);

// Set on the log thread while it calls into Go: a handler that calls
// SetLogHandler must not wait for a lock another goroutine holds while it
// waits in C for this very call to return.
static __thread int kvx_go_in_log_handler;

static void kvx_go_log_trampoline(const kvx_log_record *r, void *user) {
    kvx_go_in_log_handler = 1;
    kvxGoLog((kvx_log_record *)r, user);
    kvx_go_in_log_handler = 0;
}

static int kvx_go_set_log_handler(int on, int level) {
    return kvx_set_log_handler(on ? kvx_go_log_trampoline : NULL, NULL, level);
}

static int kvx_go_on_log_handler(void) { return kvx_go_in_log_handler; }
*/
import "C"

// SetLogHandler routes the library's records to the function of SetLogSink
// (on) or to its stderr lines (!on), from level on (kvx_set_log_handler).
// It waits for a handler call in progress (unless called from it).
func SetLogHandler(on bool, level int) int {
	o := C.int(0)
	if on {
		o = 1
	}
	return int(C.kvx_go_set_log_handler(o, C.int(level)))
}

// OnLogHandler reports whether the caller runs inside a handler call (on
// the library's log thread: a cgo callback keeps its goroutine there).
func OnLogHandler() bool { return C.kvx_go_on_log_handler() != 0 }
