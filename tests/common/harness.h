/* Shared helpers of the conformance tests: backend selection from the
 * environment (KVX_TEST_BACKEND=tcp|verbs|shm, default tcp), options of every
 * transport from the environment (KVX_TEST_OPTIONS="KEY=VALUE ...", parsed by
 * kvx_options_parse), regions with guard canaries (KVX_TEST_REGION=shared:
 * from kvx_region_alloc), waiting for transfer ids, and a forked target
 * process. */
#ifndef KVX_TEST_HARNESS_H
#define KVX_TEST_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <sys/types.h>

#include <cmocka.h>

#include "kvxfer.h"

/* Fails the cmocka test with the call, code and message when rc != 0. */
#define CHECK_OK(call)                                                                         \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != 0)                                                                          \
            fail_msg("%s -> %d (%s): %s", #call, rc_, kvx_strerror(rc_), kvx_last_error_message()); \
    } while (0)

/* Asserts rc == want and that the message is non-empty (names the value). */
#define CHECK_ERR(call, want)                                                                  \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_ != (want))                                                                     \
            fail_msg("%s -> %d (%s), expected %d (%s): %s", #call, rc_, kvx_strerror(rc_),     \
                     (want), kvx_strerror(want), kvx_last_error_message());                    \
        assert_true(kvx_last_error_message()[0] != '\0');                                     \
    } while (0)

#define GUARD_LEN 4096

/* A region of nb x bl bytes with GUARD_LEN canary bytes on both sides. */
typedef struct region {
    uint8_t *mem;  /* allocation incl. guards */
    uint8_t *base; /* the region */
    uint64_t nb, bl;
    uint8_t fill;  /* initial content of every block */
} region;

region region_new(uint64_t nb, uint64_t bl, uint8_t fill);
void region_free(region *r);
/* 1 when both guards still hold their pattern. */
int region_guards_ok(const region *r);
/* Deterministic content of block idx for a given seed. */
void fill_block(uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed);
int block_matches(const uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed);
int block_is(const uint8_t *p, uint64_t bl, uint8_t v);

const char *test_backend(void);
/* Options for the test backend, then KVX_TEST_OPTIONS, then the extra
 * arguments (NULL-terminated), each a "KEY=VALUE ..." list for
 * kvx_options_parse. */
kvx_options *test_options(const char *extra, ...);
/* The same for a given backend, extra pairs from a va_list. */
kvx_options *options_va(const char *backend, const char *extra, va_list ap);
kvx_transport *transport_new(const region *r, const char *config, kvx_options *opts);

typedef struct metablob {
    uint8_t bytes[65536];
    size_t len;
    uint64_t base, nb, bl;
} metablob;
void get_meta(kvx_transport *t, metablob *m);
void add_peer(kvx_transport *t, const char *id, const metablob *m);

/* Poll until every id in ids surfaced (done or failed) or timeout_ms passed.
 * Counts each surfacing; asserts no id surfaces twice and no unknown id
 * surfaces. Returns the number of ids that surfaced; *n_failed gets failures. */
size_t wait_ids(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms,
                size_t *n_failed, uint8_t *status /* optional: 1 done, 2 failed per id */);
/* wait_ids through kvx_poll_results (peer NULL: every peer's): codes[j]
 * (when not NULL) receives ids[j]'s status (0 done, else the failure's
 * code; untouched for ids that did not surface). Returns how many surfaced. */
size_t wait_results(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms,
                    size_t *n_failed, int32_t *codes);
uint64_t now_ms(void);
/* Polls kvx_get_peer_state() every 10 ms until the peer's link is `link`
 * (KVX_PEER_UP, ...) or timeout_ms passed; the ms it took, or -1. *st (may
 * be NULL) gets the last state read. */
long wait_peer_link(kvx_transport *t, const char *peer, int link, int timeout_ms, kvx_peer_state *st);
/* Whole-buffer read/write on a pipe or socket, retrying on EINTR; 0 or -1. */
int read_full(int fd, void *p, size_t n);
int write_full(int fd, const void *p, size_t n);

/* A target transport in a child process. The child creates it with the test
 * backend, sends its metadata, then serves commands until told to exit. */
typedef struct child_target {
    pid_t pid;
    int to_child, from_child;
    metablob meta;
} child_target;
void child_start(child_target *c, uint64_t nb, uint64_t bl, const char *config);
/* The same with extra "KEY=VALUE ..." options (NULL-terminated array, or NULL)
 * and, when nofile > 0, RLIMIT_NOFILE lowered to nofile in the child. */
void child_start_opts(child_target *c, uint64_t nb, uint64_t bl, const char *config, const char *const *opts,
                      long nofile);
/* Asks the child to verify block remote_idx holds fill_block(local_idx, seed);
 * returns 1 if it does. */
/* The same target in a fresh process: this test program again
 * (/proc/self/exe), whose main() must call child_exec_dispatch() first. For
 * what a forked child cannot do: one forked after its parent opened an RDMA
 * device shares the parent's uverbs file, and rxe refuses its sends (EACCES:
 * the file carries the parent's credentials). */
/* This test program again (/proc/self/exe) with argv; its stdin and stdout
 * are pipes from and to us (*to_child, *from_child). */
pid_t spawn_self(const char *const *argv, int *to_child, int *from_child);
void child_start_exec(child_target *c, uint64_t nb, uint64_t bl, const char *config, const char *const *opts);
/* First thing in main(): serves as the target (and exits) when this process
 * was started by child_start_exec(); returns otherwise. */
void child_exec_dispatch(int argc, char **argv);
int child_verify(child_target *c, uint64_t remote_idx, uint64_t local_idx, uint32_t seed);
/* Asks the child whether blocks not listed still hold the initial fill and
 * its guards are intact. */
int child_untouched(child_target *c, const uint64_t *written, size_t n);
/* SIGSTOP, returning only once every thread of the child is stopped: the
 * signal stops one thread first and the others only when that one runs, so
 * right after kill() the child may still receive and acknowledge. */
void child_freeze(child_target *c);
void child_kill(child_target *c);
int child_stop(child_target *c);

/* ---- /proc (the adversarial tests watch a target process) ---- */

/* pid holds a descriptor of socket inode. */
int proc_holds_inode(pid_t pid, unsigned long inode);
/* utime + stime of a process, in clock ticks (fails the test if unreadable). */
long proc_cpu_ticks(pid_t pid);
/* ta adds tb as peer "b", writes blocks 0..3 of ra (filled with salt) to
 * blocks 4..7 of rb one by one, and checks that each is reported done once
 * and landed. Regions of at least 8 blocks of 4096 bytes. */
void move_four_blocks(kvx_transport *ta, kvx_transport *tb, const region *ra, const region *rb, uint32_t salt);
/* The path of a file this process maps whose path contains name, in out
 * (cap bytes); "" when none is mapped. Returns whether one is. */
int self_maps_file(const char *name, char *out, size_t cap);
/* The abstract name (without '@') of the shm listener pid holds: a listening
 * seqpacket socket in /proc/net/unix whose inode pid holds. */
void shm_listener_name(pid_t pid, char *name, size_t cap);

/* A TCP socket bound to 127.0.0.1 on a port the kernel picked (*port), and
 * listening with backlog when backlog > 0; fails the test when it cannot. */
int loopback_socket(int backlog, uint16_t *port);

#endif
