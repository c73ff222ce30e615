/* Conformance of the 0.2 additions, one process, on the backend named by
 * KVX_TEST_BACKEND (default tcp):
 *   - kvx_add_remote_peer_async / kvx_registration_status: success, failure,
 *     never blocking on a peer that does not answer, outcomes reported once,
 *     KVX_PEER_REPLACE of a registered peer (its transfers fail), a superseded
 *     or removed registration never publishing, close cutting one short;
 *   - kvx_get_stats: counters that add up, per peer and per transport, the
 *     caller-sized struct, the histogram. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define NB 64
#define BL 4096

/* A TCP listener that never accepts: connects succeed (the kernel's backlog),
 * the handshake never gets an answer. */
static int black_hole(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* Metadata of a transport whose advertised address is a black hole (tcp only). */
static kvx_transport *silent_target(region *r, metablob *m, int *hole) {
    int port;
    *hole = black_hole(&port);
    char adv[64];
    snprintf(adv, sizeof adv, "tcp.advertise=127.0.0.1:%d", port);
    kvx_transport *t = transport_new(r, NULL, test_options(adv, NULL));
    get_meta(t, m);
    return t;
}

static int skip_unless_tcp(void) {
    if (strcmp(test_backend(), "tcp") == 0) return 0;
    print_message("skipped: needs the tcp backend's tcp.advertise\n");
    return 1;
}

static int status_of(kvx_transport *t, uint64_t reg, int timeout_ms, int *err) {
    int state = -1;
    CHECK_OK(kvx_registration_status(&state, err, t, reg, timeout_ms));
    return state;
}

static void async_add(kvx_transport *t, const char *id, const metablob *m, unsigned flags, uint64_t *reg) {
    CHECK_OK(kvx_add_remote_peer_async(reg, t, id, m->bytes, m->len, m->base, m->nb, m->bl, flags));
    assert_true(*reg != 0);
}

static void write_one(kvx_transport *t, const char *peer, uint64_t l, uint64_t r, int want_ok) {
    uint64_t id = 0;
    int rc = kvx_write_blocks(&id, t, peer, &l, &r, 1);
    if (want_ok) {
        CHECK_OK(rc);
        size_t nf = 9;
        assert_int_equal(wait_ids(t, NULL, &id, 1, 20000, &nf, NULL), 1);
        assert_int_equal(nf, 0);
    } else {
        assert_int_equal(rc, KVX_ENOENT);
    }
}

/* ------------------------------------------------------------ async registration */

static void test_async_success(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL);
    metablob mb;
    get_meta(b, &mb);
    uint64_t reg = 0, reg2 = 0;
    async_add(a, "b", &mb, 0, &reg);
    /* reserved while in progress, registered when done */
    CHECK_ERR(kvx_add_remote_peer(a, "b", mb.bytes, mb.len, mb.base, mb.nb, mb.bl), KVX_EEXIST);
    int err = 1;
    assert_int_equal(status_of(a, reg, -1, &err), KVX_REGISTRATION_DONE);
    assert_int_equal(err, 0);
    CHECK_ERR(kvx_registration_status(&err, &err, a, reg, 0), KVX_ENOENT); /* reported once */
    write_one(a, "b", 3, 4, 1);
    CHECK_ERR(kvx_add_remote_peer_async(&reg2, a, "b", mb.bytes, mb.len, mb.base, mb.nb, mb.bl, 0), KVX_EEXIST);
    /* checked at once, nothing started: bad metadata, geometry, flags, id */
    CHECK_ERR(kvx_add_remote_peer_async(&reg2, a, "x", mb.bytes, 10, mb.base, mb.nb, mb.bl, 0), KVX_EBADMETA);
    CHECK_ERR(kvx_add_remote_peer_async(&reg2, a, "x", mb.bytes, mb.len, mb.base, mb.nb + 1, mb.bl, 0), KVX_EGEOMETRY);
    CHECK_ERR(kvx_add_remote_peer_async(&reg2, a, "x", mb.bytes, mb.len, mb.base, mb.nb, mb.bl, 8), KVX_EINVAL);
    CHECK_ERR(kvx_add_remote_peer_async(&reg2, a, "", mb.bytes, mb.len, mb.base, mb.nb, mb.bl, 0), KVX_EINVAL);
    CHECK_ERR(kvx_add_remote_peer_async(NULL, a, "x", mb.bytes, mb.len, mb.base, mb.nb, mb.bl, 0), KVX_EINVAL);
    assert_int_equal(reg2, 0);
    CHECK_ERR(kvx_registration_status(&err, &err, a, 12345, 0), KVX_ENOENT);
    CHECK_ERR(kvx_registration_status(&err, &err, a, reg, -2), KVX_EINVAL);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_async_refused(void **state) {
    (void)state;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=2000", NULL));
    kvx_transport *b = transport_new(&rb, NULL, NULL);
    metablob mb;
    get_meta(b, &mb);
    kvx_transport_destroy(b); /* nobody listens there now */
    uint64_t reg;
    async_add(a, "gone", &mb, 0, &reg);
    int err = 0;
    assert_int_equal(status_of(a, reg, -1, &err), KVX_REGISTRATION_FAILED);
    assert_true(err == KVX_ECONNREFUSED || err == KVX_ETIMEDOUT || err == KVX_EHOSTUNREACH);
    if (strcmp(test_backend(), "tcp") == 0) assert_int_equal(err, KVX_ECONNREFUSED);
    assert_non_null(strstr(kvx_last_error_message(), "gone")); /* the registration's own message */
    write_one(a, "gone", 0, 0, 0);
    /* the id is free again */
    async_add(a, "gone", &mb, 0, &reg);
    assert_int_equal(status_of(a, reg, -1, &err), KVX_REGISTRATION_FAILED);
    kvx_stats s = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    assert_int_equal(s.connect_failures, 2);
    assert_int_equal(s.connects, 0);
    kvx_transport_destroy(a);
    region_free(&ra);
    region_free(&rb);
}

/* A peer that never answers: the call returns at once, the outcome stays
 * PENDING (timeout_ms waits that long), and fails by connect_timeout_ms + 10 %. */
static void test_async_silent_peer(void **state) {
    (void)state;
    if (skip_unless_tcp()) return;
    enum { TIMEOUT = 800 };
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=800", NULL));
    metablob mb;
    int hole;
    kvx_transport *b = silent_target(&rb, &mb, &hole);
    uint64_t start = now_ms(), reg;
    async_add(a, "silent", &mb, 0, &reg);
    uint64_t took = now_ms() - start;
    print_message("kvx_add_remote_peer_async returned after %llu ms\n", (unsigned long long)took);
    assert_true(took < 50);
    int err = 0;
    assert_int_equal(status_of(a, reg, 0, &err), KVX_REGISTRATION_PENDING);
    uint64_t t0 = now_ms();
    assert_int_equal(status_of(a, reg, 100, &err), KVX_REGISTRATION_PENDING);
    assert_true(now_ms() - t0 >= 100);
    assert_int_equal(status_of(a, reg, -1, &err), KVX_REGISTRATION_FAILED);
    uint64_t total = now_ms() - start;
    print_message("silent peer: FAILED (%s) after %llu ms (connect_timeout_ms %d)\n", kvx_strerror(err),
                  (unsigned long long)total, TIMEOUT);
    assert_int_equal(kvx_error_scope_of(err), KVX_SCOPE_PEER);
    assert_true(total <= TIMEOUT + TIMEOUT / 10);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    close(hole);
    region_free(&ra);
    region_free(&rb);
}

/* remove cancels a registration in progress; close fails one with ECLOSED.
 * Both call the attempt off: close does not wait out connect_timeout_ms
 * (60 s here) for an attempt that hangs on a silent peer. */
static void test_async_cancel_and_close(void **state) {
    (void)state;
    if (skip_unless_tcp()) return;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=60000", NULL));
    metablob mb;
    int hole;
    kvx_transport *b = silent_target(&rb, &mb, &hole);
    uint64_t reg, reg2;
    async_add(a, "p", &mb, 0, &reg);
    CHECK_OK(kvx_remove_remote_peer(a, "p"));
    int err = 0;
    assert_int_equal(status_of(a, reg, 0, &err), KVX_REGISTRATION_FAILED); /* at once */
    assert_int_equal(err, KVX_ECANCELED);
    CHECK_ERR(kvx_remove_remote_peer(a, "p"), KVX_ENOENT);
    async_add(a, "q", &mb, 0, &reg2);
    uint64_t t0 = now_ms();
    CHECK_OK(kvx_transport_close(a)); /* calls the attempt off, and waits for it to end */
    const uint64_t took = now_ms() - t0;
    print_message("close with a registration hanging on a silent peer: %llu ms\n", (unsigned long long)took);
    assert_true(took < 30000); /* not the 60 s connect timeout */
    assert_int_equal(status_of(a, reg2, 0, &err), KVX_REGISTRATION_FAILED);
    assert_int_equal(err, KVX_ECLOSED);
    uint64_t reg3;
    CHECK_ERR(kvx_add_remote_peer_async(&reg3, a, "r", mb.bytes, mb.len, mb.base, mb.nb, mb.bl, 0), KVX_ECLOSED);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    close(hole);
    region_free(&ra);
    region_free(&rb);
}

/* A synchronous kvx_add_remote_peer() in another thread, hanging on a silent
 * peer: close calls it off and returns only once the add is done with the
 * transport (it returns KVX_ECLOSED), not while the attempt still runs on
 * the closed transport. The transport is destroyed right after close, before
 * the add's thread is joined: an add still using it is a use after free,
 * which the sanitizer stages catch. (Whether the add's thread has got back
 * to its caller by then is up to the scheduler: not asserted.) */
typedef struct {
    kvx_transport *t;
    const metablob *m;
    int rc;
    atomic_int returned;
} sync_add;

static void *sync_add_run(void *arg) {
    sync_add *s = arg;
    s->rc = kvx_add_remote_peer(s->t, "slow", s->m->bytes, s->m->len, s->m->base, s->m->nb, s->m->bl);
    atomic_store(&s->returned, 1);
    return NULL;
}

static void test_close_waits_for_sync_add(void **state) {
    (void)state;
    if (skip_unless_tcp()) return;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=60000", NULL));
    metablob mb;
    int hole;
    kvx_transport *b = silent_target(&rb, &mb, &hole);
    sync_add s = {.t = a, .m = &mb};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sync_add_run, &s), 0);
    kvx_stats st = KVX_STATS_INIT;
    for (int i = 0; i < 5000 && st.peers_connecting == 0; i++) {
        CHECK_OK(kvx_get_stats(&st, a, NULL));
        if (st.peers_connecting == 0) usleep(1000);
    }
    assert_int_equal(st.peers_connecting, 1);
    usleep(50 * 1000); /* inside the connection attempt */
    const uint64_t t0 = now_ms();
    CHECK_OK(kvx_transport_close(a));
    const int returned = atomic_load(&s.returned);
    print_message("close with a synchronous add hanging: %llu ms, the add %s\n",
                  (unsigned long long)(now_ms() - t0), returned ? "had returned" : "was returning");
    kvx_transport_destroy(a); /* before the join: the add must be done with it */
    pthread_join(th, NULL);
    assert_int_equal(s.rc, KVX_ECLOSED);
    kvx_transport_destroy(b);
    close(hole);
    region_free(&ra);
    region_free(&rb);
}

