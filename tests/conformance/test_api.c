/* Conformance, one process: every semantic of the contract and every bad
 * input, on the backend named by KVX_TEST_BACKEND (default tcp). The same
 * binary runs on verbs inside the Soft-RoCE VM. */
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_api.h"

void pair_up(pair *p, uint64_t nb_a, uint64_t nb_b, const char *cfg) {
    p->ra = region_new(nb_a, BL, 0x11);
    p->rb = region_new(nb_b, BL, 0x22);
    p->a = transport_new(&p->ra, cfg, NULL);
    p->b = transport_new(&p->rb, cfg, NULL);
    get_meta(p->b, &p->mb);
    add_peer(p->a, "b", &p->mb);
}

void pair_down(pair *p) {
    kvx_transport_destroy(p->a);
    kvx_transport_destroy(p->b);
    assert_true(region_guards_ok(&p->ra));
    assert_true(region_guards_ok(&p->rb));
    region_free(&p->ra);
    region_free(&p->rb);
}

/* Recomputes the metadata checksum after a deliberate edit (docs/wire-format.md). */
static void reseal(metablob *m) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(m->bytes, m->len - 8, d);
    memcpy(m->bytes + m->len - 8, d, 8);
}

/* ------------------------------------------------------------ waiting */

/* 1: fd is readable within ms. */
static int readable(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    assert_true(r >= 0);
    return r == 1 && (p.revents & POLLIN);
}

/* Takes every ready id; how many. */
static size_t poll_everything(kvx_transport *t) {
    size_t total = 0, nd, nf;
    uint64_t d[64], f[64];
    do {
        CHECK_OK(kvx_poll(&nd, &nf, t, NULL, d, 64, f, 64));
        total += nd + nf;
    } while (nd == 64 || nf == 64);
    return total;
}

/* kvx_wait: bad input, nothing ready (0 looks, > 0 times out), a transfer
 * that finishes wakes a waiter without limit and counts as ready until it is
 * polled, and a cancelled unpolled id stops counting. */
static void test_wait(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    size_t n = 99;
    CHECK_ERR(kvx_wait(NULL, p.a, 0), KVX_EINVAL);
    CHECK_ERR(kvx_wait(&n, NULL, 0), KVX_EINVAL);
    CHECK_ERR(kvx_wait(&n, p.a, -2), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "-2"));
    CHECK_OK(kvx_wait(&n, p.a, 0));
    assert_int_equal(n, 0);
    CHECK_OK(kvx_wait(&n, p.a, 30));
    assert_int_equal(n, 0);

    enum { N = 5 };
    uint64_t ids[N];
    for (uint64_t i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], p.a, "b", &i, &i, 1));
    size_t got = 0;
    while (got < N) {
        CHECK_OK(kvx_wait(&n, p.a, -1));
        assert_true(n >= 1 && n <= N - got);
        size_t again;
        CHECK_OK(kvx_wait(&again, p.a, 0)); /* still ready: nothing took them */
        assert_true(again >= n);
        got += poll_everything(p.a);
    }
    assert_int_equal(got, N);
    CHECK_OK(kvx_wait(&n, p.a, 0));
    assert_int_equal(n, 0);

    /* a finished id that is cancelled before it is polled is not ready any more */
    uint64_t id, i = 7;
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", &i, &i, 1));
    CHECK_OK(kvx_wait(&n, p.a, -1));
    assert_int_equal(n, 1);
    size_t n_in;
    CHECK_OK(kvx_cancel(&n_in, p.a, &id, 1, KVX_CANCEL_IMMEDIATE, NULL));
    CHECK_OK(kvx_wait(&n, p.a, 0));
    assert_int_equal(n, 0);
    assert_int_equal(poll_everything(p.a), 0);
    pair_down(&p);
}

typedef struct waiter {
    kvx_transport *t;
    int rc;
    pthread_t th;
} waiter;

static void *wait_forever(void *arg) {
    waiter *w = arg;
    size_t n;
    w->rc = kvx_wait(&n, w->t, -1);
    return NULL;
}

/* Threads waiting without limit on an idle transport all leave with
 * KVX_ECLOSED when another thread closes it (a close that did not wake them
 * would hang here until the test's timeout). */
static void test_wait_woken_by_close(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    waiter w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (waiter){.t = p.a, .rc = 1};
        assert_int_equal(pthread_create(&w[i].th, NULL, wait_forever, &w[i]), 0);
    }
    usleep(100 * 1000); /* most likely all asleep by now; the assertions hold either way */
    CHECK_OK(kvx_transport_close(p.a));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(w[i].th, NULL), 0);
        assert_int_equal(w[i].rc, KVX_ECLOSED);
    }
    size_t n;
    CHECK_ERR(kvx_wait(&n, p.a, 0), KVX_ECLOSED);
    pair_down(&p);
}

