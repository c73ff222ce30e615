/* The bench's report: the library's own view of a run and the output lines. */
#include <stdio.h>
#include <stdlib.h>

#include "report.h"

#define MAX_CALL_SAMPLES (1u << 20) /* reservoir: 8 MiB of call samples at most */

const char *pattern_name(enum bench_pattern p) { return p == PATTERN_SEQ ? "seq" : "random"; }

bool lib_snapshot(kvx_transport *t, const char *peer_id, kvx_stats *s)
{
    kvx_stats init = KVX_STATS_INIT;
    *s = init;
    int rc = kvx_get_stats(s, t, peer_id);
    if (rc == KVX_ENOTSUP)
        return false;
    if (rc)
        die_kvx("kvx_get_stats", rc);
    return true;
}

/* The per_mille-th latency of a histogram of n samples, in us: the midpoint
 * of its bucket, as the library computes its own percentiles. */
static double hist_pct_us(const uint64_t *b, uint64_t n, unsigned per_mille)
{
    uint64_t rank = (n * per_mille + 999) / 1000, seen = 0;
    if (n == 0)
        return 0;
    if (rank == 0)
        rank = 1;
    for (size_t i = 0; i < KVX_STATS_LATENCY_BUCKETS; i++) {
        seen += b[i];
        if (seen < rank)
            continue;
        uint64_t lo = kvx_stats_bucket_lower_ns(i);
        if (i + 1 == KVX_STATS_LATENCY_BUCKETS)
            return (double)lo / 1e3;
        return (double)(lo + (kvx_stats_bucket_lower_ns(i + 1) - lo) / 2) / 1e3;
    }
    return 0;
}

/* Per transfer the library's latency lies between the bench's sample and
 * the sample's floor, so its percentiles lie between theirs; the library
 * reports a bucket's midpoint, which is off by less than a bucket (12.5 %). */
static bool latency_agrees(double lib, double bench, double floor)
{
    return lib <= bench * 1.125 + 1 && lib >= floor / 1.125 - 1;
}

void lib_view(const kvx_stats *a, const kvx_stats *b, const struct result *res, struct libview *v)
{
    uint64_t diff[KVX_STATS_LATENCY_BUCKETS], n = 0;
    for (size_t i = 0; i < KVX_STATS_LATENCY_BUCKETS; i++)
        n += diff[i] = b->latency_buckets[i] - a->latency_buckets[i];
    v->transfers = b->transfers_done - a->transfers_done;
    v->bytes = b->bytes_done - a->bytes_done;
    v->failed = (b->transfers_failed - a->transfers_failed) + (b->transfers_cancelled - a->transfers_cancelled);
    v->p50 = hist_pct_us(diff, n, 500);
    v->p99 = hist_pct_us(diff, n, 990);
    bool same = v->transfers == res->transfers && v->bytes == res->bytes && n == res->transfers;
    v->agrees = same && latency_agrees(v->p50, res->p50, res->floor_p50) &&
                        latency_agrees(v->p99, res->p99, res->floor_p99)
                    ? "yes"
                    : "no";
}

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

double pct_us(const uint64_t *s, size_t n, unsigned permille)
{
    if (!n)
        return 0;
    size_t rank = (n * permille + 999) / 1000; /* ceil(n * q) without libm */
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return (double)s[rank - 1] / 1e3;
}

void call_sample(struct call_samples *c, uint64_t ns, uint64_t cpu, uint64_t *rng)
{
    c->seen++;
    size_t at = c->n;
    if (c->n == MAX_CALL_SAMPLES) {
        uint64_t j = rng_below(rng, c->seen); /* reservoir sampling, as the latencies */
        if (j >= MAX_CALL_SAMPLES)
            return;
        at = (size_t)j;
    } else if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        uint64_t *p = realloc(c->ns, cap * sizeof *p), *q = p ? realloc(c->cpu, cap * sizeof *q) : NULL;
        if (!p || !q)
            die("out of memory for call samples");
        c->ns = p;
        c->cpu = q;
        c->cap = cap;
    }
    c->ns[at] = ns;
    c->cpu[at] = cpu;
    if (at == c->n)
        c->n++;
}

void call_summary(struct call_samples *c, struct call_times *out)
{
    qsort(c->ns, c->n, sizeof *c->ns, cmp_u64);
    qsort(c->cpu, c->n, sizeof *c->cpu, cmp_u64);
    out->calls = c->seen;
    out->p50 = pct_us(c->ns, c->n, 500);
    out->p99 = pct_us(c->ns, c->n, 990);
    out->max = c->n ? (double)c->ns[c->n - 1] / 1e3 : 0;
    out->cpu_p50 = pct_us(c->cpu, c->n, 500);
    out->cpu_p99 = pct_us(c->cpu, c->n, 990);
}

