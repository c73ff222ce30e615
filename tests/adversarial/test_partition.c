/* A network partition between two hosts, for real: the test makes two network
 * namespaces joined by a veth pair, runs the target (a forked child) in one
 * and the initiator in the other, and cuts the link mid-transfer, once with
 * `ip link set down` and once with an nft rule that drops every packet (a
 * silent peer: no reset, no error, nothing). Every transfer surfaces exactly
 * once; those that fail do so within the stall timeout's grace for a silent
 * network (docs/semantics.md, "Timers": at most 3T for a timeout T; 2T +
 * 500 ms on this idle link) + 10 % of the cut. Meanwhile the peer stays
 * registered, reconnecting: writes fail at once with KVX_EPEERBROKEN. After
 * the link returns it is up again by itself (link down; no remove, no
 * re-add), or removing and re-adding it works (nft drop), and bytes land
 * intact. A cut shorter than the timeout (1.5 s of
 * 2 s), healed, fails nothing: every transfer lands, with no re-add; so does
 * one that begins while the target's receive window is closed. Only the namespaces and addresses the test made are touched,
 * and it removes them on the way out. Needs root and iproute2 + nftables
 * (exits 77, skipped, without them). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "netns.h"

#define NB 64
#define BL (1u << 20)
#define TIMEOUT_MS 2000
#define GRACE_MS (3 * TIMEOUT_MS) /* the longest grace */
#define BURST 512

static netns_pair g_ns;

static int setup(void **state) {
    (void)state;
    if (!netns_usable("partition", "nft --version >/dev/null 2>&1")) exit(77); /* skipped */
    return netns_pair_make(&g_ns, "partition", 213);
}

static void cut_link_down(void) { assert_int_equal(netns_sh(&g_ns, "ip -n %s link set %s down", g_ns.a, g_ns.dev_a), 0); }
static void heal_link_down(void) { assert_int_equal(netns_sh(&g_ns, "ip -n %s link set %s up", g_ns.a, g_ns.dev_a), 0); }
static void cut_drop(void) { netns_drop_all(&g_ns, g_ns.a); }
static void heal_drop(void) { netns_pass_all(&g_ns, g_ns.a); }

/* The target in namespace b, our transport in a (blocks filled with seed),
 * and BURST transfers of block i % NB to the same block submitted into ids. */
static kvx_transport *burst(child_target *c, region *r, uint32_t seed, uint64_t *ids) {
    netns_enter(g_ns.b);
    child_start(c, NB, BL, NULL);
    netns_enter(g_ns.a);
    *r = region_new(NB, BL, 0);
    for (uint64_t i = 0; i < NB; i++) fill_block(r->base + i * BL, BL, i, seed);
    kvx_transport *a = transport_new(r, NULL, test_options("transfer_timeout_ms=2000 peer_redial_ms=500", NULL));
    add_peer(a, "t", &c->meta);
    for (uint64_t i = 0; i < BURST; i++) {
        uint64_t l = i % NB, rm = i % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &l, &rm, 1));
    }
    usleep(20000);
    return a;
}

/* One cut: a burst in flight, the cut, every id surfaces, failures within the
 * bound; then the link heals and a re-added peer moves verified bytes. */