/* kvx_completion_fd: the same descriptor every call; readable exactly while
 * ids wait to be polled (also ids that finished before the first call), and
 * for good after close. */
static void test_completion_fd(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    int fd = -1, fd2 = -1;
    CHECK_ERR(kvx_completion_fd(NULL, p.a), KVX_EINVAL);
    CHECK_ERR(kvx_completion_fd(&fd, NULL), KVX_EINVAL);

    /* finished before the descriptor exists: readable from its first call */
    uint64_t id, i = 3;
    size_t n;
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", &i, &i, 1));
    CHECK_OK(kvx_wait(&n, p.a, -1));
    CHECK_OK(kvx_completion_fd(&fd, p.a));
    assert_true(fd >= 0);
    CHECK_OK(kvx_completion_fd(&fd2, p.a));
    assert_int_equal(fd, fd2);
    assert_true(readable(fd, 0));
    assert_int_equal(poll_everything(p.a), 1);
    assert_false(readable(fd, 0));
    assert_false(readable(fd, 50)); /* nothing in flight: stays quiet */

    for (int round = 0; round < 20; round++) {
        enum { N = 4 };
        uint64_t ids[N];
        for (uint64_t k = 0; k < N; k++) CHECK_OK(kvx_write_blocks(&ids[k], p.a, "b", &k, &k, 1));
        size_t got = 0;
        while (got < N) {
            assert_true(readable(fd, 20000));
            got += poll_everything(p.a);
        }
        assert_int_equal(got, N);
        assert_false(readable(fd, 0));
    }
    CHECK_OK(kvx_transport_close(p.a));
    assert_true(readable(fd, 0));
    CHECK_ERR(kvx_completion_fd(&fd2, p.a), KVX_ECLOSED);
    pair_down(&p);
}

/* ------------------------------------------------------------ creation */

static void test_metadata_buffer(void **state) {
    (void)state;
    region r = region_new(NB, BL, 0);
    kvx_transport *t = transport_new(&r, NULL, NULL);
    size_t need = 0;
    CHECK_OK(kvx_get_agent_metadata(&need, t, NULL, 0));
    assert_true(need > 16);
    uint8_t *buf = malloc(need);
    size_t got = 0;
    CHECK_ERR(kvx_get_agent_metadata(&got, t, buf, need - 1), KVX_ENOBUFS);
    assert_int_equal(got, need);
    CHECK_OK(kvx_get_agent_metadata(&got, t, buf, need));
    assert_int_equal(got, need);
    free(buf);
    kvx_transport_destroy(t);
    region_free(&r);
}

/* ------------------------------------------------------------ peers */

