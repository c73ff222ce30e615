/* Admission of the tcp target under a hostile network (the target is a
 * forked child; hostile clients are threads of this process, bounded in time):
 *   - 2,000 idle unauthenticated connections held open (reopened as the
 *     target closes them) plus 200 new idle ones a second, from 64 source
 *     addresses: >= 99 of 100 legitimate kvx_add_remote_peer calls succeed,
 *     each within 1 s;
 *   - one source address over its share of handshakes is cut to it, and a
 *     peer from another address still gets in;
 *   - 300 transports add the same target at once (released by a barrier):
 *     all 300 succeed;
 *   - a flood of garbage (random bytes, wrong magic, partial and wrong
 *     HELLOs, a frame without a handshake) never fails a legitimate add and
 *     never lands a byte (canaries in every block);
 *   - tcp.max_connections bounds the authenticated connections;
 *   - the accept loop of a target out of descriptors (EMFILE) uses <= 5 % of
 *     a core, and accepts again once descriptors are free; the shm backend's
 *     listener too.
 * tcp only (exits 77 for another KVX_TEST_BACKEND). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define NB 16
#define BL 4096
#define INIT_FILL 0x5C /* what the harness's child fills its region with */

/* ---- helpers */

static uint16_t target_port(const child_target *c) {
    /* The metadata's tcp endpoint: the child listens on 127.0.0.1:PORT; ask the kernel which. */
    char path[300];
    snprintf(path, sizeof path, "/proc/%d/net/tcp", (int)c->pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    unsigned port = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned la, lp, st;
        if (sscanf(line, " %*d: %x:%x %*x:%*x %x", &la, &lp, &st) == 3 && st == 0x0A && la == htonl(0x7f000001)) {
            /* a listener on 127.0.0.1: ours is the one whose inode the child holds */
            unsigned long inode = 0;
            if (sscanf(line, " %*d: %*x:%*x %*x:%*x %*x %*x:%*x %*x:%*x %*x %*u %*u %lu", &inode) != 1) continue;
            if (proc_holds_inode(c->pid, inode)) port = lp;
        }
    }
    fclose(f);
    assert_true(port != 0);
    return (uint16_t)port;
}

/* Socket descriptors a process holds. */
static int count_sockets(pid_t pid) {
    char path[300], link[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/%d/fd/%s", (int)pid, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k > 0 && strncmp(link, "socket:", 7) == 0) n++;
    }
    closedir(d);
    return n;
}

/* The share of one core pid used over about ms milliseconds (its ticks and
 * the wall time measured come back too). */
static double cpu_share(pid_t pid, unsigned ms, long *ticks, uint64_t *wall) {
    long hz = sysconf(_SC_CLK_TCK);
    long t0 = proc_cpu_ticks(pid);
    uint64_t w0 = now_ms();
    usleep(ms * 1000u);
    *ticks = proc_cpu_ticks(pid) - t0;
    *wall = now_ms() - w0;
    return (double)*ticks / (double)hz * 1000.0 / (double)*wall;
}

static void raise_nofile(void) {
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 12000) {
        fprintf(stderr, "admission: RLIMIT_NOFILE hard limit %lu < 12000: skipped\n", (unsigned long)rl.rlim_max);
        exit(77);
    }
}

/* A non-blocking connect to 127.0.0.1:port from 127.0.SRC_HI.src (0 = the
 * kernel's choice); -1 when no descriptor or port is left. */
