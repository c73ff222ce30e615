/* The shm backend's copy threads with real peers: large transfers split
 * over two threads (mapped, and private memory through process_vm_writev),
 * a large scattered transfer with one copy thread, and a stream of
 * transfers to two peers at once over a pool of three threads, with
 * cancels. The pool alone, deterministically:
 * test_shm_pool.cpp. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "shm_common.h"

/* One block of bbl bytes (a split size + 4 KiB) to the middle of three:
 * split inside the block between the threads, every byte there, nothing
 * beside it. */
static void one_split_block(uint64_t bbl) {
    enum { BNB = 3 };
    void *mem = NULL;
    CHECK_OK(kvx_region_alloc(&mem, BNB * bbl + 2 * GUARD_LEN, 0));
    uint8_t *tb = guarded(mem, BNB * bbl, 0x33);
    region ra = region_new(BNB, bbl, 1);
    kvx_transport *a = make(ra.base, BNB, bbl, opts("shm", "shm.threads=2"));
    kvx_transport *b = make(tb, BNB, bbl, opts("shm", NULL));
    connect_ab(a, b);
    fill_block(ra.base + 2 * bbl, bbl, 2, 9);
    uint64_t two = 2, one = 1, id;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, a, "b", &two, &one, 1));
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(block_matches(tb + bbl, bbl, 2, 9));
    assert_true(block_is(tb, bbl, 0x33) && block_is(tb + 2 * bbl, bbl, 0x33));
    for (size_t i = 0; i < GUARD_LEN; i++) assert_true(tb[-1 - (long)i] == 0xA5 && tb[BNB * bbl + i] == 0xA5);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_region_free(mem);
    region_free(&ra);
}

/* Large blocks over two copy threads: a transfer of 8 MiB is split in two,
 * and so are transfers of one block of 3 MiB + 4 KiB and 1 MiB + 4 KiB
 * (inside the block). */
static void test_mapped_threads(void **state) {
    (void)state;
    enum { TNB = 16, TBL = 1 << 20 };
    void *mem = NULL;
    CHECK_OK(kvx_region_alloc(&mem, (uint64_t)TNB * TBL + 2 * GUARD_LEN, 0));
    uint8_t *tb = guarded(mem, (uint64_t)TNB * TBL, 0x33);
    region ra = region_new(TNB, TBL, 1);
    kvx_transport *a = make(ra.base, TNB, TBL, opts("shm", "shm.threads=2"));
    kvx_transport *b = make(tb, TNB, TBL, opts("shm", NULL));
    connect_ab(a, b);
    for (uint64_t i = 0; i < TNB; i++) fill_block(ra.base + i * TBL, TBL, i, 5);
    uint64_t l[8], r[8], id;
    for (int i = 0; i < 8; i++) l[i] = 2 + i, r[i] = 7 + i;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 8));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < TNB; i++) {
        if (i >= 7 && i < 15) assert_true(block_matches(tb + i * TBL, TBL, i - 5, 5));
        else assert_true(block_is(tb + i * TBL, TBL, 0x33));
    }
    for (size_t i = 0; i < GUARD_LEN; i++) assert_true(tb[-1 - (long)i] == 0xA5 && tb[(uint64_t)TNB * TBL + i] == 0xA5);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_region_free(mem);
    region_free(&ra);

    one_split_block((3 << 20) + 4096);
    one_split_block((1 << 20) + 4096); /* split from 1 MiB since 0.4.6: parts of 576 + 452 KiB */
}

/* Private memory over two copy threads: process_vm_writev costs about twice
 * a memcpy per byte, so transfers from 512 KiB are split (on 64 KiB bounds,
 * inside blocks too). Three blocks of 512 KiB + 4 KiB in one transfer, then
 * one such block alone: each lands exactly, nothing around it changes. */
