/*
 * kvxfer-cold-ref: the reference line of bench/compare-cold.sh. What a plain
 * TCP stream over loopback does cold on this machine, with no library in the
 * way: two fresh regions of REGION_BYTES (every page touched from user space
 * first, as kvxfer-bench does with both of its regions); one writer thread
 * sends from the first, cycling over it, and the reader recv()s into the
 * second in BLOCK_SIZE pieces, cycling over it. The first BYTES after connecting are timed ("cold"), then
 * the same amount again ("steady"). Prints one JSON line:
 * {"block_size":N,"region":N,"bytes":N,"cold_gb_per_s":G,"gb_per_s":G}.
 *
 *   kvxfer-cold-ref BLOCK_SIZE REGION_BYTES BYTES
 *
 * On the development VM the first kernel write into each page of a region is
 * far slower than the next ones, whoever makes it; this line shows how much
 * of kvxfer's cold start is that.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../units.h"

struct writer {
    int fd;
    const char *src;
    size_t src_len, total;
};

static void *write_all(void *arg) {
    struct writer *w = arg;
    for (size_t sent = 0, at = 0; sent < w->total;) {
        size_t n = w->src_len - at < (1u << 20) ? w->src_len - at : (1u << 20);
        if (n > w->total - sent) n = w->total - sent;
        ssize_t r = write(w->fd, w->src + at, n);
        if (r <= 0) {
            perror("kvxfer-cold-ref: write");
            exit(1);
        }
        sent += (size_t)r;
        at = (at + (size_t)r) % w->src_len;
    }
    return NULL;
}

/* Receives bytes into the region, block by block, cycling; seconds taken. */
static double receive(int fd, char *region, size_t region_len, size_t block, size_t bytes, size_t *at) {
    double t0 = now_s();
    for (size_t got = 0; got < bytes;) {
        size_t want = block - (*at % block);
        if (want > bytes - got) want = bytes - got;
        ssize_t r = read(fd, region + *at, want);
        if (r <= 0) {
            perror("kvxfer-cold-ref: read");
            exit(1);
        }
        got += (size_t)r;
        *at = (*at + (size_t)r) % region_len;
    }
    return now_s() - t0;
}

static size_t size_arg(const char *s) { return (size_t)size_or_exit("kvxfer-cold-ref", s); }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kvxfer-cold-ref BLOCK_SIZE REGION_BYTES BYTES\n");
        return 2;
    }
    size_t block = size_arg(argv[1]), region_len = size_arg(argv[2]), bytes = size_arg(argv[3]);
    if (region_len % block) {
        fprintf(stderr, "kvxfer-cold-ref: the region is not a whole number of blocks\n");
        return 2;
    }
    size_t src_len = region_len;
    char *src = mmap(NULL, src_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || region == MAP_FAILED) {
        perror("kvxfer-cold-ref: mmap");
        return 1;
    }
    memset(src, 0x5a, src_len);
    memset(region, 0xa5, region_len); /* touched from user space, as the bench's target does */

    struct writer w = {.src = src, .src_len = src_len, .total = 2 * bytes};
    int fd;
    loopback_pair("kvxfer-cold-ref", &w.fd, &fd);
    pthread_t t;
    pthread_create(&t, NULL, write_all, &w);
    size_t at = 0;
    double cold = receive(fd, region, region_len, block, bytes, &at);
    double steady = receive(fd, region, region_len, block, bytes, &at);
    pthread_join(t, NULL);
    printf("{\"block_size\":%zu,\"region\":%zu,\"bytes\":%zu,\"cold_gb_per_s\":%.4f,\"gb_per_s\":%.4f}\n", block,
           region_len, bytes, (double)bytes / cold / 1e9, (double)bytes / steady / 1e9);
    return 0;
}
