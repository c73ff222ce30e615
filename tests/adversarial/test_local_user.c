/* The shm backend against a hostile local user (issue #33; docs/security.md,
 * "shm (same host)"). Needs root (CI runs as root) and the two system users
 * of the fixture local-users.sh, kvxtest-a and kvxtest-b:
 *   - admission per uid: a writer of another user is refused at accept
 *     (KVX_EAUTH, "another user") and never holds a slot; another uid's idle
 *     connections are capped, the oldest dropped first, well below
 *     RLIMIT_NOFILE; under 2,000 idle connections of another user plus 200
 *     new ones a second, >= 99 of 100 adds of a same-user writer succeed and
 *     the target can still open() a file (shm.allow_other_users=0 and =1);
 *   - a reused pid (in a pid namespace of its own, ns_last_pid): a writer
 *     whose target died, while a forked child keeps its sockets, writes
 *     nothing into the process that got the pid; process_vm_writev only into
 *     a process of the writer's own uid;
 *   - user namespaces: a peer seen as the overflow uid is another user
 *     unless it is in our user namespace;
 *   - shm.allow_other_users=1 serves another user through the staging ring,
 *     never with the region's descriptor; a writer with 0 refuses a target of
 *     another user even though it holds the metadata.
 * Every party is a process of its own (users are per process), forked before
 * it creates a transport; none uses cmocka: they answer commands on pipes
 * and this process asserts. This process is their subreaper, and each case's
 * teardown kills and reaps every descendant, pid namespace included, whether
 * the case passed or not. Options come from the cases alone
 * (KVX_TEST_OPTIONS could change the paths they check). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "local_user_agent.h"

/* ---- the target's socket, descriptors and CPU, seen from outside */

static int count_fds(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A non-blocking connection to @name; the fd or -errno (EAGAIN: the
 * listener's backlog is full). */
static int open_unix_idle(const char *name) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, name, strlen(name));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    if (connect(fd, (struct sockaddr *)&a, len) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* 0 open, 1 closed by the target (datagrams before the EOF are read). */
static int closed_by_target(int fd) {
    for (;;) {
        uint8_t b[64];
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r > 0) continue;
        return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
}

static char g_sock[108]; /* the target's listener, for the hostile children */

/* ---- admission: a writer of another user is refused at accept */

typedef struct probe_result {
    int32_t connect_err; /* 0: connected */
    int32_t first_len;   /* the first datagram the target sent */
    int32_t closed_ms;   /* when it closed the connection, -1: not within 2.5 s */
    uint8_t first[16];
} probe_result;

/* As user B: one connection that says nothing; what the target does with it. */
static int probe_main(void *arg, int in, int out) {
    (void)arg;
    (void)in;
    probe_result p = {0, 0, -1, {0}};
    if (become(&g_b) != 0) return 10;
    int fd;
    const uint64_t end = now_ms() + 1000;
    while ((fd = open_unix_idle(g_sock)) == -EAGAIN && now_ms() < end) usleep(1000);
    p.connect_err = fd < 0 ? -fd : 0;
    const uint64_t t0 = now_ms();
    while (fd >= 0 && now_ms() - t0 < 2500) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 20) <= 0) continue;
        uint8_t b[64];
        ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (n > 0 && p.first_len == 0) {
            p.first_len = (int32_t)n;
            memcpy(p.first, b, n < 16 ? (size_t)n : 16);
        }
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            p.closed_ms = (int32_t)(now_ms() - t0);
            break;
        }
    }
    return write_full(out, &p, sizeof p) ? 11 : 0;
}

/* A REFUSE of the handshake (docs/wire-format.md): "KVXS", version 1, kind 4, status. */
static int is_refuse(const probe_result *p, int32_t status) {
    int32_t s;
    memcpy(&s, p->first + 8, 4);
    return p->first_len == 12 && memcmp(p->first, "KVXS", 4) == 0 && p->first[4] == 1 && p->first[5] == 4 && s == status;
}