static void test_private_threads(void **state) {
    (void)state;
    enum { PNB = 8, PBL = (512 << 10) + 4096 };
    region ra = region_new(PNB, PBL, 1), rb = region_new(PNB, PBL, 0x33);
    kvx_transport *a = make(ra.base, PNB, PBL, opts("shm", "shm.threads=2"));
    kvx_transport *b = make(rb.base, PNB, PBL, opts("shm", NULL));
    connect_ab(a, b);
    expect_path(a, "b", "shm", "process_vm_writev");
    for (uint64_t i = 0; i < PNB; i++) fill_block(ra.base + i * PBL, PBL, i, 7);
    uint64_t l[3] = {6, 0, 3}, r[3] = {1, 2, 3}, one_l = 5, one_r = 6, ids[2];
    CHECK_OK(kvx_write_blocks(&ids[0], a, "b", l, r, 3));
    CHECK_OK(kvx_write_blocks(&ids[1], a, "b", &one_l, &one_r, 1));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", ids, 2, 20000, &nf, NULL), 2);
    assert_int_equal(nf, 0);
    const uint64_t from[PNB] = {0, 6, 0, 3, 0, 0, 5, 0};
    for (uint64_t i = 0; i < PNB; i++) {
        if ((i >= 1 && i <= 3) || i == 6) assert_true(block_matches(rb.base + i * PBL, PBL, from[i], 7));
        else assert_true(block_is(rb.base + i * PBL, PBL, 0x33));
    }
    assert_true(region_guards_ok(&rb));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* A writer and two targets of nb blocks of bl bytes, on shm: "b" in
 * private memory (process_vm_writev), "c" in kvx_region_alloc() memory
 * between guards (mapped). The writer's copy threads: threads. */
typedef struct two_targets {
    region ra, rb;
    void *mem;
    uint8_t *tc;
    kvx_transport *a, *b, *c;
    uint64_t nb, bl;
} two_targets;

static void two_targets_up(two_targets *t, uint64_t nb, uint64_t bl, uint8_t bfill, uint8_t cfill,
                           const char *threads) {
    t->nb = nb;
    t->bl = bl;
    t->ra = region_new(nb, bl, 1);
    t->rb = region_new(nb, bl, bfill);
    t->mem = NULL;
    CHECK_OK(kvx_region_alloc(&t->mem, nb * bl + 2 * GUARD_LEN, 0));
    t->tc = guarded(t->mem, nb * bl, cfill);
    t->a = make(t->ra.base, nb, bl, opts("shm", threads));
    t->b = make(t->rb.base, nb, bl, opts("shm", NULL));
    t->c = make(t->tc, nb, bl, opts("shm", NULL));
    metablob m;
    get_meta(t->b, &m);
    add_peer(t->a, "b", &m);
    get_meta(t->c, &m);
    add_peer(t->a, "c", &m);
    expect_path(t->a, "b", "shm", "process_vm_writev");
    expect_path(t->a, "c", "shm", "mapped");
}

/* No byte beside either target's region changed. */
static void two_targets_guards_ok(const two_targets *t) {
    assert_true(region_guards_ok(&t->rb));
    for (size_t i = 0; i < GUARD_LEN; i++)
        assert_true(t->tc[-1 - (long)i] == 0xA5 && t->tc[t->nb * t->bl + i] == 0xA5);
}

static void two_targets_down(two_targets *t) {
    kvx_transport_destroy(t->a);
    kvx_transport_destroy(t->b);
    kvx_transport_destroy(t->c);
    kvx_region_free(t->mem);
    region_free(&t->ra);
    region_free(&t->rb);
}

/* One copy thread (shm.threads=1): the thread calling kvx_write_blocks
 * copies at most a small transfer itself, the copy thread the rest. A
 * transfer of 65,536 scattered blocks of 64 B (one run each, 4 MiB) to a
 * peer on private memory (process_vm_writev) and the same to a mapped one,
 * submitted back to back: each is reported once, done, every block it
 * wrote holds its source's bytes, every other still its fill. */
static void test_scattered_one_thread(void **state) {
    (void)state;
    enum { XNB = 1 << 17, XBL = 64, XN = 1 << 16 };
    two_targets t;
    two_targets_up(&t, XNB, XBL, 0x33, 0x33, "shm.threads=1");
    kvx_transport *a = t.a;
    const region rb = t.rb;
    uint8_t *tc = t.tc;
    for (uint64_t i = 0; i < XNB; i++) fill_block(t.ra.base + i * XBL, XBL, i, 11);
    uint64_t *l = malloc(XN * sizeof *l), *r = malloc(XN * sizeof *r), *from = malloc(XNB * sizeof *from), ids[2];
    assert_non_null(l);
    assert_non_null(r);
    assert_non_null(from);
    for (uint64_t i = 0; i < XNB; i++) from[i] = UINT64_MAX;
    for (uint64_t i = 0; i < XN; i++) {
        r[i] = i * 7919 % XNB; /* distinct, none next to the previous one */
        l[i] = i * 31 % XNB;
        from[r[i]] = l[i];
    }
    CHECK_OK(kvx_write_blocks(&ids[0], a, "b", l, r, XN));
    CHECK_OK(kvx_write_blocks(&ids[1], a, "c", l, r, XN));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, NULL, ids, 2, 60000, &nf, NULL), 2);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < XNB; i++) {
        if (from[i] == UINT64_MAX) {
            assert_true(block_is(rb.base + i * XBL, XBL, 0x33) && block_is(tc + i * XBL, XBL, 0x33));
        } else {
            assert_true(block_matches(rb.base + i * XBL, XBL, from[i], 11));
            assert_true(block_matches(tc + i * XBL, XBL, from[i], 11));
        }
    }
    two_targets_guards_ok(&t);
    /* Nothing more surfaces: each id once. */
    size_t nd = 0, nfl = 0;
    uint64_t d[4], f[4];
    CHECK_OK(kvx_poll(&nd, &nfl, a, NULL, d, 4, f, 4));
    assert_int_equal(nd + nfl, 0);
    free(l);
    free(r);
    free(from);
    two_targets_down(&t);
}

