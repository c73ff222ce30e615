#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GUARD_BYTE 0xA5
#define INIT_FILL 0x5C

uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* KVX_TEST_REGION=shared: regions come from kvx_region_alloc(), so that the
 * shm backend takes its mapped path (default: malloc, private memory). */
static int shared_regions(void) {
    const char *v = getenv("KVX_TEST_REGION");
    return v && strcmp(v, "shared") == 0;
}

region region_new(uint64_t nb, uint64_t bl, uint8_t fill) {
    region r;
    r.nb = nb;
    r.bl = bl;
    r.fill = fill;
    if (shared_regions()) {
        void *p = NULL;
        CHECK_OK(kvx_region_alloc(&p, nb * bl + 2 * GUARD_LEN, 0));
        r.mem = p;
    } else {
        r.mem = malloc(nb * bl + 2 * GUARD_LEN);
    }
    assert_non_null(r.mem);
    memset(r.mem, GUARD_BYTE, GUARD_LEN);
    memset(r.mem + GUARD_LEN + nb * bl, GUARD_BYTE, GUARD_LEN);
    r.base = r.mem + GUARD_LEN;
    memset(r.base, fill, nb * bl);
    return r;
}

void region_free(region *r) {
    if (shared_regions()) kvx_region_free(r->mem);
    else free(r->mem);
    r->mem = r->base = NULL;
}

