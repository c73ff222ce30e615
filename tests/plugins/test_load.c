/* The verbs backend is a plugin (src/registry/plugin.h). Without an argument:
 * the real plugin beside libkvxfer is loaded on first use of verbs, not
 * before; on this host it says why verbs is unusable (no RDMA device) or, in
 * the VM, serves. With an argument (abi, build, size, noentry; KVX_PLUGIN_PATH
 * names a directory holding a fake plugin of that kind, first in the search;
 * size: an entry shorter than the struct):
 * verbs is refused with the reason and the file, and the library goes on
 * without it (backend=auto). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const char *g_kind; /* NULL: the real plugin */

static int mapped(const char *name) { return self_maps_file(name, NULL, 0); }

static int create(const char *backend, kvx_transport **t, region *r) {
    kvx_options *o = test_options(NULL, NULL);
    CHECK_OK(kvx_options_set(o, "backend", backend));
    int rc = kvx_transport_create(t, r->base, r->nb, r->bl, NULL, o);
    kvx_options_destroy(o);
    return rc;
}

static void test_real_plugin(void **state) {
    (void)state;
    region r = region_new(4, 4096, 0);
    kvx_transport *t = NULL;
    /* verbs.* options validate without the plugin */
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "verbs.devices", "mlx5_0,mlx5_2:1"));
    CHECK_ERR(kvx_options_set(o, "verbs.port", "300"), KVX_EINVAL);
    kvx_options_destroy(o);
    CHECK_OK(create("tcp", &t, &r));
    kvx_transport_destroy(t);
    assert_false(mapped("libkvxfer-verbs.so")); /* loaded only for verbs */
    assert_false(mapped("libibverbs"));
    int rc = create("verbs", &t, &r);
    assert_true(mapped("libkvxfer-verbs.so"));
    assert_true(mapped("libibverbs"));
    if (rc == 0) {
        print_message("verbs serves here (%s)\n", kvx_transport_backend(t));
        kvx_transport_destroy(t);
    } else {
        /* unusable for the plugin's own reason, not the loader's */
        assert_int_equal(rc, KVX_ENOTSUP);
        print_message("verbs: %s\n", kvx_last_error_message());
        assert_null(strstr(kvx_last_error_message(), "libkvxfer-verbs.so"));
    }
    region_free(&r);
}

static void test_refused(void **state) {
    (void)state;
    const char *want = strcmp(g_kind, "abi") == 0     ? "has plugin ABI 999, this libkvxfer ("
                       : strcmp(g_kind, "build") == 0 ? "is from another kvxfer build (0.0.0+0000000000000000), "
                                                        "this libkvxfer is "
                       : strcmp(g_kind, "size") == 0  ? "is from another kvxfer build (unknown), this libkvxfer is "
                                                      : "is not a kvxfer plugin (no kvx_plugin_entry)";
    char path[256];
    snprintf(path, sizeof path, "fake-%s/libkvxfer-verbs.so", g_kind);
    region r = region_new(4, 4096, 0);
    kvx_transport *t = NULL;
    CHECK_ERR(create("verbs", &t, &r), KVX_ENOTSUP);
    print_message("%s\n", kvx_last_error_message());
    assert_non_null(strstr(kvx_last_error_message(), path));
    assert_non_null(strstr(kvx_last_error_message(), want));
    assert_null(t);
    /* the same answer again (the result is kept), and auto goes on without it */
    CHECK_ERR(create("verbs", &t, &r), KVX_ENOTSUP);
    assert_non_null(strstr(kvx_last_error_message(), want));
    CHECK_OK(create("auto", &t, &r));
    assert_null(strstr(kvx_transport_backends(t), "verbs"));
    kvx_transport_destroy(t);
    assert_false(mapped(path)); /* refused plugins are unloaded */
    region_free(&r);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        g_kind = argv[1];
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_refused)};
        return cmocka_run_group_tests_name("plugins_load (refused)", tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_real_plugin)};
    return cmocka_run_group_tests_name("plugins_load", tests, NULL, NULL);
}
