/* Conformance, creation: bad arguments and options, the transport's
 * properties, and region_prewarm's reading of the region. Part of the
 * conformance_api program (test_api.c has main()). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "test_api.h"

void test_create_bad_input(void **state) {
    (void)state;
    uint8_t buf[64];
    kvx_transport *t = NULL;
    CHECK_ERR(kvx_transport_create(&t, NULL, 4, 16, NULL, NULL), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "NULL"));
    CHECK_ERR(kvx_transport_create(&t, buf, 0, 16, NULL, NULL), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "num_blocks"));
    CHECK_ERR(kvx_transport_create(&t, buf, 4, 0, NULL, NULL), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "block_len"));
    CHECK_ERR(kvx_transport_create(&t, buf, UINT64_MAX / 2, 4, NULL, NULL), KVX_EOVERFLOW);
    assert_non_null(strstr(kvx_last_error_message(), "9223372036854775807"));
    CHECK_ERR(kvx_transport_create(&t, buf, 4, 16, "{\"a\":", NULL), KVX_ECONFIG);
    CHECK_ERR(kvx_transport_create(&t, buf, 4, 16, "[1,2]", NULL), KVX_ECONFIG);
    CHECK_ERR(kvx_transport_create(NULL, buf, 4, 16, NULL, NULL), KVX_EINVAL);
    assert_null(t);

    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_ERR(kvx_options_set(o, "backend", "carrier-pigeon"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "carrier-pigeon"));
    CHECK_ERR(kvx_options_set(o, "no.such.key", "1"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "no.such.key"));
    CHECK_ERR(kvx_options_set(o, "transfer_timeout_ms", "0"), KVX_EINVAL);
    /* syntax is checked at set ... */
    CHECK_ERR(kvx_options_set(o, "tcp.listen", "not-an-address"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "not-an-address"));
    /* ... whether the address can be used, at create (TEST-NET-1: never local) */
    CHECK_OK(kvx_options_set(o, "tcp.listen", "192.0.2.1:1"));
    CHECK_OK(kvx_options_set(o, "backend", "tcp"));
    CHECK_ERR(kvx_transport_create(&t, buf, 4, 16, NULL, o), KVX_EBACKEND);
    assert_non_null(strstr(kvx_last_error_message(), "192.0.2.1"));
    kvx_options_destroy(o);
    kvx_options_destroy(NULL);
    kvx_transport_destroy(NULL);
}

void test_properties(void **state) {
    (void)state;
    region r = region_new(NB, BL, 0);
    kvx_transport *t = transport_new(&r, CFG, NULL);
    uint64_t v = 0;
    CHECK_OK(kvx_transport_base_addr(&v, t));
    assert_true(v == (uint64_t)(uintptr_t)r.base);
    CHECK_OK(kvx_transport_num_blocks(&v, t));
    assert_int_equal(v, NB);
    CHECK_OK(kvx_transport_block_len(&v, t));
    assert_int_equal(v, BL);
    char fp[KVX_FINGERPRINT_LEN + 1], fp2[KVX_FINGERPRINT_LEN + 1];
    CHECK_OK(kvx_transport_config_fingerprint(fp, t));
    assert_int_equal(strlen(fp), 16);
    CHECK_OK(kvx_config_fingerprint(fp2, "{\"layers\": 32, \"model\": \"llama\"}"));
    assert_string_equal(fp, fp2); /* key order and whitespace do not matter */
    kvx_transport_destroy(t);

    t = transport_new(&r, NULL, NULL);
    CHECK_OK(kvx_transport_config_fingerprint(fp, t));
    assert_string_equal(fp, "");
    kvx_transport_destroy(t);
    t = transport_new(&r, "{}", NULL);
    CHECK_OK(kvx_transport_config_fingerprint(fp, t));
    assert_string_equal(fp, "");
    kvx_transport_destroy(t);
    region_free(&r);
}

/* A region over pages pages of which page bad cannot be read, starting off
 * bytes into the first, blocks of bl bytes: region_prewarm=1 fails the create
 * with KVX_EINVAL naming the first byte of that page and its block. Without
 * the option tcp accepts the same region (verbs would not register it). */
static void expect_unreadable(size_t pages, size_t bad, size_t off, uint64_t bl) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, pages * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    memset(m, 0x33, pages * pg);
    assert_int_equal(mprotect(m + bad * pg, pg, PROT_NONE), 0);
    const uint64_t nb = (pages * pg - off) / bl, at = bad * pg - off;
    kvx_transport *t = NULL;
    kvx_options *o = test_options("region_prewarm=1", NULL);
    CHECK_ERR(kvx_transport_create(&t, m + off, nb, bl, NULL, o), KVX_EINVAL);
    char want[96];
    snprintf(want, sizeof want, "offset %llu (block %llu,", (unsigned long long)at, (unsigned long long)(at / bl));
    if (!strstr(kvx_last_error_message(), want)) fail_msg("'%s' does not say '%s'", kvx_last_error_message(), want);
    assert_null(t);
    kvx_options_destroy(o);
    if (strcmp(test_backend(), "tcp") == 0) {
        o = test_options(NULL);
        CHECK_OK(kvx_transport_create(&t, m + off, nb, bl, NULL, o));
        kvx_options_destroy(o);
        kvx_transport_destroy(t);
    }
    munmap(m, pages * pg);
}

/* region_prewarm: 0..1, checked at set. With 1 the create has the kernel read
 * the whole region: its bytes stay as they were, transfers land as without
 * it, and a region with an unreadable page fails the create with KVX_EINVAL
 * naming that block (the same region is accepted without the option). */
void test_region_prewarm(void **state) {
    (void)state;
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_ERR(kvx_options_set(o, "region_prewarm", "2"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "region_prewarm"));
    kvx_options_destroy(o);

    pair p;
    p.ra = region_new(NB, BL, 0x11);
    p.rb = region_new(NB, BL, 0x22);
    for (uint64_t i = 0; i < NB; i++) fill_block(p.ra.base + i * BL, BL, i, 9);
    p.a = transport_new(&p.ra, CFG, test_options("region_prewarm=1", NULL));
    p.b = transport_new(&p.rb, CFG, test_options("region_prewarm=1", NULL));
    for (uint64_t i = 0; i < NB; i++) {
        assert_true(block_matches(p.ra.base + i * BL, BL, i, 9));
        assert_true(block_is(p.rb.base + i * BL, BL, 0x22));
    }
    get_meta(p.b, &p.mb);
    add_peer(p.a, "b", &p.mb);
    uint64_t l[] = {1, 2, 3, 60}, r[] = {10, 11, 12, 0}, id;
    CHECK_OK(kvx_write_blocks(&id, p.a, "b", l, r, 4));
    size_t nf = 0;
    assert_int_equal(wait_ids(p.a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < NB; i++) {
        int dest = -1;
        for (int k = 0; k < 4; k++)
            if (r[k] == i) dest = k;
        assert_true(dest >= 0 ? block_matches(p.rb.base + i * BL, BL, l[dest], 9) : block_is(p.rb.base + i * BL, BL, 0x22));
    }
    pair_down(&p);

    /* a page in the middle cannot be read */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    expect_unreadable(8, 5, 0, pg);              /* block 5 of 8, a page each */
    expect_unreadable(1024, 700, 1024, 256);     /* past the first 1 MiB written; base and blocks not page-aligned */
}