static void test_add_peer_bad_metadata(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 0), rb = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&ra, CFG, NULL), *b = transport_new(&rb, CFG, NULL);
    metablob m, x;
    get_meta(b, &m);

    for (size_t cut = 0; cut < m.len; cut += (cut < 40 ? 1 : 13))
        CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, cut, m.base, m.nb, m.bl), KVX_EBADMETA);
    x = m;
    x.bytes[x.len / 2] ^= 0x40; /* corrupt */
    CHECK_ERR(kvx_add_remote_peer(a, "p", x.bytes, x.len, x.base, x.nb, x.bl), KVX_EBADMETA);
    x = m;
    x.bytes[x.len++] = 0; /* trailing garbage */
    CHECK_ERR(kvx_add_remote_peer(a, "p", x.bytes, x.len, x.base, x.nb, x.bl), KVX_EBADMETA);
    assert_non_null(strstr(kvx_last_error_message(), "trailing"));
    x = m;
    x.bytes[4] = 7; /* major version 7 */
    CHECK_ERR(kvx_add_remote_peer(a, "p", x.bytes, x.len, x.base, x.nb, x.bl), KVX_EVERSION);
    assert_non_null(strstr(kvx_last_error_message(), "7."));
    x = m;
    x.bytes[0] = 'X'; /* not metadata at all */
    CHECK_ERR(kvx_add_remote_peer(a, "p", x.bytes, x.len, x.base, x.nb, x.bl), KVX_EBADMETA);
    /* forged: a valid checksum over an impossible geometry (num_blocks 0) */
    x = m;
    memset(x.bytes + 16 + 8 + 8, 0, 8);
    reseal(&x);
    CHECK_ERR(kvx_add_remote_peer(a, "p", x.bytes, x.len, x.base, 0, x.bl), KVX_EBADMETA);
    CHECK_ERR(kvx_add_remote_peer(a, "p", NULL, 0, m.base, m.nb, m.bl), KVX_EBADMETA);

    /* nothing was registered by any failure */
    uint64_t id, l = 0, r = 0;
    CHECK_ERR(kvx_write_blocks(&id, a, "p", &l, &r, 1), KVX_ENOENT);
    add_peer(a, "p", &m);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_add_peer_mismatch(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 0), rb = region_new(NB, BL, 0), rc = region_new(NB, BL * 2, 0);
    kvx_transport *a = transport_new(&ra, CFG, NULL);
    kvx_transport *b = transport_new(&rb, CFG, NULL);
    kvx_transport *other_cfg = transport_new(&rb, "{\"model\":\"mistral\"}", NULL);
    kvx_transport *no_cfg = transport_new(&rb, NULL, NULL);
    kvx_transport *big = transport_new(&rc, CFG, NULL);
    metablob m;

    get_meta(big, &m);
    CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, m.len, m.base, m.nb, m.bl), KVX_EGEOMETRY);
    assert_non_null(strstr(kvx_last_error_message(), "8192"));

    get_meta(b, &m);
    CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, m.len, m.base + BL, m.nb, m.bl), KVX_EGEOMETRY);
    CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, m.len, m.base, m.nb + 1, m.bl), KVX_EGEOMETRY);
    CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, m.len, m.base, m.nb, m.bl * 2), KVX_EGEOMETRY);

    get_meta(other_cfg, &m);
    CHECK_ERR(kvx_add_remote_peer(a, "p", m.bytes, m.len, m.base, m.nb, m.bl), KVX_EFINGERPRINT);
    get_meta(no_cfg, &m); /* "" is compatible with everyone */
    add_peer(a, "nocfg", &m);

    get_meta(b, &m);
    CHECK_ERR(kvx_add_remote_peer(a, "", m.bytes, m.len, m.base, m.nb, m.bl), KVX_EINVAL);
    CHECK_ERR(kvx_add_remote_peer(a, NULL, m.bytes, m.len, m.base, m.nb, m.bl), KVX_EINVAL);
    char longid[300];
    memset(longid, 'x', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    CHECK_ERR(kvx_add_remote_peer(a, longid, m.bytes, m.len, m.base, m.nb, m.bl), KVX_EINVAL);
    longid[KVX_PEER_ID_MAX] = 0; /* exactly 255 bytes is fine */
    add_peer(a, longid, &m);
    add_peer(a, "b", &m);
    CHECK_ERR(kvx_add_remote_peer(a, "b", m.bytes, m.len, m.base, m.nb, m.bl), KVX_EEXIST);
    CHECK_ERR(kvx_remove_remote_peer(a, "nobody"), KVX_ENOENT);
    assert_non_null(strstr(kvx_last_error_message(), "nobody"));
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    CHECK_ERR(kvx_remove_remote_peer(a, "b"), KVX_ENOENT);
    add_peer(a, "b", &m); /* re-add after remove */

    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_transport_destroy(other_cfg);
    kvx_transport_destroy(no_cfg);
    kvx_transport_destroy(big);
    region_free(&ra);
    region_free(&rb);
    region_free(&rc);
}

static void test_unreachable_peer(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 0), rb = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=2000", NULL));
    kvx_transport *b = transport_new(&rb, NULL, NULL);
    metablob m;
    get_meta(b, &m);
    kvx_transport_destroy(b); /* its listener is gone */
    uint64_t t0 = now_ms();
    int rc = kvx_add_remote_peer(a, "gone", m.bytes, m.len, m.base, m.nb, m.bl);
    assert_true(rc == KVX_ECONNREFUSED || rc == KVX_ETIMEDOUT || rc == KVX_EHOSTUNREACH);
    /* tcp: nothing listens on the port, so the kernel refuses, and that is
     * what the error says (not a timeout after retrying the refusal) */
    if (strcmp(test_backend(), "tcp") == 0) assert_int_equal(rc, KVX_ECONNREFUSED);
    assert_int_equal(kvx_error_scope_of(rc), KVX_SCOPE_PEER);
    assert_non_null(strstr(kvx_last_error_message(), "gone"));
    assert_true(now_ms() - t0 < 10000);
    uint64_t id, l = 0;
    CHECK_ERR(kvx_write_blocks(&id, a, "gone", &l, &l, 1), KVX_ENOENT);
    kvx_transport_destroy(a);
    region_free(&ra);
    region_free(&rb);
}

/* ------------------------------------------------------------ transfers */

