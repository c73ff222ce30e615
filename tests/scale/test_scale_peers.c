/* Scale, two processes: a forked target serves 1,000 peers of one initiator
 * (the target's metadata added under ids p0..p999, one tcp stream each).
 * Every connection lives on the transports' event loops, so both processes
 * stay within a small, fixed number of threads, and the target's resident
 * memory grows by little over its idle transport. Blocks written through a
 * few of the peers land where they should. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

#define NPEERS 1000
#define NB 64
#define BL 4096
#define MAX_THREADS 8
#define MAX_RSS_GROWTH_KB (64 * 1024)

typedef struct procstat {
    long threads, rss_kb;
} procstat;

static procstat proc_status(pid_t pid) {
    char path[64], line[256];
    procstat s = {-1, -1};
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "Threads: %ld", &s.threads);
        sscanf(line, "VmRSS: %ld kB", &s.rss_kb);
    }
    fclose(f);
    assert_true(s.threads > 0 && s.rss_kb > 0);
    return s;
}

static void peer_name(char *out, size_t cap, int i) { snprintf(out, cap, "p%d", i); }

static void test_thousand_peers(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL); /* inherits our RLIMIT_NOFILE */
    region r = region_new(NB, BL, 0);
    for (uint64_t i = 0; i < NB; i++) fill_block(r.base + i * BL, BL, i, 7);
    kvx_transport *a = transport_new(&r, NULL, NULL);
    const procstat idle = proc_status(c.pid);

    char id[16];
    uint64_t t0 = now_ms();
    for (int i = 0; i < NPEERS; i++) {
        peer_name(id, sizeof id, i);
        add_peer(a, id, &c.meta);
    }
    print_message("%d peers added in %llu ms\n", NPEERS, (unsigned long long)(now_ms() - t0));

    static const int some[] = {0, 1, 500, 998, 999};
    enum { NSOME = sizeof some / sizeof some[0] };
    uint64_t ids[NSOME];
    for (int k = 0; k < NSOME; k++) {
        uint64_t l = (uint64_t)k, rr = (uint64_t)(NB - 1 - k);
        peer_name(id, sizeof id, some[k]);
        CHECK_OK(kvx_write_blocks(&ids[k], a, id, &l, &rr, 1));
    }
    size_t nf = 0;
    assert_int_equal(wait_ids(a, NULL, ids, NSOME, 20000, &nf, NULL), NSOME);
    assert_int_equal(nf, 0);
    for (int k = 0; k < NSOME; k++) assert_true(child_verify(&c, (uint64_t)(NB - 1 - k), (uint64_t)k, 7));

    const procstat busy = proc_status(c.pid), self = proc_status(getpid());
    print_message("target: %ld -> %ld threads, VmRSS %ld -> %ld KiB; initiator: %ld threads\n", idle.threads,
                  busy.threads, idle.rss_kb, busy.rss_kb, self.threads);
    assert_true(busy.threads <= MAX_THREADS);
    assert_true(busy.rss_kb - idle.rss_kb <= MAX_RSS_GROWTH_KB);
    assert_true(self.threads <= MAX_THREADS);
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

int main(void) {
    if (strcmp(test_backend(), "tcp") != 0) {
        printf("skip: the scale test counts tcp connections; backend is %s\n", test_backend());
        return 77;
    }
    /* A socket per peer on each side, plus what the process already holds. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
    rl.rlim_cur = rl.rlim_max;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < NPEERS + 256) {
        printf("skip: RLIMIT_NOFILE hard limit %llu is below %d\n", (unsigned long long)rl.rlim_max, NPEERS + 256);
        return 77;
    }
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thousand_peers),
    };
    return cmocka_run_group_tests_name("scale", tests, NULL, NULL);
}