int region_guards_ok(const region *r) {
    const uint8_t *tail = r->base + r->nb * r->bl;
    for (size_t i = 0; i < GUARD_LEN; i++)
        if (r->mem[i] != GUARD_BYTE || tail[i] != GUARD_BYTE) return 0;
    return 1;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void fill_block(uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed) {
    uint64_t s = mix(idx * 0x9E3779B97F4A7C15ULL + seed + 1);
    for (uint64_t i = 0; i < bl; i += 8) {
        s = mix(s + i);
        size_t n = bl - i < 8 ? (size_t)(bl - i) : 8;
        memcpy(p + i, &s, n);
    }
}

int block_matches(const uint8_t *p, uint64_t bl, uint64_t idx, uint32_t seed) {
    uint8_t *want = malloc(bl);
    fill_block(want, bl, idx, seed);
    int ok = memcmp(p, want, bl) == 0;
    free(want);
    return ok;
}

int block_is(const uint8_t *p, uint64_t bl, uint8_t v) {
    for (uint64_t i = 0; i < bl; i++)
        if (p[i] != v) return 0;
    return 1;
}

const char *test_backend(void) {
    const char *b = getenv("KVX_TEST_BACKEND");
    return b && *b ? b : "tcp";
}

kvx_options *options_va(const char *backend, const char *extra, va_list ap) {
    kvx_options *o = NULL;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", backend));
    if (strcmp(backend, "tcp") == 0) CHECK_OK(kvx_options_set(o, "tcp.listen", "127.0.0.1:0"));
    /* KVX_TEST_OPTIONS="KEY=VALUE ...": options of every transport a test
     * creates (tcp.aead_impl=openssl, shm.private=staged, tcp.listen of tests
     * across network namespaces); a test's own options win. */
    const char *env = getenv("KVX_TEST_OPTIONS");
    if (env) CHECK_OK(kvx_options_parse(o, env));
    for (const char *kv = extra; kv; kv = va_arg(ap, const char *)) CHECK_OK(kvx_options_parse(o, kv));
    return o;
}

kvx_options *test_options(const char *extra, ...) {
    va_list ap;
    va_start(ap, extra);
    kvx_options *o = options_va(test_backend(), extra, ap);
    va_end(ap);
    return o;
}

kvx_transport *transport_new(const region *r, const char *config, kvx_options *opts) {
    kvx_transport *t = NULL;
    kvx_options *o = opts ? opts : test_options(NULL);
    CHECK_OK(kvx_transport_create(&t, r->base, r->nb, r->bl, config, o));
    kvx_options_destroy(o);
    assert_string_equal(kvx_transport_backend(t), test_backend());
    return t;
}

void get_meta(kvx_transport *t, metablob *m) {
    CHECK_OK(kvx_get_agent_metadata(&m->len, t, m->bytes, sizeof m->bytes));
    CHECK_OK(kvx_transport_base_addr(&m->base, t));
    CHECK_OK(kvx_transport_num_blocks(&m->nb, t));
    CHECK_OK(kvx_transport_block_len(&m->bl, t));
}

void add_peer(kvx_transport *t, const char *id, const metablob *m) {
    CHECK_OK(kvx_add_remote_peer(t, id, m->bytes, m->len, m->base, m->nb, m->bl));
}

long wait_peer_link(kvx_transport *t, const char *peer, int link, int timeout_ms, kvx_peer_state *st) {
    kvx_peer_state s;
    uint64_t t0 = now_ms();
    for (;;) {
        CHECK_OK(kvx_get_peer_state(t, peer, &s));
        if (st) *st = s;
        if (s.link == link) return (long)(now_ms() - t0);
        if (now_ms() - t0 > (uint64_t)timeout_ms) return -1;
        usleep(10 * 1000);
    }
}

size_t wait_ids(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms,
                size_t *n_failed, uint8_t *status) {
    uint8_t *seen = calloc(n ? n : 1, 1);
    size_t got = 0, nf = 0;
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    uint64_t done[64], failed[64];
    while (got < n && now_ms() < end) {
        size_t nd = 0, nfl = 0;
        CHECK_OK(kvx_poll(&nd, &nfl, t, peer, done, 64, failed, 64));
        for (size_t k = 0; k < nd + nfl; k++) {
            uint64_t id = k < nd ? done[k] : failed[k - nd];
            size_t j = 0;
            while (j < n && ids[j] != id) j++;
            if (j == n) fail_msg("poll reported id %llu that is not awaited", (unsigned long long)id);
            if (seen[j]) fail_msg("id %llu surfaced twice", (unsigned long long)id);
            seen[j] = k < nd ? 1 : 2;
            got++;
            if (k >= nd) nf++;
        }
        if (nd + nfl == 0) usleep(200);
    }
    if (status) memcpy(status, seen, n);
    free(seen);
    if (n_failed) *n_failed = nf;
    return got;
}

size_t wait_results(kvx_transport *t, const char *peer, const uint64_t *ids, size_t n, int timeout_ms,
                    size_t *n_failed, int32_t *codes) {
    uint8_t *seen = calloc(n ? n : 1, 1);
    size_t got = 0, nf = 0;
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    kvx_result res[64];
    while (got < n && now_ms() < end) {
        size_t nr = 0;
        CHECK_OK(kvx_poll_results(&nr, t, peer, res, 64));
        for (size_t k = 0; k < nr; k++) {
            size_t j = 0;
            while (j < n && ids[j] != res[k].id) j++;
            if (j == n) fail_msg("poll_results reported id %llu that is not awaited", (unsigned long long)res[k].id);
            if (seen[j]) fail_msg("id %llu surfaced twice", (unsigned long long)res[k].id);
            assert_int_equal(res[k].reserved, 0);
            seen[j] = 1;
            if (codes) codes[j] = res[k].status;
            got++;
            if (res[k].status != 0) nf++;
        }
        if (nr == 0) usleep(200);
    }
    free(seen);
    if (n_failed) *n_failed = nf;
    return got;
}

/* ---- child target ---- */

enum { CMD_VERIFY = 1, CMD_UNTOUCHED = 2, CMD_EXIT = 3 };

int write_full(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

int read_full(int fd, void *p, size_t n) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The command pipes: a write that fails means the other side is gone. */
static void write_all(int fd, const void *p, size_t n) {
    if (write_full(fd, p, n) != 0) _exit(90);
}

static void child_main(int in, int out, uint64_t nb, uint64_t bl, const char *config, const char *const *opts) {
    region r = region_new(nb, bl, INIT_FILL);
    kvx_options *o = test_options(NULL);
    for (; opts && *opts; opts++)
        if (kvx_options_parse(o, *opts) != 0) _exit(93);
    kvx_transport *t = NULL;
    if (kvx_transport_create(&t, r.base, nb, bl, config, o) != 0) {
        fprintf(stderr, "child: create failed: %s\n", kvx_last_error_message());
        _exit(91);
    }
    kvx_options_destroy(o);
    static metablob m;
    get_meta(t, &m);
    write_all(out, &m, sizeof m);
    for (;;) {
        uint64_t cmd[3];
        if (read_full(in, cmd, sizeof cmd) != 0) break;
        uint8_t ok = 0;
        if (cmd[0] == CMD_VERIFY) {
            ok = cmd[1] < nb && block_matches(r.base + cmd[1] * bl, bl, cmd[2] >> 32, (uint32_t)cmd[2]);
        } else if (cmd[0] == CMD_UNTOUCHED) {
            uint8_t *written = calloc(nb, 1);
            uint64_t idx;
            for (uint64_t i = 0; i < cmd[1]; i++) {
                if (read_full(in, &idx, sizeof idx) != 0) _exit(92);
                if (idx < nb) written[idx] = 1;
            }
            ok = (uint8_t)region_guards_ok(&r);
            for (uint64_t i = 0; i < nb && ok; i++)
                if (!written[i] && !block_is(r.base + i * bl, bl, INIT_FILL)) ok = 0;
            free(written);
        } else {
            break;
        }
        write_all(out, &ok, 1);
    }
    kvx_transport_destroy(t);
    region_free(&r);
    _exit(0);
}

void child_start_opts(child_target *c, uint64_t nb, uint64_t bl, const char *config, const char *const *opts,
                      long nofile) {
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    fflush(NULL);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        close(a[1]);
        close(b[0]);
        struct rlimit rl;
        if (nofile > 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            rl.rlim_cur = (rlim_t)nofile;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(94);
        }
        child_main(a[0], b[1], nb, bl, config, opts);
    }
    close(a[0]);
    close(b[1]);
    c->to_child = a[1];
    c->from_child = b[0];
    if (read_full(c->from_child, &c->meta, sizeof c->meta) != 0) fail_msg("child target did not start");
}

extern char **environ;

#define CHILD_EXEC_FLAG "--kvx-child-target"

pid_t spawn_self(const char *const *argv, int *to_child, int *from_child) {
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, a[0], 0);
    posix_spawn_file_actions_adddup2(&fa, b[1], 1);
    posix_spawn_file_actions_addclose(&fa, a[1]);
    posix_spawn_file_actions_addclose(&fa, b[0]);
    fflush(NULL);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(a[0]);
    close(b[1]);
    *to_child = a[1];
    *from_child = b[0];
    return pid;
}

