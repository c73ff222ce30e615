/* Conformance, creation: bad arguments and options, the transport's
 * properties, region_prewarm's reading of the region and region_hugepages. Part of the
 * conformance_api program (test_api.c has main()). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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


/* Calls f(start, end, line, ctx) for each line of /proc/self/smaps that
 * follows a mapping's first line, with that mapping's range. */
typedef void smaps_fn(uintptr_t s, uintptr_t e, char *line, void *ctx);
static void smaps_each(smaps_fn *f, void *ctx) {
    FILE *fp = fopen("/proc/self/smaps", "re");
    assert_non_null(fp);
    char line[4096 + 256];
    uintptr_t s = 0, e = 0;
    while (fgets(line, sizeof line, fp)) {
        uintptr_t a, b;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2) { /* a mapping's first line */
            s = a;
            e = b;
        } else {
            f(s, e, line, ctx);
        }
    }
    fclose(fp);
}

struct thp_count {
    uintptr_t lo, hi;
    uint64_t total;
};

static void count_thp(uintptr_t s, uintptr_t e, char *line, void *ctx) {
    struct thp_count *c = ctx;
    unsigned long long kb;
    if (e > c->lo && s < c->hi && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
        uint64_t overlap = (e < c->hi ? e : c->hi) - (s > c->lo ? s : c->lo);
        c->total += kb * 1024 < overlap ? kb * 1024 : overlap;
    }
}

/* Bytes of [p, p + len) on transparent huge pages: AnonHugePages of the
 * mappings in /proc/self/smaps, each counted within the range at most. */
static uint64_t thp_bytes(const void *p, uint64_t len) {
    struct thp_count c = {(uintptr_t)p, (uintptr_t)p + len, 0};
    smaps_each(count_thp, &c);
    return c.total;
}

struct flag_find {
    uintptr_t at;
    const char *flag;
    int found;
};

static void find_flag(uintptr_t s, uintptr_t e, char *line, void *ctx) {
    struct flag_find *c = ctx;
    if (c->at < s || c->at >= e || strncmp(line, "VmFlags:", 8) != 0) return;
    for (char *tok = strtok(line + 8, " \n"); tok; tok = strtok(NULL, " \n"))
        if (strcmp(tok, c->flag) == 0) c->found = 1;
}

/* 1 when the mapping holding p has VmFlags flag (smaps: "hg" advised
 * MADV_HUGEPAGE, "nh" MADV_NOHUGEPAGE). */
static int vm_flag(const void *p, const char *flag) {
    struct flag_find c = {(uintptr_t)p, flag, 0};
    smaps_each(find_flag, &c);
    return c.found;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* 1 when this kernel collapses on request (MADV_COLLAPSE, Linux 6.1+) and
 * THP is not disabled for this process. */
static int can_collapse(uint64_t hp) {
    if (prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) return 0;
    uint8_t *m = mmap(NULL, 2 * hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    uint8_t *a = (uint8_t *)(((uintptr_t)m + hp - 1) & ~(uintptr_t)(hp - 1));
    a[0] = 1; /* a range with no page table yet is EINVAL too */
    const int ok = madvise(a, hp, MADV_COLLAPSE) == 0 || errno != EINVAL;
    munmap(m, 2 * hp);
    return ok;
}

static uint64_t pmd_size(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "re");
    unsigned long long v = 0;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1) v = 0;
        fclose(f);
    }
    return v;
}

/* region_hugepages: 0..1, checked at set. With 1 the create moves the
 * region's whole, aligned huge pages of private anonymous memory onto
 * transparent huge pages (advised MADV_NOHUGEPAGE before: the option
 * overrides that), leaving the partial pages at its ends and every byte as
 * they were; without it nothing changes. Transfers land as without it; a
 * region in a shareable mapping is left alone. A kernel without THP fails
 * the create with KVX_ENOTSUP. */
