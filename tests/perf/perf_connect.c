/* kvx_add_remote_peer cost on loopback tcp (the default tcp.protection=aead),
 * or on verbs (the Soft-RoCE VM runs it), against a target region of 16
 * blocks and of 19,599 blocks (what vLLM registers): each round adds the
 * target as a peer and removes it again. Prints p50/p90/max in
 * microseconds; asserts nothing about time.
 *   perf_connect [rounds] [streams] [backend]
 * defaults: 200 rounds, tcp.streams=1 (verbs: verbs.qps_per_peer), tcp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kvxfer.h"

#define BLOCK_LEN 4096

static void check(int rc, const char *what) {
    if (rc == 0) return;
    fprintf(stderr, "perf_connect: %s: %s (%s)\n", what, kvx_strerror(rc), kvx_last_error_message());
    exit(1);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *g_backend = "tcp";

static kvx_transport *make(uint64_t num_blocks, const char *streams) {
    /* never touched: the tcp backend registers nothing, so the pages stay virtual */
    void *base = mmap(NULL, num_blocks * BLOCK_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (base == MAP_FAILED) exit(1);
    kvx_options *o = NULL;
    kvx_transport *t = NULL;
    check(kvx_options_create(&o), "options");
    check(kvx_options_set(o, "backend", g_backend), "backend");
    if (strcmp(g_backend, "verbs") == 0) {
        check(kvx_options_set(o, "verbs.qps_per_peer", streams), "verbs.qps_per_peer");
    } else {
        check(kvx_options_set(o, "tcp.listen", "127.0.0.1:0"), "tcp.listen");
        check(kvx_options_set(o, "tcp.streams", streams), "tcp.streams");
    }
    check(kvx_transport_create(&t, base, num_blocks, BLOCK_LEN, NULL, o), "create");
    kvx_options_destroy(o);
    return t;
}

typedef struct target {
    uint64_t blocks, base;
    kvx_transport *t;
    uint8_t meta[4096];
    size_t len;
    double *us;
} target;

static void report(target *g, int rounds, const char *streams) {
    qsort(g->us, (size_t)rounds, sizeof *g->us, cmp_double);
    printf("%s %s %s  target %6llu blocks  add_remote_peer p50 %7.1f us  p90 %7.1f us  max %7.1f us"
           "  (%d rounds)\n", g_backend, strcmp(g_backend, "verbs") == 0 ? "qps" : "streams", streams,
           (unsigned long long)g->blocks, g->us[rounds / 2], g->us[rounds * 9 / 10],
           g->us[rounds - 1], rounds);
}

/* Rounds alternate between the targets, so that both see the same machine. */
static void run(int rounds, const char *streams) {
    kvx_transport *init = make(16, streams);
    static target g[2] = {{.blocks = 16}, {.blocks = 19599}};
    for (int k = 0; k < 2; k++) {
        g[k].t = make(g[k].blocks, streams);
        check(kvx_get_agent_metadata(&g[k].len, g[k].t, g[k].meta, sizeof g[k].meta), "metadata");
        check(kvx_transport_base_addr(&g[k].base, g[k].t), "base_addr");
        g[k].us = calloc((size_t)rounds, sizeof *g[k].us);
    }
    for (int i = 0; i < 2 * rounds; i++) {
        target *x = &g[i % 2];
        double t0 = now_us();
        check(kvx_add_remote_peer(init, "target", x->meta, x->len, x->base, x->blocks, BLOCK_LEN), "add_remote_peer");
        x->us[i / 2] = now_us() - t0;
        check(kvx_remove_remote_peer(init, "target"), "remove_remote_peer");
    }
    for (int k = 0; k < 2; k++) {
        report(&g[k], rounds, streams);
        free(g[k].us);
        kvx_transport_destroy(g[k].t);
    }
    kvx_transport_destroy(init);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    const char *streams = argc > 2 ? argv[2] : "1";
    if (argc > 3) g_backend = argv[3];
    if (rounds < 1) rounds = 1;
    run(rounds, streams);
    return 0;
}
