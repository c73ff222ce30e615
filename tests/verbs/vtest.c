#include "vtest.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Metadata layout (src/wire/metadata.cpp): 16-byte header, then the core
 * section (8-byte section header + base, num_blocks, block_len, instance_id,
 * secret[32], fp_len, fp[16], reserved[7]), one section per backend (type =
 * the backend's id: 2 tcp, 3 verbs) in the writer's order of preference,
 * 8-byte checksum = first 8 bytes of SHA-256 over everything before it. */
enum {
    HDR = 16,
    CORE = HDR + 8,
    OFF_INSTANCE = CORE + 24,
    OFF_SECRET = CORE + 32,
    OFF_FPLEN = OFF_SECRET + 32,
    OFF_FP = OFF_FPLEN + 1,
    SEC_CORE = 1,
    SEC_VERBS = 3
};

static uint64_t rd(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void wr(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
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
    va_list ap;
    va_start(ap, kv);
    kvx_options *o = options_va("verbs", kv, ap);
    va_end(ap);
    return o;
}

kvx_transport *vt_transport(const region *r, const char *config, kvx_options *o) {
    kvx_transport *t = NULL;
    kvx_options *mine = o ? o : vt_options(NULL);
    CHECK_OK(kvx_transport_create(&t, r->base, r->nb, r->bl, config, mine));
    if (!o) kvx_options_destroy(mine);
    assert_string_equal(kvx_transport_backend(t), "verbs");
    return t;
}

int vt_add(kvx_transport *t, const char *id, const metablob *m) {
    return kvx_add_remote_peer(t, id, m->bytes, m->len, m->base, m->nb, m->bl);
}

void vt_meta_fix_checksum(metablob *m) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(m->bytes, m->len - 8, d);
    memcpy(m->bytes + m->len - 8, d, 8);
}

void vt_meta_flip_secret(metablob *m) {
    m->bytes[OFF_SECRET + 7] ^= 0x01;
    vt_meta_fix_checksum(m);
}

void vt_meta_clear_fingerprint(metablob *m) {
    m->bytes[OFF_FPLEN] = 0;
    memset(m->bytes + OFF_FP, 0, 16);
    vt_meta_fix_checksum(m);
}

void vt_meta_add_instance(metablob *m, uint64_t delta) {
    wr(m->bytes + OFF_INSTANCE, rd(m->bytes + OFF_INSTANCE, 8) + delta, 8);
    vt_meta_fix_checksum(m);
}

/* Body offset of the first section of type want (0: the first backend
 * section), 0 when there is none; *type gets the type found. */
static size_t section_body(const metablob *m, uint16_t want, uint16_t *type) {
    uint32_t nsec = (uint32_t)rd(m->bytes + 12, 4);
    size_t off = HDR;
    for (uint32_t s = 0; s < nsec && off + 8 <= m->len - 8; s++) {
        *type = (uint16_t)rd(m->bytes + off, 2);
        uint32_t len = (uint32_t)rd(m->bytes + off + 4, 4);
        if (want ? *type == want : *type != SEC_CORE) return off + 8;
        off += 8 + len;
    }
    return 0;
}

int vt_meta_backend(const metablob *m) {
    uint16_t type = 0;
    return section_body(m, 0, &type) ? type : 0;
}

size_t vt_meta_verbs_off(const metablob *m) {
    uint16_t type = 0;
    return section_body(m, SEC_VERBS, &type);
}

void vt_meta_set_port(metablob *m, uint16_t port) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    wr(m->bytes + v + 2, port, 2);
    vt_meta_fix_checksum(m);
}

void vt_meta_set_ipv4(metablob *m, const uint8_t ip[4]) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    assert_int_equal(m->bytes[v], 4);
    memcpy(m->bytes + v + 4, ip, 4);
    vt_meta_fix_checksum(m);
}

void vt_meta_add_mr_addr(metablob *m, int64_t delta) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    wr(m->bytes + v + 20, rd(m->bytes + v + 20, 8) + (uint64_t)delta, 8);
    vt_meta_fix_checksum(m);
}

enum { VERBS_V0_LEN = 44 }; /* endpoint 20, mr_addr, mr_len, rkey, reserved */

unsigned vt_meta_verbs_rails(const metablob *m) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    if (m->bytes[v - 8 + 3] == 0) return 1;
    return 1 + (unsigned)rd(m->bytes + v + VERBS_V0_LEN, 4);
}

unsigned vt_meta_verbs_version(const metablob *m) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    return m->bytes[v - 8 + 3];
}

uint64_t vt_meta_verbs_slice_len(const metablob *m) {
    if (vt_meta_verbs_version(m) < 2) return 0;
    size_t v = vt_meta_verbs_off(m);
    return rd(m->bytes + v + VERBS_V0_LEN + 4 + 24 * (vt_meta_verbs_rails(m) - 1), 8);
}

void vt_meta_verbs_as_v0(metablob *m) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    uint32_t len = (uint32_t)rd(m->bytes + v - 4, 4);
    assert_true(len >= VERBS_V0_LEN);
    size_t cut = len - VERBS_V0_LEN;
    memmove(m->bytes + v + VERBS_V0_LEN, m->bytes + v + len, m->len - (v + len));
    m->len -= cut;
    m->bytes[v - 8 + 3] = 0; /* version 0 (flags bits 8..15) */
    wr(m->bytes + v - 4, VERBS_V0_LEN, 4);
    wr(m->bytes + 8, m->len, 4); /* total_len */
    vt_meta_fix_checksum(m);
}

void vt_meta_mr(const metablob *m, uint64_t *addr, uint32_t *rkey) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    *addr = rd(m->bytes + v + 20, 8);
    *rkey = (uint32_t)rd(m->bytes + v + 36, 4);
}

uint64_t vt_meta_instance(const metablob *m) { return rd(m->bytes + OFF_INSTANCE, 8); }

const uint8_t *vt_meta_secret(const metablob *m) { return m->bytes + OFF_SECRET; }

void vt_meta_endpoint(const metablob *m, uint8_t ip[4], uint16_t *port) {
    size_t v = vt_meta_verbs_off(m);
    assert_true(v != 0);
    assert_int_equal(m->bytes[v], 4);
    *port = (uint16_t)rd(m->bytes + v + 2, 2);
    memcpy(ip, m->bytes + v + 4, 4);
}

void vt_expect_silence(kvx_transport *t, int ms) {
    uint64_t end = now_ms() + (uint64_t)ms;
    while (now_ms() < end) {
        size_t nd = 0, nf = 0;
        uint64_t d[8], f[8];
        CHECK_OK(kvx_poll(&nd, &nf, t, NULL, d, 8, f, 8));
        if (nd + nf) fail_msg("id %llu surfaced unexpectedly", (unsigned long long)(nd ? d[0] : f[0]));
        usleep(2000);
    }
}
