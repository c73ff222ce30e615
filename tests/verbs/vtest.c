#include "vtest.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Metadata layout (src/wire/metadata.cpp): 16-byte header, then the core
 * section (8-byte section header + base, num_blocks, block_len, instance_id,
 * secret[32], fp_len, fp[16], backend, reserved[6]), optional sections, 8-byte
 * checksum = first 8 bytes of SHA-256 over everything before it. */
enum {
    HDR = 16,
    CORE = HDR + 8,
    OFF_INSTANCE = CORE + 24,
    OFF_SECRET = CORE + 32,
    OFF_FPLEN = OFF_SECRET + 32,
    OFF_FP = OFF_FPLEN + 1,
    OFF_BACKEND = OFF_FP + 16
};

static uint64_t rd(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void wr(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

void vt_region_new(vt_region *r, uint64_t nb, uint64_t bl, uint8_t fill) {
    r->nb = nb;
    r->bl = bl;
    r->fill = fill;
    size_t sz = nb * bl + 2 * VT_GUARD;
    r->mem = aligned_alloc(4096, (sz + 4095) / 4096 * 4096);
    assert_non_null(r->mem);
    memset(r->mem, 0xa5, VT_GUARD);
    r->base = r->mem + VT_GUARD;
    memset(r->base, fill, nb * bl);
    memset(r->base + nb * bl, 0x5a, VT_GUARD);
}

void vt_region_free(vt_region *r) {
    free(r->mem);
    r->mem = r->base = NULL;
}

int vt_guards_ok(const vt_region *r) {
    for (size_t i = 0; i < VT_GUARD; i++)
        if (r->mem[i] != 0xa5 || r->base[r->nb * r->bl + i] != 0x5a) return 0;
    return 1;
}

static uint32_t mix(uint64_t idx, uint32_t seed, uint64_t word) {
    uint64_t x = idx * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32) ^ word * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (uint32_t)x;
}

void vt_fill(uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed) {
    for (uint64_t w = 0; w * 4 < bl; w++) {
        uint32_t v = mix(idx, seed, w);
        memcpy(p + w * 4, &v, bl - w * 4 < 4 ? bl - w * 4 : 4);
    }
}

int vt_matches(const uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed) {
    for (uint64_t w = 0; w * 4 < bl; w++) {
        uint32_t v = mix(idx, seed, w);
        if (memcmp(p + w * 4, &v, bl - w * 4 < 4 ? bl - w * 4 : 4) != 0) return 0;
    }
    return 1;
}

int vt_is(const uint8_t *p, uint64_t bl, uint8_t v) {
    for (uint64_t i = 0; i < bl; i++)
        if (p[i] != v) return 0;
    return 1;
}

void vt_require_verbs(void) {
    static uint8_t buf[4096];
    kvx_options *o = vt_options(NULL);
    kvx_transport *t = NULL;
    int rc = kvx_transport_create(&t, buf, 1, sizeof buf, NULL, o);
    kvx_options_destroy(o);
    if (rc == KVX_ENOTSUP) {
        printf("SKIP: no usable RDMA device: %s\n", kvx_last_error_message());
        exit(77);
    }
    if (rc != 0) {
        printf("verbs transport: %d %s: %s\n", rc, kvx_strerror(rc), kvx_last_error_message());
        exit(1);
    }
    kvx_transport_destroy(t);
}

kvx_options *vt_options(const char *kv, ...) {
    kvx_options *o = NULL;
    if (kvx_options_create(&o) != 0) abort();
    if (kvx_options_set(o, "backend", "verbs") != 0) abort();
    va_list ap;
    va_start(ap, kv);
    for (const char *s = kv; s; s = va_arg(ap, const char *)) {
        char key[128];
        const char *eq = strchr(s, '=');
        if (!eq || (size_t)(eq - s) >= sizeof key) abort();
        memcpy(key, s, (size_t)(eq - s));
        key[eq - s] = 0;
        if (kvx_options_set(o, key, eq + 1) != 0) {
            fprintf(stderr, "option %s: %s\n", s, kvx_last_error_message());
            abort();
        }
    }
    va_end(ap);
    return o;
}

kvx_transport *vt_transport(const vt_region *r, const char *config, kvx_options *o) {
    kvx_transport *t = NULL;
    kvx_options *mine = o ? o : vt_options(NULL);
    VT_OK(kvx_transport_create(&t, r->base, r->nb, r->bl, config, mine));
    if (!o) kvx_options_destroy(mine);
    assert_string_equal(kvx_transport_backend(t), "verbs");
    return t;
}

void vt_get_meta(kvx_transport *t, vt_meta *m) {
    VT_OK(kvx_get_agent_metadata(&m->len, t, m->b, sizeof m->b));
    VT_OK(kvx_transport_base_addr(&m->base, t));
    VT_OK(kvx_transport_num_blocks(&m->nb, t));
    VT_OK(kvx_transport_block_len(&m->bl, t));
}

int vt_add(kvx_transport *t, const char *id, const vt_meta *m) {
    return kvx_add_remote_peer(t, id, m->b, m->len, m->base, m->nb, m->bl);
}

void vt_meta_fix_checksum(vt_meta *m) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(m->b, m->len - 8, d);
    memcpy(m->b + m->len - 8, d, 8);
}