#define SRC_HI 1
static int open_idle(uint16_t port, int src) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (src > 0) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        me.sin_addr.s_addr = htonl(0x7f000000u | (SRC_HI << 8) | (unsigned)src);
        if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0) {
            close(fd);
            return -1;
        }
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    to.sin_addr.s_addr = htonl(0x7f000001);
    if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static int closed_by_peer(int fd) {
    char b[64];
    ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* ---- (a) idle flood */

#define HELD 2000
#define FLOOD_MAX 4000
#define SOURCES 64

typedef struct idle_flood {
    uint16_t port;
    int seconds; /* bound */
    atomic_int stop;
    int held[HELD], flood[FLOOD_MAX];
    long opened, reopened, flood_opened;
} idle_flood;

/* Keeps HELD idle connections open (reopening what the target closes) and
 * opens 200 new idle ones a second, for at most `seconds`. */
static void *idle_flood_main(void *arg) {
    idle_flood *f = arg;
    for (int i = 0; i < HELD; i++) {
        f->held[i] = open_idle(f->port, 1 + i % SOURCES);
        f->opened += f->held[i] >= 0;
    }
    int nflood = 0;
    uint64_t t0 = now_ms(), next_new = t0;
    while (!atomic_load(&f->stop) && now_ms() - t0 < (uint64_t)f->seconds * 1000) {
        for (int i = 0; i < HELD; i++) {
            if (f->held[i] >= 0 && !closed_by_peer(f->held[i])) continue;
            if (f->held[i] >= 0) close(f->held[i]);
            f->held[i] = open_idle(f->port, 1 + i % SOURCES);
            f->reopened++;
        }
        for (; next_new <= now_ms() && nflood < FLOOD_MAX; next_new += 5) {  /* 200 a second */
            f->flood[nflood] = open_idle(f->port, 1 + nflood % SOURCES);
            f->flood_opened += f->flood[nflood] >= 0;
            nflood++;
        }
        usleep(10000);
    }
    for (int i = 0; i < HELD; i++)
        if (f->held[i] >= 0) close(f->held[i]);
    for (int i = 0; i < nflood; i++)
        if (f->flood[i] >= 0) close(f->flood[i]);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One legitimate add (then a remove); its latency in ms, or UINT64_MAX when it failed. */
static uint64_t legit_add(kvx_transport *a, const metablob *m) {
    uint64_t t = now_ms();
    int rc = kvx_add_remote_peer(a, "t", m->bytes, m->len, m->base, m->nb, m->bl);
    uint64_t ms = now_ms() - t;
    if (rc != 0) {
        print_message("legit add failed after %llu ms: %s\n", (unsigned long long)ms, kvx_last_error_message());
        return UINT64_MAX;
    }
    CHECK_OK(kvx_remove_remote_peer(a, "t"));
    return ms;
}

static void test_idle_flood(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    static idle_flood f;
    memset(&f, 0, sizeof f);
    f.port = target_port(&c);
    f.seconds = 60;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, idle_flood_main, &f), 0);
    usleep(1500000); /* the held set is open, the target has closed and seen reopened ones */
    int target_sockets = count_sockets(c.pid);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, NULL);
    uint64_t ms[100];
    int ok = 0;
    for (int i = 0; i < 100; i++) {
        ms[i] = legit_add(a, &c.meta);
        ok += ms[i] <= 1000;
        usleep(20000);
    }
    int target_sockets_end = count_sockets(c.pid);
    atomic_store(&f.stop, 1);
    pthread_join(th, NULL);
    qsort(ms, 100, sizeof ms[0], cmp_u64);
    print_message("idle flood: %d of 100 adds within 1 s; latency median %llu ms, p99 %llu ms, max %llu ms; "
                  "hostile opened %ld + reopened %ld + flood %ld; target held %d, then %d sockets\n",
                  ok, (unsigned long long)ms[50], (unsigned long long)ms[98], (unsigned long long)ms[99], f.opened,
                  f.reopened, f.flood_opened, target_sockets, target_sockets_end);
    assert_true(f.reopened > HELD); /* the flood really ran against a target that closes idle connections */
    assert_true(ok >= 99);
    /* the added peer still moves bytes */
    add_peer(a, "t", &c.meta);
    fill_block(r.base, BL, 0, 11);
    uint64_t l = 0, rm = 3, id;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 10000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(child_verify(&c, 3, 0, 11));
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* One source over its share: the target keeps at most its cap of them; a
 * peer from another address gets in. */
