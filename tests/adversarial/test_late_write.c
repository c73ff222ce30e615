/* Failed means it never lands (docs/semantics.md): once a transfer is
 * reported failed, or its peer removed, no byte of it reaches the target's
 * region any more, except at most the one chunk (256 KiB on tcp) the
 * target's receive thread was copying when the connection was reset.
 *
 * Trials, canaries in every block (the target's region is read straight from
 * its memory with process_vm_readv, also while it is frozen):
 *   - freeze: 16 x 1 MiB transfers in flight, the target SIGSTOPped at a
 *     random point of them, every id reported (those stuck fail by the stall
 *     timeout), the region read, the peer removed, the target resumed; then
 *     the blocks of failed transfers must not have changed at all (0 trials
 *     with a late byte). 200 trials with tcp.protection=aead (the default)
 *     and 100 with none.
 *   - remove: the same transfers, the peer removed at a random point while
 *     they are in flight (no freeze): 200 trials on loopback, 60 over a
 *     link with a queue (network namespaces, a token bucket).
 * Counts the blocks (and bytes) of failed transfers that changed after the
 * failure was reported, and asserts the bound; blocks outside the transfers
 * never change. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "netns.h"

#define NB 32                   /* blocks per region; transfers use 0..N-1 */
#define BL (1u << 20)
#define N 16                    /* transfers per trial, one block each */
#define TIMEOUT 150             /* transfer_timeout_ms: the stall that fails them */
#define CHUNK (256u << 10)      /* the target's landing unit */
/* The asserted bound, per trial: the one chunk the target was landing when
 * the reset reached it. The initiator reports a failure only after its
 * reset has had time to arrive (a round trip and its deviation, at least
 * 1 ms): before it did, a busy host (its softirq late) or a link with a
 * queue let the target land what was still in flight, up to 522,243 bytes
 * (two chunks) in one trial in about 500 under heavy load. */
#define BOUND CHUNK

static pid_t g_frozen; /* killed at exit: a failed assertion never leaves it stopped */
static void kill_frozen(void) {
    if (g_frozen > 0) kill(g_frozen, SIGKILL);
}

typedef struct totals {
    int trials, with_failures, failed, late_blocks, trials_with_late;
    uint64_t late_bytes, max_late_bytes;
} totals;

/* What every group of trials shares: a target child, our transport with
 * the peer added, the window the freeze or remove lands in, two snapshots,
 * how long the target may take to land what it still holds. */
typedef struct rig {
    child_target c;
    region r;
    kvx_transport *a;
    uint64_t window_us;
    useconds_t drain_us;
    uint8_t *before, *after;
    totals t;
} rig;

/* The target's blocks 0..N-1, read from its memory. */
static void snapshot(const child_target *c, uint8_t *out) {
    struct iovec local = {out, (size_t)N * BL};
    struct iovec remote = {(void *)(uintptr_t)c->meta.base, (size_t)N * BL};
    ssize_t r = process_vm_readv(c->pid, &local, 1, &remote, 1, 0);
    if (r != (ssize_t)((size_t)N * BL)) fail_msg("process_vm_readv of the target's region: %s", strerror(errno));
}

