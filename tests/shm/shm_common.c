/* Helpers of the shm conformance tests (test_shm_paths.c, test_shm_threads.c). */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "shm_common.h"

kvx_options *opts(const char *backend, const char *extra) {
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", backend));
    CHECK_OK(kvx_options_set(o, "tcp.listen", "127.0.0.1:0"));
    if (extra) CHECK_OK(kvx_options_parse(o, extra));
    return o;
}

kvx_transport *make(uint8_t *base, uint64_t nb, uint64_t bl, kvx_options *o) {
    kvx_transport *t = NULL;
    CHECK_OK(kvx_transport_create(&t, base, nb, bl, NULL, o));
    kvx_options_destroy(o);
    return t;
}

void expect_path(kvx_transport *t, const char *peer, const char *backend, const char *path) {
    const char *b = NULL, *p = NULL;
    CHECK_OK(kvx_peer_backend(&b, &p, t, peer));
    assert_string_equal(b, backend);
    if (path) assert_string_equal(p, path);
}

void connect_ab(kvx_transport *a, kvx_transport *b) {
    metablob m;
    get_meta(b, &m);
    add_peer(a, "b", &m);
}

uint8_t *guarded(uint8_t *mem, uint64_t len, uint8_t fill) {
    memset(mem, 0xA5, GUARD_LEN);
    memset(mem + GUARD_LEN, fill, len);
    memset(mem + GUARD_LEN + len, 0xA5, GUARD_LEN);
    return mem + GUARD_LEN;
}