static void test_per_source_cap(void **state) {
    (void)state;
    static const char *const opts[] = {"tcp.handshake_timeout_ms=30000", "tcp.max_handshakes_per_source=32", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    uint16_t port = target_port(&c);
    int base = count_sockets(c.pid);
    static int fds[500];
    for (int i = 0; i < 500; i++) fds[i] = open_idle(port, 7);
    usleep(300000);
    int held = count_sockets(c.pid) - base;
    print_message("per source: 500 idle from one address, the target holds %d (cap 32)\n", held);
    assert_true(held >= 30 && held <= 32);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, NULL);
    for (int i = 0; i < 10; i++) assert_true(legit_add(a, &c.meta) <= 1000);
    for (int i = 0; i < 500; i++)
        if (fds[i] >= 0) close(fds[i]);
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* ---- (b) 300 at once */

#define CROWD 300

typedef struct crowd {
    pthread_barrier_t ready;
    const metablob *m;
    atomic_int ok;
    atomic_ullong worst_ms;
} crowd;

static void *crowd_main(void *arg) {
    crowd *cw = arg;
    region r = region_new(1, BL, 0);
    kvx_options *o = test_options(NULL);
    kvx_transport *t = NULL;
    int rc = kvx_transport_create(&t, r.base, 1, BL, NULL, o);
    kvx_options_destroy(o);
    pthread_barrier_wait(&cw->ready);
    if (rc == 0) {
        uint64_t t0 = now_ms();
        rc = kvx_add_remote_peer(t, "t", cw->m->bytes, cw->m->len, cw->m->base, cw->m->nb, cw->m->bl);
        uint64_t ms = now_ms() - t0;
        if (rc != 0) fprintf(stderr, "crowd: add failed: %s\n", kvx_last_error_message());
        unsigned long long w = atomic_load(&cw->worst_ms);
        while (ms > w && !atomic_compare_exchange_weak(&cw->worst_ms, &w, ms)) {}
    }
    if (rc == 0) atomic_fetch_add(&cw->ok, 1);
    pthread_barrier_wait(&cw->ready); /* every add is done before any transport goes */
    kvx_transport_destroy(t);
    region_free(&r);
    return NULL;
}

static void test_crowd(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    static crowd cw;
    memset(&cw, 0, sizeof cw);
    cw.m = &c.meta;
    pthread_barrier_init(&cw.ready, NULL, CROWD);
    static pthread_t th[CROWD];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    for (int i = 0; i < CROWD; i++) assert_int_equal(pthread_create(&th[i], &at, crowd_main, &cw), 0);
    for (int i = 0; i < CROWD; i++) pthread_join(th[i], NULL);
    print_message("crowd: %d of %d transports added one target at once; slowest %llu ms\n", atomic_load(&cw.ok),
                  CROWD, (unsigned long long)atomic_load(&cw.worst_ms));
    assert_int_equal(atomic_load(&cw.ok), CROWD);
    pthread_barrier_destroy(&cw.ready);
    assert_int_equal(child_stop(&c), 0);
}

/* ---- (c) garbage */

typedef struct garbage {
    uint16_t port;
    uint64_t instance_id;
    int seconds;
    atomic_int stop;
    long sent[6];
} garbage;

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One hostile connection of kind k; returns its fd (kept idle) or -1 (closed). */
static int garbage_conn(garbage *g, int k, unsigned *seed) {
    int fd = open_idle(g->port, 1 + (int)(rand_r(seed) % SOURCES));
    if (fd < 0) return -1;
    struct pollfd p = {fd, POLLOUT, 0};
    poll(&p, 1, 100);
    uint8_t b[512];
    size_t n = 0;
    uint8_t hello[16] = {'K', 'V', 'X', 'S', 1, 1, 0, 0};
    put_u64(hello + 8, g->instance_id);
    switch (k) {
    case 0: /* random bytes */
        n = 1 + rand_r(seed) % sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rand_r(seed);
        break;
    case 1: /* wrong magic */
        memcpy(b, hello, 16);
        b[rand_r(seed) % 4] ^= 0x20;
        n = 16;
        break;
    case 2: /* a partial HELLO, then silence */
        memcpy(b, hello, 16);
        n = 1 + rand_r(seed) % 15;
        break;
    case 3: /* a HELLO for another transport */
        memcpy(b, hello, 16);
        put_u64(b + 8, g->instance_id ^ 1);
        n = 16;
        break;
    case 4: /* a HELLO, then an AUTH of random bytes */
        memcpy(b, hello, 16);
        memcpy(b + 16, hello, 8);
        b[21] = 2; /* kind auth */
        for (size_t i = 24; i < 72; i++) b[i] = (uint8_t)rand_r(seed);
        n = 72;
        break;
    default: /* a data frame with no handshake: header, a segment, payload */
        for (size_t i = 0; i < sizeof b; i++) b[i] = 0xEE;
        put_u32(b, 0x4658564bu);
        n = sizeof b;
        break;
    }
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    g->sent[k]++;
    if (rand_r(seed) % 2) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *garbage_main(void *arg) {
    garbage *g = arg;
    unsigned seed = 12345;
    static int keep[512];
    for (int i = 0; i < 512; i++) keep[i] = -1;
    uint64_t t0 = now_ms();
    for (long i = 0; !atomic_load(&g->stop) && now_ms() - t0 < (uint64_t)g->seconds * 1000; i++) {
        int slot = (int)(i % 512);
        if (keep[slot] >= 0) close(keep[slot]);
        keep[slot] = garbage_conn(g, (int)(i % 6), &seed);
        if (i % 64 == 0) usleep(1000);
    }
    for (int i = 0; i < 512; i++)
        if (keep[i] >= 0) close(keep[i]);
    return NULL;
}

static uint64_t instance_of(const metablob *m) {
    /* the core section (type 1) comes first: its 8-byte header at 16, the instance id at 24 of its body */
    assert_int_equal(m->bytes[16] | m->bytes[17] << 8, 1);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)m->bytes[48 + i] << (8 * i);
    return v;
}

static void test_garbage_flood(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    static garbage g;
    memset(&g, 0, sizeof g);
    g.port = target_port(&c);
    g.instance_id = instance_of(&c.meta);
    g.seconds = 60;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, garbage_main, &g), 0);
    usleep(300000);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, NULL);
    int ok = 0;
    uint64_t worst = 0;
    for (int i = 0; i < 50; i++) {
        uint64_t ms = legit_add(a, &c.meta);
        ok += ms != UINT64_MAX;
        if (ms != UINT64_MAX && ms > worst) worst = ms;
        usleep(20000);
    }
    /* a legitimate write in the middle of it lands, and only there */
    add_peer(a, "t", &c.meta);
    fill_block(r.base + 2 * BL, BL, 2, 5);
    uint64_t l = 2, rm = 9, id;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, a, "t", &l, &rm, 1));
    assert_int_equal(wait_ids(a, "t", &id, 1, 10000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    atomic_store(&g.stop, 1);
    pthread_join(th, NULL);
    long total = 0;
    for (int k = 0; k < 6; k++) total += g.sent[k];
    print_message("garbage: %ld hostile connections (random %ld, magic %ld, partial %ld, other %ld, auth %ld, "
                  "frame %ld); %d of 50 adds succeeded, slowest %llu ms\n",
                  total, g.sent[0], g.sent[1], g.sent[2], g.sent[3], g.sent[4], g.sent[5], ok,
                  (unsigned long long)worst);
    assert_true(total > 1000);
    assert_int_equal(ok, 50);
    assert_true(child_verify(&c, 9, 2, 5));
    uint64_t written = 9;
    assert_true(child_untouched(&c, &written, 1)); /* canaries: every other block and the guards */
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* ---- authenticated connections are bounded */

static void test_max_connections(void **state) {
    (void)state;
    static const char *const opts[] = {"tcp.max_connections=4", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    region r = region_new(NB, BL, 0);
    kvx_transport *a[5];
    for (int i = 0; i < 5; i++) a[i] = transport_new(&r, NULL, test_options("connect_timeout_ms=1000", NULL));
    for (int i = 0; i < 4; i++) add_peer(a[i], "t", &c.meta);
    uint64_t t0 = now_ms();
    int rc = kvx_add_remote_peer(a[4], "t", c.meta.bytes, c.meta.len, c.meta.base, c.meta.nb, c.meta.bl);
    print_message("max_connections=4: a fifth peer -> %s after %llu ms\n", kvx_strerror(rc),
                  (unsigned long long)(now_ms() - t0));
    assert_true(rc != 0);
    CHECK_OK(kvx_remove_remote_peer(a[0], "t"));
    usleep(100000);
    add_peer(a[4], "t", &c.meta); /* a slot is free again */
    for (int i = 0; i < 5; i++) kvx_transport_destroy(a[i]);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

/* ---- (d) out of descriptors */

#define NOFILE 64
#define OVER 400

static void test_emfile(void **state) {
    (void)state;
    static const char *const opts[] = {"tcp.handshake_timeout_ms=60000", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, NOFILE);
    uint16_t port = target_port(&c);
    static int fds[OVER];
    for (int i = 0; i < OVER; i++) fds[i] = open_idle(port, 1 + i % SOURCES);
    usleep(1000000);
    char dpath[64];
    snprintf(dpath, sizeof dpath, "/proc/%d/fd", (int)c.pid);
    int nfd = 0;
    DIR *d = opendir(dpath);
    assert_non_null(d);
    while (readdir(d)) nfd++;
    closedir(d);
    nfd -= 2; /* . and .. */
    long ticks;
    uint64_t wall;
    double share = cpu_share(c.pid, 4000, &ticks, &wall);
    print_message("EMFILE: the target holds %d of %d descriptors; its CPU over %llu ms: %ld ticks = %.1f %% of a core\n",
                  nfd, NOFILE, (unsigned long long)wall, ticks, share * 100);
    assert_true(nfd >= NOFILE - 1); /* it really ran out */
    assert_true(share <= 0.05);
    /* descriptors free again: the listener is back */
    for (int i = 0; i < OVER; i++)
        if (fds[i] >= 0) close(fds[i]);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = transport_new(&r, NULL, NULL);
    add_peer(a, "t", &c.meta);
    kvx_transport_destroy(a);
    assert_int_equal(child_stop(&c), 0);
    region_free(&r);
}

static int open_unix_idle(const char *name) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0); /* a full backlog: EAGAIN, not a wait */
    assert_true(fd >= 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, name, strlen(name));
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    if (connect(fd, (struct sockaddr *)&a, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The same for the shm listener (an abstract unix socket): the child serves
 * shm only; its listening socket's name is found in /proc/net/unix
 * (shm_listener_name). */
static void test_shm_emfile(void **state) {
    (void)state;
    static const char *const opts[] = {"backend=shm", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, NOFILE);
    char name[256];
    shm_listener_name(c.pid, name, sizeof name);
    static int fds[OVER];
    int opened = 0;
    for (int i = 0; i < OVER; i++) opened += (fds[i] = open_unix_idle(name)) >= 0;
    usleep(1000000);
    long ticks;
    uint64_t wall;
    double share = cpu_share(c.pid, 4000, &ticks, &wall);
    print_message("shm EMFILE: %d idle connections to @%s (the child may hold %d descriptors); its CPU over %llu ms: "
                  "%ld ticks = %.1f %% of a core\n",
                  opened, name, NOFILE, (unsigned long long)wall, ticks, share * 100);
    assert_true(opened > NOFILE); /* more than it can accept: it ran out */
    assert_true(share <= 0.05);
    for (int i = 0; i < OVER; i++)
        if (fds[i] >= 0) close(fds[i]);
    assert_int_equal(child_stop(&c), 0);
}

static int setup(void **state) {
    (void)state;
    if (strcmp(test_backend(), "tcp") != 0) {
        fprintf(stderr, "admission: tcp only: skipped\n");
        exit(77);
    }
    raise_nofile();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_flood),      cmocka_unit_test(test_per_source_cap),
        cmocka_unit_test(test_crowd),           cmocka_unit_test(test_garbage_flood),
        cmocka_unit_test(test_max_connections), cmocka_unit_test(test_emfile),
        cmocka_unit_test(test_shm_emfile),
    };
    return cmocka_run_group_tests_name("adversarial_admission", tests, setup, NULL);
}
