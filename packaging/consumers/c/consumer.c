/*
 * Install test consumer (C, built with `pkg-config --cflags --libs kvxfer`):
 * two tcp transports in one process, blocks written from one into the other,
 * every byte checked. Prints the path of the libkvxfer.so.0 it runs with, so
 * that packaging/test-install.sh can check it is the installed one.
 * Exit status 0 on success, 1 on any failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvxfer.h>

#define NUM_BLOCKS 32
#define BLOCK_LEN 4096

static int check(int rc, const char *what) {
    if (rc != 0)
        fprintf(stderr, "consumer-c: %s: %s: %s\n", what, kvx_strerror(rc), kvx_last_error_message());
    return rc;
}

static kvx_transport *make_transport(unsigned char *region) {
    kvx_options *o = NULL;
    kvx_transport *t = NULL;
    if (check(kvx_options_create(&o), "kvx_options_create") != 0) return NULL;
    if (check(kvx_options_set(o, "backend", "tcp"), "backend=tcp") == 0 &&
        check(kvx_options_set(o, "tcp.listen", "127.0.0.1:0"), "tcp.listen") == 0)
        check(kvx_transport_create(&t, region, NUM_BLOCKS, BLOCK_LEN, "{\"model\":\"consumer\"}", o),
              "kvx_transport_create");
    kvx_options_destroy(o);
    return t;
}

static unsigned char pattern(uint64_t block, size_t off) { return (unsigned char)(block * 131u + off * 7u + 1u); }

int main(void) {
    static unsigned char src[NUM_BLOCKS * BLOCK_LEN], dst[NUM_BLOCKS * BLOCK_LEN];
    const uint64_t local[] = {0, 1, 2, 3, 9, 17, 31};
    const uint64_t remote[] = {4, 5, 6, 7, 0, 30, 12};
    const size_t n = sizeof local / sizeof local[0];
    Dl_info info;
    int ok = 0;

    if (dladdr((void *)kvx_version_string, &info) && info.dli_fname)
        printf("library: %s\n", info.dli_fname);
    printf("version: %s (header %d, library %u)\n", kvx_version_string(), KVX_VERSION_NUMBER,
           kvx_version_number());
    if (kvx_version_number() < KVX_VERSION_NUMBER) {
        fprintf(stderr, "consumer-c: library older than header\n");
        return 1;
    }

    for (uint64_t b = 0; b < NUM_BLOCKS; b++)
        for (size_t i = 0; i < BLOCK_LEN; i++) src[b * BLOCK_LEN + i] = pattern(b, i);
    memset(dst, 0xEE, sizeof dst);

    kvx_transport *a = make_transport(src), *b = make_transport(dst);
    if (!a || !b) goto out;
    printf("backend: %s\n", kvx_transport_backend(a));

    unsigned char meta[4096];
    size_t meta_len = 0;
    uint64_t base = 0, nb = 0, bl = 0;
    if (check(kvx_get_agent_metadata(&meta_len, b, meta, sizeof meta), "kvx_get_agent_metadata") ||
        check(kvx_transport_base_addr(&base, b), "base_addr") ||
        check(kvx_transport_num_blocks(&nb, b), "num_blocks") ||
        check(kvx_transport_block_len(&bl, b), "block_len") ||
        check(kvx_add_remote_peer(a, "b", meta, meta_len, base, nb, bl), "kvx_add_remote_peer"))
        goto out;

    uint64_t id = 0;
    if (check(kvx_write_blocks(&id, a, "b", local, remote, n), "kvx_write_blocks")) goto out;

    time_t deadline = time(NULL) + 30;
    for (;;) {
        uint64_t done[8], failed[8];
        size_t nd = 0, nf = 0;
        if (check(kvx_poll(&nd, &nf, a, NULL, done, 8, failed, 8), "kvx_poll")) goto out;
        if (nf > 0) {
            fprintf(stderr, "consumer-c: transfer %llu failed\n", (unsigned long long)failed[0]);
            goto out;
        }
        if (nd == 1 && done[0] == id) break;
        if (time(NULL) > deadline) {
            fprintf(stderr, "consumer-c: transfer not done after 30 s\n");
            goto out;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }

    for (uint64_t r = 0; r < NUM_BLOCKS; r++) {
        const unsigned char *got = dst + r * BLOCK_LEN;
        long from = -1;
        for (size_t i = 0; i < n; i++)
            if (remote[i] == r) from = (long)local[i];
        for (size_t i = 0; i < BLOCK_LEN; i++) {
            unsigned char want = from < 0 ? 0xEE : pattern((uint64_t)from, i);
            if (got[i] != want) {
                fprintf(stderr, "consumer-c: block %llu byte %zu is 0x%02x, expected 0x%02x\n",
                        (unsigned long long)r, i, got[i], want);
                goto out;
            }
        }
    }
    printf("verified: %zu blocks of %d bytes over tcp\n", n, BLOCK_LEN);
    ok = 1;
out:
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    return ok ? 0 : 1;
}