/* ------------------------------------------------------------ output */

void print_header(void)
{
    printf("%8s  %-7s %5s  %-7s %8s %9s %10s %9s %9s  %-8s | %9s %9s %9s  %s\n", "block", "backend",
           "batch", "pattern", "blocks", "GB/s", "xfers/s", "p50_us", "p99_us", "verified", "lib_GB/s",
           "lib_p50", "lib_p99", "agree");
}

void print_row(const struct bench_opts *o, const struct result *r)
{
    char sz[32];
    fmt_size(sz, sizeof sz, r->block_size);
    double lib_gbps = r->seconds > 0 ? (double)r->lib.bytes / r->seconds / 1e9 : 0;
    printf("%8s  %-7s %5llu  %-7s %8llu %9.3f %10.0f %9.1f %9.1f  %-8s | %9.3f %9.1f %9.1f  %s\n", sz,
           r->backend, (unsigned long long)r->batch, pattern_name(o->pattern), (unsigned long long)r->blocks,
           r->gbps, r->xps, r->p50, r->p99, r->verified, lib_gbps, r->lib.p50, r->lib.p99, r->lib.agrees);
    printf("%8s  submit: p50 %.1f us, p99 %.1f us, max %.1f us inside kvx_write_blocks (%llu calls; CPU time "
           "p50 %.1f us, p99 %.1f us; checking the lists alone %.1f us)\n",
           "", r->submit.p50, r->submit.p99, r->submit.max, (unsigned long long)r->submit.calls, r->submit.cpu_p50,
           r->submit.cpu_p99, r->submit.validate);
    if (o->cold) {
        fmt_size(sz, sizeof sz, o->cold);
        printf("%8s  cold: the first %s after connecting at %.3f GB/s, %.2f x the steady rate\n", "",
               sz, r->cold_gbps, r->gbps > 0 ? r->cold_gbps / r->gbps : 0.0);
    }
    fflush(stdout);
}

void print_json(const struct bench_opts *o, const struct result *r)
{
    /* Every string printed here is from a fixed set or the library's backend
     * name; escape anyway so the line stays valid JSON whatever it holds. */
    char be[64];
    size_t j = 0;
    for (const char *s = r->backend; *s && j + 7 < sizeof be; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            be[j++] = '\\', be[j++] = (char)c;
        else if (c < 0x20)
            j += (size_t)snprintf(be + j, sizeof be - j, "\\u%04x", c);
        else
            be[j++] = (char)c;
    }
    be[j] = '\0';
    printf("{\"backend\":\"%s\",\"path\":\"%s\",\"block_size\":%llu,\"batch\":%llu,\"pattern\":\"%s\","
           "\"bytes\":%llu,\"seconds\":%.6f,\"gb_per_s\":%.4f,\"xfers_per_s\":%.1f,"
           "\"p50_us\":%.2f,\"p99_us\":%.2f,\"verified\":\"%s\","
           "\"blocks\":%llu,\"inflight\":%llu,\"transfers\":%llu,\"failed\":%llu,"
           "\"p999_us\":%.2f,\"max_us\":%.2f,\"lib_transfers\":%llu,\"lib_bytes\":%llu,"
           "\"lib_failed\":%llu,\"lib_p50_us\":%.2f,\"lib_p99_us\":%.2f,\"lib_agrees\":\"%s\","
           "\"cold_bytes\":%llu,\"cold_gb_per_s\":%.4f,\"submit_p50_us\":%.2f,\"submit_p99_us\":%.2f,"
           "\"submit_max_us\":%.2f,\"submit_cpu_p50_us\":%.2f,\"submit_cpu_p99_us\":%.2f,"
           "\"submit_validate_us\":%.2f}\n",
           be, r->path ? r->path : "", (unsigned long long)r->block_size, (unsigned long long)r->batch,
           pattern_name(o->pattern), (unsigned long long)r->bytes, r->seconds, r->gbps, r->xps,
           r->p50, r->p99, r->verified, (unsigned long long)r->blocks,
           (unsigned long long)r->inflight, (unsigned long long)r->transfers,
           (unsigned long long)r->failed, r->p999, r->max_us, (unsigned long long)r->lib.transfers,
           (unsigned long long)r->lib.bytes, (unsigned long long)r->lib.failed, r->lib.p50, r->lib.p99,
           r->lib.agrees, (unsigned long long)o->cold, r->cold_gbps, r->submit.p50, r->submit.p99, r->submit.max,
           r->submit.cpu_p50, r->submit.cpu_p99, r->submit.validate);
    fflush(stdout);
}
