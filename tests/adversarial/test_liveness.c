/* A peer host that vanishes without a FIN is noticed: the tcp target (a
 * forked child in one network namespace) holds an idle authenticated
 * connection from an initiator in another, joined by a veth pair; an nft rule
 * then drops every packet of the initiator's namespace (no FIN, no reset,
 * nothing). The target's socket count returns to its baseline within
 * transfer_timeout_ms + 10 %: keepalive and TCP_USER_TIMEOUT derived from
 * the timeout. Also with transfers in flight when the link goes silent.
 * Only the namespaces the test made are touched, and it removes them. Needs
 * root, iproute2 and nftables (exits 77, skipped, without them). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define NB 16
#define BL (1u << 20)
#define TIMEOUT_MS 2000

static char ns_a[32], ns_b[32];

static int sh(const char *fmt, ...) {
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0) print_message("liveness: '%s' exited %d\n", cmd, rc);
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
    if (system(cmd) != 0) fprintf(stderr, "liveness: cleanup of %s, %s failed\n", ns_a, ns_b);
}

static int setup(void **state) {
    (void)state;
    if (strcmp(test_backend(), "tcp") != 0) {
        fprintf(stderr, "liveness: tcp only: skipped\n");
        exit(77);
    }
    if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1 && nft --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "liveness: needs root, iproute2 and nftables: skipped\n");
        exit(77);
    }
    snprintf(ns_a, sizeof ns_a, "kvxla%d", (int)getpid());
    snprintf(ns_b, sizeof ns_b, "kvxlb%d", (int)getpid());
    atexit(cleanup);
    setenv("KVX_TEST_LISTEN", "0.0.0.0:0", 1); /* the target advertises its veth address */
    int p = (int)getpid() % 250 + 1;          /* 10.214.P.0/24: only inside our own namespaces */
    if (sh("ip netns add %s && ip netns add %s", ns_a, ns_b) ||
        sh("ip link add la%d netns %s type veth peer name lb%d netns %s", p, ns_a, p, ns_b) ||
        sh("ip -n %s addr add 10.214.%d.1/24 dev la%d && ip -n %s link set la%d up && ip -n %s link set lo up", ns_a,
           p, p, ns_a, p, ns_a) ||
        sh("ip -n %s addr add 10.214.%d.2/24 dev lb%d && ip -n %s link set lb%d up && ip -n %s link set lo up", ns_b,
           p, p, ns_b, p, ns_b))
        return -1;
    return 0;
}

static void cut(void) {
    assert_int_equal(sh("ip netns exec %s nft add table inet kvxlive && "
                        "ip netns exec %s nft add chain inet kvxlive in '{ type filter hook input priority 0; policy drop; }' && "
                        "ip netns exec %s nft add chain inet kvxlive out '{ type filter hook output priority 0; policy drop; }'",
                        ns_a, ns_a, ns_a),
                     0);
}

static void heal(void) { assert_int_equal(sh("ip netns exec %s nft delete table inet kvxlive", ns_a), 0); }

static int count_sockets(pid_t pid) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/%d/fd/%s", (int)pid, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k > 0 && strncmp(link, "socket:", 7) == 0) n++;
    }
    closedir(d);
    return n;
}

/* The target's sockets back at base; ms from the cut, or -1 after 5 x the timeout. */
static long released_after(pid_t pid, int base, uint64_t t_cut) {
    while (now_ms() - t_cut < 5 * TIMEOUT_MS) {
        if (count_sockets(pid) <= base) return (long)(now_ms() - t_cut);
        usleep(5000);
    }
    return -1;
}

/* streams: connections per peer; busy: transfers in flight at the cut. */
static void vanish(int streams, int busy, const char *what) {
    static const char *const opts[] = {"transfer_timeout_ms=2000", NULL};
    char s_opt[32];
    snprintf(s_opt, sizeof s_opt, "tcp.streams=%d", streams);
    enter(ns_b);
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    int base = count_sockets(c.pid);
    enter(ns_a);
    region r = region_new(NB, BL, 0);
    for (uint64_t i = 0; i < NB; i++) fill_block(r.base + i * BL, BL, i, 3);
    kvx_transport *a = transport_new(&r, NULL, test_options("transfer_timeout_ms=2000", s_opt, NULL));
    add_peer(a, "t", &c.meta);
    uint64_t l = 1, rm = 2, id;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 10000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    int held = count_sockets(c.pid);
    assert_int_equal(held, base + streams);
    usleep(1300000); /* idle past the first keepalive probe: the bound holds from any point of the cycle */
    static uint64_t ids[256];
    for (int i = 0; i < busy; i++) {
        uint64_t li = (uint64_t)i % NB;
        CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &li, &li, 1));
    }
    cut();
    uint64_t t_cut = now_ms();
    long ms = released_after(c.pid, base, t_cut);
    print_message("%s: the target held %d connection(s); released %ld ms after the cut (timeout %d ms, bound %d)\n",
                  what, held - base, ms, TIMEOUT_MS, TIMEOUT_MS + TIMEOUT_MS / 10);
    if (busy) assert_int_equal(wait_ids(a, "t", ids, (size_t)busy, 10 * TIMEOUT_MS, &nf, NULL), (size_t)busy);
    assert_true(ms >= 0 && ms <= TIMEOUT_MS + TIMEOUT_MS / 10);
    heal();
    kvx_transport_destroy(a);
    enter(ns_b);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

static void test_idle_peer_vanishes(void **state) {
    (void)state;
    vanish(1, 0, "idle, 1 stream");
}

static void test_idle_peer_vanishes_streams(void **state) {
    (void)state;
    vanish(4, 0, "idle, 4 streams");
}

static void test_busy_peer_vanishes(void **state) {
    (void)state;
    vanish(2, 200, "200 x 1 MiB in flight, 2 streams");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_peer_vanishes),
        cmocka_unit_test(test_idle_peer_vanishes_streams),
        cmocka_unit_test(test_busy_peer_vanishes),
    };
    return cmocka_run_group_tests_name("adversarial_liveness", tests, setup, NULL);
}
