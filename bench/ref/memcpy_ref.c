/*
 * kvxfer-memcpy-ref: the reference line of bench/compare-shm.sh. One thread
 * copies blocks between two regions of the same working-set size with plain
 * memcpy, the way kvxfer-bench moves them: per block size, seq (batch 1,
 * consecutive blocks) or random (batch blocks at distinct random indexes per
 * call). Prints one JSON line per size: {"block_size":N,"pattern":"...",
 * "batch":N,"bytes":N,"seconds":S,"gb_per_s":G}.
 *
 * With "pvw", the destination is the private memory of a child process
 * and every call is one process_vm_writev carrying the call's blocks (one
 * iovec each, as kvxfer's shm backend sends them): the ceiling of kvxfer's
 * kernel path for private memory, on this kernel. With "thp", both regions
 * are 2 MiB aligned and advised MADV_HUGEPAGE (transparent huge pages; the
 * child's copy of dst inherits the advice). With "threads=N" (1..8), N
 * threads copy at once, each into its own 1/N of dst (from anywhere in src
 * when random): the reference of kvxfer's shm lines with shm.threads=N.
 *
 *   kvxfer-memcpy-ref BLOCK_SIZE[,...] WORKING_SET_BYTES seq|random BATCH SECONDS [pvw] [thp] [threads=N]
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../units.h"

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The pid whose copy of dst process_vm_writev writes, or 0: memcpy. */
static pid_t g_child;

/* One call's n blocks of bs bytes: memcpy each, or one process_vm_writev for all of them. */
static int copy_batch(const struct iovec *lv, const struct iovec *rv, uint64_t n, uint64_t bs) {
    if (g_child == 0) {
        for (uint64_t i = 0; i < n; i++) memcpy(rv[i].iov_base, lv[i].iov_base, bs);
        return 0;
    }
    ssize_t w = process_vm_writev(g_child, lv, n, rv, n, 0);
    if (w < 0 || (uint64_t)w != n * bs) {
        perror("kvxfer-memcpy-ref: process_vm_writev");
        return -1;
    }
    return 0;
}

/* One thread's share: blocks [first, first + count) of dst (seq: the same
 * of src; random: any of src). */
struct share {
    uint64_t bs, batch, first, count, nb, bytes;
    int random, failed;
    double secs;
    const uint8_t *src;
    uint8_t *dst;
    uint64_t seed;
};

static void *copy_share(void *arg) {
    struct share *w = arg;
    struct iovec lv[1024], rv[1024];
    uint64_t next = 0;
    double t0 = now_s(), t = t0;
    while (t - t0 < w->secs) {
        for (int k = 0; k < 64; k++) {
            for (uint64_t i = 0; i < w->batch; i++) {
                uint64_t l = w->random ? rng(&w->seed) % w->nb : w->first + next;
                uint64_t r = w->first + (w->random ? rng(&w->seed) % w->count : next);
                next = (next + 1) % w->count;
                lv[i] = (struct iovec){(void *)(w->src + l * w->bs), w->bs};
                rv[i] = (struct iovec){w->dst + r * w->bs, w->bs};
            }
            if (copy_batch(lv, rv, w->batch, w->bs) != 0) {
                w->failed = 1;
                return NULL;
            }
            w->bytes += w->batch * w->bs;
        }
        t = now_s();
    }
    return NULL;
}

static int run(uint64_t bs, uint64_t ws, int random, uint64_t batch, double secs, unsigned threads, uint8_t *src,
               uint8_t *dst) {
    const uint64_t nb = ws / bs;
    if (nb < threads) return -1;
    struct share w[8];
    pthread_t tid[8];
    const double t0 = now_s();
    for (unsigned i = 0; i < threads; i++) {
        w[i] = (struct share){.bs = bs, .batch = batch, .first = nb / threads * i, .count = nb / threads, .nb = nb,
                              .random = random, .secs = secs, .src = src, .dst = dst,
                              .seed = 0x9e3779b97f4a7c15ULL + 0x2545F4914F6CDD1DULL * i};
        if (threads > 1 && pthread_create(&tid[i], NULL, copy_share, &w[i]) != 0) return -1;
    }
    if (threads == 1) copy_share(&w[0]);
    uint64_t bytes = 0;
    int failed = 0;
    for (unsigned i = 0; i < threads; i++) {
        if (threads > 1) pthread_join(tid[i], NULL);
        bytes += w[i].bytes;
        failed |= w[i].failed;
    }
    if (failed) return -1;
    const double t = now_s();
    printf("{\"block_size\":%llu,\"pattern\":\"%s\",\"batch\":%llu,\"threads\":%u,\"bytes\":%llu,\"seconds\":%.6f,"
           "\"gb_per_s\":%.4f}\n",
           (unsigned long long)bs, random ? "random" : "seq", (unsigned long long)batch, threads,
           (unsigned long long)bytes, t - t0, (double)bytes / (t - t0) / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    int pvw = 0, thp = 0, bad = argc < 6;
    unsigned threads = 1;
    for (int i = 6; i < argc; i++) {
        uint64_t n;
        if (strcmp(argv[i], "pvw") == 0) pvw = 1;
        else if (strcmp(argv[i], "thp") == 0) thp = 1;
        else if (strncmp(argv[i], "threads=", 8) == 0 && parse_u64(argv[i] + 8, &n) == 0 && n >= 1 && n <= 8)
            threads = (unsigned)n;
        else bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: %s BLOCK_SIZE[,...] WORKING_SET_BYTES seq|random BATCH SECONDS [pvw] [thp] [threads=N]\n",
                argv[0]);
        return 2;
    }
    const uint64_t ws = size_or_exit("kvxfer-memcpy-ref", argv[2]);
    uint64_t batch;
    if (parse_u64(argv[4], &batch) != 0) batch = 0;
    const int random = strcmp(argv[3], "random") == 0;
    const double secs = atof(argv[5]);
    uint8_t *src = ws ? map_private(ws, thp) : NULL;
    uint8_t *dst = ws ? map_private(ws, thp) : NULL;
    if (!src || !dst || batch == 0 || batch > 1024) {
        fprintf(stderr, "%s: bad arguments or no memory\n", argv[0]);
        return 1;
    }
    memset(src, 1, ws);  /* touch every page: no page faults in the measurement */
    if (!pvw) memset(dst, 2, ws); /* with pvw the child's copy is the destination: untouched here, so that
                                     the child's own writes fault in huge pages (a copy-on-write of a huge
                                     page would split it) */
    if (pvw) {
        /* The child's dst is its own: it writes every page after the fork. */
        int ready[2];
        if (pipe(ready) != 0) return 1;
        g_child = fork();
        if (g_child < 0) return 1;
        if (g_child == 0) {
            memset(dst, 3, ws);
            if (write(ready[1], "r", 1) != 1) _exit(1);
            for (;;) pause();
        }
        char c;
        if (read(ready[0], &c, 1) != 1) return 1;
    }
    int rc = 0;
    char *list = strdup(argv[1]);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t bs = size_or_exit("kvxfer-memcpy-ref", tok);
        if (bs > ws) {
            rc = 2;
            break;
        }
        if (run(bs, ws, random, batch, secs, threads, src, dst) != 0) {
            rc = 1;
            break;
        }
    }
    free(list);
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
    }
    return rc;
}
