/* Helpers of the verbs tests (public API only): skip when no RDMA device,
 * regions with canaries, deterministic block contents, waiting for ids,
 * metadata surgery (fields at fixed offsets, checksum fixed up). */
#ifndef KVX_VTEST_H
#define KVX_VTEST_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvxfer.h"

#define VT_OK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != 0)                                                                          \
            fail_msg("%s -> %d (%s): %s", #call, rc_, kvx_strerror(rc_), kvx_last_error_message()); \
    } while (0)

#define VT_ERR(call, want)                                                                     \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != (want))                                                                     \
            fail_msg("%s -> %d (%s), expected %d (%s): %s", #call, rc_, kvx_strerror(rc_),     \
                     (int)(want), kvx_strerror(want), kvx_last_error_message());               \
    } while (0)

#define VT_GUARD 4096

typedef struct vt_region {
    uint8_t *mem, *base;
    uint64_t nb, bl;
    uint8_t fill;
} vt_region;

void vt_region_new(vt_region *r, uint64_t nb, uint64_t bl, uint8_t fill);
void vt_region_free(vt_region *r);
int vt_guards_ok(const vt_region *r);
void vt_fill(uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed);
int vt_matches(const uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed);
int vt_is(const uint8_t *p, uint64_t bl, uint8_t v);

/* Exits 77 (ctest: skipped) when backend=verbs is not available here. */
void vt_require_verbs(void);
/* Options: backend=verbs plus "key=value" strings, NULL-terminated. */
kvx_options *vt_options(const char *kv, ...);
kvx_transport *vt_transport(const vt_region *r, const char *config, kvx_options *o);

typedef struct vt_meta {
    uint8_t b[4096];
    size_t len;
    uint64_t base, nb, bl;
} vt_meta;
void vt_get_meta(kvx_transport *t, vt_meta *m);
int vt_add(kvx_transport *t, const char *id, const vt_meta *m);

/* Metadata surgery; each recomputes the checksum. */
void vt_meta_fix_checksum(vt_meta *m);
void vt_meta_flip_secret(vt_meta *m);
void vt_meta_clear_fingerprint(vt_meta *m);
void vt_meta_add_instance(vt_meta *m, uint64_t delta);
int vt_meta_backend(const vt_meta *m);  /* core.backend byte: 1 tcp, 2 verbs */
/* The verbs section: endpoint (IPv4 only) and MR fields. */
size_t vt_meta_verbs_off(const vt_meta *m);  /* 0 when absent */
void vt_meta_set_port(vt_meta *m, uint16_t port);
void vt_meta_set_ipv4(vt_meta *m, const uint8_t ip[4]);
void vt_meta_add_mr_addr(vt_meta *m, int64_t delta);

/* Poll until every id surfaced or timeout_ms; fails the test on an id
 * reported twice or not in ids. status[i]: 1 done, 2 failed (optional).
 * Returns how many surfaced; *n_failed the failures. */
size_t vt_wait(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms, size_t *n_failed,
               uint8_t *status);
/* Polls for a while and fails the test if anything at all surfaces. */
void vt_expect_silence(kvx_transport *t, int ms);
uint64_t vt_now_ms(void);

#endif