static void test_other_user_refused_at_accept(void **state) {
    (void)state;
    need_users();
    agent t, w;
    agent_cfg tc = {.region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=0", .fill = FILL};
    start(&t, &tc, "target (root)");
    shm_listener_name(t.c.pid, g_sock, sizeof g_sock);
    /* a kvxfer writer of user B; its own shm.allow_other_users=1 leaves the target to decide */
    agent_cfg wc = {.user = &g_b, .region = R_PRIVATE, .transport = 1,
                    .opts = "shm.allow_other_users=1 connect_timeout_ms=2000"};
    start(&w, &wc, "writer (kvxtest-b)");
    reply r = call(&w, OP_ADD, 0, 0, 0, &t.meta);
    print_message("a writer of %s adds a target of root (shm.allow_other_users=0): %s after %llu ms: %s%s\n", g_b.name,
                  kvx_strerror(r.rc), (unsigned long long)r.value, r.msg, r.rc == 0 ? r.path : "");
    /* and a connection of user B that never says anything */
    chan p = {0};
    assert_int_equal(chan_spawn(&p, probe_main, NULL), 0);
    probe_result pr;
    if (read_timed(p.from, &pr, sizeof pr, 10000) != 0) fail_msg("the probe of %s reported nothing", g_b.name);
    print_message("a silent connection of %s: connect %s; first datagram %d bytes%s; closed after %d ms "
                  "(-1: still open at 2.5 s)\n",
                  g_b.name, pr.connect_err ? strerror(pr.connect_err) : "ok", pr.first_len,
                  is_refuse(&pr, KVX_EAUTH) ? " (REFUSE KVX_EAUTH)" : "", pr.closed_ms);
    assert_int_equal(r.rc, KVX_EAUTH);
    if (!strstr(r.msg, "another user")) fail_msg("the writer's message does not say \"another user\": %s", r.msg);
    assert_int_equal(pr.connect_err, 0);
    if (pr.closed_ms < 0 || pr.closed_ms > 300)
        fail_msg("the target held a connection of another user for %d ms (-1: 2.5 s and more), not closed at accept",
                 pr.closed_ms);
    if (!is_refuse(&pr, KVX_EAUTH)) fail_msg("the target closed it without a REFUSE (KVX_EAUTH) first");
}

/* ---- admission: another uid's idle connections are capped, oldest first */

#define CAP_PROBE 1200

typedef struct hold_result {
    int32_t connected, held, inversions, youngest_closed, oldest_open;
} hold_result;

/* As user B: up to CAP_PROBE idle connections in order, for OPEN_MS (well
 * inside the 1 s a connection has to authenticate: what is closed by then
 * was dropped for a cap, not timed out); on a byte from in, which the target
 * closed. */
#define OPEN_MS 600
static int hold_main(void *arg, int in, int out) {
    (void)arg;
    struct rlimit rl = {CAP_PROBE + 64, CAP_PROBE + 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || become(&g_b) != 0) return 10;
    static int fds[CAP_PROBE];
    hold_result h = {0, 0, 0, -1, -1};
    const uint64_t end = now_ms() + OPEN_MS;
    for (int i = 0; i < CAP_PROBE; i++) {
        fds[i] = -1;
        while (now_ms() < end && (fds[i] = open_unix_idle(g_sock)) == -EAGAIN) usleep(200);
        h.connected += fds[i] >= 0;
    }
    if (write_full(out, &h, sizeof h) != 0) return 11;
    uint8_t go;
    if (read_timed(in, &go, 1, 30000) != 0) return 12;
    for (int i = 0; i < CAP_PROBE; i++) {
        if (fds[i] < 0) continue;
        if (!closed_by_target(fds[i])) {
            h.held++;
            if (h.oldest_open < 0) h.oldest_open = i;
        } else {
            h.youngest_closed = i;
            h.inversions += h.oldest_open >= 0; /* closed, yet younger than one kept */
        }
    }
    return write_full(out, &h, sizeof h) ? 13 : 0;
}

static void test_other_uid_capped_oldest_first(void **state) {
    (void)state;
    need_users();
    agent t;
    agent_cfg tc = {.region = R_PRIVATE, .transport = 1, .nofile = NOFILE, .opts = "shm.allow_other_users=1", .fill = FILL};
    start(&t, &tc, "target (root, shm.allow_other_users=1)");
    shm_listener_name(t.c.pid, g_sock, sizeof g_sock);
    chan h;
    assert_int_equal(chan_spawn(&h, hold_main, NULL), 0);
    hold_result hr;
    if (read_timed(h.from, &hr, sizeof hr, 30000) != 0) fail_msg("%s did not open its connections", g_b.name);
    usleep(50 * 1000); /* the target has taken what is in its backlog */
    const int fds = count_fds(t.c.pid);
    reply o = call(&t, OP_OPEN, 0, 0, 0, NULL);
    assert_int_equal(write_full(h.to, "x", 1), 0);
    if (read_timed(h.from, &hr, sizeof hr, 30000) != 0) fail_msg("%s did not report", g_b.name);
    print_message("%s opened %d idle connections at once: the target keeps %d (closed: up to #%d; kept: from #%d; "
                  "%d closed ones younger than one kept); it holds %d descriptors (RLIMIT_NOFILE %d), open() %s\n",
                  g_b.name, hr.connected, hr.held, hr.youngest_closed, hr.oldest_open, hr.inversions, fds, NOFILE,
                  o.rc ? strerror(-o.rc) : "ok");
    assert_true(hr.connected > 0);
    if (o.rc != 0) fail_msg("the target cannot open() a file: %s", strerror(-o.rc));
    if (hr.held > NOFILE * 3 / 4)
        fail_msg("one other uid holds %d connections: its cap must be well below RLIMIT_NOFILE (%d)", hr.held, NOFILE);
    if (hr.inversions != 0) fail_msg("%d connections closed while older ones were kept: oldest first", hr.inversions);
}

/* ---- admission under a flood of another user (the bar) */

#define HELD 2000
#define FRESH_PER_S 200
#define FRESH_MAX 6000
#define ADDS 100
/* The loop stops at GIVE_UP failed adds (the bar allows one) or after
 * BUDGET_MS (100 adds in 20 s: 200 ms each, add, write, check and remove,
 * where a same-user writer that finds a slot needs a few) */
#define GIVE_UP 5
#define BUDGET_MS 20000

typedef struct flood_stats {
    int32_t done; /* 0: the held set is open; 1: the flood stopped */
    long opened, reopened, fresh, refused, seen_closed;
} flood_stats;

/* The held set: reopen what the target closed (epoll says which). */
static void flood_sweep(int ep, int *held, flood_stats *s) {
    struct epoll_event ev[256];
    int n;
    while ((n = epoll_wait(ep, ev, 256, 0)) > 0) {
        for (int i = 0; i < n; i++) {
            const int k = (int)ev[i].data.u32;
            if (held[k] < 0) continue;
            if (!(ev[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) && !closed_by_target(held[k]))
                continue; /* a datagram (a REFUSE), read; not closed yet */
            close(held[k]); /* and out of the epoll set */
            held[k] = -1;
            s->seen_closed++;
        }
    }
    for (int k = 0; k < HELD; k++) {
        if (held[k] >= 0) continue;
        held[k] = open_unix_idle(g_sock);
        if (held[k] < 0) {
            s->refused++;
            continue;
        }
        struct epoll_event e = {EPOLLIN | EPOLLRDHUP, {.u32 = (uint32_t)k}};
        epoll_ctl(ep, EPOLL_CTL_ADD, held[k], &e);
        if (s->opened < HELD) s->opened++;
        else s->reopened++;
    }
}

/* As user B: HELD idle connections held open (reopened as the target closes
 * them, every 10 ms) plus FRESH_PER_S new idle ones a second, until a byte
 * comes on in (at most 60 s). */
static int flood_main(void *arg, int in, int out) {
    (void)arg;
    struct rlimit rl = {HELD + FRESH_MAX + 100, HELD + FRESH_MAX + 100};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || become(&g_b) != 0) return 10;
    static int held[HELD], fresh[FRESH_MAX];
    for (int k = 0; k < HELD; k++) held[k] = -1;
    int ep = epoll_create1(EPOLL_CLOEXEC), nfresh = 0;
    flood_stats s;
    memset(&s, 0, sizeof s);
    const uint64_t t0 = now_ms();
    uint64_t next = t0;
    for (int first = 1; now_ms() - t0 < 60000; first = 0) {
        flood_sweep(ep, held, &s);
        for (; next <= now_ms() && nfresh < FRESH_MAX; next += 1000 / FRESH_PER_S) {
            fresh[nfresh] = open_unix_idle(g_sock);
            s.fresh += fresh[nfresh++] >= 0;
        }
        if (first && write_full(out, &s, sizeof s) != 0) return 11;
        struct pollfd pf = {in, POLLIN, 0};
        if (poll(&pf, 1, 10) != 0) break;
    }
    s.done = 1;
    return write_full(out, &s, sizeof s) ? 12 : 0;
}

typedef struct flood_run {
    int tried, ok, writes_ok, opens, open_fails, open_errno, peak_fds;
    uint64_t ms[ADDS]; /* each add's */
} flood_run;

static void peak(flood_run *f, pid_t pid) {
    int n = count_fds(pid);
    if (n > f->peak_fds) f->peak_fds = n;
}

/* One add, a write checked byte for byte by the target, a remove. */
static void flood_add(flood_run *f, agent *t, agent *w, int i) {
    reply r;
    if (agent_send(w, OP_ADD, 0, 0, 0, &t->meta) != 0) fail_msg("the writer is gone: %s", gone_why(w));
    const uint64_t t0 = now_ms();
    int got;
    while ((got = agent_recv(w, &r, 50)) == 0) {
        peak(f, t->c.pid);
        if (now_ms() - t0 > 30000) fail_msg("kvx_add_remote_peer has not returned for 30 s");
    }
    if (got < 0) fail_msg("the writer is gone: %s", gone_why(w));
    f->ms[f->tried++] = r.value;
    if (r.rc != 0 || strcmp(r.backend, "shm") != 0) {
        if (f->tried - f->ok <= 3) print_message("add %d: %s after %llu ms: %s\n", i, kvx_strerror(r.rc),
                                                 (unsigned long long)r.value, r.msg);
        return;
    }
    f->ok++;
    const uint64_t remote = (uint64_t)(i * 5 + 3) % NB;
    reply wr = call(w, OP_WRITE, (uint64_t)i % NB, remote, (uint64_t)i + 1, NULL);
    if (wr.rc == 0 && wr.status == 1 && call(t, OP_VERIFY, remote, (uint64_t)i + 1, 0, NULL).rc == 0) f->writes_ok++;
    else print_message("add %d: its write: %s, status %d: %s\n", i, kvx_strerror(wr.rc), wr.status, wr.msg);
    reply rm = call(w, OP_REMOVE, 0, 0, 0, NULL);
    if (rm.rc != 0) fail_msg("remove: %s: %s", kvx_strerror(rm.rc), rm.msg);
}

static void flood_case(int allow_others) {
    need_users();
    agent t, w;
    agent_cfg tc = {.region = R_PRIVATE, .transport = 1, .nofile = NOFILE, .fill = FILL,
                    .opts = allow_others ? "shm.allow_other_users=1" : "shm.allow_other_users=0"};
    start(&t, &tc, "target (root)");
    shm_listener_name(t.c.pid, g_sock, sizeof g_sock);
    chan fl;
    assert_int_equal(chan_spawn(&fl, flood_main, NULL), 0);
    flood_stats fs;
    if (read_timed(fl.from, &fs, sizeof fs, 30000) != 0) fail_msg("the flood of %s did not start", g_b.name);
    usleep(1500 * 1000); /* the held set is open; the target has closed some and seen them reopened */
    agent_cfg wc = {.region = R_PRIVATE, .transport = 1, .opts = "connect_timeout_ms=1000"};
    start(&w, &wc, "writer (root)");
    flood_run f;
    memset(&f, 0, sizeof f);
    const long ticks0 = proc_cpu_ticks(t.c.pid);
    const uint64_t wall0 = now_ms();
    for (int i = 0; i < ADDS && f.tried - f.ok < GIVE_UP && now_ms() - wall0 < BUDGET_MS; i++) {
        if (i % 10 == 0) {
            reply o = call(&t, OP_OPEN, 0, 0, 0, NULL);
            f.opens++;
            f.open_fails += o.rc != 0;
            if (o.rc) f.open_errno = -o.rc;
        }
        flood_add(&f, &t, &w, i);
        peak(&f, t.c.pid);
        usleep(20 * 1000);
    }
    const double cpu = (double)(proc_cpu_ticks(t.c.pid) - ticks0) / (double)sysconf(_SC_CLK_TCK) * 1000.0 /
                       (double)(now_ms() - wall0);
    const uint64_t wall = now_ms() - wall0;
    write_full(fl.to, "x", 1); /* (it may have stopped at its own bound) */
    do {
        if (read_timed(fl.from, &fs, sizeof fs, 10000) != 0) fail_msg("the flood did not report");
    } while (!fs.done);
    qsort(f.ms, (size_t)f.tried, sizeof f.ms[0], cmp_u64);
    print_message("flood, target shm.allow_other_users=%d: %d of %d adds ok on shm%s, %d writes byte-exact; add "
                  "median %llu ms, slowest %llu ms; the target: %.1f %% of a core over %.1f s, %d descriptors at the "
                  "peak (RLIMIT_NOFILE %d), open() %d of %d ok%s%s; %s: %ld connected, %ld reopened, %ld new, %ld "
                  "connects refused (backlog full)\n",
                  allow_others, f.ok, f.tried, f.tried < ADDS ? " (stopped early: the bar is missed)" : "",
                  f.writes_ok, (unsigned long long)f.ms[f.tried / 2], (unsigned long long)f.ms[f.tried - 1], cpu * 100,
                  (double)wall / 1000, f.peak_fds, NOFILE,
                  f.opens - f.open_fails, f.opens, f.open_fails ? ": " : "", f.open_fails ? strerror(f.open_errno) : "",
                  g_b.name, fs.opened, fs.reopened, fs.fresh, fs.refused);
    assert_true(fs.opened + fs.reopened + fs.fresh > HELD); /* the flood really ran */
    if (f.ok < 99 || f.tried < ADDS) fail_msg("%d of %d adds succeeded (the bar: 99 of 100)", f.ok, f.tried);
    assert_int_equal(f.writes_ok, f.ok);
    if (f.open_fails) fail_msg("the target could not open() a file during the flood: %s", strerror(f.open_errno));
}

static void test_flood_other_users_refused(void **state) {
    (void)state;
    flood_case(0);
}

static void test_flood_other_users_allowed(void **state) {
    (void)state;
    flood_case(1);
}

/* ---- a reused pid */

typedef struct reuse_report {
    int32_t skipped, broken; /* skipped: the kernel forbids a step; broken: the case did not reach its question */
    char why[320];
    int32_t t_pid, c_pid, v_pid;
    char path[24];
    int32_t second_rc, second_status, link;
    char second_msg[320];
    uint64_t changed;
} reuse_report;

static int report(int out, reuse_report *r, int skipped, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    r->skipped = skipped;
    r->broken = !skipped;
    write_full(out, r, sizeof *r);
    return 0;
}

static int set_last_pid(int pid) {
    int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char b[16];
    int n = snprintf(b, sizeof b, "%d", pid);
    int ok = write(fd, b, (size_t)n) == n;
    close(fd);
    return ok ? 0 : -1;
}

/* The victim: T's pid, memory at T's region's address. */
static int make_victim(agent *v, const agent_cfg *vc, int want, reuse_report *rep, int out) {
    for (int tries = 0; tries < 5; tries++) {
        if (set_last_pid(want - 1) != 0) {
            report(out, rep, 1, "the kernel refuses ns_last_pid: %s", strerror(errno));
            return -1;
        }
        if (agent_start(v, vc) != 0 || v->hello.rc != 0) {
            report(out, rep, 0, "the victim did not start: %s", v->hello.msg);
            return -1;
        }
        rep->v_pid = (int32_t)v->hello.value;
        if (rep->v_pid == want) return 0;
        kill(v->c.pid, SIGKILL);
        waitpid(v->c.pid, NULL, 0);
    }
    report(out, rep, 0, "the victim got pid %d, not the target's %d", rep->v_pid, want);
    return -1;
}

/* Pid 1 of a new pid namespace (and mount namespace, for its own /proc):
 * writer W adds target T (private memory at FIXED_ADDR: process_vm_writev)
 * and writes; T forks a child that keeps its sockets and is killed; victim V
 * gets T's pid and memory at the same address; W writes again. */
static int reuse_init(int out) {
    static reuse_report rep;
    static agent t, w, v;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return report(out, &rep, 1, "cannot mount a proc of the new pid namespace: %s", strerror(errno));
    agent_cfg tc = {.region = R_FIXED, .transport = 1, .fill = 0};
    agent_cfg wc = {.region = R_PRIVATE, .transport = 1, .opts = "transfer_timeout_ms=2000"};
    agent_cfg vc = {.region = R_FIXED, .fill = VICTIM_FILL};
    reply r;
    if (agent_start(&t, &tc) != 0 || t.hello.rc != 0) return report(out, &rep, 0, "target: %s", t.hello.msg);
    rep.t_pid = (int32_t)t.hello.value;
    if (agent_start(&w, &wc) != 0 || w.hello.rc != 0) return report(out, &rep, 0, "writer: %s", w.hello.msg);
    if (agent_call(&w, OP_ADD, 0, 0, 0, &t.meta, &r) != 0 || r.rc != 0) return report(out, &rep, 0, "add: %s", r.msg);
    snprintf(rep.path, sizeof rep.path, "%s", r.path);
    if (strcmp(r.path, "process_vm_writev") != 0)
        return report(out, &rep, 0, "the writer took path '%s'; the case needs process_vm_writev", r.path);
    if (agent_call(&w, OP_WRITE, 0, 1, 1, NULL, &r) != 0 || r.rc != 0 || r.status != 1)
        return report(out, &rep, 0, "the first write: %s, status %d: %s", kvx_strerror(r.rc), r.status, r.msg);
    if (agent_call(&t, OP_VERIFY, 1, 1, 0, NULL, &r) != 0 || r.rc != 0)
        return report(out, &rep, 0, "the first write's bytes are wrong");
    if (agent_call(&t, OP_FORK, 0, 0, 0, NULL, &r) != 0 || r.rc != 0)
        return report(out, &rep, 0, "the target could not fork: %s", strerror(-r.rc));
    rep.c_pid = (int32_t)r.value;
    kill(t.c.pid, SIGKILL);
    waitpid(t.c.pid, NULL, 0);
    if (make_victim(&v, &vc, rep.t_pid, &rep, out) != 0) return 0;
    if (agent_call(&w, OP_WRITE, 0, 1, 2, NULL, &r) != 0) return report(out, &rep, 0, "the writer died");
    rep.second_rc = r.rc;
    rep.second_status = r.status;
    snprintf(rep.second_msg, sizeof rep.second_msg, "%s", r.msg);
    usleep(200 * 1000);
    rep.link = agent_call(&w, OP_STATE, 0, 0, 0, NULL, &r) == 0 && r.rc == 0 ? (int32_t)r.value : -1;
    if (agent_call(&v, OP_CHANGED, 0, 0, 0, NULL, &r) != 0) return report(out, &rep, 0, "the victim died");
    rep.changed = r.value;
    write_full(out, &rep, sizeof rep);
    return 0;
}

static int reuse_parent(void *arg, int in, int out) {
    (void)arg;
    (void)in;
    static reuse_report rep;
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
        return report(out, &rep, 1, "unshare(CLONE_NEWPID | CLONE_NEWNS): %s", strerror(errno));
    pid_t i = fork();
    if (i == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(reuse_init(out));
    }
    if (i < 0) return report(out, &rep, 0, "fork: %s", strerror(errno));
    waitpid(i, NULL, 0);
    return 0;
}

static const char *status_name(int s) { return s == 1 ? "done" : s == 2 ? "failed" : "not reported in 5 s"; }

static void test_pid_reuse(void **state) {
    (void)state;
    chan p = {0};
    assert_int_equal(chan_spawn(&p, reuse_parent, NULL), 0);
    static reuse_report rep;
    if (read_timed(p.from, &rep, sizeof rep, 60000) != 0) fail_msg("the pid namespace reported nothing");
    if (rep.skipped) {
        print_message("pid reuse: %s: skipped\n", rep.why);
        skip();
    }
    if (rep.broken) fail_msg("pid reuse: %s", rep.why);
    const int refused = rep.second_rc != 0 && kvx_error_scope_of(rep.second_rc) == KVX_SCOPE_PEER;
    const int failed = rep.second_rc == 0 && rep.second_status == 2;
    print_message("pid reuse: target pid %d (path %s) killed while its child %d keeps its sockets; the victim got "
                  "pid %d; the writer's next write: kvx_write_blocks %s%s%s (%s), peer link %d; %llu bytes of the "
                  "victim changed\n",
                  rep.t_pid, rep.path, rep.c_pid, rep.v_pid, kvx_strerror(rep.second_rc),
                  rep.second_rc == 0 ? ", transfer " : "", rep.second_rc == 0 ? status_name(rep.second_status) : "",
                  rep.second_msg, rep.link, (unsigned long long)rep.changed);
    /* accepted: write_blocks refuses with a peer-scope code (KVX_EPEERBROKEN, ...), or the transfer fails */
    if (!refused && !failed)
        fail_msg("the write into a dead target's reused pid was not failed (%s, %s)", kvx_strerror(rep.second_rc),
                 status_name(rep.second_status));
    if (rep.changed != 0) fail_msg("%llu bytes written into the process that got the pid", (unsigned long long)rep.changed);
}

/* process_vm_writev only into a process of the writer's own uid: root
 * writing into user A's private memory goes through the staging ring. */
static void test_kernel_path_own_uid_only(void **state) {
    (void)state;
    need_users();
    agent t, w;
    agent_cfg tc = {.user = &g_a, .region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=1", .fill = FILL};
    agent_cfg wc = {.region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=1"};
    start(&t, &tc, "target (kvxtest-a, private memory)");
    start(&w, &wc, "writer (root)");
    reply r = call(&w, OP_ADD, 0, 0, 0, &t.meta);
    if (r.rc != 0) fail_msg("add: %s: %s", kvx_strerror(r.rc), r.msg);
    reply wr = call(&w, OP_WRITE, 0, 4, 7, NULL);
    const int landed = wr.rc == 0 && wr.status == 1 && call(&t, OP_VERIFY, 4, 7, 0, NULL).rc == 0;
    print_message("root writes into the private memory of %s: path %s, write %s\n", g_a.name, r.path,
                  landed ? "landed" : "did not land");
    if (strcmp(r.path, "process_vm_writev") == 0)
        fail_msg("process_vm_writev into a process of another uid (%u)", (unsigned)g_a.uid);
    assert_string_equal(r.path, "staged");
    assert_true(landed);
}

/* ---- user namespaces */

/* (a) The target in a user namespace without mappings sees everyone
 * outside as the overflow uid, itself too: user A is not its own user. */
static void test_userns_target(void **state) {
    (void)state;
    need_users();
    agent t, w0, w1;
    agent_cfg tc = {.userns = 1, .region = R_ALLOC, .transport = 1, .fill = FILL};
    start(&t, &tc, "target (root, in a new user namespace)");
    if ((unsigned)t.hello.uid != g_overflowuid)
        fail_msg("the target sees itself as uid %lld, not the overflow uid %u", (long long)t.hello.uid, g_overflowuid);
    agent_cfg wc0 = {.user = &g_a, .region = R_PRIVATE, .transport = 1};
    agent_cfg wc1 = {.user = &g_a, .region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=1"};
    start(&w0, &wc0, "writer (kvxtest-a)");
    start(&w1, &wc1, "writer (kvxtest-a, shm.allow_other_users=1)");
    reply r0 = call(&w0, OP_ADD, 0, 0, 0, &t.meta);
    /* a writer that skips its own check: the target alone must refuse */
    reply r1 = call(&w1, OP_ADD, 0, 0, 0, &t.meta), wr = {0};
    if (r1.rc == 0) wr = call(&w1, OP_WRITE, 0, 2, 9, NULL);
    const uint64_t changed = call(&t, OP_CHANGED, 0, 0, 0, NULL).value;
    print_message("target in a user namespace (uid %lld there): %s adds it: %s (%s); with shm.allow_other_users=1: "
                  "%s%s%s (%s)%s; %llu bytes of the target's region changed\n",
                  (long long)t.hello.uid, g_a.name, kvx_strerror(r0.rc), r0.msg, kvx_strerror(r1.rc),
                  r1.rc == 0 ? ", path " : "", r1.rc == 0 ? r1.path : "", r1.msg,
                  r1.rc == 0 ? (wr.status == 1 ? ", and a write landed" : ", a write did not land") : "",
                  (unsigned long long)changed);
    assert_int_equal(r0.rc, KVX_EAUTH);
    if (r1.rc != KVX_EAUTH)
        fail_msg("the target in a user namespace let %s in (%s, path %s)", g_a.name, kvx_strerror(r1.rc), r1.path);
    assert_int_equal(changed, 0);
}

/* (b) The writer in a user namespace without mappings sees the target (user
 * A, as the writer was before) as the overflow uid, as itself: not its user. */
static void test_userns_writer(void **state) {
    (void)state;
    need_users();
    agent t, w;
    agent_cfg tc = {.user = &g_a, .region = R_ALLOC, .transport = 1, .fill = FILL};
    agent_cfg wc = {.user = &g_a, .userns = 1, .region = R_PRIVATE, .transport = 1};
    start(&t, &tc, "target (kvxtest-a)");
    start(&w, &wc, "writer (kvxtest-a, then a new user namespace)");
    reply r = call(&w, OP_ADD, 0, 0, 0, &t.meta);
    print_message("writer in a user namespace (uid %lld there) adds a target of %s: %s%s%s (%s)\n",
                  (long long)w.hello.uid, g_a.name, kvx_strerror(r.rc), r.rc == 0 ? ", path " : "",
                  r.rc == 0 ? r.path : "", r.msg);
    if (r.rc != KVX_EAUTH)
        fail_msg("a writer in a user namespace took a target outside it for its own user (%s)", kvx_strerror(r.rc));
}

typedef struct shared_ns {
    agent *t, *w;
    agent_cfg tc, wc;
} shared_ns;

/* The common parent: one user namespace, then the target and the writer. */
static int shared_ns_main(void *arg, int in, int out) {
    (void)in;
    shared_ns *s = arg;
    int32_t err = unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
    if (write_full(out, &err, sizeof err) != 0 || err) return 1;
    chan_fork(&s->t->c, agent_main, &s->tc, NULL, 0);
    chan_fork(&s->w->c, agent_main, &s->wc, NULL, 0);
    int ends[] = {s->t->c.cin, s->t->c.cout, s->w->c.cin, s->w->c.cout};
    for (int i = 0; i < 4; i++) close(ends[i]);
    while (wait(NULL) > 0) {}
    return 0;
}

/* (c) Both in the same user namespace (made by their common parent): the
 * same user. */
static void test_userns_shared(void **state) {
    (void)state;
    static agent t, w;
    static shared_ns s;
    s.t = &t;
    s.w = &w;
    s.tc = (agent_cfg){.region = R_ALLOC, .transport = 1, .fill = FILL};
    s.wc = (agent_cfg){.region = R_PRIVATE, .transport = 1};
    chan p = {0};
    assert_int_equal(chan_pipes(&t.c), 0);
    assert_int_equal(chan_pipes(&w.c), 0);
    assert_int_equal(chan_pipes(&p), 0);
    int ends[] = {t.c.cin, t.c.cout, w.c.cin, w.c.cout};
    assert_true(chan_fork(&p, shared_ns_main, &s, ends, 4) > 0);
    int fds[] = {t.c.to, t.c.from, w.c.to, w.c.from, p.to, p.from};
    for (int i = 0; i < 6; i++) hold_fd(fds[i]);
    for (int i = 0; i < 4; i++) close(ends[i]);
    close(p.cin);
    close(p.cout);
    int32_t err = 0;
    if (read_timed(p.from, &err, sizeof err, 10000) != 0) fail_msg("the common parent said nothing");
    if (err) {
        print_message("unshare(CLONE_NEWUSER): %s: skipped\n", strerror(err));
        skip();
    }
    if (agent_hello(&t) != 0 || t.hello.rc != 0) fail_msg("target: %s", t.hello.msg);
    if (agent_hello(&w) != 0 || w.hello.rc != 0) fail_msg("writer: %s", w.hello.msg);
    reply r = call(&w, OP_ADD, 0, 0, 0, &t.meta);
    if (r.rc != 0) fail_msg("the writer cannot add a target of its own user namespace: %s: %s", kvx_strerror(r.rc), r.msg);
    reply wr = call(&w, OP_WRITE, 0, 6, 3, NULL);
    const int landed = wr.rc == 0 && wr.status == 1 && call(&t, OP_VERIFY, 6, 3, 0, NULL).rc == 0;
    print_message("target and writer in one user namespace (uid %lld, %lld there): path %s, a write %s\n",
                  (long long)t.hello.uid, (long long)w.hello.uid, r.path, landed ? "landed" : "did not land");
    assert_true(landed);
}

/* ---- shm.allow_other_users=1, both directions */

/* (a) Another user, allowed, is served through the staging ring: it never
 * receives the descriptor of the region's file. */
static void test_other_user_staged(void **state) {
    (void)state;
    need_users();
    agent t, w;
    agent_cfg tc = {.region = R_ALLOC, .transport = 1, .opts = "shm.allow_other_users=1", .fill = FILL};
    agent_cfg wc = {.user = &g_a, .region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=1"};
    start(&t, &tc, "target (root, kvx_region_alloc)");
    start(&w, &wc, "writer (kvxtest-a)");
    reply r = call(&w, OP_ADD, 0, 0, 0, &t.meta);
    if (r.rc != 0) fail_msg("add: %s: %s", kvx_strerror(r.rc), r.msg);
    reply wr = call(&w, OP_WRITE, 1, 5, 4, NULL);
    const int landed = wr.rc == 0 && wr.status == 1 && call(&t, OP_VERIFY, 5, 4, 0, NULL).rc == 0;
    print_message("%s writes into a kvx_region_alloc region of root: path %s, write %s\n", g_a.name, r.path,
                  landed ? "landed" : "did not land");
    if (strcmp(r.path, "staged") != 0)
        fail_msg("another user took path '%s' (mapped: it was given the region's file descriptor)", r.path);
    assert_true(landed);
}

/* (b) A writer with shm.allow_other_users=0 refuses a target of another
 * user, metadata or not (the squatter); with 1 it connects. */
static void test_writer_refuses_other_user(void **state) {
    (void)state;
    need_users();
    agent t, w0, w1;
    agent_cfg tc = {.user = &g_a, .region = R_ALLOC, .transport = 1, .opts = "shm.allow_other_users=1", .fill = FILL};
    agent_cfg wc0 = {.region = R_PRIVATE, .transport = 1};
    agent_cfg wc1 = {.region = R_PRIVATE, .transport = 1, .opts = "shm.allow_other_users=1"};
    start(&t, &tc, "target (kvxtest-a)");
    start(&w0, &wc0, "writer (root)");
    start(&w1, &wc1, "writer (root, shm.allow_other_users=1)");
    reply r0 = call(&w0, OP_ADD, 0, 0, 0, &t.meta);
    reply r1 = call(&w1, OP_ADD, 0, 0, 0, &t.meta), wr = {0};
    if (r1.rc == 0) wr = call(&w1, OP_WRITE, 0, 3, 5, NULL);
    const int landed = r1.rc == 0 && wr.rc == 0 && wr.status == 1 && call(&t, OP_VERIFY, 3, 5, 0, NULL).rc == 0;
    print_message("root adds a target of %s: %s (%s); with shm.allow_other_users=1: %s, path %s, write %s\n", g_a.name,
                  kvx_strerror(r0.rc), r0.msg, kvx_strerror(r1.rc), r1.path, landed ? "landed" : "did not land");
    assert_int_equal(r0.rc, KVX_EAUTH);
    if (r1.rc != 0) fail_msg("add with shm.allow_other_users=1: %s: %s", kvx_strerror(r1.rc), r1.msg);
    if (strcmp(r1.path, "staged") != 0 && strcmp(r1.path, "mapped") != 0) fail_msg("path %s", r1.path);
    assert_true(landed);
}

/* ---- */

/* The shm backend is usable here (in a child: this process stays without
 * threads, so that its children may unshare(CLONE_NEWUSER)). */
static int shm_usable(void) {
    pid_t p = fork();
    if (p == 0) {
        static uint8_t buf[BL];
        kvx_transport *t = NULL;
        kvx_options *o = NULL;
        int rc = kvx_options_create(&o);
        if (rc == 0) rc = kvx_options_set(o, "backend", "shm");
        if (rc == 0) rc = kvx_transport_create(&t, buf, 1, BL, NULL, o);
        if (rc != 0) fprintf(stderr, "local_user: shm is not usable here: %s: skipped\n", kvx_last_error_message());
        kvx_transport_destroy(t);
        _exit(rc == 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void find_user(test_user *u) {
    struct passwd *pw = getpwnam(u->name);
    if (!pw) return;
    u->uid = pw->pw_uid;
    u->gid = pw->pw_gid;
    u->found = 1;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    g_self = getpid();
    if (geteuid() != 0) {
        printf("local_user: needs root (to become the test users, and for namespaces): skipped\n");
        return 77;
    }
    if (!shm_usable()) return 77;
    find_user(&g_a);
    find_user(&g_b);
    FILE *f = fopen("/proc/sys/kernel/overflowuid", "r");
    if (f && fscanf(f, "%u", &g_overflowuid) != 1) g_overflowuid = 65534;
    if (f) fclose(f);
    /* orphans of the cases (a killed target's child, a namespace's first
     * process) come to us, and each teardown reaps them */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (getenv("KVX_TEST_FILTER")) cmocka_set_test_filter(getenv("KVX_TEST_FILTER")); /* e.g. "*flood*" */
#define T(f) cmocka_unit_test_teardown(f, reap_all)
    const struct CMUnitTest tests[] = {
        T(test_other_user_refused_at_accept), T(test_other_uid_capped_oldest_first),
        T(test_flood_other_users_refused),    T(test_flood_other_users_allowed),
        T(test_pid_reuse),                    T(test_kernel_path_own_uid_only),
        T(test_userns_target),                T(test_userns_writer),
        T(test_userns_shared),                T(test_other_user_staged),
        T(test_writer_refuses_other_user),
    };
    return cmocka_run_group_tests_name("adversarial_local_user", tests, NULL, NULL);
}
