/* 1000 add/remove cycles of a verbs peer (KVX_VERBS_CYCLES overrides), every
 * 10th with a transfer: no fd or memory growth (run it under valgrind for the
 * latter). Skips (77) without an RDMA device. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "vtest.h"

static int count_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void test_cycles(void **state) {
    (void)state;
    const char *env = getenv("KVX_VERBS_CYCLES");
    int cycles = env ? atoi(env) : 1000;
    region ra, rb;
    ra = region_new(16, 4096, 1);
    rb = region_new(16, 4096, 2);
    kvx_transport *a = vt_transport(&ra, NULL, NULL), *b = vt_transport(&rb, NULL, NULL);
    metablob mb;
    get_meta(b, &mb);
    int fds0 = -1;
    uint64_t t0 = now_ms(), t_add = 0, t_rm = 0;
    for (int i = 0; i < cycles; i++) {
        if (i == 1) fds0 = count_fds(); /* after the first cycle: lazily opened things are open */
        uint64_t ta = now_ms();
        CHECK_OK(vt_add(a, "b", &mb));
        t_add += now_ms() - ta;
        if (i % 10 == 0) {
            uint64_t l = (uint64_t)i % 16, id;
            fill_block(ra.base + l * 4096, 4096, l, (uint32_t)i);
            CHECK_OK(kvx_write_blocks(&id, a, "b", &l, &l, 1));
            size_t nf = 9;
            assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
            assert_int_equal(nf, 0);
            assert_true(block_matches(rb.base + l * 4096, 4096, l, (uint32_t)i));
        }
        uint64_t tr = now_ms();
        CHECK_OK(kvx_remove_remote_peer(a, "b"));
        t_rm += now_ms() - tr;
        if (getenv("KVX_VERBS_CYCLES_TRACE") && (i + 1) % 100 == 0)
            printf("cycle %d: %.1f ms/cycle so far\n", i + 1, (double)(now_ms() - t0) / (i + 1));
    }
    uint64_t dt = now_ms() - t0;
    int fds1 = count_fds();
    printf("%d add/remove cycles: %.1f ms each (add %.1f, remove %.1f); fds %d -> %d\n", cycles,
           (double)dt / cycles, (double)t_add / cycles, (double)t_rm / cycles, fds0, fds1);
    if (cycles > 1) assert_int_equal(fds0, fds1);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    assert_true(region_guards_ok(&ra) && region_guards_ok(&rb));
    region_free(&ra);
    region_free(&rb);
}

int main(void) {
    vt_require_verbs();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cycles)};
    return cmocka_run_group_tests_name("verbs_cycles", tests, NULL, NULL);
}
