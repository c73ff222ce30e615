/*
 * kvxfer-bench: shared declarations. The program uses only the public API of
 * kvxfer.h; everything here is the bench's own (options, control protocol,
 * data pattern, statistics).
 */
#ifndef KVXFER_BENCH_H
#define KVXFER_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvxfer.h"
#include "units.h"

#define BENCH_MAX_SIZES 32
#define BENCH_MAX_OPTIONS 64

/* Default region per side: ~256 MiB, so a run touches more than the caches. */
#define BENCH_DEFAULT_REGION (256ull << 20)
/* Default batch makes one write_blocks call carry at least this many bytes. */
#define BENCH_DEFAULT_CALL_BYTES (64ull << 10)
/* ...within limits, so tiny blocks don't make huge calls and index arrays. */
#define BENCH_MAX_DEFAULT_BATCH 256ull
#define BENCH_MAX_DEFAULT_BLOCKS (1ull << 20)

enum bench_pattern { PATTERN_SEQ = 0, PATTERN_RANDOM = 1 };

struct bench_opts {
    const char *backend;          /* "auto" unless --backend */
    bool backend_given;
    uint64_t block_sizes[BENCH_MAX_SIZES];
    size_t n_sizes;
    uint64_t blocks;              /* 0: default per size */
    uint64_t batch;               /* 0: default per size */
    uint64_t inflight;
    enum bench_pattern pattern;
    double duration;              /* seconds per size, used when total == 0 */
    uint64_t total;               /* bytes per size, 0: use duration */
    double warmup;                /* seconds, not measured */
    uint64_t cold;                /* bytes measured right after connecting, 0: none */
    bool verify;
    bool json;
    bool progress;                /* only honoured when stderr is a tty */
    const char *options[BENCH_MAX_OPTIONS]; /* "KEY=VALUE ..." lists from argv */
    size_t n_options;
    const char *config;           /* NULL: none */
    bool config_given;
    uint64_t seed;
    bool seed_given;
    enum { REGION_PRIVATE, REGION_SHARED, REGION_THP } target_region; /* --target-region: private (anonymous),
                                                                          shared (kvx_region_alloc()), thp (anonymous,
                                                                          MADV_HUGEPAGE) */
    bool idle_wait;               /* --idle wait: sleep in kvx_wait() when nothing can be submitted */
    /* roles */
    const char *serve;            /* --serve [HOST:]PORT */
    const char *connect;          /* --connect HOST:PORT */
    bool once;                    /* --once: serve one session then exit */
    int port_fd;                  /* hidden --port-fd: report port there */
};

/* ---- util.c (time and sizes: units.h) */
extern const char *g_prog;        /* "kvxfer-bench" or "kvxfer-bench target" */

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void warnx_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Report a failed kvx_* call (code, strerror, last error message) and exit 1. */
void die_kvx(const char *what, int rc) __attribute__((noreturn));
/* Format a failed kvx_* call into buf (for sending to the peer). */
void fmt_kvx_error(char *buf, size_t cap, const char *what, int rc);
/* Registered cleanup run by die() (kills the local target). */
extern void (*g_die_hook)(void);


uint64_t mix64(uint64_t x);
uint64_t rng_next(uint64_t *state);
uint64_t rng_below(uint64_t *state, uint64_t n);

/*
 * Data pattern: every 8-byte word of a block is a function of (seed, tag,
 * word index), so a block that landed in the wrong place, at the wrong
 * offset, or from the wrong local block does not match.
 * Written blocks use tag = local block index; untouched target blocks use
 * poison_tag(remote index) so "never written" is recognisable.
 */
void pattern_fill(void *dst, uint64_t len, uint64_t seed, uint64_t tag);
/* true if equal; else *bad_off = first differing byte offset. */
bool pattern_check(const void *src, uint64_t len, uint64_t seed, uint64_t tag, uint64_t *bad_off);
uint64_t poison_seed(uint64_t seed);

/* Region memory: page-aligned, zero-filled, from mmap. NULL on failure. */
void *region_alloc(uint64_t bytes, bool thp);
void region_free(void *p, uint64_t bytes);

/* kvx_options from every --option list (kvx_options_parse) and backend
 * (NULL: library default), set last. 0, or -1 with the reason in err. */
int make_kvx_options(const struct bench_opts *o, const char *backend, kvx_options **out,
                     char *err, size_t err_cap);

/* Batch and region blocks for block size bs (defaults applied). 0, or -1
 * with the reason in err. */
int plan_size(const struct bench_opts *o, uint64_t bs, uint64_t *batch, uint64_t *nblocks, char *err,
              size_t err_cap);

/* ---- target.c / initiator.c */
int run_target(const struct bench_opts *o);
int run_initiator(const struct bench_opts *o, int ctl_fd, const char *target_desc);

#endif
