/*
 * Install test of the verbs plugin (packaging/test-install.sh, built like
 * consumer.c with `pkg-config --cflags --libs kvxfer`): creates a transport
 * with backend=verbs and prints what happened, for the script to judge:
 *
 *   library: PATH of the libkvxfer.so.0 it runs with
 *   result: ok | KVX_ENOTSUP | error CODE (kvx_strerror of CODE)
 *   message: kvx_last_error_message() of the failure
 *
 * Without libkvxfer0-verbs (kvxfer-verbs) the result must be KVX_ENOTSUP and
 * the message name libkvxfer-verbs.so; with it, the plugin loads and the
 * backend fails (or works) for its own reasons. Exit status 0 when it could
 * tell, 1 otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include <kvxfer.h>

#define NUM_BLOCKS 4
#define BLOCK_LEN 4096

int main(void) {
    static unsigned char region[NUM_BLOCKS * BLOCK_LEN];
    kvx_options *o = NULL;
    kvx_transport *t = NULL;
    Dl_info info;

    if (dladdr((void *)kvx_version_string, &info) && info.dli_fname)
        printf("library: %s\n", info.dli_fname);
    if (kvx_options_create(&o) != 0) {
        fprintf(stderr, "verbs-check: kvx_options_create: %s\n", kvx_last_error_message());
        return 1;
    }
    /* verbs.* keys are validated by the library alone, plugin or not */
    int rc = kvx_options_set(o, "backend", "verbs");
    if (rc != 0) {
        fprintf(stderr, "verbs-check: backend=verbs refused: %s: %s\n", kvx_strerror(rc), kvx_last_error_message());
        kvx_options_destroy(o);
        return 1;
    }
    rc = kvx_transport_create(&t, region, NUM_BLOCKS, BLOCK_LEN, "{\"model\":\"verbs-check\"}", o);
    kvx_options_destroy(o);
    if (rc == 0) {
        printf("result: ok\nbackend: %s\n", kvx_transport_backend(t));
        kvx_transport_destroy(t);
        return 0;
    }
    if (rc == KVX_ENOTSUP)
        printf("result: KVX_ENOTSUP\n");
    else
        printf("result: error %d (%s)\n", rc, kvx_strerror(rc));
    printf("message: %s\n", kvx_last_error_message());
    return 0;
}