static void test_write_bad_input(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB / 2, CFG);
    uint64_t id = 0, l[3] = {0, 1, 2}, r[3] = {0, 1, 2};
    CHECK_ERR(kvx_write_blocks(&id, p.a, "nobody", l, r, 1), KVX_ENOENT);
    uint64_t lbad[1] = {NB};
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", lbad, r, 1), KVX_ERANGE);
    assert_non_null(strstr(kvx_last_error_message(), "local index 64"));
    uint64_t rbad[2] = {3, NB / 2};
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", l, rbad, 2), KVX_ERANGE);
    assert_non_null(strstr(kvx_last_error_message(), "remote index 32"));
    uint64_t rdup[3] = {5, 9, 5};
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", l, rdup, 3), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "remote index 5"));
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", NULL, r, 1), KVX_EINVAL);
    /* more blocks than a call takes: refused before the arrays are read */
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", l, r, (size_t)UINT32_MAX + 1), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "n = 4294967296 blocks"));
    CHECK_ERR(kvx_write_blocks(NULL, p.a, "b", l, r, 1), KVX_EINVAL);
    CHECK_ERR(kvx_write_blocks(&id, p.a, NULL, l, r, 1), KVX_EINVAL);
    assert_int_equal(id, 0); /* out-param untouched on failure */
    /* the same local block twice is fine (a broadcast) */
    uint64_t lsame[2] = {7, 7}, rtwo[2] = {1, 2};
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", lsame, rtwo, 2));
    size_t nf = 9;
    assert_int_equal(wait_ids(p.a, NULL, &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    /* nothing landed from the rejected calls: block 0 and 3 untouched */
    assert_true(block_is(p.rb.base, BL, 0x22));
    assert_true(block_is(p.rb.base + 3 * BL, BL, 0x22));
    pair_down(&p);
}

static void test_write_zero_blocks(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    uint64_t id1 = 0, id2 = 0;
    CHECK_OK(kvx_write_blocks(&id1, p.a, "b", NULL, NULL, 0));
    CHECK_OK(kvx_write_blocks(&id2, p.a, "b", NULL, NULL, 0));
    assert_true(id1 != 0 && id2 != 0 && id1 != id2);
    size_t nd = 0, nf = 0;
    uint64_t done[4], failed[4];
    CHECK_OK(kvx_poll(&nd, &nf, p.a, NULL, done, 4, failed, 4));
    assert_int_equal(nd, 2);
    assert_int_equal(nf, 0);
    assert_true(done[0] == id1 && done[1] == id2);
    CHECK_OK(kvx_poll(&nd, &nf, p.a, NULL, done, 4, failed, 4));
    assert_int_equal(nd + nf, 0);
    pair_down(&p);
}

/* Data lands exactly where asked; nothing else changes (canaries). */
static void test_data_and_canaries(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    for (uint64_t i = 0; i < NB; i++) fill_block(p.ra.base + i * BL, BL, i, 7);
    /* a run (3..10 -> 20..27), a reversed pair, singles, a broadcast-free random mix */
    uint64_t l[] = {3, 4, 5, 6, 7, 8, 9, 10, 40, 39, 0, 63, 17};
    uint64_t r[] = {20, 21, 22, 23, 24, 25, 26, 27, 50, 49, 63, 0, 33};
    size_t n = sizeof l / sizeof l[0];
    uint64_t id;
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", l, r, n));
    size_t nf = 0;
    assert_int_equal(wait_ids(p.a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    uint8_t written[NB] = {0};
    for (size_t i = 0; i < n; i++) {
        assert_true(block_matches(p.rb.base + r[i] * BL, BL, l[i], 7));
        written[r[i]] = 1;
    }
    for (uint64_t i = 0; i < NB; i++)
        if (!written[i]) assert_true(block_is(p.rb.base + i * BL, BL, 0x22));
    assert_true(region_guards_ok(&p.rb));
    assert_true(region_guards_ok(&p.ra));
    pair_down(&p);
}

/* Backend knobs that split a transfer (tcp.streams) keep the data exact. */
static void test_parallel_streams(void **state) {
    (void)state;
    enum { PNB = 96, PBL = 64 * 1024 };
    region ra = region_new(PNB, PBL, 1), rb = region_new(PNB, PBL, 2);
    kvx_transport *a = transport_new(&ra, NULL, test_options("tcp.streams=3", NULL));
    kvx_transport *b = transport_new(&rb, NULL, test_options("tcp.streams=3", NULL));
    metablob m;
    get_meta(b, &m);
    add_peer(a, "b", &m);
    for (uint64_t i = 0; i < PNB; i++) fill_block(ra.base + i * PBL, PBL, i, 3);
    uint64_t l[PNB], r[PNB], ids[2];
    for (uint64_t i = 0; i < PNB; i++) l[i] = i, r[i] = (i + 17) % PNB; /* two runs */
    CHECK_OK(kvx_write_blocks(&ids[0], a, "b", l, r, PNB));
    CHECK_OK(kvx_write_blocks(&ids[1], a, "b", l, l, 0));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, NULL, ids, 2, 30000, &nf, NULL), 2);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < PNB; i++) assert_true(block_matches(rb.base + r[i] * PBL, PBL, i, 3));
    assert_true(region_guards_ok(&rb));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* ------------------------------------------------------------ cancel */

static void test_cancel_immediate(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    enum { N = 64 };
    uint64_t ids[N];
    for (uint64_t i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], p.a, "b", &i, &i, 1));
    size_t n_in = 99;
    CHECK_OK(kvx_cancel(&n_in, p.a, ids, N / 2, KVX_CANCEL_IMMEDIATE, NULL));
    assert_int_equal(n_in, 0);
    /* the cancelled half is never reported; the other half is, once */
    size_t nf = 0;
    assert_int_equal(wait_ids(p.a, NULL, ids + N / 2, N / 2, 20000, &nf, NULL), N / 2);
    usleep(200 * 1000);
    size_t nd = 0;
    uint64_t d[N], f[N];
    CHECK_OK(kvx_poll(&nd, &nf, p.a, NULL, d, N, f, N));
    assert_int_equal(nd + nf, 0);
    /* unknown and finished ids are ignored */
    uint64_t junk[3] = {ids[N - 1], 999999, 0};
    CHECK_OK(kvx_cancel(&n_in, p.a, junk, 3, KVX_CANCEL_IMMEDIATE, NULL));
    uint64_t out[3];
    CHECK_OK(kvx_cancel(&n_in, p.a, junk, 3, KVX_CANCEL_WAIT, out));
    assert_int_equal(n_in, 0);
    CHECK_ERR(kvx_cancel(&n_in, p.a, junk, 3, 7, out), KVX_EINVAL);
    CHECK_ERR(kvx_cancel(&n_in, p.a, junk, 3, KVX_CANCEL_WAIT, NULL), KVX_EINVAL);
    pair_down(&p);
}

