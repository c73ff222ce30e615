/* Small helpers: errors, time, size parsing, data pattern, memory. */
#define _GNU_SOURCE
#include <endian.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench.h"

const char *g_prog = "kvxfer-bench";
void (*g_die_hook)(void);

static void vmsg(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

static void vmsg(const char *fmt, va_list ap)
{
    /* One fprintf per message so lines of target and initiator don't interleave. */
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    fprintf(stderr, "%s: %s\n", g_prog, buf);
}

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    if (g_die_hook)
        g_die_hook();
    exit(1);
}

void warnx_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
}

void fmt_kvx_error(char *buf, size_t cap, const char *what, int rc)
{
    const char *msg = kvx_last_error_message();
    snprintf(buf, cap, "%s failed: %s (%d)%s%s", what, kvx_strerror(rc), rc,
             msg && *msg ? ": " : "", msg ? msg : "");
}

void die_kvx(const char *what, int rc)
{
    char buf[1024];
    fmt_kvx_error(buf, sizeof buf, what, rc);
    die("%s", buf);
}

uint64_t mix64(uint64_t x)
{
    /* splitmix64 finalizer: cheap and every input bit affects every output bit. */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mix64(*state);
}

uint64_t rng_below(uint64_t *state, uint64_t n)
{
    /* Modulo bias is < n / 2^64: irrelevant for picking block indexes. */
    return rng_next(state) % n;
}

#define WORD_STEP 0xd6e8feb86659fd93ull

static inline uint64_t block_base(uint64_t seed, uint64_t tag) { return mix64(seed ^ mix64(tag)); }

void pattern_fill(void *dst, uint64_t len, uint64_t seed, uint64_t tag)
{
    uint8_t *p = dst;
    uint64_t base = block_base(seed, tag);
    uint64_t nw = len / 8, i;
    for (i = 0; i < nw; i++) {
        uint64_t v = htole64(base ^ (i * WORD_STEP)); /* explicit LE: hosts may differ */
        memcpy(p + 8 * i, &v, 8);
    }
    if (len % 8) {
        uint64_t v = htole64(base ^ (i * WORD_STEP));
        memcpy(p + 8 * i, &v, len % 8);
    }
}

bool pattern_check(const void *src, uint64_t len, uint64_t seed, uint64_t tag, uint64_t *bad_off)
{
    const uint8_t *p = src;
    uint64_t base = block_base(seed, tag);
    uint64_t nw = len / 8, i;
    for (i = 0; i < nw; i++) {
        uint64_t v = htole64(base ^ (i * WORD_STEP)), got;
        memcpy(&got, p + 8 * i, 8);
        if (got != v) {
            uint64_t off = 8 * i;
            while (p[off] == ((const uint8_t *)&v)[off - 8 * i])
                off++;
            *bad_off = off;
            return false;
        }
    }
    if (len % 8) {
        uint64_t v = htole64(base ^ (i * WORD_STEP));
        for (uint64_t k = 0; k < len % 8; k++)
            if (p[8 * i + k] != ((const uint8_t *)&v)[k]) {
                *bad_off = 8 * i + k;
                return false;
            }
    }
    return true;
}

uint64_t poison_seed(uint64_t seed) { return mix64(seed ^ 0x706f69736f6e2121ull); /* "poison!!" */ }

void *region_alloc(uint64_t bytes, bool thp)
{
    if (bytes == 0 || bytes > SIZE_MAX)
        return NULL;
    return map_private((size_t)bytes, thp);
}

void region_free(void *p, uint64_t bytes)
{
    if (p)
        munmap(p, (size_t)bytes);
}

int make_kvx_options(const struct bench_opts *o, const char *backend, kvx_options **out,
                     char *err, size_t err_cap)
{
    kvx_options *opts = NULL;
    int rc = kvx_options_create(&opts);
    if (rc) {
        fmt_kvx_error(err, err_cap, "kvx_options_create", rc);
        return -1;
    }
    for (size_t i = 0; i < o->n_options; i++) {
        if ((rc = kvx_options_parse(opts, o->options[i])) != 0) {
            /* Format first: the next kvx call may reset the thread's message. */
            char what[300];
            snprintf(what, sizeof what, "--option '%.200s': kvx_options_parse", o->options[i]);
            fmt_kvx_error(err, err_cap, what, rc);
            kvx_options_destroy(opts);
            return -1;
        }
    }
    /* After the --option lists: the backend is always --backend's. */
    if (backend && (rc = kvx_options_set(opts, "backend", backend)) != 0) {
        fmt_kvx_error(err, err_cap, "kvx_options_set(backend)", rc);
        kvx_options_destroy(opts);
        return -1;
    }
    *out = opts;
    return 0;
}

int plan_size(const struct bench_opts *o, uint64_t bs, uint64_t *batch, uint64_t *nblocks, char *err,
              size_t err_cap)
{
    char sz[32];
    fmt_size(sz, sizeof sz, bs);
    uint64_t b = bs >= BENCH_DEFAULT_CALL_BYTES ? 1 : BENCH_DEFAULT_CALL_BYTES / bs;
    if (b > BENCH_MAX_DEFAULT_BATCH)
        b = BENCH_MAX_DEFAULT_BATCH;
    if (o->batch)
        b = o->batch;
    uint64_t n = BENCH_DEFAULT_REGION / bs;
    if (n > BENCH_MAX_DEFAULT_BLOCKS)
        n = BENCH_MAX_DEFAULT_BLOCKS;
    if (o->blocks)
        n = o->blocks;
    if (!o->blocks && n < 2 * b)
        n = 2 * b;
    if (n < b) {
        snprintf(err, err_cap,
                 "%s blocks: --blocks %llu is smaller than the batch of %llu (the remote "
                 "indexes of one call must differ)",
                 sz, (unsigned long long)n, (unsigned long long)b);
        return -1;
    }
    if (bs > UINT64_MAX / n || bs * n > SIZE_MAX / 2) {
        snprintf(err, err_cap, "%s blocks: %llu blocks do not fit in memory", sz, (unsigned long long)n);
        return -1;
    }
    *batch = b;
    *nblocks = n;
    return 0;
}
