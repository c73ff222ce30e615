/* Two tcp rails between two network namespaces ("hosts") joined by two veth
 * pairs, each through its own token-bucket rate limit (tbf): the writer
 * serves `tcp.interfaces=all`, so the peer gets one stream per rail, and
 * transfers are spread over both (docs/semantics.md, "Rails").
 * - Both rails carry bytes; the bytes the rails report add up.
 * - A rail lost mid-stream, two ways (its interface set down at the writer;
 *   every packet of it dropped at both ends, a silent path): no transfer
 *   fails, each id surfaces once, every block holds what was written last;
 *   the rail shows taken out; it is dialled again and carries bytes again
 *   once the path is back, with no remove or re-add.
 * - A rail whose path is silent when the peer is added: the add succeeds on
 *   the other, and the silent one joins when its path returns.
 * - The target closes the lost stream when a surviving one says so (FENCE):
 *   blocks written again through the survivor after the fault keep their
 *   new content once the lost path is back.
 * Only the namespaces and addresses the test made are touched. Needs root,
 * iproute2, tc and nftables (exits 77, skipped, without them). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "netns.h"

#define NB 64
#define BL (256u << 10)
#define BURST 256
#define RATE "200mbit" /* per rail: 25 MB/s, a burst takes about 1.3 s on two */

static netns_pair g_ns;

static int setup(void **state) {
    (void)state;
    if (!netns_usable("tcp_rails", "tc -V >/dev/null 2>&1 && nft --version >/dev/null 2>&1")) exit(77);
    if (netns_pair_make(&g_ns, "tcprail", 216) || netns_pair_add_link(&g_ns, 217)) return -1;
    const char *dev[2] = {g_ns.dev_a, g_ns.dev_a2};
    for (int i = 0; i < 2; i++)
        if (netns_sh(&g_ns, "ip netns exec %s tc qdisc add dev %s root tbf rate %s burst 256kb latency 100ms", g_ns.a,
                     dev[i], RATE))
            return -1;
    return 0;
}

typedef struct rig {
    child_target c;
    region r;
    kvx_transport *a;
} rig;

static void rig_up(rig *g) {
    netns_enter(g_ns.b);
    child_start(&g->c, NB, BL, NULL);
    netns_enter(g_ns.a);
    g->r = region_new(NB, BL, 0);
    g->a = transport_new(&g->r, NULL,
                         test_options("tcp.interfaces=all transfer_timeout_ms=5000 peer_redial_ms=300 "
                                      "connect_timeout_ms=1000",
                                      NULL));
    add_peer(g->a, "t", &g->c.meta);
}

static void rig_down(rig *g) {
    kvx_transport_destroy(g->a);
    assert_int_equal(child_stop(&g->c), 0);
    assert_true(region_guards_ok(&g->r));
    region_free(&g->r);
}

static size_t rails(rig *g, kvx_rail_stats *out) {
    size_t n = 99;
    CHECK_OK(kvx_peer_rails(g->a, "t", out, 4, &n));
    return n;
}

static void print_rails(rig *g) {
    kvx_rail_stats r[4];
    size_t n = rails(g, r);
    for (size_t i = 0; i < n && i < 4; i++)
        print_message("rail %s: up %u, %llu bytes in %llu parts, %u failure(s)\n", r[i].name, r[i].up,
                      (unsigned long long)r[i].bytes, (unsigned long long)r[i].parts, r[i].failures);
}

/* BURST transfers of block i % NB (filled with seed) to the same block. */
static void submit(rig *g, uint32_t seed, uint64_t *ids) {
    for (uint64_t i = 0; i < NB; i++) fill_block(g->r.base + i * BL, BL, i, seed);
    for (uint64_t i = 0; i < BURST; i++) {
        uint64_t b = i % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], g->a, "t", &b, &b, 1));
    }
}