/* A stream of transfers over a pool (shm.threads=3) to two peers at once,
 * one over private memory (process_vm_writev) and one mapped, submitted
 * alternately: the queue holds parts of both links, and the copiers take
 * batches of several transfers of one link (tests/conformance/
 * test_shm_pool.cpp checks that deterministically; here the real peers).
 * Each round fills the sources anew, writes every remote block of both
 * targets once (transfers of 1..8 random blocks of 64 KiB, so runs and
 * singles mix), and cancels a third of the transfers at once (immediate) or
 * with wait. Every id not cancelled surfaces exactly once, done; a
 * cancelled one never surfaces (or, with wait, surfaces once as its
 * inflight answer says); every block of a transfer not cancelled holds its
 * source's bytes, and no byte outside the regions changes. A transfer
 * cancelled at once may still be copying after its round: removing the
 * peers (which waits for the copiers to let go) and adding them again ends
 * such a round. */
static void test_pool_stream(void **state) {
    (void)state;
    enum { SNB = 128, SBL = 64 << 10, ROUNDS = 30, MAXK = 8 };
    two_targets tt;
    two_targets_up(&tt, SNB, SBL, 0x44, 0x55, "shm.threads=3");
    kvx_transport *a = tt.a, *b = tt.b, *c = tt.c;
    const region ra = tt.ra, rb = tt.rb;
    uint8_t *tc = tt.tc;
    metablob m;
    uint64_t seed = 0x2545F4914F6CDD1DULL;
    size_t total = 0, cancelled = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (uint64_t i = 0; i < SNB; i++) fill_block(ra.base + i * SBL, SBL, i, 100 + (uint32_t)round);
        /* Per target a permutation of its blocks, cut into transfers. */
        uint64_t perm[2][SNB], src[2][SNB];
        uint64_t ids[2 * SNB];
        int peer_of[2 * SNB], first[2 * SNB], count[2 * SNB], cut[2 * SNB];
        size_t n = 0;
        for (int p = 0; p < 2; p++) {
            for (uint64_t i = 0; i < SNB; i++) perm[p][i] = i;
            for (uint64_t i = SNB - 1; i > 0; i--) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                uint64_t j = seed % (i + 1), t = perm[p][i];
                perm[p][i] = perm[p][j];
                perm[p][j] = t;
            }
            for (uint64_t i = 0; i < SNB; i++) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                src[p][i] = seed % SNB;
            }
            /* Runs too: every fourth transfer takes consecutive blocks on both sides. */
            for (int at = 0; at < SNB;) {
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                int k = 1 + (int)(seed % MAXK);
                if (k > SNB - at) k = SNB - at;
                if (n % 4 == 3) {
                    for (int q = 0; q < k; q++) perm[p][at + q] = (uint64_t)at + (uint64_t)q;
                    for (int q = 0; q < k; q++) src[p][at + q] = (src[p][at] + (uint64_t)q) % SNB;
                }
                peer_of[n] = p, first[n] = at, count[n] = k, cut[n] = 0;
                n++;
                at += k;
            }
        }
        /* The consecutive runs above may repeat a remote block of the
         * permutation: keep a transfer's blocks distinct from every earlier
         * one of the round (the others are dropped from it). */
        uint8_t used[2][SNB];
        memset(used, 0, sizeof used);
        for (size_t t = 0; t < n; t++) {
            const int p = peer_of[t];
            int k = 0;
            for (int q = 0; q < count[t]; q++) {
                const uint64_t r = perm[p][first[t] + q];
                if (used[p][r]) continue;
                used[p][r] = 1;
                perm[p][first[t] + k] = r;
                src[p][first[t] + k] = src[p][first[t] + q];
                k++;
            }
            count[t] = k;
        }
        /* Alternately to b and c: b's transfers are the first nb of the list. */
        size_t nb_b = 0;
        while (nb_b < n && peer_of[nb_b] == 0) nb_b++;
        for (size_t k = 0, ib = 0, ic = nb_b; k < n; k++) {
            const size_t t = (k % 2 == 0 && ib < nb_b) || ic == n ? ib++ : ic++;
            CHECK_OK(kvx_write_blocks(&ids[t], a, peer_of[t] ? "c" : "b", src[peer_of[t]] + first[t],
                                      perm[peer_of[t]] + first[t], (size_t)count[t]));
        }
        /* Cancel every third transfer, immediate in even rounds, with wait in odd ones. */
        uint64_t victims[2 * SNB], inflight[2 * SNB];
        size_t nv = 0, ninf = 0;
        for (size_t t = 2; t < n; t += 3) victims[nv++] = ids[t];
        CHECK_OK(kvx_cancel(&ninf, a, victims, nv, round % 2 ? KVX_CANCEL_WAIT : KVX_CANCEL_IMMEDIATE, inflight));
        uint64_t expect[2 * SNB];
        size_t ne = 0;
        for (size_t t = 0; t < n; t++) {
            int gone = t >= 2 && (t - 2) % 3 == 0;
            for (size_t q = 0; gone && q < ninf; q++)
                if (inflight[q] == ids[t]) gone = 0;
            cut[t] = gone;
            if (!gone) expect[ne++] = ids[t];
        }
        size_t nf = 0;
        assert_int_equal(wait_ids(a, NULL, expect, ne, 20000, &nf, NULL), ne);
        assert_int_equal(nf, 0);
        total += ne;
        cancelled += n - ne;
        for (size_t t = 0; t < n; t++) {
            if (cut[t]) continue;
            uint8_t *dst = peer_of[t] ? tc : rb.base;
            for (int q = 0; q < count[t]; q++)
                assert_true(block_matches(dst + perm[peer_of[t]][first[t] + q] * SBL, SBL,
                                          src[peer_of[t]][first[t] + q], 100 + (uint32_t)round));
        }
        two_targets_guards_ok(&tt);
        if (round % 2 == 0) { /* cancelled at once: some may still copy until the peers are removed */
            CHECK_OK(kvx_remove_remote_peer(a, "b"));
            CHECK_OK(kvx_remove_remote_peer(a, "c"));
            get_meta(b, &m);
            add_peer(a, "b", &m);
            get_meta(c, &m);
            add_peer(a, "c", &m);
        }
    }
    /* Nothing more surfaces: no id twice, no cancelled one late. */
    usleep(50 * 1000);
    size_t nd = 0, nfl = 0;
    uint64_t d[8], f[8];
    CHECK_OK(kvx_poll(&nd, &nfl, a, NULL, d, 8, f, 8));
    assert_int_equal(nd + nfl, 0);
    print_message("%zu transfers done, %zu cancelled\n", total, cancelled);
    two_targets_down(&tt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapped_threads),
        cmocka_unit_test(test_private_threads),
        cmocka_unit_test(test_scattered_one_thread),
        cmocka_unit_test(test_pool_stream),
    };
    return cmocka_run_group_tests_name("shm_threads", tests, NULL, NULL);
}