void child_start_exec(child_target *c, uint64_t nb, uint64_t bl, const char *config, const char *const *opts) {
    char snb[24], sbl[24];
    snprintf(snb, sizeof snb, "%llu", (unsigned long long)nb);
    snprintf(sbl, sizeof sbl, "%llu", (unsigned long long)bl);
    const char *argv[64] = {"kvx-child-target", CHILD_EXEC_FLAG, snb, sbl, config ? config : ""};
    size_t n = 5;
    for (; opts && *opts && n < 63; opts++) argv[n++] = *opts;
    c->pid = spawn_self(argv, &c->to_child, &c->from_child);
    if (read_full(c->from_child, &c->meta, sizeof c->meta) != 0) fail_msg("child target did not start");
}

void child_exec_dispatch(int argc, char **argv) {
    if (argc < 5 || strcmp(argv[1], CHILD_EXEC_FLAG) != 0) return;
    const char *const *opts = (const char *const *)argv + 5;
    child_main(0, 1, strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), argv[4][0] ? argv[4] : NULL, opts);
}

void child_start(child_target *c, uint64_t nb, uint64_t bl, const char *config) {
    child_start_opts(c, nb, bl, config, NULL, 0);
}

int child_verify(child_target *c, uint64_t remote_idx, uint64_t local_idx, uint32_t seed) {
    uint64_t cmd[3] = {CMD_VERIFY, remote_idx, (local_idx << 32) | seed};
    write_all(c->to_child, cmd, sizeof cmd);
    uint8_t ok = 0;
    if (read_full(c->from_child, &ok, 1) != 0) return 0;
    return ok;
}

int child_untouched(child_target *c, const uint64_t *written, size_t n) {
    uint64_t cmd[3] = {CMD_UNTOUCHED, n, 0};
    write_all(c->to_child, cmd, sizeof cmd);
    write_all(c->to_child, written, n * sizeof *written);
    uint8_t ok = 0;
    if (read_full(c->from_child, &ok, 1) != 0) return 0;
    return ok;
}

/* 1 when every thread of pid is in state T (stopped). */
static int all_threads_stopped(pid_t pid) {
    char dir[64], path[64 + 256 + 8], line[512];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int all = 1;
    for (struct dirent *e; all && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        const char *paren = f && fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
        all = paren && paren[1] == ' ' && paren[2] == 'T';  /* after "pid (comm)" */
        if (f) fclose(f);
    }
    closedir(d);
    return all;
}

