/*
 * What one block size's run produced, and how it is shown: the bench's own
 * measurement beside the library's view of it (kvx_get_stats()), as a table
 * row or a JSON line.
 */
#ifndef KVXFER_BENCH_REPORT_H
#define KVXFER_BENCH_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "bench.h"

/* The library's own view of the measured phase: the difference of two
 * kvx_get_stats() readings of the target peer, taken when nothing is
 * outstanding (both phases drain), so its counts must equal the bench's.
 * Its latencies run from inside kvx_write_blocks until the library learnt
 * the bytes landed; the bench's from before the call until kvx_poll reported
 * the id: shorter by at most the call and the wait to be polled. */
struct libview {
    const char *agrees;                  /* "yes", "no", "n/a" (no telemetry) */
    uint64_t transfers, bytes, failed;
    double p50, p99;                     /* us */
};

/* The time each measured call spent inside kvx_write_blocks (a bounded
 * reservoir of samples, in ns), and its summary in us. The CPU time tells
 * the call's own work from time the thread waited for a core (a machine
 * with more runnable threads than cores). */
struct call_samples {
    uint64_t *ns, *cpu;    /* wall-clock time, and the thread's CPU time */
    size_t n, cap;
    uint64_t seen;
};
struct call_times {
    uint64_t calls;
    double p50, p99, max, cpu_p50, cpu_p99;
    double validate;       /* p50 of calls refused after checking their lists */
};
void call_sample(struct call_samples *c, uint64_t ns, uint64_t cpu, uint64_t *rng);
/* Sorts the samples. */
void call_summary(struct call_samples *c, struct call_times *out);
/* Sorting, and the nearest-rank percentile (permille: 500 = p50) of sorted
 * samples in ns, in us. */
int cmp_u64(const void *a, const void *b);
double pct_us(const uint64_t *s, size_t n, unsigned permille);

struct result {
    const char *backend;                  /* the path the library picked for the target */
    const char *path;                     /* and how (shm: mapped / process_vm_writev), or "" */
    uint64_t block_size, batch, blocks, inflight, bytes, transfers, failed;
    double seconds, gbps, xps, p50, p99, p999, max_us;
    double floor_p50, floor_p99;          /* us: what the library's may be at least */
    double cold_gbps;                     /* --cold: the first bytes after connecting */
    struct call_times submit;             /* inside kvx_write_blocks */
    const char *verified;
    struct libview lib;
    char problem[600];
};

/* kvx_get_stats() of peer_id; false if the library has no telemetry. */
bool lib_snapshot(kvx_transport *t, const char *peer_id, kvx_stats *s);
/* The library's view of a phase from two snapshots, checked against res. */
void lib_view(const kvx_stats *a, const kvx_stats *b, const struct result *res, struct libview *v);

const char *pattern_name(enum bench_pattern p);
void print_header(void);
void print_row(const struct bench_opts *o, const struct result *r);
void print_json(const struct bench_opts *o, const struct result *r);

#endif