static void partition(void (*cut)(void), void (*heal)(void), int readd, const char *what) {
    child_target c;
    region r;
    static uint64_t ids[BURST];
    kvx_transport *a = burst(&c, &r, 3, ids);
    cut();
    uint64_t t_cut = now_ms();
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "t", ids, BURST, 10 * TIMEOUT_MS, &nf, NULL), BURST);
    uint64_t ms = now_ms() - t_cut;
    print_message("%s: %zu of %d transfers failed, the last surfaced %llu ms after the cut (timeout %d ms, "
                  "grace at most %d ms)\n", what, nf, BURST, (unsigned long long)ms, TIMEOUT_MS, GRACE_MS);
    assert_true(nf > 0);
    assert_true(ms <= GRACE_MS + GRACE_MS / 10);
    /* the peer stays registered, down: writes fail at once, saying so */
    uint64_t l = 5, rm = 6, id;
    CHECK_ERR(kvx_write_blocks(&id, a, "t", &l, &rm, 1), KVX_EPEERBROKEN);
    assert_true(strstr(kvx_last_error_message(), "reconnecting") != NULL);
    kvx_peer_state st;
    CHECK_OK(kvx_get_peer_state(a, "t", &st));
    assert_int_equal(st.link, KVX_PEER_RECONNECTING);
    assert_true(st.error != 0 && st.reason[0] != 0);
    if (!readd) { /* the outage goes on: reconnection attempts fail meanwhile */
        uint64_t until = now_ms() + 10000;
        do {
            usleep(20 * 1000);
            CHECK_OK(kvx_get_peer_state(a, "t", &st));
        } while (st.attempts < 2 && now_ms() < until);
        print_message("%s: %u reconnection attempts failed during the outage (last: %s)\n", what, st.attempts,
                      st.reason);
        assert_true(st.attempts >= 2);
        assert_int_equal(st.link, KVX_PEER_RECONNECTING);
        CHECK_ERR(kvx_write_blocks(&id, a, "t", &l, &rm, 1), KVX_EPEERBROKEN);
    }
    heal();
    uint64_t t_heal = now_ms();
    if (readd) { /* removing a reconnecting peer ends its attempts; re-adding works */
        CHECK_OK(kvx_remove_remote_peer(a, "t"));
        add_peer(a, "t", &c.meta);
    } else { /* no remove, no re-add: it reconnects by itself */
        long up = wait_peer_link(a, "t", KVX_PEER_UP, 30000, &st);
        print_message("%s: peer up again %ld ms after the heal (peer_redial_ms=500, no write meanwhile)\n", what,
                      up);
        assert_true(up >= 0);
        assert_int_equal(st.reconnects, 1);
    }
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 30000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    print_message("%s: first write after the heal done %llu ms after it\n", what,
                  (unsigned long long)(now_ms() - t_heal));
    netns_enter(g_ns.a);
    assert_true(child_verify(&c, 6, 5, 3));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* A silent cut shorter than the stall timeout, healed: every transfer of
 * the burst lands (none fails), and the peer needs no re-add. The resend
 * that ends it comes when the kernel's doubling backoff says, up to twice
 * the cut later. behind_ms > 0: the target falls behind just before the
 * cut (stopped that long, as a starved target is, and resumed once the cut
 * is in place), so that its receive window is closed when the cut begins
 * and our kernel sends window probes into it instead of resending data. */
static void short_cut(int cut_ms, int behind_ms, const char *what) {
    child_target c;
    region r;
    static uint64_t ids[BURST];
    kvx_transport *a = burst(&c, &r, 4, ids);
    if (behind_ms > 0) {
        child_freeze(&c);
        usleep((useconds_t)behind_ms * 1000);
    }
    netns_drop_in(&g_ns, g_ns.a); /* in the middle: both kernels back off */
    netns_drop_in(&g_ns, g_ns.b);
    if (behind_ms > 0) assert_int_equal(kill(c.pid, SIGCONT), 0);
    usleep((useconds_t)cut_ms * 1000);
    netns_pass_all(&g_ns, g_ns.a);
    netns_pass_all(&g_ns, g_ns.b);
    size_t nf = 0;
    uint64_t t_heal = now_ms();
    assert_int_equal(wait_ids(a, "t", ids, BURST, 10 * TIMEOUT_MS, &nf, NULL), BURST);
    print_message("%s: %zu of %d transfers failed; the burst ended %llu ms after the heal\n", what, nf, BURST,
                  (unsigned long long)(now_ms() - t_heal));
    assert_int_equal(nf, 0);
    uint64_t l = 7, rm = 9, id; /* the same peer, no re-add */
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 10000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    netns_enter(g_ns.a);
    for (uint64_t i = 0; i < NB; i++)
        if (i != 9) assert_true(child_verify(&c, i, i, 4));
    assert_true(child_verify(&c, 9, 7, 4));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

static void test_short_cut(void **state) {
    (void)state;
    short_cut(1500, 0, "every packet lost for 1.5 s (timeout 2 s)");
}

/* The same with the target's window closed when the cut begins (a target
 * that fell behind on a loaded machine): the silence shows only as window
 * probes without an answer (docs/semantics.md, Timers). */
static void test_short_cut_closed_window(void **state) {
    (void)state;
    short_cut(1500, 300, "every packet lost for 1.5 s, the target's window closed (timeout 2 s)");
}

static void test_link_down(void **state) {
    (void)state;
    partition(cut_link_down, heal_link_down, 0, "link down");
}

static void test_silent_drop(void **state) {
    (void)state;
    partition(cut_drop, heal_drop, 1, "nft drop");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_down),
        cmocka_unit_test(test_silent_drop),
        cmocka_unit_test(test_short_cut),
        cmocka_unit_test(test_short_cut_closed_window),
    };
    if (getenv("KVX_TEST_FILTER")) cmocka_set_test_filter(getenv("KVX_TEST_FILTER")); /* e.g. "*short*" */
    return cmocka_run_group_tests_name("adversarial_partition", tests, setup, NULL);
}
