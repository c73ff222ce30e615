/* libkvxfer needs no rdma-core and no ipsec-mb library to load and move
 * blocks (issue 31). The test hides them in a mount namespace of its own (a
 * bind mount of /dev/null over each file) and runs itself again there: the
 * library loads, tcp (AES-GCM by OpenSSL) and shm move verified blocks,
 * verbs.* options still validate, none of those libraries is mapped, and
 * backend=verbs fails with KVX_ENOTSUP naming the plugin and the library it
 * could not load, which KVX_LOG's info level said too. A second run hides
 * the plugin itself (an empty directory over kvxfer-0/): "not installed",
 * with the directories searched. Needs root. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *const kHidden[] = {"libibverbs.so.1", "librdmacm.so.1", "libIPSec_MB.so.1", "libIPSec_MB.so.2"};

static int mapped(const char *name) { return self_maps_file(name, NULL, 0); }

static char g_log[8192];
static void on_log(const kvx_log_record *rec, void *user) {
    (void)user;
    if (strlen(g_log) + strlen(rec->message) + 2 < sizeof g_log) {
        strcat(g_log, rec->message);
        strcat(g_log, "\n");
    }
}

static kvx_transport *make(region *r, const char *backend, const char *protection, int *rc) {
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", backend));
    if (protection) CHECK_OK(kvx_options_set(o, "tcp.protection", protection));
    kvx_transport *t = NULL;
    *rc = kvx_transport_create(&t, r->base, r->nb, r->bl, NULL, o);
    kvx_options_destroy(o);
    return t;
}

/* Two transports of that backend move 4 blocks, verified. */
static void move_blocks(const char *backend, const char *protection) {
    region a = region_new(8, 4096, 0), b = region_new(8, 4096, 0);
    int rc;
    kvx_transport *ta = make(&a, backend, protection, &rc);
    assert_int_equal(rc, 0);
    kvx_transport *tb = make(&b, backend, protection, &rc);
    assert_int_equal(rc, 0);
    move_four_blocks(ta, tb, &a, &b, 9);
    const char *be = NULL, *path = NULL;
    CHECK_OK(kvx_peer_backend(&be, &path, ta, "b"));
    print_message("%s moved blocks (%s)\n", be, path);
    kvx_transport_destroy(ta);
    kvx_transport_destroy(tb);
    region_free(&a);
    region_free(&b);
}

static const char *g_mode;

/* In the namespace (argv[1] is the mode). */
static void test_hidden(void **state) {
    (void)state;
    CHECK_OK(kvx_set_log_handler(on_log, NULL, KVX_LOG_INFO));
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "verbs.devices", "mlx5_0"));
    CHECK_ERR(kvx_options_set(o, "verbs.qps_per_peer", "99"), KVX_EINVAL);
    kvx_options_destroy(o);
    region r = region_new(2, 4096, 0);
    int rc;
    kvx_transport *t = make(&r, "verbs", NULL, &rc);
    assert_int_equal(rc, KVX_ENOTSUP);
    assert_null(t);
    const char *msg = kvx_last_error_message();
    print_message("backend=verbs: %s\n", msg);
    assert_non_null(strstr(msg, "libkvxfer-verbs.so"));
    const char *why = strcmp(g_mode, "--no-rdma-core") == 0 ? "libibverbs.so.1" : "is not installed (searched ";
    assert_non_null(strstr(msg, why));
    CHECK_OK(kvx_log_flush(5000));
    assert_non_null(strstr(g_log, "verbs: no plugin: "));
    assert_non_null(strstr(g_log, why));
    t = make(&r, "auto", NULL, &rc);
    assert_int_equal(rc, 0);
    print_message("backend=auto serves %s\n", kvx_transport_backends(t));
    assert_null(strstr(kvx_transport_backends(t), "verbs"));
    kvx_transport_destroy(t);
    region_free(&r);
    move_blocks("shm", NULL);
    move_blocks("tcp", "aead");
    /* none of rdma-core (and without the plugin, ipsec-mb is still there to use) */
    const size_t n = strcmp(g_mode, "--no-rdma-core") == 0 ? sizeof kHidden / sizeof *kHidden : 2;
    for (size_t i = 0; i < n; i++) assert_false(mapped(kHidden[i]));
    CHECK_OK(kvx_set_log_handler(NULL, NULL, KVX_LOG_WARN));
}

/* The file the dynamic linker finds for a library name, or "". */
static void locate(const char *name, char *out, size_t cap) {
    out[0] = 0;
    void *h = dlopen(name, RTLD_LAZY | RTLD_LOCAL);
    if (!h) return;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) {
        char *real = realpath(lm->l_name, NULL);
        snprintf(out, cap, "%s", real ? real : lm->l_name);
        free(real);
    }
    dlclose(h);
}

static void run_hidden(const char *mode) {
    char files[8][512];
    size_t n = 0;
    char plugin_dir[512] = "";
    if (strcmp(mode, "--no-rdma-core") == 0) {
        for (size_t i = 0; i < sizeof kHidden / sizeof *kHidden; i++) {
            locate(kHidden[i], files[n], sizeof files[n]);
            if (files[n][0]) print_message("hiding %s (%s)\n", kHidden[i], files[n++]);
        }
        assert_true(n >= 2); /* at least rdma-core's two: the build needs them */
    } else {
        Dl_info info;
        assert_true(dladdr((void *)kvx_version_string, &info) && info.dli_fname);
        snprintf(plugin_dir, sizeof plugin_dir, "%s", info.dli_fname);
        char *slash = strrchr(plugin_dir, '/');
        assert_non_null(slash);
        strcpy(slash, "/kvxfer-0");
        print_message("hiding %s\n", plugin_dir);
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) _exit(3);
        for (size_t i = 0; i < n; i++)
            if (mount("/dev/null", files[i], NULL, MS_BIND, NULL) != 0) _exit(4);
        if (plugin_dir[0] && mount("tmpfs", plugin_dir, "tmpfs", 0, "size=1m") != 0) _exit(5);
        unsetenv("KVX_PLUGIN_PATH");
        execl("/proc/self/exe", "/proc/self/exe", mode, (char *)NULL);
        _exit(6);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_no_rdma_core(void **state) {
    (void)state;
    if (geteuid() != 0) {
        print_message("needs root (a mount namespace): skipped\n");
        skip();
    }
    run_hidden("--no-rdma-core");
}

static void test_no_plugin(void **state) {
    (void)state;
    if (geteuid() != 0) {
        print_message("needs root (a mount namespace): skipped\n");
        skip();
    }
    run_hidden("--no-plugin");
}

int main(int argc, char **argv) {
    if (argc > 1) {
        g_mode = argv[1];
        const struct CMUnitTest hidden[] = {cmocka_unit_test(test_hidden)};
        return cmocka_run_group_tests_name("plugins_hidden (inside)", hidden, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_rdma_core), cmocka_unit_test(test_no_plugin)};
    return cmocka_run_group_tests_name("plugins_hidden", tests, NULL, NULL);
}