static uint64_t diff_bytes(const uint8_t *a, const uint8_t *b, size_t n) {
    uint64_t d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

/* Writes blocks 0..N-1 with this trial's content; returns their ids. */
static void submit_all(kvx_transport *a, region *r, uint32_t seed, uint64_t *ids) {
    for (uint64_t i = 0; i < N; i++) fill_block(r->base + i * BL, BL, i, seed);
    for (uint64_t i = 0; i < N; i++) CHECK_OK(kvx_write_blocks(&ids[i], a, "t", &i, &i, 1));
}

/* After the report (snapshot before) and the target's resumption: which
 * blocks of failed transfers changed, and that done ones hold their bytes. */
static void account(rig *g, const uint8_t *status, uint32_t seed) {
    totals *t = &g->t;
    const uint8_t *before = g->before, *after = g->after;
    usleep(g->drain_us); /* the (resumed) target's loop drains its sockets */
    snapshot(&g->c, g->after);
    uint64_t late = 0;
    int nf = 0, blocks = 0;
    for (size_t i = 0; i < N; i++) {
        const uint8_t *b = before + i * BL, *x = after + i * BL;
        if (status[i] == 1) {
            if (!block_matches(x, BL, i, seed)) fail_msg("block %zu reported done but does not hold its bytes", i);
            continue;
        }
        nf++;
        uint64_t d = diff_bytes(b, x, BL);
        if (d) blocks++;
        late += d;
    }
    t->trials++;
    t->failed += nf;
    t->with_failures += nf > 0;
    t->late_blocks += blocks;
    t->trials_with_late += late > 0;
    t->late_bytes += late;
    if (late > t->max_late_bytes) t->max_late_bytes = late;
    if (late > BOUND || blocks > 2)
        fail_msg("trial %d: %llu bytes in %d blocks of failed transfers landed after the failure was reported",
                 t->trials, (unsigned long long)late, blocks);
}

static void print_totals(const char *what, const totals *t) {
    print_message("%s: %d trials, %d with failed transfers (%d failed in all); late after the report: %d blocks, "
                  "%llu bytes in %d trials (largest %llu bytes; chunk %u)\n",
                  what, t->trials, t->with_failures, t->failed, t->late_blocks, (unsigned long long)t->late_bytes,
                  t->trials_with_late, (unsigned long long)t->max_late_bytes, CHUNK);
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* How long 16 x 1 MiB take on this link, warm (the fastest of 3): the
 * window the freeze or the remove lands in, so most trials catch transfers
 * in flight. */
static uint64_t measure_us(kvx_transport *a, region *r) {
    uint64_t best = UINT64_MAX;
    for (int k = 0; k < 4; k++) {
        uint64_t ids[N];
        uint8_t st[N];
        size_t nf = 0;
        uint64_t t0 = now_us();
        submit_all(a, r, 1, ids);
        assert_int_equal(wait_ids(a, NULL, ids, N, 60000, &nf, st), N);
        assert_int_equal(nf, 0);
        uint64_t us = now_us() - t0;
        if (k > 0 && us < best) best = us;
    }
    return best < 500 ? 500 : best;
}

/* ns: the namespace our side runs in, the child started in the current one
 * (NULL: both here). */
static void rig_start(rig *g, const char *const *child_opts, kvx_options *opts, unsigned seed, const char *ns) {
    memset(g, 0, sizeof *g);
    g->drain_us = 30000;
    child_start_opts(&g->c, NB, BL, NULL, child_opts, 0);
    if (ns) netns_enter(ns);
    g_frozen = g->c.pid;
    g->r = region_new(NB, BL, 0);
    g->a = transport_new(&g->r, NULL, opts);
    add_peer(g->a, "t", &g->c.meta);
    g->window_us = measure_us(g->a, &g->r);
    g->before = malloc((size_t)N * BL);
    g->after = malloc((size_t)N * BL);
    srand(seed);
}

/* The totals, that the trials caught transfers in flight, the canaries. */
static void rig_finish(rig *g, const char *what, int trials) {
    print_totals(what, &g->t);
    /* the trials exercised what they claim: failures at random points */
    assert_true(g->t.with_failures >= trials / 10);
    uint64_t written[N];
    for (uint64_t i = 0; i < N; i++) written[i] = i;
    assert_true(child_untouched(&g->c, written, N)); /* canaries: nothing outside the transfers' blocks */
    kvx_transport_destroy(g->a);
    assert_int_equal(child_stop(&g->c), 0);
    g_frozen = 0;
    free(g->before);
    free(g->after);
    region_free(&g->r);
}

static void freeze_trials(const char *protection, int trials) {
    const char *opt[] = {protection, NULL};
    char timeout[64];
    snprintf(timeout, sizeof timeout, "transfer_timeout_ms=%d", TIMEOUT);
    rig g;
    rig_start(&g, opt, test_options(timeout, protection, NULL), 12345, NULL);
    for (int k = 0; k < trials; k++) {
        uint32_t seed = 100 + (uint32_t)k;
        uint64_t ids[N];
        uint8_t st[N];
        size_t nf = 0;
        submit_all(g.a, &g.r, seed, ids);
        usleep((useconds_t)((uint64_t)rand() % g.window_us));
        child_freeze(&g.c);
        assert_int_equal(wait_ids(g.a, NULL, ids, N, 20 * TIMEOUT, &nf, st), N);
        snapshot(&g.c, g.before); /* everything reported: from here on nothing of the failed ones may land */
        CHECK_OK(kvx_remove_remote_peer(g.a, "t"));
        assert_int_equal(kill(g.c.pid, SIGCONT), 0);
        account(&g, st, seed);
        add_peer(g.a, "t", &g.c.meta);
    }
    print_message("freeze window: %llu us\n", (unsigned long long)g.window_us);
    char what[96];
    snprintf(what, sizeof what, "freeze, fail, remove, resume (%s)", protection);
    /* Cleartext lands by the kernel's copy, which a freeze cannot split;
     * protected records are opened aside and land by a kernel copy too
     * (staged records, since 0.8); and bytes that waited in the socket land
     * only after the probe for a reset (docs/semantics.md): nothing at all
     * lands late, either way. */
    rig_finish(&g, what, trials);
    assert_int_equal(g.t.trials_with_late, 0);
}

static void test_freeze_aead(void **state) {
    (void)state;
    freeze_trials("tcp.protection=aead", 200);
}

static void test_freeze_cleartext(void **state) {
    (void)state;
    freeze_trials("tcp.protection=none", 100);
}

/* Trials of removing the peer at a random point of the transfers. */
static void remove_trials(rig *g, int trials, uint32_t seed0) {
    for (int k = 0; k < trials; k++) {
        uint32_t seed = seed0 + (uint32_t)k;
        uint64_t ids[N];
        uint8_t st[N];
        size_t nf = 0;
        submit_all(g->a, &g->r, seed, ids);
        usleep((useconds_t)((uint64_t)rand() % g->window_us));
        CHECK_OK(kvx_remove_remote_peer(g->a, "t"));
        /* remove reported every transfer still in flight, failed */
        assert_int_equal(wait_ids(g->a, NULL, ids, N, 1000, &nf, st), N);
        snapshot(&g->c, g->before);
        account(g, st, seed);
        add_peer(g->a, "t", &g->c.meta);
    }
}

static void test_remove_in_flight(void **state) {
    (void)state;
    rig g;
    rig_start(&g, NULL, NULL, 54321, NULL);
    remove_trials(&g, 200, 1000);
    rig_finish(&g, "remove while in flight", 200);
}

/* The remove trials again over a link with a queue: the two sides in
 * network namespaces joined by a veth pair, the target's side receiving
 * through a token bucket (800 Mbit/s, up to 30 ms queued). The reset sent at
 * the remove waits in that queue behind the bytes already sent, and the
 * target, which keeps reading, lands them until the reset arrives: the
 * initiator must report only after a reset has had time to get there.
 * Needs root, iproute2 and tc (skipped without). */
static void test_remove_slow_link(void **state) {
    (void)state;
    enum { TRIALS = 60 };
    static netns_pair ns; /* netns.c removes the namespaces at exit, through a pointer to it */
    if (!netns_usable("late_write", "tc -V >/dev/null 2>&1")) skip();
    if (netns_pair_make(&ns, "latewr", 215) != 0) fail_msg("making the namespaces failed");
    /* the queue sits on the target's side of the link, as in a switch: the
     * initiator's own queues (TCP small queues) hold little of what is in
     * flight; its congestion window decides */
    assert_int_equal(netns_sh(&ns,
                              "ip netns exec %s sh -c 'ip link add kvxifb type ifb && ip link set kvxifb up && "
                              "tc qdisc add dev %s handle ffff: ingress && "
                              "tc filter add dev %s parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev kvxifb && "
                              "tc qdisc add dev kvxifb root tbf rate 800mbit burst 64kb latency 30ms'",
                              ns.b, ns.dev_b, ns.dev_b),
                     0);
    netns_enter(ns.b);
    rig g;
    rig_start(&g, NULL, NULL, 777, ns.a);
    g.drain_us = 200000; /* the queue drains at 800 Mbit/s */
    remove_trials(&g, TRIALS, 5000);
    /* Without the wait for the reset, 5 to 7 trials in 40 landed bytes
     * here, up to 347,607 (more than a chunk); with it, none. */
    rig_finish(&g, "remove while in flight, 800 Mbit/s link, queue at the target", TRIALS);
    assert_true(g.t.trials_with_late <= 2);
}

int main(void) {
    atexit(kill_frozen);
    if (getenv("KVX_TEST_FILTER")) cmocka_set_test_filter(getenv("KVX_TEST_FILTER")); /* e.g. "*slow*" */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freeze_aead),
        cmocka_unit_test(test_freeze_cleartext),
        cmocka_unit_test(test_remove_in_flight),
        cmocka_unit_test(test_remove_slow_link),
    };
    return cmocka_run_group_tests_name("adversarial_late_write", tests, NULL, NULL);
}