static void settle_burst(rig *g, const uint64_t *ids, uint32_t seed, const char *what) {
    size_t nf = 99;
    assert_int_equal(wait_ids(g->a, "t", ids, BURST, 60000, &nf, NULL), BURST);
    print_message("%s: %zu of %d transfers failed\n", what, nf, BURST);
    assert_int_equal(nf, 0);
    netns_enter(g_ns.a);
    for (uint64_t i = 0; i < NB; i++)
        if (!child_verify(&g->c, i, i, seed)) fail_msg("%s: block %llu has wrong content", what, (unsigned long long)i);
}

static void test_both_rails_carry(void **state) {
    (void)state;
    rig g;
    rig_up(&g);
    kvx_rail_stats r[4];
    assert_int_equal(rails(&g, r), 2);
    static uint64_t ids[BURST];
    submit(&g, 1, ids);
    settle_burst(&g, ids, 1, "two rails");
    print_rails(&g);
    assert_int_equal(rails(&g, r), 2);
    assert_true(strstr(r[0].name, g_ns.dev_a) != NULL || strstr(r[1].name, g_ns.dev_a) != NULL);
    assert_true(strstr(r[0].name, g_ns.dev_a2) != NULL || strstr(r[1].name, g_ns.dev_a2) != NULL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].up, 1);
        assert_int_equal(r[i].failures, 0);
        assert_true(r[i].bytes > 0);
    }
    assert_int_equal(r[0].bytes + r[1].bytes, (uint64_t)BURST * BL);
    rig_down(&g);
}

static void down_at_writer(void) {
    assert_int_equal(netns_sh(&g_ns, "ip -n %s link set %s down", g_ns.a, g_ns.dev_a2), 0);
}
static void up_at_writer(void) {
    assert_int_equal(netns_sh(&g_ns, "ip -n %s link set %s up", g_ns.a, g_ns.dev_a2), 0);
}
/* Every packet of the second rail dropped at both ends: no error anywhere. */
static void drop_rail(void) {
    const char *ns[2] = {g_ns.a, g_ns.b}, *dev[2] = {g_ns.dev_a2, g_ns.dev_b2};
    for (int i = 0; i < 2; i++)
        assert_int_equal(netns_sh(&g_ns,
                                  "ip netns exec %s nft add table inet kvxrail && "
                                  "ip netns exec %s nft add chain inet kvxrail in '{ type filter hook input priority 0; }' && "
                                  "ip netns exec %s nft add rule inet kvxrail in iifname %s drop && "
                                  "ip netns exec %s nft add chain inet kvxrail out '{ type filter hook output priority 0; }' && "
                                  "ip netns exec %s nft add rule inet kvxrail out oifname %s drop",
                                  ns[i], ns[i], ns[i], dev[i], ns[i], ns[i], dev[i]),
                         0);
}
static void pass_rail(void) {
    const char *ns[2] = {g_ns.a, g_ns.b};
    for (int i = 0; i < 2; i++)
        assert_int_equal(netns_sh(&g_ns, "ip netns exec %s nft delete table inet kvxrail", ns[i]), 0);
}

/* The rail of dev_a2 (by name), or NULL. */
static const kvx_rail_stats *second(const kvx_rail_stats *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strstr(r[i].name, g_ns.dev_a2)) return &r[i];
    return NULL;
}

