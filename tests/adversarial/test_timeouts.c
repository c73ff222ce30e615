/* Timeouts measure a stall, not a wait in a queue (tcp unless
 * KVX_TEST_BACKEND says otherwise; the target is a forked child):
 *   - a burst of 10,000 x 1 MiB submitted at once on a healthy link with
 *     transfer_timeout_ms=2000: all done, none failed, the peer not broken;
 *   - a SIGSTOPped target: every id fails within the timeout + 10 %, later
 *     writes say KVX_EPEERBROKEN and the peer is reconnecting; after SIGCONT
 *     it is up again by itself (no remove, no re-add) and moves bytes;
 *   - each failed id says why (kvx_poll_results): KVX_ETIMEDOUT for the
 *     frozen target, KVX_ECANCELED when its peer is removed, KVX_ECONNRESET
 *     when its process is killed; the stats count them by cause;
 *   - a SIGSTOPped initiator (stopped 2.4 x its timeout, three times) fails
 *     nothing: the time it did not run is not its healthy peer's stall. */
#include <sys/wait.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define BURST 10000
#define NB 64
#define BL (1u << 20)

static pid_t g_frozen;  /* killed at exit: a failed assertion never leaves it stopped */
static void kill_frozen(void) {
    if (g_frozen > 0) kill(g_frozen, SIGKILL);
}

static void test_burst_on_healthy_link(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    region r = region_new(NB, BL, 0);
    for (uint64_t i = 0; i < NB; i++) fill_block(r.base + i * BL, BL, i, 7);
    kvx_transport *a = transport_new(&r, NULL, test_options("transfer_timeout_ms=2000", NULL));
    add_peer(a, "t", &c.meta);
    uint64_t *ids = malloc(BURST * sizeof *ids);
    uint64_t t0 = now_ms();
    for (uint64_t i = 0; i < BURST; i++) {
        uint64_t l = i % NB, rm = (i * 7) % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &l, &rm, 1));
    }
    size_t nf = 0;
    size_t got = wait_ids(a, "t", ids, BURST, 600000, &nf, NULL);
    uint64_t ms = now_ms() - t0;
    print_message("burst: %d x 1 MiB in %llu ms (%.2f GB/s), %zu failed\n", BURST, (unsigned long long)ms,
                  BURST * (double)BL / 1e6 / (double)(ms ? ms : 1), nf);
    assert_int_equal(got, BURST);
    assert_int_equal(nf, 0);
    /* not broken: one more write goes through, and the bytes are right */
    uint64_t l = 3, rm = 5, id;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 60000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(child_verify(&c, 5, 3, 7));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    free(ids);
    region_free(&r);
}