/* KVX_PEER_REPLACE: a registered peer's transfers fail and the new
 * registration takes the id; a registration in progress is superseded and
 * never publishes, even though its peer answers later. */
static void test_replace_and_supersede(void **state) {
    (void)state;
    if (skip_unless_tcp()) return;
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2), rc = region_new(NB, BL, 3);
    kvx_transport *a = transport_new(&ra, NULL, test_options("connect_timeout_ms=1500", NULL));
    kvx_transport *b = transport_new(&rb, NULL, NULL);
    metablob mb, mc;
    get_meta(b, &mb);
    int hole;
    kvx_transport *c = silent_target(&rc, &mc, &hole);
    add_peer(a, "p", &mb);
    uint64_t l[NB], r[NB], ids[8];
    for (uint64_t i = 0; i < NB; i++) l[i] = r[i] = i;
    for (int i = 0; i < 8; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "p", l, r, NB));
    /* replace p by the silent one: p's transfers end (failed unless done) */
    uint64_t slow, fast;
    async_add(a, "p", &mc, KVX_PEER_REPLACE, &slow);
    write_one(a, "p", 0, 0, 0); /* not registered while it connects */
    size_t nf;
    assert_int_equal(wait_ids(a, NULL, ids, 8, 20000, &nf, NULL), 8);
    /* supersede the silent registration with a good one */
    async_add(a, "p", &mb, KVX_PEER_REPLACE, &fast);
    int err = 0;
    assert_int_equal(status_of(a, slow, 0, &err), KVX_REGISTRATION_FAILED);
    assert_int_equal(err, KVX_ECANCELED);
    assert_int_equal(status_of(a, fast, -1, &err), KVX_REGISTRATION_DONE);
    for (uint64_t i = 0; i < NB; i++) fill_block(ra.base + i * BL, BL, i, 9);
    write_one(a, "p", 5, 6, 1);
    assert_true(block_matches(rb.base + 6 * BL, BL, 5, 9));
    kvx_stats s = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, a, "p"));
    assert_int_equal(s.connects, 2); /* replace keeps counting */
    assert_int_equal(s.peers, 1);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kvx_transport_destroy(c);
    close(hole);
    region_free(&ra);
    region_free(&rb);
    region_free(&rc);
}

