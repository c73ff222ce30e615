/* verbs backend across two processes: the target runs in a child (this
 * binary re-executed with --target) and checks its own region on request;
 * then a target SIGKILLed mid-transfer: every transfer surfaces within
 * transfer_timeout_ms, the peer is broken, removal is prompt, nothing hangs.
 * Skips (77) without an RDMA device. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vtest.h"

extern char **environ;

enum { T_NB = 512, T_BL = 64 * 1024 };

/* ---- child: stdin = commands, stdout = metadata + answers */
static int run_target(void) {
    region r;
    r = region_new(T_NB, T_BL, 0x33);
    kvx_options *o = vt_options(NULL);
    kvx_transport *t = NULL;
    if (kvx_transport_create(&t, r.base, r.nb, r.bl, NULL, o) != 0) {
        fprintf(stderr, "target: %s\n", kvx_last_error_message());
        return 1;
    }
    kvx_options_destroy(o);
    static metablob m;
    if (kvx_get_agent_metadata(&m.len, t, m.bytes, sizeof m.bytes) != 0) return 1;
    m.base = (uint64_t)(uintptr_t)r.base;
    m.nb = r.nb;
    m.bl = r.bl;
    if (write_full(1, &m, sizeof m) != 0) return 1;
    for (;;) {
        char cmd;
        if (read_full(0, &cmd, 1) != 0 || cmd == 'Q') break;
        if (cmd != 'V') return 1;
        uint32_t seed, n;
        if (read_full(0, &seed, 4) || read_full(0, &n, 4)) return 1;
        uint64_t *pairs = malloc(2 * sizeof(uint64_t) * (n ? n : 1));
        if (read_full(0, pairs, 2 * sizeof(uint64_t) * n)) return 1;
        uint8_t *written = calloc(r.nb, 1);
        uint8_t ok = 1;
        for (uint32_t k = 0; k < n; k++) {
            written[pairs[2 * k]] = 1;
            ok &= (uint8_t)block_matches(r.base + pairs[2 * k] * r.bl, r.bl, pairs[2 * k + 1], seed);
        }
        for (uint64_t i = 0; i < r.nb; i++)
            if (!written[i]) ok &= (uint8_t)block_is(r.base + i * r.bl, r.bl, 0x33);
        ok &= (uint8_t)region_guards_ok(&r);
        free(written);
        free(pairs);
        if (write_full(1, &ok, 1) != 0) return 1;
    }
    kvx_transport_destroy(t);
    region_free(&r);
    return 0;
}

/* ---- parent side */
typedef struct child {
    pid_t pid;
    int to, from;
    metablob meta;
} child;

static void vchild_start(child *c) {
    const char *argv[] = {"test_verbs_procs", "--target", NULL};
    c->pid = spawn_self(argv, &c->to, &c->from);
    assert_int_equal(read_full(c->from, &c->meta, sizeof c->meta), 0);
}

static int vchild_verify(child *c, uint32_t seed, const uint64_t *remote, const uint64_t *local, uint32_t n) {
    uint64_t *pairs = malloc(2 * sizeof(uint64_t) * n);
    for (uint32_t k = 0; k < n; k++) pairs[2 * k] = remote[k], pairs[2 * k + 1] = local[k];
    char cmd = 'V';
    uint8_t ok = 0;
    assert_int_equal(write_full(c->to, &cmd, 1), 0);
    assert_int_equal(write_full(c->to, &seed, 4), 0);
    assert_int_equal(write_full(c->to, &n, 4), 0);
    assert_int_equal(write_full(c->to, pairs, 2 * sizeof(uint64_t) * n), 0);
    assert_int_equal(read_full(c->from, &ok, 1), 0);
    free(pairs);
    return ok;
}