void test_region_hugepages(void **state) {
    (void)state;
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_ERR(kvx_options_set(o, "region_hugepages", "2"), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "region_hugepages"));
    kvx_options_destroy(o);

    const uint64_t hp = pmd_size(), bl = 64 << 10, pg = (uint64_t)sysconf(_SC_PAGESIZE);
    region r;
    if (hp == 0) { /* no THP in this kernel */
        r = region_new(NB, BL, 0x44);
        kvx_transport *t = NULL;
        o = test_options("region_hugepages=1", NULL);
        CHECK_ERR(kvx_transport_create(&t, r.base, NB, BL, CFG, o), KVX_ENOTSUP);
        assert_non_null(strstr(kvx_last_error_message(), "region_hugepages"));
        kvx_options_destroy(o);
        region_free(&r);
        return;
    }
    if (hp > (4u << 20)) { /* e.g. 512 MiB with 64 KiB base pages: too large a test */
        print_message("huge pages of %llu bytes: not tested\n", (unsigned long long)hp);
        return;
    }
    /* 64 KiB blocks from a page into an aligned huge page to about 34 huge
     * pages on: 32 whole huge pages inside (64 MiB: more than khugepaged
     * collapses in one pass, 16 MiB by default, which an advice alone wakes
     * it for), a partial one at each end, and marked bytes around it up to
     * the mapping's ends */
    const uint64_t span = 36 * hp;
    uint8_t *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(madvise(m, span, MADV_NOHUGEPAGE), 0);
    uint8_t *aligned = (uint8_t *)(((uintptr_t)m + hp - 1) & ~(uintptr_t)(hp - 1));
    r.mem = m;
    r.base = aligned + pg;
    r.bl = bl;
    r.nb = (34 * hp - 2 * pg) / bl; /* ends a page or more before the 34th huge page does */
    r.fill = 0x44;
    memset(m, 0xA5, span);
    for (uint64_t i = 0; i < r.nb; i++) fill_block(r.base + i * bl, bl, i, 21);
    const uint64_t len = r.nb * bl;
    uint8_t *inner_lo = aligned + hp, *inner_hi = (uint8_t *)(((uintptr_t)(r.base + len)) & ~(uintptr_t)(hp - 1));

    kvx_transport *t = transport_new(&r, CFG, test_options(NULL));
    assert_int_equal(thp_bytes(m, span), 0); /* the default leaves it alone, and the count can tell */
    kvx_transport_destroy(t);

    t = transport_new(&r, CFG, test_options("region_hugepages=1", NULL));
    assert_true(vm_flag(inner_lo, "hg") && vm_flag(inner_hi - 1, "hg")); /* advised, NOHUGEPAGE gone */
    assert_false(vm_flag(inner_lo, "nh"));
    assert_true(vm_flag(r.base, "nh") && vm_flag(inner_hi, "nh")); /* the partial pages keep theirs */
    const uint64_t inner = (uint64_t)(inner_hi - inner_lo), got = thp_bytes(inner_lo, inner);
    if (!can_collapse(hp)) /* only advised: khugepaged's, some time */
        print_message("this kernel does not collapse on request: %llu of %llu bytes on huge pages\n",
                      (unsigned long long)got, (unsigned long long)inner);
    else if (got < inner / 4 * 3) /* all of it unless the host is out of free huge pages */
        fail_msg("%llu of %llu bytes on huge pages", (unsigned long long)got, (unsigned long long)inner);
    assert_int_equal(thp_bytes(m, (uint64_t)(inner_lo - m)), 0); /* the partial pages stay */
    assert_int_equal(thp_bytes(inner_hi, (uint64_t)(m + span - inner_hi)), 0);
    for (uint64_t i = 0; i < r.nb; i++) assert_true(block_matches(r.base + i * bl, bl, i, 21));
    for (uint8_t *q = m; q < r.base; q++) assert_int_equal(*q, 0xA5);
    for (uint8_t *q = r.base + len; q < m + span; q++) assert_int_equal(*q, 0xA5);

    /* transfers into it: the first and the last block (partial pages) and one inside */
    region ra = region_new(4, bl, 0x11);
    for (uint64_t i = 0; i < 4; i++) fill_block(ra.base + i * bl, bl, 100 + i, 22);
    kvx_transport *a = transport_new(&ra, CFG, test_options(NULL));
    metablob mb;
    get_meta(t, &mb);
    add_peer(a, "b", &mb);
    uint64_t l[] = {0, 1, 2}, dst[] = {0, r.nb / 2, r.nb - 1}, id;
    CHECK_OK(kvx_write_blocks(&id, a, "b", l, dst, 3));
    size_t nf = 0;
    assert_int_equal(wait_ids(a, "b", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < r.nb; i++) {
        int k = i == dst[0] ? 0 : i == dst[1] ? 1 : i == dst[2] ? 2 : -1;
        assert_true(k >= 0 ? block_matches(r.base + i * bl, bl, 100 + (uint64_t)k, 22)
                           : block_matches(r.base + i * bl, bl, i, 21));
    }
    for (uint8_t *q = m; q < r.base; q++) assert_int_equal(*q, 0xA5);
    for (uint8_t *q = r.base + len; q < m + span; q++) assert_int_equal(*q, 0xA5);
    kvx_transport_destroy(a);
    kvx_transport_destroy(t);
    region_free(&ra);
    munmap(m, span);

    /* a region in a shareable mapping: left as it is, no error */
    void *s = NULL;
    CHECK_OK(kvx_region_alloc(&s, 4 * hp, 0));
    region rs = {.mem = s, .base = s, .nb = 4 * hp / bl, .bl = bl, .fill = 0};
    t = transport_new(&rs, CFG, test_options("region_hugepages=1", NULL));
    assert_false(vm_flag(s, "hg"));
    kvx_transport_destroy(t);
    kvx_region_free(s);
}