/* Cancel of ids that finished but were not polled yet: both modes release
 * them (never reported); wait returns only ids still on the wire, which poll
 * then reports once. Holds whatever the timing. */
static void test_cancel_finished_unpolled(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    enum { N = 8 };
    uint64_t ids[N];
    for (uint64_t i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], p.a, "b", &i, &i, 1));
    usleep(300 * 1000); /* most likely all finished; the assertions hold either way */
    size_t n_in = 99;
    CHECK_OK(kvx_cancel(&n_in, p.a, ids, N / 2, KVX_CANCEL_IMMEDIATE, NULL));
    assert_int_equal(n_in, 0);
    uint64_t back[N];
    uint64_t twice[N];
    for (int i = 0; i < N / 2; i++) twice[2 * i] = twice[2 * i + 1] = ids[N / 2 + i];
    CHECK_OK(kvx_cancel(&n_in, p.a, twice, N, KVX_CANCEL_WAIT, back));
    /* no id reported twice even if given twice; the returned ones surface once */
    assert_true(n_in <= N / 2);
    for (size_t i = 0; i < n_in; i++)
        for (size_t j = i + 1; j < n_in; j++) assert_true(back[i] != back[j]);
    size_t nf = 0;
    assert_int_equal(wait_ids(p.a, NULL, back, n_in, 20000, &nf, NULL), n_in);
    assert_int_equal(nf, 0);
    usleep(100 * 1000);
    size_t nd = 0;
    uint64_t d[N], f[N];
    CHECK_OK(kvx_poll(&nd, &nf, p.a, NULL, d, N, f, N));
    assert_int_equal(nd + nf, 0);
    pair_down(&p);
}

/* wait mode: returned ids surface later exactly once; ids not returned never do. */
static void test_cancel_wait(void **state) {
    (void)state;
    enum { BIGNB = 512, BIGBL = 64 * 1024, N = 48 };
    region ra = region_new(BIGNB, BIGBL, 1), rb = region_new(BIGNB, BIGBL, 2);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL);
    metablob m;
    get_meta(b, &m);
    add_peer(a, "b", &m);
    uint64_t ids[N], idx[BIGNB], rev[BIGNB];
    for (uint64_t i = 0; i < BIGNB; i++) idx[i] = i, rev[i] = BIGNB - 1 - i;
    /* 32 MiB each, as 512 separate blocks (no runs: 512 verbs WRs, so two
     * transfers fill a send queue): the later ones are still queued when we
     * cancel */
    for (int i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "b", idx, rev, BIGNB));
    uint64_t inflight[N];
    size_t n_in = 0;
    CHECK_OK(kvx_cancel(&n_in, a, ids, N, KVX_CANCEL_WAIT, inflight));
    assert_true(n_in <= N);
    size_t nf = 0;
    assert_int_equal(wait_ids(a, NULL, inflight, n_in, 60000, &nf, NULL), n_in);
    usleep(300 * 1000);
    size_t nd = 0;
    uint64_t d[N], f[N];
    CHECK_OK(kvx_poll(&nd, &nf, a, NULL, d, N, f, N));
    /* ids not returned were released (not started, or finished before the
     * cancel): none of them surfaces */
    assert_int_equal(nd + nf, 0);
    print_message("cancel wait: %zu of %d still on the wire, the rest released\n", n_in, N);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