void vt_meta_flip_secret(vt_meta *m) {
    m->b[OFF_SECRET + 7] ^= 0x01;
    vt_meta_fix_checksum(m);
}

void vt_meta_clear_fingerprint(vt_meta *m) {
    m->b[OFF_FPLEN] = 0;
    memset(m->b + OFF_FP, 0, 16);
    vt_meta_fix_checksum(m);
}

void vt_meta_add_instance(vt_meta *m, uint64_t delta) {
    wr(m->b + OFF_INSTANCE, rd(m->b + OFF_INSTANCE, 8) + delta, 8);
    vt_meta_fix_checksum(m);
}

int vt_meta_backend(const vt_meta *m) { return m->b[OFF_BACKEND]; }

size_t vt_meta_verbs_off(const vt_meta *m) {
    uint32_t nsec = (uint32_t)rd(m->b + 12, 4);
    size_t off = HDR;
    for (uint32_t s = 0; s < nsec && off + 8 <= m->len - 8; s++) {
        uint16_t type = (uint16_t)rd(m->b + off, 2);
        uint32_t len = (uint32_t)rd(m->b + off + 4, 4);
        if (type == 3) return off + 8;
        off += 8 + len;
    }
    return 0;
}

void vt_meta_set_port(vt_meta *m, uint16_t port) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    wr(m->b + v + 2, port, 2);
    vt_meta_fix_checksum(m);
}

void vt_meta_set_ipv4(vt_meta *m, const uint8_t ip[4]) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    assert_int_equal(m->b[v], 4);
    memcpy(m->b + v + 4, ip, 4);
    vt_meta_fix_checksum(m);
}

void vt_meta_add_mr_addr(vt_meta *m, int64_t delta) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    wr(m->b + v + 20, rd(m->b + v + 20, 8) + (uint64_t)delta, 8);
    vt_meta_fix_checksum(m);
}

uint64_t vt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

size_t vt_wait(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms, size_t *n_failed,
               uint8_t *status) {
    uint8_t *seen = calloc(n ? n : 1, 1);
    size_t got = 0, nf = 0;
    uint64_t end = vt_now_ms() + (uint64_t)timeout_ms;
    enum { CAP = 256 };
    uint64_t d[CAP], f[CAP];
    while (got < n && vt_now_ms() < end) {
        size_t nd = 0, nff = 0;
        VT_OK(kvx_poll(&nd, &nff, t, peer, d, CAP, f, CAP));
        for (size_t k = 0; k < nd + nff; k++) {
            uint64_t id = k < nd ? d[k] : f[k - nd];
            size_t i = 0;
            while (i < n && ids[i] != id) i++;
            if (i == n) fail_msg("poll reported id %llu that is not awaited", (unsigned long long)id);
            if (seen[i]) fail_msg("id %llu reported twice", (unsigned long long)id);
            seen[i] = k < nd ? 1 : 2;
            got++;
            if (k >= nd) nf++;
        }
        if (nd + nff == 0) usleep(500);
    }
    if (status) memcpy(status, seen, n);
    free(seen);
    if (n_failed) *n_failed = nf;
    return got;
}

void vt_expect_silence(kvx_transport *t, int ms) {
    uint64_t end = vt_now_ms() + (uint64_t)ms;
    while (vt_now_ms() < end) {
        size_t nd = 0, nf = 0;
        uint64_t d[8], f[8];
        VT_OK(kvx_poll(&nd, &nf, t, NULL, d, 8, f, 8));
        if (nd + nf) fail_msg("id %llu surfaced unexpectedly", (unsigned long long)(nd ? d[0] : f[0]));
        usleep(2000);
    }
}
