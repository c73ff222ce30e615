/* A network partition between two hosts, for real: the test makes two network
 * namespaces joined by a veth pair, runs the target (a forked child) in one
 * and the initiator in the other, and cuts the link mid-transfer, once with
 * `ip link set down` and once with an nft rule that drops every packet (a
 * silent peer: no reset, no error, nothing). Every transfer surfaces exactly
 * once; those that fail do so within transfer_timeout_ms + 10 % of the cut;
 * after the link returns, removing and re-adding the peer works and bytes
 * land intact. Only the namespaces and addresses the test made are touched,
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

#define NB 64
#define BL (1u << 20)
#define TIMEOUT_MS 2000
#define BURST 512

static char ns_a[32], ns_b[32];

static int sh(const char *fmt, ...) {
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) print_message("partition: '%s' exited %d\n", cmd, rc);
    return rc;
}

static void enter(const char *ns) {
    char path[96];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(setns(fd, CLONE_NEWNET), 0);
    close(fd);
}

static void cleanup(void) {
    if (!ns_a[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a, ns_b);
    if (system(cmd) != 0) fprintf(stderr, "partition: cleanup of %s, %s failed\n", ns_a, ns_b);
}

static int setup(void **state) {
    (void)state;
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1 && nft --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "partition: needs root, iproute2 and nftables: skipped\n");
        exit(77);
    }
    snprintf(ns_a, sizeof ns_a, "kvxpa%d", (int)getpid());
    snprintf(ns_b, sizeof ns_b, "kvxpb%d", (int)getpid());
    atexit(cleanup);
    setenv("KVX_TEST_LISTEN", "0.0.0.0:0", 1);  /* the target advertises its veth address */
    int p = (int)getpid() % 250 + 1;  /* 10.213.P.0/24: only inside our own namespaces */
    if (sh("ip netns add %s && ip netns add %s", ns_a, ns_b) ||
        sh("ip link add va%d netns %s type veth peer name vb%d netns %s", p, ns_a, p, ns_b) ||
        sh("ip -n %s addr add 10.213.%d.1/24 dev va%d && ip -n %s link set va%d up && ip -n %s link set lo up", ns_a,
           p, p, ns_a, p, ns_a) ||
        sh("ip -n %s addr add 10.213.%d.2/24 dev vb%d && ip -n %s link set vb%d up && ip -n %s link set lo up", ns_b,
           p, p, ns_b, p, ns_b))
        return -1;
    return 0;
}

static void cut_link_down(int p) { assert_int_equal(sh("ip -n %s link set va%d down", ns_a, p), 0); }
static void heal_link_down(int p) { assert_int_equal(sh("ip -n %s link set va%d up", ns_a, p), 0); }
static void cut_drop(int p) {
    (void)p;
    assert_int_equal(sh("ip netns exec %s nft add table inet kvxcut && "
                        "ip netns exec %s nft add chain inet kvxcut in '{ type filter hook input priority 0; policy drop; }' && "
                        "ip netns exec %s nft add chain inet kvxcut out '{ type filter hook output priority 0; policy drop; }'",
                        ns_a, ns_a, ns_a),
                     0);
}
static void heal_drop(int p) {
    (void)p;
    assert_int_equal(sh("ip netns exec %s nft delete table inet kvxcut", ns_a), 0);
}

/* One cut: a burst in flight, the cut, every id surfaces, failures within the
 * bound; then the link heals and a re-added peer moves verified bytes. */
static void partition(void (*cut)(int), void (*heal)(int), const char *what) {
    int p = (int)getpid() % 250 + 1;
    enter(ns_b);
    child_target c;
    child_start(&c, NB, BL, NULL);
    enter(ns_a);
    region r = region_new(NB, BL, 0);
    for (uint64_t i = 0; i < NB; i++) fill_block(r.base + i * BL, BL, i, 3);
    kvx_transport *a = transport_new(&r, NULL, test_options("transfer_timeout_ms=2000", NULL));
    add_peer(a, "t", &c.meta);
    static uint64_t ids[BURST];
    for (uint64_t i = 0; i < BURST; i++) {
        uint64_t l = i % NB, rm = i % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &l, &rm, 1));
    }
    usleep(20000);
    cut(p);
    uint64_t t_cut = now_ms();
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "t", ids, BURST, 10 * TIMEOUT_MS, &nf, NULL), BURST);
    uint64_t ms = now_ms() - t_cut;
    print_message("%s: %zu of %d transfers failed, the last surfaced %llu ms after the cut (timeout %d ms)\n", what,
                  nf, BURST, (unsigned long long)ms, TIMEOUT_MS);
    assert_true(nf > 0);
    assert_true(ms <= TIMEOUT_MS + TIMEOUT_MS / 10);
    heal(p);
    CHECK_OK(kvx_remove_remote_peer(a, "t"));
    add_peer(a, "t", &c.meta);
    uint64_t l = 5, rm = 6, id;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 30000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    enter(ns_a);
    assert_true(child_verify(&c, 6, 5, 3));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

static void test_link_down(void **state) {
    (void)state;
    partition(cut_link_down, heal_link_down, "link down");
}

static void test_silent_drop(void **state) {
    (void)state;
    partition(cut_drop, heal_drop, "nft drop");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_link_down),
        cmocka_unit_test(test_silent_drop),
    };
    return cmocka_run_group_tests_name("adversarial_partition", tests, setup, NULL);
}
