/* The processes of tests/adversarial/test_local_user.c (local_user_agent.c):
 * children on pipes, test users, and the agent that serves as target or
 * writer on command. */
#ifndef KVX_LOCAL_USER_AGENT_H
#define KVX_LOCAL_USER_AGENT_H

#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define NB 16
#define BL 4096
#define FILL 0x5C
#define VICTIM_FILL 0xEE
/* Where the pid-reuse target and its victim map their memory. */
#define FIXED_ADDR ((void *)0x3a5a00000000ull)
#define NOFILE 1024
#define SKIP_RC 77

typedef struct test_user {
    const char *name;
    uid_t uid;
    gid_t gid;
    int found;
} test_user;

typedef int (*child_fn)(void *arg, int in, int out);

/* A child and its two pipes: to/from are ours, cin/cout the child's. */
typedef struct chan {
    pid_t pid;
    int to, from, cin, cout;
} chan;

enum { R_PRIVATE, R_ALLOC, R_FIXED };

enum { OP_ADD = 1, OP_WRITE, OP_REMOVE, OP_VERIFY, OP_CHANGED, OP_OPEN, OP_FORK, OP_STATE, OP_EXIT };

typedef struct agent_cfg {
    const test_user *user; /* NULL: stays root */
    int userns;            /* unshare(CLONE_NEWUSER), after the user switch, before anything else */
    int region;            /* R_PRIVATE (anonymous), R_ALLOC (kvx_region_alloc), R_FIXED (anonymous at FIXED_ADDR) */
    int transport;         /* 0: the memory alone */
    long nofile;           /* > 0: RLIMIT_NOFILE soft limit */
    const char *opts;      /* besides backend=shm */
    uint8_t fill;
} agent_cfg;

typedef struct cmd {
    uint32_t op, pad;
    uint64_t a, b, c;
} cmd;

typedef struct reply {
    int32_t rc;     /* 0, a KVX_E* code, -errno, or SKIP_RC (hello) */
    int32_t status; /* OP_WRITE: 1 done, 2 failed, 0 not reported in time */
    uint64_t value; /* hello: our pid; OP_ADD: ms; OP_CHANGED: bytes; OP_FORK: pid; OP_STATE: link */
    int64_t uid;    /* hello: geteuid(), as we see ourselves */
    char backend[16], path[24];
    char msg[320];
} reply;

typedef struct agent {
    chan c;
    reply hello;
    metablob meta;
} agent;

extern test_user g_a, g_b;   /* the fixture's users, looked up by main() */
extern unsigned g_overflowuid;
extern pid_t g_self;         /* the test process */

void hold_fd(int fd);
int cmp_u64(const void *a, const void *b);
int chan_pipes(chan *c);
pid_t chan_fork(chan *c, child_fn fn, void *arg, const int *extra, int nextra);
int chan_spawn(chan *c, child_fn fn, void *arg);
int read_timed(int fd, void *p, size_t n, int ms);
int become(const test_user *u);
int children(pid_t *out, int cap);
int reap_all(void **state);
int say(int out, reply *r, int rc, const char *fmt, ...);
int agent_main(void *arg, int in, int out);
int agent_hello(agent *a);
int agent_start(agent *a, const agent_cfg *c);
int agent_send(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m);
int agent_recv(agent *a, reply *r, int ms);
int agent_call(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m, reply *r);
const char *gone_why(const agent *a);
void start(agent *a, const agent_cfg *c, const char *who);
reply call(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m);
void need_users(void);

#endif
