/* Conformance, completions: many ids through a one-entry poll, poll scoped to
 * a peer, and kvx_poll_results beside kvx_poll. Part of the conformance_api
 * program (test_api.c has main()). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_api.h"

/* Many transfers: each id exactly once; poll with tiny arrays keeps leftovers. */
void test_many_transfers_small_poll(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    enum { N = 200 };
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        uint64_t l = (uint64_t)i % NB, r = (uint64_t)(i * 7) % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], p.a, "b", &l, &r, 1));
        for (int j = 0; j < i; j++) assert_true(ids[j] != ids[i]);
    }
    uint8_t seen[N] = {0};
    size_t got = 0;
    uint64_t end = now_ms() + 30000;
    while (got < N && now_ms() < end) {
        size_t nd = 0, nf = 0;
        uint64_t d[1], f[1];
        CHECK_OK(kvx_poll(&nd, &nf, p.a, NULL, d, 1, f, 1));
        assert_true(nd <= 1 && nf == 0);
        if (nd) {
            int k = 0;
            while (k < N && ids[k] != d[0]) k++;
            assert_true(k < N);
            assert_false(seen[k]);
            seen[k] = 1;
            got++;
        } else {
            usleep(100);
        }
    }
    assert_int_equal(got, N);
    pair_down(&p);
}

/* poll(peer) returns only that peer's ids. */
void test_poll_scoped(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2), rc = region_new(NB, BL, 3);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL),
                  *c = transport_new(&rc, NULL, NULL);
    metablob mb, mc;
    get_meta(b, &mb);
    get_meta(c, &mc);
    add_peer(a, "b", &mb);
    add_peer(a, "c", &mc);
    uint64_t idb[5], idc[5];
    for (uint64_t i = 0; i < 5; i++) {
        CHECK_OK(kvx_write_blocks(&idb[i], a, "b", &i, &i, 1));
        CHECK_OK(kvx_write_blocks(&idc[i], a, "c", &i, &i, 1));
    }
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "c", idc, 5, 20000, &nf, NULL), 5); /* fails on any b id */
    assert_int_equal(wait_ids(a, "b", idb, 5, 20000, &nf, NULL), 5);
    size_t nd = 0;
    uint64_t d[4], f[4];
    CHECK_OK(kvx_poll(&nd, &nf, a, "unknown-peer", d, 4, f, 4));
    assert_int_equal(nd + nf, 0);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_transport_destroy(c);
    region_free(&ra);
    region_free(&rb);
    region_free(&rc);
}

/* kvx_poll_results: done ids with status 0, each id once across it and
 * kvx_poll() (half the ids taken by each), scoped like kvx_poll(), and its
 * argument checks. */
void test_poll_results(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    enum { N = 64 };
    uint64_t ids[N];
    for (uint64_t i = 0; i < N; i++) {
        uint64_t l = i % NB, r = (i * 3) % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], p.a, "b", &l, &r, 1));
    }
    uint8_t seen[N] = {0};
    size_t got = 0, turn = 0;
    for (uint64_t end = now_ms() + 30000; got < N && now_ms() < end; turn++) {
        uint64_t one = 0, none;
        kvx_result res;
        size_t n = 0, nf = 0;
        if (turn % 2) {
            CHECK_OK(kvx_poll_results(&n, p.a, (turn % 4) == 1 ? "b" : NULL, &res, 1));
            if (n) {
                assert_int_equal(res.status, 0);
                assert_int_equal(res.reserved, 0);
                one = res.id;
            }
        } else {
            CHECK_OK(kvx_poll(&n, &nf, p.a, NULL, &one, 1, &none, 1));
            assert_int_equal(nf, 0);
        }
        if (n == 0) {
            usleep(100);
            continue;
        }
        int k = 0;
        while (k < N && ids[k] != one) k++;
        assert_true(k < N);
        assert_false(seen[k]);
        seen[k] = 1;
        got++;
    }
    assert_int_equal(got, N);
    size_t n = 7;
    kvx_result res[2];
    CHECK_OK(kvx_poll_results(&n, p.a, "unknown-peer", res, 2));
    assert_int_equal(n, 0);
    CHECK_OK(kvx_poll_results(&n, p.a, NULL, NULL, 0));
    assert_int_equal(n, 0);
    CHECK_ERR(kvx_poll_results(&n, p.a, NULL, NULL, 2), KVX_EINVAL);
    CHECK_ERR(kvx_poll_results(NULL, p.a, NULL, res, 2), KVX_EINVAL);
    CHECK_ERR(kvx_poll_results(&n, NULL, NULL, res, 2), KVX_EINVAL);
    kvx_stats s = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, p.a, NULL));
    assert_int_equal(s.size, sizeof s);
    assert_int_equal(s.transfers_done, N);
    assert_int_equal(s.transfers_failed + s.transfers_failed_timeout + s.transfers_failed_connection +
                         s.transfers_failed_removed + s.transfers_failed_other, 0);
    pair_down(&p);
}