static int vchild_stop(child *c) {
    char cmd = 'Q';
    (void)!write(c->to, &cmd, 1);
    close(c->to);
    close(c->from);
    int st = 0;
    waitpid(c->pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_two_processes(void **state) {
    (void)state;
    child c;
    vchild_start(&c);
    region r;
    r = region_new(T_NB, T_BL, 0x44);
    kvx_transport *t = vt_transport(&r, NULL, NULL);
    for (uint64_t i = 0; i < T_NB; i++) fill_block(r.base + i * T_BL, T_BL, i, 21);
    CHECK_OK(vt_add(t, "target", &c.meta));
    /* a 64-block run, 100 scattered blocks, and 2 more transfers of runs */
    uint64_t l[256], rr[256];
    uint32_t n = 0;
    for (uint64_t i = 0; i < 64; i++) l[n] = i, rr[n++] = 300 + i;
    for (uint64_t i = 0; i < 100; i++) l[n] = 64 + i, rr[n++] = (i * 3) % 300;
    uint64_t ids[3];
    CHECK_OK(kvx_write_blocks(&ids[0], t, "target", l, rr, 64));
    CHECK_OK(kvx_write_blocks(&ids[1], t, "target", l + 64, rr + 64, 100));
    for (uint64_t i = 0; i < 40; i++) l[n + i] = 200 + i, rr[n + i] = 400 + i;
    CHECK_OK(kvx_write_blocks(&ids[2], t, "target", l + n, rr + n, 40));
    n += 40;
    size_t nf = 9;
    assert_int_equal(wait_ids(t, "target", ids, 3, 60000, &nf, NULL), 3);
    assert_int_equal(nf, 0);
    assert_true(vchild_verify(&c, 21, rr, l, n));
    CHECK_OK(kvx_remove_remote_peer(t, "target"));
    kvx_transport_destroy(t);
    assert_true(region_guards_ok(&r));
    region_free(&r);
    assert_int_equal(vchild_stop(&c), 0);
}

/* Kills the target from another thread: on Soft-RoCE ibv_post_send runs the
 * requester inline, so the main thread is inside kvx_write_blocks (bytes on
 * the wire) when the kill lands. */
typedef struct killer {
    pid_t pid;
    unsigned delay_ms;
    _Atomic uint64_t at_ms;  /* set by the killer thread, read by the test */
} killer;

static void *kill_later(void *arg) {
    killer *k = arg;
    usleep(k->delay_ms * 1000);
    k->at_ms = now_ms();
    kill(k->pid, SIGKILL);
    return NULL;
}

static void test_target_killed(void **state) {
    (void)state;
    enum { TIMEOUT = 4000, MAXIDS = 4096, BATCH = 32, INFLIGHT = 16 };
    child c;
    vchild_start(&c);
    region r;
    r = region_new(T_NB, T_BL, 0x55);
    kvx_options *o = vt_options("transfer_timeout_ms=4000", NULL);
    kvx_transport *t = vt_transport(&r, NULL, o);
    kvx_options_destroy(o);
    CHECK_OK(vt_add(t, "target", &c.meta));
    static uint64_t ids[MAXIDS], idx[T_NB];
    for (uint64_t i = 0; i < T_NB; i++) idx[i] = i;
    killer k = {c.pid, 600, 0};
    pthread_t th;
    pthread_create(&th, NULL, kill_later, &k);
    /* keep 2 MiB transfers going until the peer is reported broken */
    size_t n = 0, done_before = 0, failed_early = 0;
    uint64_t t0 = now_ms();
    int rc = 0;
    while (now_ms() - t0 < 10000 && n < MAXIDS) {
        if (n - done_before - failed_early < INFLIGHT) {
            uint64_t base = (n * BATCH) % (T_NB - BATCH);
            rc = kvx_write_blocks(&ids[n], t, "target", idx + base, idx + base, BATCH);
            if (rc == KVX_EPEERBROKEN) break;
            CHECK_OK(rc);
            n++;
        }
        size_t nd = 0, nff = 0;
        uint64_t d[64], f[64];
        CHECK_OK(kvx_poll(&nd, &nff, t, NULL, d, 64, f, 64));
        for (size_t q = 0; q < nd + nff; q++) {
            uint64_t id = q < nd ? d[q] : f[q - nd];
            if (!k.at_ms) assert_true(q < nd); /* nothing fails before the kill */
            for (size_t j = 0; j < n; j++)
                if (ids[j] == id) ids[j] = 0;
        }
        done_before += nd;
        failed_early += nff;
    }
    pthread_join(th, NULL);
    assert_int_equal(rc, KVX_EPEERBROKEN);
    uint64_t tb = now_ms();
    uint64_t rest[MAXIDS];
    size_t nr = 0;
    for (size_t j = 0; j < n; j++)
        if (ids[j]) rest[nr++] = ids[j];
    size_t nf = 0;
    size_t got = wait_ids(t, NULL, rest, nr, TIMEOUT + 3000, &nf, NULL);
    uint64_t dt = now_ms() - k.at_ms;
    printf("killed target: %zu transfers done, %zu failed before the peer was reported broken %llu ms after the "
           "kill; %zu more surfaced (%zu failed), all within %llu ms of the kill\n",
           done_before, failed_early, (unsigned long long)(tb - k.at_ms), got, nf, (unsigned long long)dt);
    assert_int_equal(got, nr);
    assert_true(dt <= TIMEOUT + 1500);
    assert_true(done_before > 0);
    assert_true(failed_early + nf > 0);
    uint64_t id;
    VT_ERR(kvx_write_blocks(&id, t, "target", idx, idx, 1), KVX_EPEERBROKEN);
    uint64_t tr = now_ms();
    CHECK_OK(kvx_remove_remote_peer(t, "target"));
    printf("remove after kill: %llu ms\n", (unsigned long long)(now_ms() - tr));
    assert_true(now_ms() - tr < 3000);
    int st = 0;
    waitpid(c.pid, &st, 0);
    close(c.to);
    close(c.from);
    /* a fresh target works */
    child c2;
    vchild_start(&c2);
    for (uint64_t i = 0; i < 4; i++) fill_block(r.base + i * T_BL, T_BL, i, 8);
    CHECK_OK(vt_add(t, "target", &c2.meta));
    CHECK_OK(kvx_write_blocks(&id, t, "target", idx, idx, 4));
    assert_int_equal(wait_ids(t, "target", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(vchild_verify(&c2, 8, idx, idx, 4));
    kvx_transport_destroy(t);
    region_free(&r);
    assert_int_equal(vchild_stop(&c2), 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--target") == 0) return run_target();
    signal(SIGPIPE, SIG_IGN);
    vt_require_verbs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_processes),
        cmocka_unit_test(test_target_killed),
    };
    return cmocka_run_group_tests_name("verbs_procs", tests, NULL, NULL);
}