/* ------------------------------------------------------------ stats */

static void check_histogram(const kvx_stats *s) {
    uint64_t sum = 0;
    for (int i = 0; i < KVX_STATS_LATENCY_BUCKETS; i++) sum += s->latency_buckets[i];
    assert_int_equal(sum, s->latency_count);
    assert_true(s->latency_ns_p50 <= s->latency_ns_p90 && s->latency_ns_p90 <= s->latency_ns_p99);
    assert_true(s->latency_ns_p99 <= s->latency_ns_p999 && s->latency_ns_p999 <= s->latency_ns_max);
    assert_true(s->latency_count == 0 || s->latency_ns_p50 > 0);
}

static void test_stats_add_up(void **state) {
    (void)state;
    enum { N = 100 };
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL);
    metablob mb;
    get_meta(b, &mb);
    add_peer(a, "b", &mb);
    uint64_t ids[N + 1], l[4] = {0, 1, 2, 3}, r[4] = {10, 11, 12, 13};
    for (int i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "b", l, r, 4));
    CHECK_OK(kvx_write_blocks(&ids[N], a, "b", NULL, NULL, 0));
    size_t nf;
    assert_int_equal(wait_ids(a, NULL, ids, N + 1, 20000, &nf, NULL), N + 1);
    kvx_stats s = KVX_STATS_INIT, p = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    CHECK_OK(kvx_get_stats(&p, a, "b"));
    assert_int_equal(s.size, sizeof s);
    assert_int_equal(s.transfers_done, N + 1);
    assert_int_equal(s.bytes_done, (uint64_t)N * 4 * BL);
    assert_int_equal(s.transfers_failed + s.transfers_cancelled + s.transfers_inflight + s.bytes_inflight, 0);
    assert_int_equal(s.latency_count, N); /* the empty transfer has no latency */
    assert_int_equal(s.peers, 1);
    assert_int_equal(s.connects, 1);
    assert_true(s.connect_ns_total > 0 && s.connect_ns_last == s.connect_ns_total);
    assert_memory_equal(&s, &p, sizeof s); /* one peer: the same numbers */
    check_histogram(&s);
    print_message("%d transfers: p50 %llu ns, p99 %llu ns, max %llu ns; connect %llu ns\n", N,
                  (unsigned long long)s.latency_ns_p50, (unsigned long long)s.latency_ns_p99,
                  (unsigned long long)s.latency_ns_max, (unsigned long long)s.connect_ns_last);
    /* caller-sized: an older, smaller struct gets the prefix and nothing more */
    uint64_t small[4] = {3 * sizeof(uint64_t), 0, 0, 0xabcd};
    CHECK_OK(kvx_get_stats((kvx_stats *)small, a, NULL));
    assert_int_equal(small[0], 3 * sizeof(uint64_t));
    assert_int_equal(small[1], N + 1);
    assert_int_equal(small[3], 0xabcd);
    small[0] = 4;
    CHECK_ERR(kvx_get_stats((kvx_stats *)small, a, NULL), KVX_EINVAL);
    CHECK_ERR(kvx_get_stats(&s, a, "nobody"), KVX_ENOENT);
    CHECK_ERR(kvx_get_stats(NULL, a, NULL), KVX_EINVAL);
    /* remove forgets the peer's counters, the transport's stay */
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    CHECK_ERR(kvx_get_stats(&p, a, "b"), KVX_ENOENT);
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    assert_int_equal(s.transfers_done, N + 1);
    assert_int_equal(s.peers, 0);
    /* readable after close */
    CHECK_OK(kvx_transport_close(a));
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    assert_int_equal(s.transfers_done, N + 1);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_stats_failed_and_cancelled(void **state) {
    (void)state;
    enum { N = 40 };
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2);
    kvx_transport *a = transport_new(&ra, NULL, NULL), *b = transport_new(&rb, NULL, NULL);
    metablob mb;
    get_meta(b, &mb);
    add_peer(a, "b", &mb);
    uint64_t ids[N], l[NB], r[NB];
    for (uint64_t i = 0; i < NB; i++) l[i] = r[i] = i;
    for (int i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "b", l, r, NB));
    size_t n = 0;
    CHECK_OK(kvx_cancel(&n, a, ids, N / 2, KVX_CANCEL_IMMEDIATE, NULL));
    kvx_stats s = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    assert_true(s.transfers_cancelled >= 1 || s.transfers_done >= 1); /* some may have finished first */
    CHECK_OK(kvx_remove_remote_peer(a, "b")); /* the rest end now: done or failed */
    size_t nf;
    wait_ids(a, NULL, ids + N / 2, N / 2, 20000, &nf, NULL);
    CHECK_OK(kvx_get_stats(&s, a, NULL));
    assert_int_equal(s.transfers_done + s.transfers_failed + s.transfers_cancelled, N);
    assert_int_equal(s.bytes_done + s.bytes_failed + s.bytes_cancelled, (uint64_t)N * NB * BL);
    assert_int_equal(s.transfers_inflight, 0);
    assert_int_equal(s.bytes_inflight, 0);
    assert_true(s.transfers_cancelled <= N / 2);
    print_message("done %llu, failed %llu, cancelled %llu\n", (unsigned long long)s.transfers_done,
                  (unsigned long long)s.transfers_failed, (unsigned long long)s.transfers_cancelled);
    check_histogram(&s);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_success),
        cmocka_unit_test(test_async_refused),
        cmocka_unit_test(test_async_silent_peer),
        cmocka_unit_test(test_async_cancel_and_close),
        cmocka_unit_test(test_close_waits_for_sync_add),
        cmocka_unit_test(test_replace_and_supersede),
        cmocka_unit_test(test_stats_add_up),
        cmocka_unit_test(test_stats_failed_and_cancelled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
