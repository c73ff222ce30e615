/* The processes of tests/adversarial/test_local_user.c: forked children on
 * pipes (chan), the switch to a test user, the teardown that reaps every
 * descendant, and the agent, a process with a region and a shm transport
 * that serves as target or writer on command. None uses cmocka but start(),
 * call() and need_users(), which run in the test process and assert. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "local_user_agent.h"

test_user g_a = {"kvxtest-a", 0, 0, 0}, g_b = {"kvxtest-b", 0, 0, 0};
unsigned g_overflowuid = 65534;
pid_t g_self;

/* ---- processes */

/* Pipe ends this process holds, closed by the teardown. */
static int g_fds[256];
static int g_nfds;

void hold_fd(int fd) {
    if (getpid() == g_self && g_nfds < 256) g_fds[g_nfds++] = fd;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int chan_pipes(chan *c) {
    int a[2], b[2];
    if (pipe(a) != 0) return -1;
    if (pipe(b) != 0) {
        close(a[0]);
        close(a[1]);
        return -1;
    }
    c->cin = a[0];
    c->to = a[1];
    c->from = b[0];
    c->cout = b[1];
    c->pid = -1;
    return 0;
}

/* In a new child: every descriptor but stdio and keep[] closed, so that no
 * pipe end or socket of another party lingers in it. */
static void close_others(int *keep, int n) {
    qsort(keep, (size_t)n, sizeof *keep, cmp_int);
    unsigned lo = 3;
    for (int i = 0; i < n; i++) {
        if (keep[i] < (int)lo) continue;
        if ((unsigned)keep[i] > lo) close_range(lo, (unsigned)keep[i] - 1, 0);
        lo = (unsigned)keep[i] + 1;
    }
    close_range(lo, ~0u, 0);
}

/* Forks fn(arg, cin, cout) with extra[] kept open too; the child dies with
 * its parent (PR_SET_PDEATHSIG, set again after every change of user). */
pid_t chan_fork(chan *c, child_fn fn, void *arg, const int *extra, int nextra) {
    const pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return c->pid = pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const pid_t pp = getppid();
    if (pp != parent && pp != 0) _exit(96); /* 0: the first process of a new pid namespace */
    int keep[8] = {c->cin, c->cout};
    int n = 2;
    for (int i = 0; i < nextra && n < 8; i++) keep[n++] = extra[i];
    close_others(keep, n);
    _exit(fn(arg, c->cin, c->cout));
}

int chan_spawn(chan *c, child_fn fn, void *arg) {
    if (chan_pipes(c) != 0) return -1;
    pid_t pid = chan_fork(c, fn, arg, NULL, 0);
    close(c->cin);
    close(c->cout);
    hold_fd(c->to);
    hold_fd(c->from);
    return pid > 0 ? 0 : -1;
}

/* n bytes within ms; 0, or -1 at EOF, error or timeout. */
int read_timed(int fd, void *p, size_t n, int ms) {
    uint8_t *b = p;
    const uint64_t end = now_ms() + (uint64_t)ms;
    while (n) {
        const int64_t left = (int64_t)(end - now_ms());
        if (left <= 0) return -1;
        struct pollfd pf = {fd, POLLIN, 0};
        int r = poll(&pf, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Groups, gid, uid of u (in that order: each step needs the root before it);
 * dumpable again, as a process of that user started by a login would be, and
 * still dying with its parent. 0 or -1 (errno). */
int become(const test_user *u) {
    if (setgroups(0, NULL) != 0 || setgid(u->gid) != 0 || setuid(u->uid) != 0) return -1;
    prctl(PR_SET_DUMPABLE, 1);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    return 0;
}

/* The live children of this process (its descendants land here too: it is
 * their subreaper). */
int children(pid_t *out, int cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(path, "r");
    int n = 0, p;
    while (f && n < cap && fscanf(f, "%d", &p) == 1) out[n++] = p;
    if (f) fclose(f);
    return n;
}

/* Every case's teardown: kill and reap every descendant (a pid namespace's
 * first process reaps the rest of its namespace before it can be reaped). */
int reap_all(void **state) {
    (void)state;
    for (int round = 0; round < 100; round++) {
        pid_t kids[256];
        int n = children(kids, 256);
        if (n == 0) break;
        for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
        for (int i = 0; i < n; i++) waitpid(kids[i], NULL, 0);
    }
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
    for (int i = 0; i < g_nfds; i++) close(g_fds[i]);
    g_nfds = 0;
    return 0;
}

/* ---- the agent: a process with a region and a shm transport, that serves
 * as target and writer on command */

static int put_meta(int fd, const metablob *m) {
    uint64_t h[4] = {m->len, m->base, m->nb, m->bl};
    return write_full(fd, h, sizeof h) || write_full(fd, m->bytes, m->len) ? -1 : 0;
}

static int get_meta_timed(int fd, metablob *m, int ms) {
    uint64_t h[4];
    if (read_timed(fd, h, sizeof h, ms) != 0 || h[0] > sizeof m->bytes) return -1;
    m->len = h[0];
    m->base = h[1];
    m->nb = h[2];
    m->bl = h[3];
    return read_timed(fd, m->bytes, m->len, ms);
}

int say(int out, reply *r, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->rc = rc;
    write_full(out, r, sizeof *r);
    return 1;
}

static uint8_t *region_make(int kind, uint64_t size) {
    void *p = NULL;
    if (kind == R_ALLOC) return kvx_region_alloc(&p, size, 0) == 0 ? p : NULL;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (kind == R_FIXED ? MAP_FIXED_NOREPLACE : 0);
    p = mmap(kind == R_FIXED ? FIXED_ADDR : NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED || (kind == R_FIXED && p != FIXED_ADDR)) return NULL; /* an old kernel ignores NOREPLACE */
    return p;
}

static int shm_transport(kvx_transport **t, uint8_t *base, const char *opts, metablob *m) {
    kvx_options *o = NULL;
    int rc = kvx_options_create(&o);
    if (rc == 0) rc = kvx_options_set(o, "backend", "shm");
    if (rc == 0 && opts) rc = kvx_options_parse(o, opts);
    if (rc == 0) rc = kvx_transport_create(t, base, NB, BL, NULL, o);
    kvx_options_destroy(o);
    if (rc == 0) rc = kvx_get_agent_metadata(&m->len, *t, m->bytes, sizeof m->bytes);
    if (rc == 0) rc = kvx_transport_base_addr(&m->base, *t);
    m->nb = NB;
    m->bl = BL;
    return rc;
}

/* 1 done, 2 failed, 0 not reported within ms, < 0 kvx_poll failed. */
static int wait_id(kvx_transport *t, uint64_t id, int ms) {
    const uint64_t end = now_ms() + (uint64_t)ms;
    do {
        uint64_t done[16], failed[16];
        size_t nd = 0, nf = 0;
        int rc = kvx_poll(&nd, &nf, t, NULL, done, 16, failed, 16);
        if (rc != 0) return rc;
        for (size_t i = 0; i < nd; i++)
            if (done[i] == id) return 1;
        for (size_t i = 0; i < nf; i++)
            if (failed[i] == id) return 2;
        usleep(500);
    } while (now_ms() < end);
    return 0;
}

static void last_error(reply *r) { snprintf(r->msg, sizeof r->msg, "%s", kvx_last_error_message()); }

/* One command (peer id "p"); fills r. */
static void agent_op(const cmd *k, int in, kvx_transport *t, uint8_t *base, uint8_t fill, reply *r, int *gone) {
    static metablob peer;
    switch (k->op) {
    case OP_ADD: {
        if (get_meta_timed(in, &peer, 10000) != 0) {
            *gone = 1;
            return;
        }
        const uint64_t t0 = now_ms();
        r->rc = kvx_add_remote_peer(t, "p", peer.bytes, peer.len, peer.base, peer.nb, peer.bl);
        r->value = now_ms() - t0;
        const char *b = "", *p = "";
        if (r->rc != 0) last_error(r);
        else if (kvx_peer_backend(&b, &p, t, "p") == 0) {
            snprintf(r->backend, sizeof r->backend, "%s", b);
            snprintf(r->path, sizeof r->path, "%s", p);
        }
        return;
    }
    case OP_WRITE: { /* local block a to remote block b, content fill_block(b, seed c) */
        uint64_t l = k->a % NB, rm = k->b, id = 0;
        fill_block(base + l * BL, BL, rm, (uint32_t)k->c);
        r->rc = kvx_write_blocks(&id, t, "p", &l, &rm, 1);
        if (r->rc != 0) {
            last_error(r);
            return;
        }
        r->status = wait_id(t, id, 5000);
        kvx_peer_state s;
        if (r->status != 1 && kvx_get_peer_state(t, "p", &s) == 0) snprintf(r->msg, sizeof r->msg, "%s", s.reason);
        return;
    }
    case OP_REMOVE:
        r->rc = kvx_remove_remote_peer(t, "p");
        if (r->rc != 0) last_error(r);
        return;
    case OP_VERIFY: /* block a holds fill_block(a, seed b) */
        r->rc = k->a < NB && block_matches(base + k->a * BL, BL, k->a, (uint32_t)k->b) ? 0 : 1;
        return;
    case OP_CHANGED:
        for (uint64_t i = 0; i < (uint64_t)NB * BL; i++) r->value += base[i] != fill;
        return;
    case OP_OPEN: {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        r->rc = fd >= 0 ? 0 : -errno;
        if (fd >= 0) close(fd);
        return;
    }
    case OP_FORK: { /* a child that keeps every descriptor we hold, and sleeps */
        pid_t c = fork();
        if (c == 0)
            for (;;) pause();
        r->rc = c > 0 ? 0 : -errno;
        r->value = (uint64_t)c;
        return;
    }
    case OP_STATE: {
        kvx_peer_state s;
        r->rc = kvx_get_peer_state(t, "p", &s);
        if (r->rc == 0) {
            r->value = (uint64_t)s.link;
            r->status = s.error;
            snprintf(r->msg, sizeof r->msg, "%s", s.reason);
        }
        return;
    }
    default:
        *gone = 1;
    }
}

int agent_main(void *arg, int in, int out) {
    const agent_cfg *c = arg;
    static reply r;
    static metablob m;
    struct rlimit rl;
    if (c->nofile > 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = (rlim_t)c->nofile;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return say(out, &r, -errno, "setrlimit: %s", strerror(errno));
    }
    if (c->user && become(c->user) != 0) return say(out, &r, -errno, "cannot become %s: %s", c->user->name, strerror(errno));
    if (c->userns && unshare(CLONE_NEWUSER) != 0)
        return say(out, &r, SKIP_RC, "the kernel refuses uid %u a user namespace: %s", (unsigned)geteuid(), strerror(errno));
    uint8_t *base = region_make(c->region, (uint64_t)NB * BL);
    if (!base) return say(out, &r, -ENOMEM, "no region of kind %d: %s", c->region, strerror(errno));
    memset(base, c->fill, (size_t)NB * BL);
    kvx_transport *t = NULL;
    int rc = c->transport ? shm_transport(&t, base, c->opts, &m) : 0;
    if (rc != 0) return say(out, &r, rc, "transport: %s", kvx_last_error_message());
    r.value = (uint64_t)getpid();
    r.uid = geteuid();
    if (write_full(out, &r, sizeof r) != 0 || put_meta(out, &m) != 0) return 2;
    for (int gone = 0; !gone;) {
        cmd k;
        if (read_full(in, &k, sizeof k) != 0 || k.op == OP_EXIT) break;
        memset(&r, 0, sizeof r);
        agent_op(&k, in, t, base, c->fill, &r, &gone);
        if (!gone && write_full(out, &r, sizeof r) != 0) gone = 1;
    }
    kvx_transport_destroy(t);
    return 0;
}

/* Its hello (and metadata) once forked; 0, or -1 when it said nothing. */
int agent_hello(agent *a) {
    memset(&a->hello, 0, sizeof a->hello);
    if (read_timed(a->c.from, &a->hello, sizeof a->hello, 20000) != 0) return -1;
    return a->hello.rc == 0 ? get_meta_timed(a->c.from, &a->meta, 10000) : 0;
}

int agent_start(agent *a, const agent_cfg *c) {
    memset(&a->hello, 0, sizeof a->hello);
    return chan_spawn(&a->c, agent_main, (void *)c) == 0 ? agent_hello(a) : -1;
}

int agent_send(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m) {
    cmd k = {op, 0, x, y, z};
    if (write_full(a->c.to, &k, sizeof k) != 0) return -1;
    return m ? put_meta(a->c.to, m) : 0;
}

/* 1 answered, 0 not within ms, -1 gone. */
int agent_recv(agent *a, reply *r, int ms) {
    struct pollfd pf = {a->c.from, POLLIN, 0};
    int n = poll(&pf, 1, ms);
    if (n == 0 || (n < 0 && errno == EINTR)) return 0;
    return n > 0 && read_timed(a->c.from, r, sizeof *r, 5000) == 0 ? 1 : -1;
}

int agent_call(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m, reply *r) {
    memset(r, 0, sizeof *r);
    return agent_send(a, op, x, y, z, m) == 0 && agent_recv(a, r, 30000) == 1 ? 0 : -1;
}

/* Why an agent stopped answering: how it ended, if it did. */
const char *gone_why(const agent *a) {
    static char b[96];
    int st = 0;
    pid_t p = a->c.pid > 0 ? waitpid(a->c.pid, &st, WNOHANG) : -1; /* (a grandchild's pid is not ours to wait for) */
    if (p != a->c.pid || p <= 0) snprintf(b, sizeof b, "still running, or not our child");
    else if (WIFSIGNALED(st)) snprintf(b, sizeof b, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else snprintf(b, sizeof b, "exited with %d", WEXITSTATUS(st));
    return b;
}

/* The same in this process, asserting. */
void start(agent *a, const agent_cfg *c, const char *who) {
    if (agent_start(a, c) != 0) fail_msg("%s did not start", who);
    if (a->hello.rc == SKIP_RC) {
        print_message("%s: %s: skipped\n", who, a->hello.msg);
        skip();
    }
    if (a->hello.rc != 0) fail_msg("%s: %s", who, a->hello.msg);
}

reply call(agent *a, uint32_t op, uint64_t x, uint64_t y, uint64_t z, const metablob *m) {
    reply r;
    if (agent_call(a, op, x, y, z, m, &r) != 0)
        fail_msg("agent %d did not answer command %u: %s", (int)a->c.pid, op, gone_why(a));
    return r;
}

void need_users(void) {
    if (g_a.found && g_b.found) return;
    print_message("no users %s and %s (tests/adversarial/local-users.sh setup makes them): skipped\n", g_a.name,
                  g_b.name);
    skip();
}
