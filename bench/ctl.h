/*
 * The bench's own control channel (kvxfer has no control plane): one TCP
 * connection between initiator and target carrying small length-prefixed
 * frames. Everything read from it is untrusted and bounds-checked.
 *
 * Frame: u32 big-endian length L (1..CTL_MAX_FRAME), then L bytes: one type
 * byte and the payload. Payload integers are big-endian; a string or byte
 * blob is a u32 length then the bytes (no NUL).
 *
 * Conversation (initiator -> target, reply <- target; any reply may instead
 * be CTL_ERR {i32 code, str message}):
 *   HELLO  {u32 magic, u32 version, str lib}  <- HELLO {same}
 *   per block size:
 *     RUN    {u32 run, u64 block_len, u64 num_blocks, u64 seed, u8 verify,
 *             str backend, u8 has_config, str config}
 *            <- RUN_OK {u64 base_addr, u64 num_blocks, u64 block_len,
 *                       str backend, blob metadata}
 *     PEER   {u64 base_addr, u64 num_blocks, u64 block_len, blob metadata}
 *            <- OK                      (target registers the initiator)
 *     VERIFY {u64 first, u32 count, u64 expected[count]}   (no reply)
 *     VERIFY_END {}  <- VERIFY_RESULT {u64 checked, u64 written,
 *                                      u64 mismatches, str first_problem}
 *     END_RUN {}     <- OK              (target frees transport and region)
 *   DONE {} <- OK, then both close.
 * expected[i] is the local block index whose pattern remote block first+i
 * must hold, or EXP_UNWRITTEN (must still hold the poison), or EXP_UNKNOWN
 * (a failed transfer touched it: not checked).
 */
#ifndef KVXFER_BENCH_CTL_H
#define KVXFER_BENCH_CTL_H

#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_MAGIC 0x4b565842u /* "KVXB" */
#define CTL_VERSION 1u
#define CTL_MAX_FRAME (8u << 20)
#define CTL_MAX_STR (64u << 10)
#define CTL_MAX_META (1u << 20)
#define CTL_VERIFY_CHUNK 65536u

#define EXP_UNWRITTEN UINT64_MAX
#define EXP_UNKNOWN (UINT64_MAX - 1)

enum ctl_type {
    CTL_HELLO = 'H',
    CTL_RUN = 'R',
    CTL_RUN_OK = 'r',
    CTL_PEER = 'P',
    CTL_OK = 'k',
    CTL_VERIFY = 'V',
    CTL_VERIFY_END = 'W',
    CTL_VERIFY_RESULT = 'v',
    CTL_END_RUN = 'E',
    CTL_DONE = 'D',
    CTL_ERR = 'x',
};

/* Growable write buffer; an allocation failure is sticky and makes send fail. */
struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};
void wb_reset(struct wbuf *b);
void wb_free(struct wbuf *b);
void wb_u8(struct wbuf *b, uint8_t v);
void wb_u32(struct wbuf *b, uint32_t v);
void wb_u64(struct wbuf *b, uint64_t v);
void wb_blob(struct wbuf *b, const void *p, size_t n);
void wb_str(struct wbuf *b, const char *s);

/* Reader over a received payload; any overrun sets bad and yields zeros. */
struct rbuf {
    const uint8_t *p;
    size_t len, off;
    bool bad;
};
uint8_t rb_u8(struct rbuf *b);
uint32_t rb_u32(struct rbuf *b);
uint64_t rb_u64(struct rbuf *b);
/* Blob of at most max bytes; returns a pointer into the payload. */
const uint8_t *rb_blob(struct rbuf *b, size_t max, size_t *n);
/* String of at most max bytes without NUL bytes; malloc'd copy (NULL if bad). */
char *rb_str(struct rbuf *b, size_t max);
/* true when the whole payload was consumed without error. */
bool rb_done(const struct rbuf *b);

/* 0 on success, -1 with errno (EPROTO for framing errors, ETIMEDOUT). */
int ctl_send(int fd, uint8_t type, const struct wbuf *payload);
/* Receive one frame; *payload is malloc'd (free it). timeout_ms < 0: wait forever. */
int ctl_recv(int fd, int timeout_ms, uint8_t *type, uint8_t **payload, size_t *len);

/* Sockets. "HOST:PORT", "[V6]:PORT", or "PORT" (serve only: all interfaces). */
/* Room for any address the functions below describe, NUL included: a numeric
 * IPv6 address with a scope ("[fe80::1%eth0]:7400") is the longest. */
#define CTL_ADDR_LEN (INET6_ADDRSTRLEN + IF_NAMESIZE + sizeof "[]:65535")
int ctl_listen(const char *spec, char *bound, size_t bound_cap, int *port);
int ctl_connect(const char *spec, int timeout_ms, char *err, size_t err_cap);
/* Describe the peer address of fd as "HOST:PORT" (cap: CTL_ADDR_LEN). */
void ctl_peer_name(int fd, char *buf, size_t cap);
/* TCP_NODELAY: the conversation is request/reply of small frames. */
void ctl_nodelay(int fd);

#endif
