/*
 * kvxfer-tcp-ref: a reference line of bench/compare-tcp.sh. What one plain
 * TCP stream over loopback does with kvxfer-bench's access pattern, with no
 * library and no protocol in the way: a writer thread gathers BATCH blocks
 * of BLOCK_SIZE from a source region with one writev() per call, and the
 * reader scatters them into BATCH blocks of a destination region with
 * readv(). PATTERN random picks the blocks of each call at random on both
 * sides (distinct within a call), seq walks the regions in order. Both
 * regions are REGION_BYTES, touched from user space first (as kvxfer-bench
 * does). iperf3 sends one small buffer over and over, which stays in the
 * CPU's caches; this line pays for the same cache and TLB misses as kvxfer
 * does over a region of KV-cache blocks. After WARMUP seconds, the next
 * SECONDS are timed. Prints one JSON line:
 * {"block_size":N,"batch":N,"pattern":"random","region":N,"gb_per_s":G}.
 *
 *   kvxfer-tcp-ref BLOCK_SIZE BATCH seq|random REGION_BYTES SECONDS WARMUP
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../units.h"

#define MAX_BATCH 1024

struct side {
    int fd;
    char *region;
    size_t block, blocks, batch;
    int random;
    uint64_t rng;    /* each side draws its own indexes */
    size_t next;     /* seq: the next block */
    unsigned *mark;  /* random: distinct indexes within a call */
    unsigned call;
};

static atomic_bool stop;

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The blocks of one call, as iovecs. */
static void pick(struct side *s, struct iovec *iov) {
    s->call++;
    for (size_t i = 0; i < s->batch; i++) {
        size_t b;
        if (s->random) {
            do b = (size_t)(next_rand(&s->rng) % s->blocks);
            while (s->mark[b] == s->call);
            s->mark[b] = s->call;
        } else {
            b = s->next;
            s->next = (s->next + 1) % s->blocks;
        }
        iov[i] = (struct iovec){s->region + b * s->block, s->block};
    }
}

/* Moves every byte of iov with readv or writev, however short the calls. */
static int move_all(int fd, struct iovec *iov, int cnt, int writing) {
    while (cnt > 0) {
        ssize_t r = writing ? writev(fd, iov, cnt) : readv(fd, iov, cnt);
        if (r <= 0)
            return -1;
        while (cnt > 0 && (size_t)r >= iov->iov_len) {
            r -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + r;
            iov->iov_len -= (size_t)r;
        }
    }
    return 0;
}

static void *write_all(void *arg) {
    struct side *s = arg;
    struct iovec iov[MAX_BATCH];
    while (!atomic_load(&stop)) {
        pick(s, iov);
        if (move_all(s->fd, iov, (int)s->batch, 1) != 0)
            break; /* the reader closed: done */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7 || (strcmp(argv[3], "seq") && strcmp(argv[3], "random"))) {
        fprintf(stderr, "usage: kvxfer-tcp-ref BLOCK_SIZE BATCH seq|random REGION_BYTES SECONDS WARMUP\n");
        return 2;
    }
    const char *me = "kvxfer-tcp-ref";
    size_t block = (size_t)size_or_exit(me, argv[1]), batch = (size_t)size_or_exit(me, argv[2]);
    size_t region_len = (size_t)size_or_exit(me, argv[4]);
    double seconds = atof(argv[5]), warmup = atof(argv[6]);
    if (block == 0 || batch == 0 || batch > MAX_BATCH || region_len % block || region_len / block < 2 * batch ||
        !(seconds > 0) || warmup < 0) {
        fprintf(stderr, "%s: need block > 0, 1 <= batch <= %d, a region of whole blocks and at least 2 x batch "
                        "of them, seconds > 0, warmup >= 0\n", me, MAX_BATCH);
        return 2;
    }
    size_t blocks = region_len / block;
    struct side w = {.region = touched_region(me, region_len, 0x5a), .block = block, .blocks = blocks,
                     .batch = batch, .random = argv[3][0] == 'r', .rng = 0x9e3779b97f4a7c15u};
    struct side r = w;
    r.region = touched_region(me, region_len, 0xa5);
    r.rng = 0xd1b54a32d192ed03u;
    w.mark = calloc(blocks, sizeof *w.mark);
    r.mark = calloc(blocks, sizeof *r.mark);

    if (!w.mark || !r.mark) {
        perror("kvxfer-tcp-ref: calloc");
        return 1;
    }
    loopback_pair(me, &w.fd, &r.fd);
    signal(SIGPIPE, SIG_IGN); /* the writer learns of the end from a failed writev */
    pthread_t t;
    pthread_create(&t, NULL, write_all, &w);
    struct iovec iov[MAX_BATCH];
    const double t0 = now_s();
    double start = 0;
    uint64_t calls = 0;
    for (double now = t0; now - t0 < warmup + seconds; now = now_s()) {
        if (start == 0 && now - t0 >= warmup) {
            start = now;
            calls = 0;
        }
        pick(&r, iov);
        if (move_all(r.fd, iov, (int)batch, 0) != 0) {
            perror("kvxfer-tcp-ref: read");
            return 1;
        }
        calls++;
    }
    const double took = now_s() - start;
    atomic_store(&stop, 1);
    shutdown(r.fd, SHUT_RDWR);
    pthread_join(t, NULL);
    printf("{\"block_size\":%zu,\"batch\":%zu,\"pattern\":\"%s\",\"region\":%zu,\"gb_per_s\":%.4f}\n", block, batch,
           argv[3], region_len, (double)(calls * batch * block) / took / 1e9);
    return 0;
}
