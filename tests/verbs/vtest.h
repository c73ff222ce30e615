/* Helpers of the verbs tests (public API only), on top of tests/common/harness:
 * skip when no RDMA device, verbs transports, metadata surgery (fields at
 * fixed offsets, checksum fixed up). */
#ifndef KVX_VTEST_H
#define KVX_VTEST_H

#include "harness.h"

/* Regions, block contents, metadata blobs (metablob), waiting for ids and
 * the clock come from tests/common/harness.h. */

/* Like CHECK_ERR, without requiring a message. */
#define VT_ERR(call, want)                                                                     \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != (want))                                                                     \
            fail_msg("%s -> %d (%s), expected %d (%s): %s", #call, rc_, kvx_strerror(rc_),     \
                     (int)(want), kvx_strerror(want), kvx_last_error_message());               \
    } while (0)

/* Exits 77 (ctest: skipped) when backend=verbs is not available here. */
void vt_require_verbs(void);
/* Options: backend=verbs plus "key=value" strings, NULL-terminated. */
kvx_options *vt_options(const char *kv, ...);
kvx_transport *vt_transport(const region *r, const char *config, kvx_options *o);

int vt_add(kvx_transport *t, const char *id, const metablob *m);

/* Metadata surgery; each recomputes the checksum. */
void vt_meta_fix_checksum(metablob *m);
void vt_meta_flip_secret(metablob *m);
void vt_meta_clear_fingerprint(metablob *m);
void vt_meta_add_instance(metablob *m, uint64_t delta);
int vt_meta_backend(const metablob *m);  /* first backend section's type: 2 tcp, 3 verbs */
/* The verbs section: endpoint (IPv4 only) and MR fields. */
size_t vt_meta_verbs_off(const metablob *m);  /* 0 when absent */
void vt_meta_set_port(metablob *m, uint16_t port);
void vt_meta_set_ipv4(metablob *m, const uint8_t ip[4]);
void vt_meta_add_mr_addr(metablob *m, int64_t delta);
/* The target's instance id and secret (32 bytes), and its rdma_cm endpoint (IPv4). */
uint64_t vt_meta_instance(const metablob *m);
const uint8_t *vt_meta_secret(const metablob *m);
void vt_meta_endpoint(const metablob *m, uint8_t ip[4], uint16_t *port);
/* The region's MR as the metadata offers it to writers: address and rkey. */
void vt_meta_mr(const metablob *m, uint64_t *addr, uint32_t *rkey);

/* The verbs section as a transport before 0.7 writes it: version 0, the
 * first rail only (its other rails cut off). */
void vt_meta_verbs_as_v0(metablob *m);
/* How many rails the verbs section advertises. */
unsigned vt_meta_verbs_rails(const metablob *m);
/* The verbs section's version (2: the region registered in slices). */
unsigned vt_meta_verbs_version(const metablob *m);
/* Its slice length (version 2), or 0 (one registration). */
uint64_t vt_meta_verbs_slice_len(const metablob *m);

/* Polls for a while and fails the test if anything at all surfaces. */
void vt_expect_silence(kvx_transport *t, int ms);

#endif