static void test_frozen_target(void **state) {
    (void)state;
    enum { N = 32, TIMEOUT = 1000 };
    child_target c;
    child_start(&c, NB, BL, NULL);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, test_options("transfer_timeout_ms=1000 connect_timeout_ms=1000 peer_redial_ms=200", NULL));
    add_peer(a, "t", &c.meta);
    g_frozen = c.pid;
    atexit(kill_frozen);
    child_freeze(&c);
    uint64_t ids[N];
    uint64_t t0 = now_ms();
    for (uint64_t i = 0; i < N; i++) {
        uint64_t l = i, rm = i;
        CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &l, &rm, 1));
    }
    size_t nf = 0;
    int32_t codes[N];
    /* every id surfaces once; the ones that fit the socket buffers may not
     * have landed either, so all of them fail, each saying why */
    assert_int_equal(wait_results(a, "t", ids, N, 10 * TIMEOUT, &nf, codes), N);
    uint64_t ms = now_ms() - t0;
    print_message("frozen target: %d transfers failed after %llu ms (timeout %d ms)\n", N, (unsigned long long)ms,
                  TIMEOUT);
    assert_int_equal(nf, N);
    for (int i = 0; i < N; i++) assert_int_equal(codes[i], KVX_ETIMEDOUT);
    kvx_stats s = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, a, "t"));
    assert_int_equal(s.transfers_failed, N);
    assert_int_equal(s.transfers_failed_timeout, N);
    assert_int_equal(s.transfers_failed_connection + s.transfers_failed_removed + s.transfers_failed_other, 0);
    assert_true(ms >= TIMEOUT);
    assert_true(ms <= TIMEOUT + TIMEOUT / 10);
    /* the peer is down while frozen: writes fail at once, reconnection
     * attempts fail (the target does not answer its handshake) */
    uint64_t l = 0, rm = 0, id;
    CHECK_ERR(kvx_write_blocks(&id, a, "t", &l, &rm, 1), KVX_EPEERBROKEN);
    kvx_peer_state st;
    CHECK_OK(kvx_get_peer_state(a, "t", &st));
    assert_int_equal(st.link, KVX_PEER_RECONNECTING);
    assert_int_equal(st.error, KVX_ETIMEDOUT);
    assert_true(strstr(st.reason, "transfer_timeout_ms") != NULL);
    assert_int_equal(st.in_flight, 0);
    /* an attempt (peer_redial_ms=200) runs into the frozen target: its
     * handshake gets no answer within connect_timeout_ms */
    for (uint64_t until = now_ms() + 20000; st.attempts < 1 && now_ms() < until; usleep(20 * 1000))
        CHECK_OK(kvx_get_peer_state(a, "t", &st));
    print_message("frozen target: reconnection attempt %u failed: %s\n", st.attempts, st.reason);
    assert_true(st.attempts >= 1);
    assert_int_equal(st.link, KVX_PEER_RECONNECTING);
    CHECK_ERR(kvx_write_blocks(&id, a, "t", &l, &rm, 1), KVX_EPEERBROKEN);
    assert_int_equal(kill(c.pid, SIGCONT), 0);
    g_frozen = 0;
    /* resumed: it reconnects by itself, no remove, no re-add */
    long back = wait_peer_link(a, "t", KVX_PEER_UP, 20000, &st);
    print_message("frozen target resumed: peer up again %ld ms later\n", back);
    assert_true(back >= 0);
    assert_int_equal(st.reconnects, 1);
    assert_int_equal(st.error, 0);
    fill_block(r.base, BL, 0, 9);
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 60000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(child_verify(&c, 0, 0, 9));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* Why a transfer failed (kvx_poll_results): a frozen target's peer removed
 * with transfers in flight says KVX_ECANCELED for each; one killed with
 * transfers in flight, KVX_ECONNRESET (the stall timeout is far off). The
 * stats count them by cause, per peer and in total. */
static void test_failure_reasons(void **state) {
    (void)state;
    enum { N = 16 };
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, test_options("transfer_timeout_ms=60000 peer_redial_ms=0", NULL));
    const char *names[2] = {"removed", "killed"};
    const int32_t want[2] = {KVX_ECANCELED, KVX_ECONNRESET};
    for (int k = 0; k < 2; k++) {
        child_target c;
        child_start(&c, NB, BL, NULL);
        add_peer(a, names[k], &c.meta);
        g_frozen = c.pid;
        atexit(kill_frozen);
        child_freeze(&c);
        uint64_t ids[N];
        for (uint64_t i = 0; i < N; i++) {
            uint64_t l = i, rm = i;
            CHECK_OK(kvx_write_blocks(&ids[i], a, names[k], &l, &rm, 1));
        }
        if (k == 0) {
            CHECK_OK(kvx_remove_remote_peer(a, names[k]));
        } else {
            kill(c.pid, SIGKILL);
        }
        size_t nf = 0;
        int32_t codes[N];
        assert_int_equal(wait_results(a, NULL, ids, N, 30000, &nf, codes), N);
        assert_int_equal(nf, N);
        for (int i = 0; i < N; i++) assert_int_equal(codes[i], want[k]);
        print_message("peer %s with %d transfers in flight: each failed with %s\n", names[k], N, kvx_strerror(want[k]));
        kvx_stats s = KVX_STATS_INIT;
        if (k == 1) {
            CHECK_OK(kvx_get_stats(&s, a, names[k]));
            assert_int_equal(s.transfers_failed_connection, N);
            assert_int_equal(s.transfers_failed_timeout + s.transfers_failed_removed + s.transfers_failed_other, 0);
            CHECK_OK(kvx_remove_remote_peer(a, names[k]));
        }
        CHECK_OK(kvx_get_stats(&s, a, NULL));
        assert_int_equal(s.transfers_failed_removed, N);
        assert_int_equal(s.transfers_failed_connection, k == 1 ? N : 0);
        assert_int_equal(s.transfers_failed, s.transfers_failed_timeout + s.transfers_failed_connection +
                                                 s.transfers_failed_removed + s.transfers_failed_other);
        child_kill(&c);
        g_frozen = 0;
    }
    kvx_transport_destroy(a);
    region_free(&r);
}