/* ------------------------------------------------------------ remove / close */

static void test_remove_with_inflight(void **state) {
    (void)state;
    enum { BIGNB = 256, BIGBL = 64 * 1024, N = 32 };
    region ra = region_new(BIGNB, BIGBL, 1), rb = region_new(BIGNB, BIGBL, 2);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL);
    metablob m;
    get_meta(b, &m);
    add_peer(a, "b", &m);
    uint64_t ids[N], idx[BIGNB];
    for (uint64_t i = 0; i < BIGNB; i++) idx[i] = i;
    for (int i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "b", idx, idx, BIGNB));
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    size_t nf = 0;
    /* every id surfaces exactly once, done or failed, right after remove */
    assert_int_equal(wait_ids(a, NULL, ids, N, 5000, &nf, NULL), N);
    print_message("remove: %zu of %d transfers failed\n", nf, N);
    uint64_t id;
    CHECK_ERR(kvx_write_blocks(&id, a, "b", idx, idx, 1), KVX_ENOENT);
    add_peer(a, "b", &m);
    CHECK_OK(kvx_write_blocks(&id, a, "b", idx, idx, 1));
    assert_int_equal(wait_ids(a, NULL, &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_close(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    uint64_t id, i = 1;
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", &i, &i, 1));
    CHECK_OK(kvx_transport_close(p.a));
    CHECK_OK(kvx_transport_close(p.a)); /* idempotent */
    size_t nd, nf, nin;
    uint64_t d[2], f[2];
    uint8_t buf[4096];
    size_t len;
    CHECK_ERR(kvx_write_blocks(&id, p.a, "b", &i, &i, 1), KVX_ECLOSED);
    CHECK_ERR(kvx_poll(&nd, &nf, p.a, NULL, d, 2, f, 2), KVX_ECLOSED);
    CHECK_ERR(kvx_cancel(&nin, p.a, &id, 1, KVX_CANCEL_WAIT, d), KVX_ECLOSED);
    CHECK_ERR(kvx_get_agent_metadata(&len, p.a, buf, sizeof buf), KVX_ECLOSED);
    CHECK_ERR(kvx_add_remote_peer(p.a, "c", p.mb.bytes, p.mb.len, p.mb.base, p.mb.nb, p.mb.bl), KVX_ECLOSED);
    CHECK_ERR(kvx_remove_remote_peer(p.a, "b"), KVX_ECLOSED);
    assert_int_equal(kvx_error_scope_of(KVX_ECLOSED), KVX_SCOPE_TRANSPORT);
    uint64_t v;
    CHECK_OK(kvx_transport_num_blocks(&v, p.a)); /* properties stay readable */
    assert_int_equal(v, NB);
    /* the closed target refuses new writers: b writes to a closed a */
    CHECK_OK(kvx_transport_close(p.b));
    pair_down(&p);
}

/* A closed target's region is never written again. */
static void test_close_target_stops_writes(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    CHECK_OK(kvx_transport_close(p.b));
    memset(p.rb.base, 0x33, NB * BL);
    uint64_t id, i = 2;
    int rc = kvx_write_blocks(&id, p.a, "b", &i, &i, 1);
    if (rc == 0) {
        size_t nf = 0;
        assert_int_equal(wait_ids(p.a, NULL, &id, 1, 40000, &nf, NULL), 1);
        assert_int_equal(nf, 1);
    } else {
        assert_int_equal(rc, KVX_EPEERBROKEN);
    }
    assert_true(block_is(p.rb.base + 2 * BL, BL, 0x33));
    pair_down(&p);
}

/* kvx_get_peer_state through a failure: up after the add (same path as
 * kvx_peer_backend), then, once the target closed, reconnecting with the
 * failure's code and reason and attempts that fail (nobody answers); with
 * peer_redial_ms=0 broken instead, never attempted. Bad arguments: EINVAL,
 * an unknown peer: ENOENT. */
static void peer_state_after_close(const char *redial, int want_link) {
    region ra = region_new(NB, BL, 0x11), rb = region_new(NB, BL, 0x22);
    kvx_transport *a = transport_new(&ra, CFG, test_options(redial, NULL));
    kvx_transport *b = transport_new(&rb, CFG, NULL);
    metablob mb;
    get_meta(b, &mb);
    add_peer(a, "b", &mb);
    kvx_peer_state st;
    memset(&st, 0xab, sizeof st);
    CHECK_OK(kvx_get_peer_state(a, "b", &st));
    const char *backend = NULL, *path = NULL;
    CHECK_OK(kvx_peer_backend(&backend, &path, a, "b"));
    assert_int_equal(st.link, KVX_PEER_UP);
    assert_int_equal(st.error, 0);
    assert_string_equal(st.backend, backend);
    assert_string_equal(st.path, path);
    assert_int_equal(st.in_flight, 0);
    assert_int_equal(st.reconnects + st.attempts, 0);
    assert_int_equal(st.next_attempt_ns, 0);
    assert_string_equal(st.reason, "");
    for (size_t i = 0; i < sizeof st.reserved / sizeof st.reserved[0]; i++) assert_int_equal(st.reserved[i], 0);
    assert_true(st.since_ns > 1700000000LL * 1000000000LL); /* CLOCK_REALTIME */
    CHECK_ERR(kvx_get_peer_state(a, "nobody", &st), KVX_ENOENT);
    CHECK_ERR(kvx_get_peer_state(a, "b", NULL), KVX_EINVAL);
    CHECK_ERR(kvx_get_peer_state(NULL, "b", &st), KVX_EINVAL);
    CHECK_ERR(kvx_get_peer_state(a, NULL, &st), KVX_EINVAL);

    CHECK_OK(kvx_transport_close(b));
    /* a write notices the break if nothing else did (it fails, or is
     * accepted and surfaces failed) */
    uint64_t id, i = 1;
    if (kvx_write_blocks(&id, a, "b", &i, &i, 1) == 0) {
        size_t nf = 0;
        assert_int_equal(wait_ids(a, NULL, &id, 1, 40000, &nf, NULL), 1);
        assert_int_equal(nf, 1);
    }
    assert_true(wait_peer_link(a, "b", want_link, 20000, &st) >= 0);
    assert_true(st.error != 0);
    assert_true(st.reason[0] != 0);
    CHECK_ERR(kvx_write_blocks(&id, a, "b", &i, &i, 1), KVX_EPEERBROKEN);
    if (want_link == KVX_PEER_RECONNECTING) {
        uint64_t until = now_ms() + 20000;
        while (st.attempts < 2 && now_ms() < until) {
            usleep(20 * 1000);
            CHECK_OK(kvx_get_peer_state(a, "b", &st));
        }
        print_message("closed target: %u failed reconnection attempts, last: %s (%s)\n", st.attempts,
                      kvx_strerror(st.error), st.reason);
        assert_true(st.attempts >= 2);
        assert_int_equal(st.link, KVX_PEER_RECONNECTING);
        assert_int_equal(st.reconnects, 0);
    } else {
        usleep(300 * 1000);
        CHECK_OK(kvx_get_peer_state(a, "b", &st));
        assert_int_equal(st.link, KVX_PEER_BROKEN);
        assert_int_equal(st.attempts, 0);
        assert_int_equal(st.next_attempt_ns, 0);
    }
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    CHECK_ERR(kvx_get_peer_state(a, "b", &st), KVX_ENOENT);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_peer_state_reconnecting(void **state) {
    (void)state;
    peer_state_after_close("peer_redial_ms=50", KVX_PEER_RECONNECTING);
}

static void test_peer_state_broken(void **state) {
    (void)state;
    peer_state_after_close("peer_redial_ms=0", KVX_PEER_BROKEN);
}

/* ------------------------------------------------------------ threads */

/* Writers, cancellers and a poller on one transport at once: every id that
 * was not cancelled surfaces exactly once; ids returned by a wait-mode cancel
 * surface exactly once; nothing surfaces twice. */
enum { T_WRITERS = 4, T_PER = 64, T_MAXID = 4096 };

typedef struct shared_ids {
    kvx_transport *t;
    int stop;
    pthread_mutex_t mu;
    uint8_t surfaced[T_MAXID];
    uint8_t must[T_MAXID]; /* 1: must surface exactly once */
    int dup;
} shared_ids;

typedef struct worker {
    shared_ids *sh;
    int seed;
    int ok;
} worker;

static void *writer_main(void *arg) {
    worker *w = arg;
    shared_ids *sh = w->sh;
    int n = 0;
    for (int i = 0; i < T_PER; i++) {
        uint64_t l = (uint64_t)(w->seed * T_PER + i) % NB, r = (uint64_t)(w->seed * 16 + i % 16) % NB, id;
        if (kvx_write_blocks(&id, sh->t, "b", &l, &r, 1) != 0 || id >= T_MAXID) break;
        n++;
        int cancelled = 0;
        if (i % 8 == 7) {
            size_t nin = 0;
            uint64_t out[1];
            if (kvx_cancel(&nin, sh->t, &id, 1, KVX_CANCEL_WAIT, out) != 0) break;
            cancelled = nin == 0; /* dropped, or finished before: may or may not surface */
        }
        pthread_mutex_lock(&sh->mu);
        sh->must[id] = !cancelled;
        pthread_mutex_unlock(&sh->mu);
    }
    w->ok = n == T_PER;
    return NULL;
}

static void *poller_main(void *arg) {
    shared_ids *sh = arg;
    for (unsigned iter = 0;; iter++) {
        size_t nd = 0, nf = 0;
        uint64_t d[8], f[8];
        int stop = __atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE);
        if (kvx_poll(&nd, &nf, sh->t, (iter & 1) ? "b" : NULL, d, 8, f, 8) != 0) break;
        pthread_mutex_lock(&sh->mu);
        for (size_t k = 0; k < nd + nf; k++) {
            uint64_t id = k < nd ? d[k] : f[k - nd];
            if (id >= T_MAXID || sh->surfaced[id]++) sh->dup = 1;
        }
        pthread_mutex_unlock(&sh->mu);
        if (stop && nd + nf == 0) break;
        if (nd + nf == 0) usleep(100);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    static shared_ids sh;
    memset(&sh, 0, sizeof sh);
    sh.t = p.a;
    pthread_mutex_init(&sh.mu, NULL);
    pthread_t th[T_WRITERS], poller;
    worker w[T_WRITERS];
    pthread_create(&poller, NULL, poller_main, &sh);
    for (int i = 0; i < T_WRITERS; i++) {
        w[i] = (worker){&sh, i, 0};
        pthread_create(&th[i], NULL, writer_main, &w[i]);
    }
    for (int i = 0; i < T_WRITERS; i++) {
        pthread_join(th[i], NULL);
        assert_true(w[i].ok);
    }
    /* let everything drain, then stop the poller after an empty poll */
    uint64_t end = now_ms() + 20000;
    for (;;) {
        pthread_mutex_lock(&sh.mu);
        int missing = 0;
        for (int id = 0; id < T_MAXID; id++) missing += sh.must[id] && !sh.surfaced[id];
        pthread_mutex_unlock(&sh.mu);
        if (!missing || now_ms() > end) break;
        usleep(1000);
    }
    __atomic_store_n(&sh.stop, 1, __ATOMIC_RELEASE);
    pthread_join(poller, NULL);
    assert_false(sh.dup);
    for (int id = 0; id < T_MAXID; id++)
        if (sh.must[id] && sh.surfaced[id] != 1) fail_msg("id %d surfaced %d times", id, sh.surfaced[id]);
    pthread_mutex_destroy(&sh.mu);
    pair_down(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_bad_input),
        cmocka_unit_test(test_properties),
        cmocka_unit_test(test_region_prewarm),
        cmocka_unit_test(test_region_hugepages),
        cmocka_unit_test(test_metadata_buffer),
        cmocka_unit_test(test_add_peer_bad_metadata),
        cmocka_unit_test(test_add_peer_mismatch),
        cmocka_unit_test(test_unreachable_peer),
        cmocka_unit_test(test_write_bad_input),
        cmocka_unit_test(test_write_zero_blocks),
        cmocka_unit_test(test_data_and_canaries),
        cmocka_unit_test(test_parallel_streams),
        cmocka_unit_test(test_many_transfers_small_poll),
        cmocka_unit_test(test_poll_scoped),
        cmocka_unit_test(test_poll_results),
        cmocka_unit_test(test_list_peers),
        cmocka_unit_test(test_metrics_text),
        cmocka_unit_test(test_cancel_immediate),
        cmocka_unit_test(test_cancel_wait),
        cmocka_unit_test(test_cancel_finished_unpolled),
        cmocka_unit_test(test_remove_with_inflight),
        cmocka_unit_test(test_close),
        cmocka_unit_test(test_wait),
        cmocka_unit_test(test_wait_woken_by_close),
        cmocka_unit_test(test_completion_fd),
        cmocka_unit_test(test_close_target_stops_writes),
        cmocka_unit_test(test_peer_state_reconnecting),
        cmocka_unit_test(test_peer_state_broken),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name(test_backend(), tests, NULL, NULL);
}