static void lose_rail(void (*cut)(void), void (*heal)(void), const char *what) {
    rig g;
    rig_up(&g);
    static uint64_t ids[BURST];
    submit(&g, 2, ids);
    usleep(300 * 1000); /* mid-stream: about a quarter of the burst is through */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const int64_t cut_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    cut();
    const uint64_t t_cut = now_ms();
    settle_burst(&g, ids, 2, what);
    print_message("%s: the burst ended %llu ms after the fault\n", what, (unsigned long long)(now_ms() - t_cut));
    print_rails(&g);
    kvx_rail_stats r[4];
    size_t n = rails(&g, r);
    assert_int_equal(n, 2);
    const kvx_rail_stats *lost = second(r, n);
    assert_non_null(lost);
    assert_int_equal(lost->up, 0);
    assert_true(lost->failures >= 1);
    print_message("%s: the rail was taken out %lld ms after the fault\n", what,
                  (long long)((lost->changed_ns - cut_ns) / 1000000));
    const uint64_t before = lost->bytes;

    /* Through the survivor, new content into every block; the lost stream
     * is closed at the target, so nothing of it lands once its path is back. */
    const uint64_t t_one = now_ms();
    submit(&g, 3, ids);
    settle_burst(&g, ids, 3, what);
    print_message("%s: the survivor alone moved %d x %u KiB at %.1f MB/s (its limit: %s)\n", what, BURST, BL >> 10,
                  (double)BURST * BL / 1e3 / (double)(now_ms() - t_one), RATE);
    heal();
    const uint64_t t_heal = now_ms();
    do {
        usleep(50 * 1000);
        n = rails(&g, r);
        lost = second(r, n);
    } while (!lost->up && now_ms() - t_heal < 20000);
    print_message("%s: the rail is up again %llu ms after the path came back\n", what,
                  (unsigned long long)(now_ms() - t_heal));
    assert_int_equal(lost->up, 1);
    usleep(500 * 1000); /* what the old stream might land, given the time */
    netns_enter(g_ns.a);
    for (uint64_t i = 0; i < NB; i++)
        if (!child_verify(&g.c, i, i, 3)) fail_msg("%s: block %llu changed after the path came back", what, (unsigned long long)i);

    /* It carries bytes again. */
    submit(&g, 4, ids);
    settle_burst(&g, ids, 4, what);
    print_rails(&g);
    n = rails(&g, r);
    lost = second(r, n);
    assert_true(lost->bytes > before);
    rig_down(&g);
}

static void test_rail_down(void **state) {
    (void)state;
    lose_rail(down_at_writer, up_at_writer, "interface down at the writer");
}

static void test_rail_silent(void **state) {
    (void)state;
    lose_rail(drop_rail, pass_rail, "every packet of the rail dropped");
}

/* A rail whose path drops everything when the peer is added: the rails
 * connect each in its own thread, so the add waits for the silent one at
 * most connect_timeout_ms and succeeds on the other; the silent rail shows
 * down, and joins once its path returns. */
static void test_rail_dead_at_add(void **state) {
    (void)state;
    drop_rail();
    rig g;
    const uint64_t t0 = now_ms();
    rig_up(&g); /* connect_timeout_ms=1000 */
    print_message("added in %llu ms with the second rail's path dropping everything\n",
                  (unsigned long long)(now_ms() - t0));
    kvx_rail_stats r[4];
    size_t n = rails(&g, r);
    assert_int_equal(n, 2);
    assert_int_equal(second(r, n)->up, 0);
    static uint64_t ids[BURST];
    submit(&g, 5, ids);
    settle_burst(&g, ids, 5, "one rail of two at the add");
    pass_rail();
    const uint64_t t_heal = now_ms();
    do {
        usleep(50 * 1000);
        n = rails(&g, r);
    } while (!second(r, n)->up && now_ms() - t_heal < 20000);
    print_message("the second rail joined %llu ms after its path came back\n", (unsigned long long)(now_ms() - t_heal));
    assert_int_equal(second(r, n)->up, 1);
    const uint64_t before = second(r, n)->bytes;
    submit(&g, 6, ids);
    settle_burst(&g, ids, 6, "both rails after the join");
    n = rails(&g, r);
    assert_true(second(r, n)->bytes > before);
    rig_down(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_rails_carry),
        cmocka_unit_test(test_rail_down),
        cmocka_unit_test(test_rail_silent),
        cmocka_unit_test(test_rail_dead_at_add),
    };
    if (getenv("KVX_TEST_FILTER")) cmocka_set_test_filter(getenv("KVX_TEST_FILTER"));
    return cmocka_run_group_tests_name("adversarial_tcp_rails", tests, setup, NULL);
}
