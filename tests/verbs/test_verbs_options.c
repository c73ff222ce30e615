/* verbs.* options and the watchdog (stall timeout, abort path). Skips (77) without RDMA;
 * the device/address expectations follow the rdma-vm (rxe0, GID 1 = IPv4
 * $KVX_VM_ADDR, GID 0 = link-local IPv6) and are skipped elsewhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vtest.h"

static int in_vm(void) { return getenv("KVX_VM_ADDR") && getenv("KVX_VM_DEV"); }

static int create_rc(kvx_options *o) {
    static uint8_t buf[8 * 4096];
    kvx_transport *t = NULL;
    int rc = kvx_transport_create(&t, buf, 8, 4096, NULL, o);
    kvx_options_destroy(o);
    if (rc == 0) kvx_transport_destroy(t);
    return rc;
}

/* A transport with these options talks to a default one. */
static void check_works(kvx_options *o) {
    region ra, rb;
    ra = region_new(8, 4096, 1);
    rb = region_new(8, 4096, 2);
    kvx_transport *a = vt_transport(&ra, NULL, o), *b = vt_transport(&rb, NULL, NULL);
    kvx_options_destroy(o);
    metablob ma, mb;
    get_meta(a, &ma);
    get_meta(b, &mb);
    CHECK_OK(vt_add(a, "b", &mb));
    CHECK_OK(vt_add(b, "a", &ma));
    uint64_t s3 = 3, d5 = 5, s4 = 4, d6 = 6, id;
    fill_block(ra.base + 3 * 4096, 4096, 3, 1);
    fill_block(rb.base + 4 * 4096, 4096, 4, 2);
    CHECK_OK(kvx_write_blocks(&id, a, "b", &s3, &d5, 1));
    size_t nf = 9;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    CHECK_OK(kvx_write_blocks(&id, b, "a", &s4, &d6, 1));
    assert_int_equal(wait_ids(b, "a", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(block_matches(rb.base + 5 * 4096, 4096, 3, 1));
    assert_true(block_matches(ra.base + 6 * 4096, 4096, 4, 2));
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_pinned_choices(void **state) {
    (void)state;
    if (!in_vm()) skip();
    char dev[64], listen[80];
    snprintf(dev, sizeof dev, "verbs.device=%s", getenv("KVX_VM_DEV"));
    snprintf(listen, sizeof listen, "verbs.listen=%s:0", getenv("KVX_VM_ADDR"));
    check_works(vt_options(dev, "verbs.port=1", "verbs.gid_index=1", NULL));
    check_works(vt_options(listen, NULL));
    check_works(vt_options("verbs.listen=0.0.0.0:0", NULL)); /* wildcard: advertises the device address */
    check_works(vt_options("verbs.qps_per_peer=3", NULL));
}

static void test_fixed_port(void **state) {
    (void)state;
    if (!in_vm()) skip();
    char listen[80];
    snprintf(listen, sizeof listen, "verbs.listen=%s:18999", getenv("KVX_VM_ADDR"));
    region r;
    r = region_new(8, 4096, 0);
    kvx_transport *t = vt_transport(&r, NULL, vt_options(listen, NULL));
    metablob m;
    get_meta(t, &m);
    size_t v = vt_meta_verbs_off(&m);
    assert_true(v != 0);
    assert_int_equal(m.bytes[v + 2] | m.bytes[v + 3] << 8, 18999);
    VT_ERR(create_rc(vt_options(listen, NULL)), KVX_EBACKEND); /* port taken */
    printf("port in use: %s\n", kvx_last_error_message());
    kvx_transport_destroy(t);
    region_free(&r);
}

static void test_unusable_choices(void **state) {
    (void)state;
    if (!in_vm()) skip();
    VT_ERR(create_rc(vt_options("verbs.device=mlx5_9", NULL)), KVX_ENOTSUP);
    printf("%s\n", kvx_last_error_message());
    VT_ERR(create_rc(vt_options("verbs.port=2", NULL)), KVX_ENOTSUP);
    printf("%s\n", kvx_last_error_message());
    VT_ERR(create_rc(vt_options("verbs.gid_index=0", NULL)), KVX_ENOTSUP); /* link-local IPv6 only */
    printf("%s\n", kvx_last_error_message());
    VT_ERR(create_rc(vt_options("verbs.listen=127.0.0.1:0", NULL)), KVX_ENOTSUP);
    printf("%s\n", kvx_last_error_message());
    /* malformed: refused when set, naming the key and value */
    kvx_options *o = vt_options(NULL);
    VT_ERR(kvx_options_set(o, "verbs.listen", "nonsense"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "verbs.listen"));
    assert_non_null(strstr(kvx_last_error_message(), "nonsense"));
    kvx_options_destroy(o);
    /* auto leaves verbs out when it is not usable with these options (it then
     * serves on shm and tcp: shm is the most preferred) */
    o = vt_options("verbs.device=mlx5_9", NULL);
    CHECK_OK(kvx_options_set(o, "backend", "auto"));
    static uint8_t buf[4096];
    kvx_transport *t = NULL;
    CHECK_OK(kvx_transport_create(&t, buf, 1, 4096, NULL, o));
    assert_string_equal(kvx_transport_backend(t), "shm");
    assert_string_equal(kvx_transport_backends(t), "shm,tcp");
    kvx_transport_destroy(t);
    kvx_options_destroy(o);
    /* also when verbs only finds out at creation (its probe passes) */
    o = vt_options("verbs.listen=127.0.0.1:0", NULL);
    CHECK_OK(kvx_options_set(o, "backend", "auto"));
    CHECK_OK(kvx_transport_create(&t, buf, 1, 4096, NULL, o));
    assert_string_equal(kvx_transport_backend(t), "shm");
    kvx_transport_destroy(t);
    kvx_options_destroy(o);
    /* and serves on verbs when usable (first of verbs,tcp; after shm with auto) */
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", "verbs,tcp"));
    CHECK_OK(kvx_transport_create(&t, buf, 1, 4096, NULL, o));
    assert_string_equal(kvx_transport_backend(t), "verbs");
    assert_string_equal(kvx_transport_backends(t), "verbs,tcp");
    kvx_transport_destroy(t);
    kvx_options_destroy(o);
}

/* transfer_timeout_ms (1 ms) elapses while the work is on the wire or waits
 * behind the send queue: the watchdog aborts the peer (QPs to ERR), every id
 * surfaces once, the peer is broken, and re-adding it works. */
/* The transfer timeout measures a stall, not a transfer's length: one
 * transfer of 32768 scattered 4 KiB blocks (a WR each) takes seconds on rxe,
 * several times transfer_timeout_ms, and completes, because each signalled WR
 * that comes back is progress. */
static void test_long_transfer_progresses(void **state) {
    (void)state;
    enum { NB = 32768, BL = 4096 };
    region ra, rb;
    ra = region_new(NB, BL, 1);
    rb = region_new(NB, BL, 2);
    kvx_options *o = vt_options("transfer_timeout_ms=1000", NULL);
    kvx_transport *a = vt_transport(&ra, NULL, o), *b = vt_transport(&rb, NULL, NULL);
    kvx_options_destroy(o);
    metablob mb;
    get_meta(b, &mb);
    CHECK_OK(vt_add(a, "b", &mb));
    uint64_t *l = malloc(NB * sizeof *l), *r = malloc(NB * sizeof *r);
    for (uint64_t k = 0; k < NB; k++) l[k] = k, r[k] = (k * 7919) % NB; /* a permutation: no runs */
    const uint64_t probe[] = {0, 1, NB / 2, NB - 1};
    for (size_t i = 0; i < 4; i++) fill_block(ra.base + probe[i] * BL, BL, probe[i], 5);
    uint64_t t0 = now_ms(), id;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, NB));
    size_t nf = 9;
    assert_int_equal(wait_ids(a, "b", &id, 1, 120000, &nf, NULL), 1);
    printf("one transfer of %d scattered 4 KiB blocks: %llu ms with transfer_timeout_ms=1000\n", NB,
           (unsigned long long)(now_ms() - t0));
    assert_int_equal(nf, 0);
    for (size_t i = 0; i < 4; i++) assert_true(block_matches(rb.base + r[probe[i]] * BL, BL, probe[i], 5));
    free(l);
    free(r);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    region_free(&ra);
    region_free(&rb);
}

static void test_timeout_abort(void **state) {
    (void)state;
    enum { NB = 2048, BL = 4096, PER = 900, T = 12 };
    region ra, rb;
    ra = region_new(NB, BL, 1);
    rb = region_new(NB, BL, 2);
    kvx_options *o = vt_options("transfer_timeout_ms=1", "verbs.qps_per_peer=2", NULL);
    kvx_transport *a = vt_transport(&ra, NULL, o), *b = vt_transport(&rb, NULL, NULL);
    kvx_options_destroy(o);
    metablob mb;
    get_meta(b, &mb);
    CHECK_OK(vt_add(a, "b", &mb));
    static uint64_t l[PER], r[PER];
    for (uint64_t k = 0; k < PER; k++) l[k] = 2 * k, r[k] = 2 * k + 1;
    uint64_t ids[T];
    size_t n = 0;
    for (int t = 0; t < T; t++) {
        int rc = kvx_write_blocks(&ids[n], a, "b", l, r, PER);
        if (rc == KVX_EPEERBROKEN) break;
        CHECK_OK(rc);
        n++;
    }
    size_t nf = 0;
    assert_int_equal(wait_ids(a, NULL, ids, n, 20000, &nf, NULL), n);
    printf("timeout: %zu submitted, %zu failed\n", n, nf);
    /* The timeout fired: transfers failed, or (the first one finished just as
     * the watchdog declared the stall) the peer broke before a second submit. */
    assert_true(nf > 0 || n < T);
    vt_expect_silence(a, 200);
    uint64_t id;
    VT_ERR(kvx_write_blocks(&id, a, "b", l, r, 1), KVX_EPEERBROKEN);
    CHECK_OK(kvx_remove_remote_peer(a, "b"));
    CHECK_OK(vt_add(a, "b", &mb));
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, r, 1));
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1); /* done or timed out: once */
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    assert_true(region_guards_ok(&ra) && region_guards_ok(&rb));
    region_free(&ra);
    region_free(&rb);
}

int main(void) {
    vt_require_verbs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_choices),   cmocka_unit_test(test_fixed_port),
        cmocka_unit_test(test_unusable_choices), cmocka_unit_test(test_long_transfer_progresses),
        cmocka_unit_test(test_timeout_abort),
    };
    return cmocka_run_group_tests_name("verbs_options", tests, NULL, NULL);
}