/* Children frozen by child_freeze(): killed at exit, so that a test that
 * fails while one is stopped does not leave it holding the test's output
 * open (CTest would wait for it until its timeout). */
static pid_t g_frozen[64];

static void kill_frozen(void) {
    for (size_t i = 0; i < sizeof g_frozen / sizeof g_frozen[0]; i++)
        if (g_frozen[i] > 0 && waitpid(g_frozen[i], NULL, WNOHANG) == 0) {
            kill(g_frozen[i], SIGKILL);
            waitpid(g_frozen[i], NULL, 0);
        }
}

void child_freeze(child_target *c) {
    static int hooked;
    if (!hooked) hooked = atexit(kill_frozen) == 0;
    for (size_t i = 0; i < sizeof g_frozen / sizeof g_frozen[0]; i++)
        if (g_frozen[i] == c->pid || g_frozen[i] <= 0) {
            g_frozen[i] = c->pid;
            break;
        }
    assert_int_equal(kill(c->pid, SIGSTOP), 0);
    uint64_t end = now_ms() + 10000;
    while (!all_threads_stopped(c->pid)) {
        if (now_ms() > end) fail_msg("child %d did not stop within 10 s", (int)c->pid);
        usleep(200);
    }
}

void child_kill(child_target *c) {
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    close(c->to_child);
    close(c->from_child);
    c->pid = -1;
}

int child_stop(child_target *c) {
    uint64_t cmd[3] = {CMD_EXIT, 0, 0};
    write_all(c->to_child, cmd, sizeof cmd);
    int st = 0;
    waitpid(c->pid, &st, 0);
    close(c->to_child);
    close(c->from_child);
    c->pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- /proc ---- */

int proc_holds_inode(pid_t pid, unsigned long inode) {
    char want[64], dpath[64], path[400], link[128];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    snprintf(dpath, sizeof dpath, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dpath);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        snprintf(path, sizeof path, "%s/%s", dpath, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            found |= strcmp(link, want) == 0;
        }
    }
    if (d) closedir(d);
    return found;
}

long proc_cpu_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    assert_non_null(p);
    unsigned long ut = 0, st = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
    return (long)(ut + st);
}

void move_four_blocks(kvx_transport *ta, kvx_transport *tb, const region *ra, const region *rb, uint32_t salt) {
    metablob m;
    get_meta(tb, &m);
    add_peer(ta, "b", &m);
    uint64_t ids[4];
    for (uint64_t i = 0; i < 4; i++) {
        fill_block(ra->base + i * 4096, 4096, i, salt);
        uint64_t r = i + 4;
        CHECK_OK(kvx_write_blocks(&ids[i], ta, "b", &i, &r, 1));
    }
    size_t nf = 1;
    assert_int_equal(wait_ids(ta, "b", ids, 4, 30000, &nf, NULL), 4);
    assert_int_equal(nf, 0);
    for (uint64_t i = 0; i < 4; i++) assert_true(block_matches(rb->base + (i + 4) * 4096, 4096, i, salt));
}

int self_maps_file(const char *name, char *out, size_t cap) {
    if (cap) out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *p = strstr(line, " /");
        if (p && strstr(p, name)) {
            found = 1;
            if (cap) {
                snprintf(out, cap, "%s", p + 1);
                out[strcspn(out, "\n")] = 0;
            }
        }
    }
    fclose(f);
    return found;
}

void shm_listener_name(pid_t pid, char *name, size_t cap) {
    FILE *f = fopen("/proc/net/unix", "r");
    assert_non_null(f);
    char line[512];
    name[0] = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned flags, type, st;
        unsigned long inode;
        char p[256];
        if (sscanf(line, "%*s %*x %*x %x %x %x %lu %255s", &flags, &type, &st, &inode, p) != 5) continue;
        if (type == SOCK_SEQPACKET && (flags & 0x10000) && p[0] == '@' && proc_holds_inode(pid, inode))
            snprintf(name, cap, "%.*s", (int)(cap - 1), p + 1);
    }
    fclose(f);
    assert_true(name[0] != 0);
}

int loopback_socket(int backlog, uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    if (backlog > 0) assert_int_equal(listen(fd, backlog), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}
