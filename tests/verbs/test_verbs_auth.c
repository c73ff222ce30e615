/* verbs handshake: every refusal maps to its code, happens within the
 * connect timeout, registers nothing, and leaves the target serving honest
 * peers. Metadata is forged with the checksum fixed up, so the core accepts
 * it and only the rdma_cm handshake can refuse. Skips (77) without RDMA. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vtest.h"

#define CFG_X "{\"model\":\"x\",\"layers\":2}"
#define CFG_Y "{\"model\":\"y\",\"layers\":2}"

typedef struct pair {
    region ra, rb;
    kvx_transport *a, *b;
    metablob mb;
} pair;

static void pair_up(pair *p, const char *cfg_a, const char *cfg_b, kvx_options *oa) {
    p->ra = region_new(8, 4096, 0x11);
    p->rb = region_new(8, 4096, 0x22);
    p->a = vt_transport(&p->ra, cfg_a, oa);
    p->b = vt_transport(&p->rb, cfg_b, NULL);
    get_meta(p->b, &p->mb);
}

static void pair_down(pair *p) {
    kvx_transport_destroy(p->a);
    kvx_transport_destroy(p->b);
    assert_true(region_guards_ok(&p->ra) && region_guards_ok(&p->rb));
    region_free(&p->ra);
    region_free(&p->rb);
}

/* The honest metadata still works after the refusals: one block lands. */
static void check_honest(pair *p) {
    CHECK_OK(vt_add(p->a, "b", &p->mb));
    fill_block(p->ra.base, 4096, 0, 77);
    uint64_t z = 0, id;
    CHECK_OK(kvx_write_blocks(&id, p->a, "b", &z, &z, 1));
    size_t nf = 9;
    assert_int_equal(wait_ids(p->a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(block_matches(p->rb.base, 4096, 0, 77));
    CHECK_OK(kvx_remove_remote_peer(p->a, "b"));
}

static void test_wrong_secret(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NULL, NULL, NULL);
    metablob m = p.mb;
    vt_meta_flip_secret(&m);
    VT_ERR(vt_add(p.a, "b", &m), KVX_EAUTH);
    printf("wrong secret: %s\n", kvx_last_error_message());
    VT_ERR(vt_add(p.a, "b", &m), KVX_EAUTH); /* nothing was registered */
    check_honest(&p);
    for (uint64_t i = 1; i < 8; i++) assert_true(block_is(p.rb.base + i * 4096, 4096, 0x22));
    pair_down(&p);
}

/* The target checks the fingerprint too: the metadata hides it (""), so the
 * core lets it through and the target refuses in the handshake. */
static void test_wrong_fingerprint(void **state) {
    (void)state;
    pair p;
    pair_up(&p, CFG_X, CFG_Y, NULL);
    VT_ERR(vt_add(p.a, "b", &p.mb), KVX_EFINGERPRINT); /* the core's own check */
    metablob m = p.mb;
    vt_meta_clear_fingerprint(&m);
    VT_ERR(vt_add(p.a, "b", &m), KVX_EFINGERPRINT);
    printf("wrong fingerprint: %s\n", kvx_last_error_message());
    kvx_transport_destroy(p.a);
    /* no fingerprint on our side is compatible with anything */
    p.a = vt_transport(&p.ra, NULL, NULL);
    check_honest(&p);
    pair_down(&p);
}

static void test_wrong_instance(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NULL, NULL, NULL);
    metablob m = p.mb;
    vt_meta_add_instance(&m, 1);
    VT_ERR(vt_add(p.a, "b", &m), KVX_ECONNREFUSED);
    printf("wrong instance: %s\n", kvx_last_error_message());
    check_honest(&p);
    pair_down(&p);
}

static void test_nobody_listening(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NULL, NULL, NULL);
    metablob m = p.mb;
    vt_meta_set_port(&m, 9); /* discard: no rdma_cm listener there */
    uint64_t t0 = now_ms();
    VT_ERR(vt_add(p.a, "b", &m), KVX_ECONNREFUSED);
    printf("nobody listening: %s (%llu ms)\n", kvx_last_error_message(), (unsigned long long)(now_ms() - t0));
    /* a closed target refuses too */
    region rc;
    rc = region_new(8, 4096, 0);
    kvx_transport *c = vt_transport(&rc, NULL, NULL);
    metablob mc;
    get_meta(c, &mc);
    CHECK_OK(kvx_transport_close(c));
    VT_ERR(vt_add(p.a, "c", &mc), KVX_ECONNREFUSED);
    kvx_transport_destroy(c);
    region_free(&rc);
    check_honest(&p);
    pair_down(&p);
}

/* An address nobody answers: fails within connect_timeout_ms. */
static void test_unreachable(void **state) {
    (void)state;
    pair p;
    kvx_options *o = vt_options("connect_timeout_ms=1500", NULL);
    pair_up(&p, NULL, NULL, o);
    kvx_options_destroy(o);
    metablob m = p.mb;
    const uint8_t ip[4] = {198, 18, 0, 77};
    vt_meta_set_ipv4(&m, ip);
    uint64_t t0 = now_ms();
    int rc = vt_add(p.a, "b", &m);
    uint64_t dt = now_ms() - t0;
    printf("unreachable: %d %s (%llu ms)\n", rc, kvx_last_error_message(), (unsigned long long)dt);
    assert_true(rc == KVX_ETIMEDOUT || rc == KVX_EHOSTUNREACH);
    assert_true(dt < 1500 + 1500);
    check_honest(&p);
    pair_down(&p);
}

int main(void) {
    vt_require_verbs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_secret),     cmocka_unit_test(test_wrong_fingerprint),
        cmocka_unit_test(test_wrong_instance),   cmocka_unit_test(test_nobody_listening),
        cmocka_unit_test(test_unreachable),
    };
    return cmocka_run_group_tests_name("verbs_auth", tests, NULL, NULL);
}
