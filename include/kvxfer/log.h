/*
 * kvxfer - logging: levels, records, the log handler.
 *
 * A part of <kvxfer.h>, which includes it where this section stands in the
 * API: include <kvxfer.h>, never this file alone (the conventions, the types
 * and KVX_API it uses are there).
 */
#ifndef KVXFER_LOG_H
#define KVXFER_LOG_H

#ifndef KVXFER_H
#error "include <kvxfer.h>, not <kvxfer/log.h>"
#endif

/* ---------------------------------------------------------------- logging */

/** Levels of kvx_set_log_handler() and kvx_log_record (since 0.10). */
typedef enum kvx_log_level {
    KVX_LOG_OFF = -1,  /**< nothing (a level to set, never a record's)       */
    KVX_LOG_ERROR = 0, /**< the library failed at something nobody asked for  */
    KVX_LOG_WARN = 1,  /**< a peer broke, a path fell back, a peer was refused */
    KVX_LOG_INFO = 2,  /**< choices made: paths, addresses, codes             */
    KVX_LOG_DEBUG = 3  /**< per-transfer detail                               */
} kvx_log_level;

/**
 * One message for a log handler (since 0.10). The library owns it and every
 * string in it, valid only during the handler call: copy what you keep.
 * Fields may be added at the end: read only those below size.
 */
typedef struct kvx_log_record {
    uint32_t size;         /**< sizeof(kvx_log_record) as the library knows it */
    int32_t level;         /**< a kvx_log_level, ERROR..DEBUG                 */
    const char *message;   /**< one line: control bytes show as '?'; not NULL */
    /** The part of the library that logged it: "core", "handshake", "shm",
     *  "tcp" or "verbs"; static storage. */
    const char *component;
    /** The peer it is about, or NULL when it is not about one peer (the
     *  messages of the core about a peer carry it; a backend's name it in
     *  the message). */
    const char *peer_id;
    int64_t time_ns;       /**< when it was logged: CLOCK_REALTIME, ns        */
    /** Messages of the same call site the rate limit dropped since one last
     *  passed (see kvx_set_log_handler()). */
    uint64_t suppressed;
    /** Messages of any site dropped since the previous record because the
     *  handler fell behind (more than 4,096 waiting). */
    uint64_t dropped;
    int32_t thread_id;     /**< the kernel tid of the thread that logged it   */
    int32_t reserved;      /**< 0                                             */
} kvx_log_record;

/** A log handler: called with one record and the user pointer given. */
typedef void (*kvx_log_fn)(const kvx_log_record *record, void *user);

/**
 * Where the library's messages go, and from which level on (since 0.10).
 * Process-wide: every transport logs through it.
 *
 * By default warnings and errors go to stderr, one line each
 * ("kvxfer[PID] warn: ..."); the environment variable KVX_LOG sets the
 * starting level (off, error, warn, info or debug; another value means warn,
 * with a warning). Every call site is rate-limited: a burst of 20 messages,
 * then one a second; the next message that passes says how many it
 * suppressed (record->suppressed). Debug messages are never limited.
 *
 * @param fn     NULL: back to stderr. Otherwise the handler, called on one
 *               thread of the library's own, one record at a time, in the
 *               order they were logged, never with a library lock held: it
 *               may call any kvxfer function, also this one. A handler that
 *               blocks delays only the delivery; the library never waits for
 *               it, and drops (and counts, record->dropped) messages once
 *               4,096 wait. In a forked child the thread is started again on
 *               the first message.
 * @param user   passed to fn as it is.
 * @param level  the most verbose level delivered, KVX_LOG_OFF to
 *               KVX_LOG_DEBUG; replaces KVX_LOG's. Messages above it cost one
 *               load and a compare.
 * When it returns, a call of the previous handler that was in progress has
 * returned and no other will start, so its user data may be freed (unless
 * called from that handler itself). Messages still waiting for a replaced
 * handler go to the new one, or to stderr when fn is NULL.
 * Call it with fn NULL before unloading the code of the handler (a language
 * runtime's exit, dlclose).
 * @return 0; KVX_EINVAL (level out of range).
 * Thread safety: any thread. Do not call it while holding a lock your
 * handler takes: it waits for a handler call in progress.
 */
KVX_API int kvx_set_log_handler(kvx_log_fn fn, void *user, int level);

/**
 * @return the current log level (since 0.10): KVX_LOG_OFF..KVX_LOG_DEBUG, as
 *         set by kvx_set_log_handler() or else by KVX_LOG (default
 *         KVX_LOG_WARN). Never fails.
 * Thread safety: any thread.
 */
KVX_API int kvx_get_log_level(void);

/**
 * Wait until every message logged before this call has been handed to the
 * handler and that call returned (since 0.10); at once with stderr.
 * @param timeout_ms  most ms to wait; -1 for no limit.
 * @return 0; KVX_ETIMEDOUT (still waiting after timeout_ms); KVX_EBUSY
 *         (called from the handler: it would wait for itself); KVX_EINVAL
 *         (timeout_ms below -1).
 * Thread safety: any thread.
 */
KVX_API int kvx_log_flush(int timeout_ms);

#endif /* KVXFER_LOG_H */
