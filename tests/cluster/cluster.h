/* kvx_cluster: what the driver and its host processes share. The driver maps
 * one MAP_SHARED anonymous "scoreboard" before it forks the hosts (shared
 * memory crosses network namespaces), and everything the processes tell each
 * other goes through it: each host's metadata, the phase of the run, per
 * (writer, target, slot) the sequence number last written and last checked,
 * and the counters the driver reports and asserts on. Every field is written
 * by one process (and one thread) only; the others read it. */
#ifndef KVX_CLUSTER_H
#define KVX_CLUSTER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CL_MAX_HOSTS 64
#define CL_SLOTS 32                  /* slots per writer in each target's region */
#define CL_BL (64u << 10)            /* block length */
#define CL_MIN_BATCH 4               /* blocks per kvx_write_blocks call */
#define CL_MAX_BATCH 16
#define CL_INFLIGHT 8                /* transfers in flight per host, at most */
#define CL_TIMEOUT_MS 2000           /* transfer_timeout_ms */
#define CL_CONNECT_MS 3000           /* connect_timeout_ms: bounds re-adds to a cut or dead host */
#define CL_RETRY_MS 250              /* pause before a failed re-add is tried again */
#define CL_META_MAX 4096
#define CL_LAT_BUCKETS 304           /* kvx_stats' buckets: 8 per power of two of ns */
#define CL_CODES 8                   /* distinct error codes tallied per host */
#define CL_MSG 384
#define CL_GUARD 4096                /* canary bytes on both sides of a region */
#define CL_LOG_SHUTDOWN "kvx_cluster: shutdown" /* in a host's log: the run is over */

#define CL_LD(x) atomic_load_explicit(&(x), memory_order_acquire)
#define CL_ST(x, v) atomic_store_explicit(&(x), (v), memory_order_release)
#define CL_ADD(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

typedef enum cl_scenario { SC_NOFAULT, SC_KILL, SC_PART_SHORT, SC_PART_LONG, SC_SIGSTOP, SC_COUNT } cl_scenario;

/* The run's phases, set by the driver; hosts follow. */
enum { PH_SETUP, PH_ADD, PH_RUN, PH_STOP, PH_FINAL };

typedef struct cl_slot {
    _Atomic uint64_t written; /* writer: seq of the last write reported done (0: none) */
    _Atomic uint64_t checked; /* target: seq it verified the slot holds */
    _Atomic uint32_t dirty;   /* writer: the last write failed, the bytes are undefined */
} cl_slot;

typedef struct cl_pair { /* writer w -> target t */
    _Atomic uint64_t done_xfers, done_blocks, failed_xfers, failed_blocks; /* writer */
    _Atomic uint64_t first_fail_ms, last_fail_ms;                         /* writer, since the run began */
    _Atomic uint64_t readds_started, readds_done, submit_errors;          /* writer */
    _Atomic uint64_t verified, verified_after_heal, wrong;                /* target */
    _Atomic int removed;      /* writer removed the dead target (kill) */
    _Atomic int probe_done;   /* writer tried kvx_add_remote_peer with the dead target's old metadata */
    _Atomic int probe_rc;
    char probe_msg[200];
} cl_pair;

typedef struct cl_code {
    int code;
    uint64_t n;
} cl_code;

typedef struct cl_host {
    _Atomic int ready, added, drained, finished; /* the host's progress */
    _Atomic int dead;                            /* driver: killed (the survivors remove it) */
    _Atomic int gone;                            /* driver: killed, or exited before it finished */
    pid_t pid;
    uint64_t meta_len, base, nb, bl;
    uint8_t meta[CL_META_MAX];
    _Atomic uint64_t seq;                        /* last block seq issued */
    _Atomic uint64_t heal_seq;                   /* driver: seq at the heal (UINT64_MAX before) */
    _Atomic uint64_t bytes_done, xfers_done, xfers_failed, blocks_failed;
    _Atomic uint64_t submit_errors, reg_failures, readds_started, readds_done;
    _Atomic uint64_t unknown_ids, dup_ids, missing_ids, api_errors;
    _Atomic uint64_t checked, wrong, reverify_bad, guard_bad;
    _Atomic uint64_t peers_final;                /* kvx_get_stats().peers at the end */
    _Atomic uint64_t lat[CL_LAT_BUCKETS];        /* submit -> done seen by kvx_poll, ns */
    cl_code submit_codes[CL_CODES];              /* kvx_write_blocks failures by code */
    cl_code reg_codes[CL_CODES];                 /* re-add failures by code */
    char msg[CL_MSG];                            /* first error of the host */
    char wrong_msg[CL_MSG];                      /* first wrong block it found */
} cl_host;

typedef struct cl_board {
    int n, scenario, nvictims, victims[2];
    _Atomic int phase;
    _Atomic uint64_t t_run_ms, t_stop_ms;        /* CLOCK_MONOTONIC ms */
    size_t size;                                 /* of the mapping */
    cl_host *hosts;                              /* [n] */
    cl_pair *pairs;                              /* [n * n] */
    cl_slot *slots;                              /* [n * n * CL_SLOTS] */
} cl_board;

/* scoreboard.c */
cl_board *cl_board_new(int n, int scenario);
void cl_board_free(cl_board *b);
static inline cl_pair *cl_pair_at(cl_board *b, int w, int t) { return &b->pairs[w * b->n + t]; }
static inline cl_slot *cl_slot_at(cl_board *b, int w, int t, int s) {
    return &b->slots[((size_t)w * (size_t)b->n + (size_t)t) * CL_SLOTS + (size_t)s];
}
int cl_is_victim(const cl_board *b, int i);
/* Adds one to the count of code in a host's table (single writer). */
void cl_code_count(cl_code *tab, int code);
/* Keeps the first message only. */
void cl_note(char *dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

uint64_t cl_now_ms(void);
uint64_t cl_now_ns(void);

/* Block content: a header naming (writer, target, slot, seq), then words
 * derived from all four. */
void cl_fill(uint8_t *p, int w, int t, int s, uint64_t seq);
/* 1 when p holds exactly cl_fill(w, t, s, seq); otherwise 0 and, in why,
 * what it holds instead (another write, a torn one, the poison, garbage). */
int cl_check(const uint8_t *p, int w, int t, int s, uint64_t seq, char *why, size_t cap);

/* Latency histogram (kvx_stats' layout). */
int cl_lat_bucket(uint64_t ns);
/* Percentile q (0..1) of a histogram, bucket midpoint in ns; 0 when empty. */
uint64_t cl_lat_pct(const uint64_t *hist, double q);

/* host.c: runs host i of the board (already in its namespace); never returns. */
void cl_host_main(cl_board *b, int i, int net) __attribute__((noreturn));

#endif
