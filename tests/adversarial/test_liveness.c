/* A peer host that vanishes without a FIN is noticed: the tcp target (a
 * forked child in one network namespace) holds an idle authenticated
 * connection from an initiator in another, joined by a veth pair; an nft rule
 * then drops every packet of the initiator's namespace (no FIN, no reset,
 * nothing). The target's socket count returns to its baseline within the
 * kernel's give-up time derived from transfer_timeout_ms T (docs/semantics.md,
 * "Timers": TCP_USER_TIMEOUT = 3T + 1 s; keepalive probes
 * a second apart) + 15 % (the timer fires late). Not sooner than T: an
 * outage shorter than the stall timeout must not end a connection. Also with
 * transfers in flight when the link goes silent.
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
#include "netns.h"

#define NB 16
#define BL (1u << 20)
#define TIMEOUT_MS 2000
/* TCP_USER_TIMEOUT for TIMEOUT_MS, and when the target must have let go */
#define GIVE_UP_MS (3 * TIMEOUT_MS + 1000)
#define BOUND_MS ((GIVE_UP_MS + 1000) * 115 / 100)

static netns_pair g_ns;

static int setup(void **state) {
    (void)state;
    if (strcmp(test_backend(), "tcp") != 0) {
        fprintf(stderr, "liveness: tcp only: skipped\n");
        exit(77);
    }
    if (!netns_usable("liveness", "nft --version >/dev/null 2>&1")) exit(77); /* skipped */
    return netns_pair_make(&g_ns, "liveness", 214);
}

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

/* The target's sockets back at base; ms from the cut, or -1 after twice the bound. */
static long released_after(pid_t pid, int base, uint64_t t_cut) {
    while (now_ms() - t_cut < 2 * BOUND_MS) {
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
    netns_enter(g_ns.b);
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    int base = count_sockets(c.pid);
    netns_enter(g_ns.a);
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
    netns_drop_all(&g_ns, g_ns.a);
    uint64_t t_cut = now_ms();
    long ms = released_after(c.pid, base, t_cut);
    print_message("%s: the target held %d connection(s); released %ld ms after the cut (timeout %d ms, bound %d)\n",
                  what, held - base, ms, TIMEOUT_MS, BOUND_MS);
    if (busy) assert_int_equal(wait_ids(a, "t", ids, (size_t)busy, 10 * TIMEOUT_MS, &nf, NULL), (size_t)busy);
    assert_true(ms >= TIMEOUT_MS && ms <= BOUND_MS);
    netns_pass_all(&g_ns, g_ns.a);
    kvx_transport_destroy(a);
    netns_enter(g_ns.b);
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
