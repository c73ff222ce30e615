/* The scoreboard shared by the driver and the hosts, the block content every
 * writer derives from (writer, target, slot, seq), and the latency histogram. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cluster.h"

#define MAGIC 0x6b76786c75737472ULL /* "kvxlustr" */
#define STEP 0x9E3779B97F4A7C15ULL

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

cl_board *cl_board_new(int n, int scenario) {
    size_t head = round_up(sizeof(cl_board), 64);
    size_t hosts = round_up(sizeof(cl_host) * (size_t)n, 64);
    size_t pairs = round_up(sizeof(cl_pair) * (size_t)n * (size_t)n, 64);
    size_t slots = sizeof(cl_slot) * (size_t)n * (size_t)n * CL_SLOTS;
    size_t size = head + hosts + pairs + slots;
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    cl_board *b = (cl_board *)m; /* zeroed by mmap */
    b->n = n;
    b->scenario = scenario;
    b->size = size;
    b->hosts = (cl_host *)(m + head);
    b->pairs = (cl_pair *)(m + head + hosts);
    b->slots = (cl_slot *)(m + head + hosts + pairs);
    for (int i = 0; i < n; i++) atomic_init(&b->hosts[i].heal_seq, UINT64_MAX);
    return b;
}

void cl_board_free(cl_board *b) {
    if (b) munmap(b, b->size);
}

int cl_is_victim(const cl_board *b, int i) {
    for (int k = 0; k < b->nvictims; k++)
        if (b->victims[k] == i) return 1;
    return 0;
}

void cl_code_count(cl_code *tab, int code) {
    for (int k = 0; k < CL_CODES; k++) {
        if (tab[k].n == 0) tab[k].code = code;
        if (tab[k].code == code) {
            tab[k].n++;
            return;
        }
    }
    tab[CL_CODES - 1].n++; /* the last entry takes the overflow */
}

void cl_note(char *dst, const char *fmt, ...) {
    if (dst[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, CL_MSG, fmt, ap);
    va_end(ap);
}

uint64_t cl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cl_now_ms(void) { return cl_now_ns() / 1000000u; }

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t block_key(int w, int t, int s, uint64_t seq) {
    return mix(mix(((uint64_t)w << 40) ^ ((uint64_t)t << 20) ^ (uint64_t)s) ^ (seq * STEP));
}

#define HEAD_WORDS 4

void cl_fill(uint8_t *p, int w, int t, int s, uint64_t seq) {
    uint64_t *q = (uint64_t *)p, key = block_key(w, t, s, seq), acc = key;
    q[0] = MAGIC;
    q[1] = ((uint64_t)(uint32_t)w << 32) | (uint32_t)t;
    q[2] = (uint64_t)s;
    q[3] = seq;
    for (size_t i = HEAD_WORDS; i < CL_BL / 8; i++) {
        q[i] = acc;
        acc += STEP;
    }
}

/* Offset of the first word that differs from cl_fill(w, t, s, seq), or CL_BL. */
static size_t first_diff(const uint8_t *p, int w, int t, int s, uint64_t seq) {
    uint8_t want[CL_BL] __attribute__((aligned(8)));
    cl_fill(want, w, t, s, seq);
    for (size_t i = 0; i < CL_BL; i += 8)
        if (memcmp(p + i, want + i, 8) != 0) return i;
    return CL_BL;
}

int cl_check(const uint8_t *p, int w, int t, int s, uint64_t seq, char *why, size_t cap) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t key = block_key(w, t, s, seq), acc = key, bad = 0;
    bad |= q[0] ^ MAGIC;
    bad |= q[1] ^ (((uint64_t)(uint32_t)w << 32) | (uint32_t)t);
    bad |= q[2] ^ (uint64_t)s;
    bad |= q[3] ^ seq;
    for (size_t i = HEAD_WORDS; i < CL_BL / 8; i++) {
        bad |= q[i] ^ acc;
        acc += STEP;
    }
    if (!bad) return 1;
    size_t at = first_diff(p, w, t, s, seq);
    if (q[0] != MAGIC) {
        snprintf(why, cap, "no block header (first word %016llx), first wrong byte at %zu",
                 (unsigned long long)q[0], at);
        return 0;
    }
    /* A header: whose block is it, and is it whole? */
    int hw = (int)(q[1] >> 32), ht = (int)(uint32_t)q[1], hs = (int)q[2];
    uint64_t hseq = q[3];
    int whole = hw >= 0 && hw < CL_MAX_HOSTS && ht >= 0 && ht < CL_MAX_HOSTS && hs >= 0 && hs < CL_SLOTS &&
                first_diff(p, hw, ht, hs, hseq) == CL_BL;
    snprintf(why, cap, "holds %s block of writer %d target %d slot %d seq %llu (first wrong byte at %zu)",
             whole ? "the whole" : "a torn", hw, ht, hs, (unsigned long long)hseq, at);
    return 0;
}

int cl_lat_bucket(uint64_t ns) {
    if (ns < 8) return (int)ns;
    int e = 63 - __builtin_clzll(ns);
    int i = (e - 2) * 8 + (int)(ns >> (e - 3)) - 8;
    return i < CL_LAT_BUCKETS ? i : CL_LAT_BUCKETS - 1;
}

static uint64_t bucket_lo(int i) {
    if (i < 8) return (uint64_t)i;
    int e = i / 8 + 2, m = i % 8;
    return (uint64_t)(8 + m) << (e - 3);
}

uint64_t cl_lat_pct(const uint64_t *hist, double q) {
    uint64_t total = 0;
    for (int i = 0; i < CL_LAT_BUCKETS; i++) total += hist[i];
    if (total == 0) return 0;
    uint64_t want = (uint64_t)(q * (double)total + 0.999999), cum = 0;
    if (want == 0) want = 1;
    for (int i = 0; i < CL_LAT_BUCKETS; i++) {
        cum += hist[i];
        if (cum >= want) return i + 1 < CL_LAT_BUCKETS ? (bucket_lo(i) + bucket_lo(i + 1)) / 2 : bucket_lo(i);
    }
    return bucket_lo(CL_LAT_BUCKETS - 1);
}