/* The initiator, in a forked child of its own: writes for `ms` to the target
 * with 8 transfers in flight, reports "go" once it is under way, then exits
 * with the number of failed transfers (at most 100), or 101 when fewer than
 * `min_done` were done. */
static int write_for(const child_target *c, int go_fd, int ms) {
    region r = region_new(NB, BL, 0);
    kvx_options *o = NULL;
    if (kvx_options_create(&o) != 0 || kvx_options_set(o, "transfer_timeout_ms", "500") != 0) return 102;
    kvx_transport *a = NULL;
    if (kvx_transport_create(&a, r.base, r.nb, r.bl, NULL, o) != 0) return 103;
    if (kvx_add_remote_peer(a, "t", c->meta.bytes, c->meta.len, c->meta.base, c->meta.nb, c->meta.bl) != 0) return 104;
    uint64_t t0 = now_ms(), done = 0, failed = 0;
    size_t inflight = 0;
    int told = 0;
    while (now_ms() - t0 < (uint64_t)ms || inflight > 0) {
        while (inflight < 8 && now_ms() - t0 < (uint64_t)ms) {
            uint64_t id, l = (done + inflight) % NB;
            if (kvx_write_blocks(&id, a, "t", &l, &l, 1) != 0) return 105;
            inflight++;
        }
        if (!told && done >= 16) {
            if (write_full(go_fd, "g", 1) != 0) return 106;
            told = 1;
        }
        uint64_t d[16], f[16];
        size_t nd = 0, nf = 0;
        if (kvx_poll(&nd, &nf, a, "t", d, 16, f, 16) != 0) return 107;
        done += nd;
        failed += nf;
        inflight -= nd + nf;
        if (nd + nf == 0) usleep(200);
    }
    kvx_transport_destroy(a);
    kvx_options_destroy(o);
    region_free(&r);
    return failed > 0 ? (int)(failed > 100 ? 100 : failed) : done < 64 ? 101 : 0;
}

static void test_frozen_initiator(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t w = fork();
    assert_true(w >= 0);
    if (w == 0) {
        close(go[0]);
        _exit(write_for(&c, go[1], 6000));
    }
    close(go[1]);
    g_frozen = w;
    char b;
    assert_int_equal(read_full(go[0], &b, 1), 0); /* under way: transfers in flight */
    /* Whether the resumed watchdog or event loop runs first is a race: three
     * stops catch a watchdog that counts the pause most of the time. */
    for (int k = 0; k < 3; k++) {
        assert_int_equal(kill(w, SIGSTOP), 0);
        usleep(1200000); /* more than twice the initiator's timeout */
        assert_int_equal(kill(w, SIGCONT), 0);
        usleep(300000);
    }
    int st = 0;
    assert_int_equal(waitpid(w, &st, 0), w);
    g_frozen = 0;
    assert_true(WIFEXITED(st));
    print_message("initiator stopped 3 x 1200 ms (its timeout 500 ms): exit %d (0: nothing failed)\n", WEXITSTATUS(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(go[0]);
    assert_int_equal(child_stop(&c), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_on_healthy_link),
        cmocka_unit_test(test_frozen_target),
        cmocka_unit_test(test_failure_reasons),
        cmocka_unit_test(test_frozen_initiator),
    };
    return cmocka_run_group_tests_name("adversarial_timeouts", tests, NULL, NULL);
}
