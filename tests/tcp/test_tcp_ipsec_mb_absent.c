/* libIPSec_MB is loaded on first use, never linked: on a host without it
 * libkvxfer still loads, protected tcp runs on OpenSSL, and asking for
 * ipsec-mb by name fails with KVX_ENOTSUP naming the file. The test hides
 * the library in a mount namespace of its own (a bind mount of /dev/null
 * over it) and runs itself again there. Needs root; a build without
 * ipsec-mb has nothing to hide (skipped). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* The file the process mapped whose name holds "libIPSec_MB", or "". */
static void mapped_ipsec_mb(char *out, size_t cap) { self_maps_file("libIPSec_MB", out, cap); }

static kvx_transport *aead_transport(region *r, const char *impl, int *rc) {
    kvx_options *o = test_options("backend=tcp", "tcp.protection=aead", NULL);
    CHECK_OK(kvx_options_set(o, "tcp.aead_impl", impl));
    kvx_transport *t = NULL;
    *rc = kvx_transport_create(&t, r->base, r->nb, r->bl, NULL, o);
    kvx_options_destroy(o);
    return t;
}

/* Two protected transports move blocks, verified. */
static void move_blocks(void) {
    region a = region_new(8, 4096, 0), b = region_new(8, 4096, 0);
    int rc;
    kvx_transport *ta = aead_transport(&a, "auto", &rc);
    assert_int_equal(rc, 0);
    kvx_transport *tb = aead_transport(&b, "auto", &rc);
    assert_int_equal(rc, 0);
    move_four_blocks(ta, tb, &a, &b, 7);
    kvx_transport_destroy(ta);
    kvx_transport_destroy(tb);
    region_free(&a);
    region_free(&b);
}

/* In the namespace where the library is hidden (argv[1] == "--hidden"). */
static void test_hidden(void **state) {
    (void)state;
    char path[512];
    mapped_ipsec_mb(path, sizeof path);
    assert_string_equal(path, ""); /* not a dependency: nothing loaded it */
    move_blocks();                 /* auto: OpenSSL */
    region r = region_new(2, 4096, 0);
    int rc;
    kvx_transport *t = aead_transport(&r, "ipsec-mb", &rc);
    assert_int_equal(rc, KVX_ENOTSUP);
    assert_null(t);
    print_message("%s\n", kvx_last_error_message());
    assert_non_null(strstr(kvx_last_error_message(), "ipsec-mb: cannot load libIPSec_MB.so"));
    region_free(&r);
}

static const char *g_self;

static void test_absent(void **state) {
    (void)state;
    if (geteuid() != 0) {
        print_message("needs root (a mount namespace): skipped\n");
        skip();
    }
    /* Control: here ipsec-mb loads (this host's CPU runs at least its SSE code). */
    region r = region_new(2, 4096, 0);
    int rc;
    kvx_transport *t = aead_transport(&r, "ipsec-mb", &rc);
    if (rc == KVX_ENOTSUP && strstr(kvx_last_error_message(), "built without")) {
        print_message("this libkvxfer has no ipsec-mb: nothing to hide, skipped\n");
        region_free(&r);
        skip();
    }
    assert_int_equal(rc, 0);
    kvx_transport_destroy(t);
    region_free(&r);
    char path[512];
    mapped_ipsec_mb(path, sizeof path);
    assert_string_not_equal(path, "");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
            mount("/dev/null", path, NULL, MS_BIND, NULL) != 0) {
            perror("hiding libIPSec_MB");
            _exit(3);
        }
        execl(g_self, g_self, "--hidden", (char *)NULL);
        _exit(4);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(int argc, char **argv) {
    g_self = "/proc/self/exe";
    (void)argv;
    if (argc > 1 && strcmp(argv[1], "--hidden") == 0) {
        const struct CMUnitTest hidden[] = {cmocka_unit_test(test_hidden)};
        return cmocka_run_group_tests_name("tcp_ipsec_mb_absent (hidden)", hidden, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_absent)};
    return cmocka_run_group_tests_name("tcp_ipsec_mb_absent", tests, NULL, NULL);
}
