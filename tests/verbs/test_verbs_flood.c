/* The verbs listener under a hostile network. The target is a forked child;
 * the hostile client is this process, on librdmacm directly, from the
 * target's own address and (in the Soft-RoCE VM) from FLOOD_EXTRA more
 * addresses it adds to the rxe netdev:
 *   - a slow peer: HELLO, then thousands of HELLOs by others, then its AUTH:
 *     accepted (a table that evicts the oldest challenge refused it), once:
 *     a replayed AUTH is not accepted;
 *   - a half-open connection (accepted, never an RTU) is closed by the
 *     target after twice its connect timeout;
 *   - a flood of connect requests with no private data, garbage private
 *     data, valid HELLOs never followed by AUTH, AUTHs naming no challenge
 *     and HELLOs for another transport (200 a second, see FLOOD_RATE), while
 *     >= 99 of 100 legitimate kvx_add_remote_peer calls succeed, each within
 *     1 s; the peer then moves bytes;
 *   - CROWD transports add one target at once: all succeed.
 * Skips (77) without RDMA. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "vtest.h"

#define NB 16
#define BL 4096
#define MAX_SRC 9
#define FLOOD_EXTRA 8 /* extra source addresses, VM only */
#define INFLIGHT 48   /* hostile connect attempts in flight per flood thread */
#define CROWD_DEFAULT 300

enum { K_NONE, K_GARBAGE, K_HELLO, K_AUTH, K_OTHER_HELLO, K_KINDS };

/* ---- handshake bytes (docs/wire-format.md, "Handshake") */

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void header(uint8_t *p, int kind) {
    memcpy(p, "KVXS", 4);
    p[4] = 1;
    p[5] = (uint8_t)kind;
    p[6] = p[7] = 0;
}
static size_t hello(uint8_t *p, uint64_t instance) {
    header(p, 1);
    put_le(p + 8, instance, 8);
    return 16;
}

typedef struct challenge {
    uint32_t id;
    uint8_t nonce[16];
} challenge;

/* 1 when p holds a CHALLENGE. */
static int parse_challenge(const uint8_t *p, size_t n, challenge *c) {
    if (n < 28 || memcmp(p, "KVXS", 4) != 0 || p[4] != 1 || p[5] != 3) return 0;
    c->id = (uint32_t)get_le(p + 8, 4);
    memcpy(c->nonce, p + 12, 16);
    return 1;
}

/* The AUTH answering c with the metadata's secret (no fingerprint, flags 0). */
static size_t auth(uint8_t *p, const metablob *m, const challenge *c) {
    header(p, 2);
    put_le(p + 8, vt_meta_instance(m), 8);
    put_le(p + 16, c->id, 4);
    memset(p + 20, 0, 12); /* fingerprint, flags */
    RAND_bytes(p + 32, 8);
    static const char label[] = "kvxfer handshake v1 client proof";
    uint8_t msg[sizeof label + 16 + 4 + 40 + 4];
    size_t n = 0;
    memcpy(msg, label, sizeof label);
    n += sizeof label;
    memcpy(msg + n, c->nonce, 16);
    n += 16;
    put_le(msg + n, c->id, 4);
    n += 4;
    memcpy(msg + n, p, 40);
    n += 40;
    put_le(msg + n, 0, 4);
    n += 4;
    uint8_t mac[32];
    unsigned len = 0;
    assert_non_null(HMAC(EVP_sha256(), vt_meta_secret(m), 32, msg, n, mac, &len));
    memcpy(p + 40, mac, 16);
    return 56;
}

/* ---- a hostile rdma_cm client */

typedef struct attempt {
    int kind;
    int src;
} attempt;

typedef struct flood {
    struct sockaddr_in dst;
    struct sockaddr_in src[MAX_SRC];
    int nsrc;
    uint64_t instance;
    int kinds_mask; /* which kinds to send */
    long limit;     /* stop after this many attempts (0: until stop) */
    int rate;       /* attempts a second (0: as fast as the target answers) */
    atomic_int stop;
    unsigned seed;
    long started, answered, challenged, other_outcome, errors;
    long sent[K_KINDS];
} flood;

static int pick_kind(flood *f) {
    for (;;) {
        int k = (int)(rand_r(&f->seed) % K_KINDS);
        if (f->kinds_mask & (1 << k)) return k;
    }
}

static void start_attempt(flood *f, struct rdma_event_channel *ch) {
    attempt *a = malloc(sizeof *a);
    a->kind = pick_kind(f);
    a->src = (int)(f->started % f->nsrc);
    struct rdma_cm_id *id = NULL;
    if (rdma_create_id(ch, &id, a, RDMA_PS_TCP) != 0 ||
        rdma_resolve_addr(id, (struct sockaddr *)&f->src[a->src], (struct sockaddr *)&f->dst, 2000) != 0) {
        f->errors++;
        if (id) rdma_destroy_id(id);
        free(a);
        return;
    }
    f->started++;
}

static void send_request(flood *f, struct rdma_cm_id *id, const attempt *a) {
    uint8_t b[56];
    size_t n = 0;
    switch (a->kind) {
    case K_NONE: break;
    case K_GARBAGE:
        n = 1 + rand_r(&f->seed) % sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rand_r(&f->seed);
        break;
    case K_HELLO: n = hello(b, f->instance); break;
    case K_OTHER_HELLO: n = hello(b, f->instance ^ 1); break;
    default: /* AUTH of random bytes under a good header and instance */
        for (size_t i = 0; i < sizeof b; i++) b[i] = (uint8_t)rand_r(&f->seed);
        header(b, 2);
        put_le(b + 8, f->instance, 8);
        n = 56;
        break;
    }
    struct rdma_conn_param cp = {0};
    cp.private_data = n ? b : NULL;
    cp.private_data_len = (uint8_t)n;
    cp.qp_num = 2 + rand_r(&f->seed) % 0xfffffd; /* no QP: nothing here could ever be accepted */
    cp.retry_count = 7;
    f->sent[a->kind]++;
    if (rdma_connect(id, &cp) != 0) f->errors++;
}

/* One event; returns 1 when the attempt is over (its id is to go). */
static int on_flood_event(flood *f, struct rdma_cm_event *ev) {
    attempt *a = ev->id->context;
    switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        if (rdma_resolve_route(ev->id, 2000) != 0) return f->errors++, 1;
        return 0;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: send_request(f, ev->id, a); return 0;
    case RDMA_CM_EVENT_REJECTED: {
        challenge c;
        f->answered++;
        f->challenged += parse_challenge(ev->param.conn.private_data, ev->param.conn.private_data_len, &c);
        return 1;
    }
    default:
        f->answered++;
        f->other_outcome++;
        return 1;
    }
}

/* Starts attempts: as fast as answers come back (rate 0), or rate a second;
 * at most INFLIGHT at once. */
static void refill(flood *f, struct rdma_event_channel *ch, long *live, uint64_t *next) {
    while (*live < INFLIGHT && !atomic_load(&f->stop) && (!f->limit || f->started < f->limit)) {
        if (f->rate) {
            if (now_ms() < *next) return;
            *next += 1000 / f->rate ? 1000 / f->rate : 1;
        }
        long before = f->started;
        start_attempt(f, ch);
        *live += f->started - before;
    }
}

static void *flood_main(void *arg) {
    flood *f = arg;
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) return NULL;
    long live = 0;
    uint64_t next = now_ms();
    refill(f, ch, &live, &next);
    while (live > 0 || (!atomic_load(&f->stop) && (!f->limit || f->started < f->limit))) {
        struct pollfd p = {ch->fd, POLLIN, 0};
        if (poll(&p, 1, f->rate ? 2 : 100) <= 0) {
            refill(f, ch, &live, &next);
            continue;
        }
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(ch, &ev) != 0) break;
        struct rdma_cm_id *id = ev->id;
        int over = on_flood_event(f, ev);
        rdma_ack_cm_event(ev);
        if (over) {
            free(id->context);
            rdma_destroy_id(id);
            live--;
        }
        refill(f, ch, &live, &next);
    }
    rdma_destroy_event_channel(ch);
    return NULL;
}

static void print_flood(const char *what, const flood *f) {
    print_message("%s: %ld attempts (no data %ld, garbage %ld, HELLO %ld, bogus AUTH %ld, foreign HELLO %ld) "
                  "from %d address(es): %ld answered, %ld with a challenge, %ld otherwise, %ld local errors\n",
                  what, f->started, f->sent[K_NONE], f->sent[K_GARBAGE], f->sent[K_HELLO], f->sent[K_AUTH],
                  f->sent[K_OTHER_HELLO], f->nsrc, f->answered, f->challenged, f->other_outcome, f->errors);
}

/* ---- source addresses */

static struct sockaddr_in sources[MAX_SRC];
static int nsources;

/* The target's address, plus FLOOD_EXTRA more on the rxe netdev when the VM
 * names it (KVX_VM_NETDEV): the VM is thrown away afterwards. */
static void setup_sources(const uint8_t ip[4]) {
    if (nsources) return;
    sources[0].sin_family = AF_INET;
    memcpy(&sources[0].sin_addr, ip, 4);
    nsources = 1;
    const char *dev = getenv("KVX_VM_NETDEV");
    if (!dev || !*dev) return;
    for (int i = 0; i < FLOOD_EXTRA; i++) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "ip addr replace %u.%u.%u.%u/24 dev %s 2>/dev/null", ip[0], ip[1], ip[2], 200 + i,
                 dev);
        if (system(cmd) != 0) continue;
        sources[nsources] = sources[0];
        ((uint8_t *)&sources[nsources].sin_addr)[3] = (uint8_t)(200 + i);
        nsources++;
    }
    usleep(500000); /* rxe adds the GIDs asynchronously */
}

static void flood_init(flood *f, const metablob *m, int kinds_mask) {
    memset(f, 0, sizeof *f);
    uint8_t ip[4];
    uint16_t port;
    vt_meta_endpoint(m, ip, &port);
    f->dst.sin_family = AF_INET;
    f->dst.sin_port = htons(port);
    memcpy(&f->dst.sin_addr, ip, 4);
    memcpy(f->src, sources, sizeof sources);
    f->nsrc = nsources;
    f->instance = vt_meta_instance(m);
    f->kinds_mask = kinds_mask;
    f->seed = (unsigned)now_ms();
}

/* ---- the tests */

static int group_setup(void **state) {
    (void)state;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max; /* the crowd holds a few descriptors per transport */
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    setenv("KVX_TEST_BACKEND", "verbs", 1);
    vt_require_verbs();
    return 0;
}

/* One connect request carrying pdata; the private data of the answer.
 * Returns the event: REJECTED, CONNECT_RESPONSE (accepted) or a failure.
 * With keep, *keep gets the channel and the id stays (never an RTU). */
typedef struct kept {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
} kept;

/* A new id on ch, its address and route resolved to the target of m. */
static struct rdma_cm_id *resolved_id(const metablob *m, struct rdma_event_channel *ch) {
    struct rdma_cm_id *id = NULL;
    assert_int_equal(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0);
    uint8_t ip[4];
    uint16_t port;
    vt_meta_endpoint(m, ip, &port);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    memcpy(&dst.sin_addr, ip, 4);
    struct rdma_cm_event *ev;
    assert_int_equal(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000), 0);
    assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
    assert_int_equal(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
    rdma_ack_cm_event(ev);
    assert_int_equal(rdma_resolve_route(id, 2000), 0);
    assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
    assert_int_equal(ev->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
    rdma_ack_cm_event(ev);
    return id;
}

static int request_keep(const metablob *m, const uint8_t *pdata, size_t n, uint8_t *answer, size_t *alen,
                        kept *keep) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    assert_non_null(ch);
    struct rdma_cm_id *id = resolved_id(m, ch);
    struct rdma_cm_event *ev;
    struct rdma_conn_param cp = {.private_data = pdata, .private_data_len = (uint8_t)n, .retry_count = 7};
    cp.qp_num = 2 + (uint32_t)random() % 0xfffffd;
    assert_int_equal(rdma_connect(id, &cp), 0);
    assert_int_equal(rdma_get_cm_event(ch, &ev), 0);
    int type = ev->event;
    *alen = ev->param.conn.private_data_len;
    if (*alen > 64) *alen = 64;
    if (ev->param.conn.private_data) memcpy(answer, ev->param.conn.private_data, *alen);
    rdma_ack_cm_event(ev);
    if (keep) {
        keep->ch = ch;
        keep->id = id;
        return type;
    }
    rdma_destroy_id(id); /* an accepted one: the target sees a reject of its REP */
    rdma_destroy_event_channel(ch);
    return type;
}

static int request(const metablob *m, const uint8_t *pdata, size_t n, uint8_t *answer, size_t *alen) {
    return request_keep(m, pdata, n, answer, alen, NULL);
}

/* Accepted, then silent (no RTU): the target closes its half of the
 * connection after twice its connect timeout (the CM alone waits about a
 * minute). */
static void test_half_open(void **state) {
    (void)state;
    static const char *const opts[] = {"connect_timeout_ms=1000", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    uint8_t b[64], ans[64];
    size_t alen = 0;
    challenge ch;
    assert_int_equal(request(&c.meta, b, hello(b, vt_meta_instance(&c.meta)), ans, &alen), RDMA_CM_EVENT_REJECTED);
    assert_true(parse_challenge(ans, alen, &ch));
    kept k;
    uint64_t t0 = now_ms();
    assert_int_equal(request_keep(&c.meta, b, auth(b, &c.meta, &ch), ans, &alen, &k),
                     RDMA_CM_EVENT_CONNECT_RESPONSE);
    struct pollfd p = {k.ch->fd, POLLIN, 0};
    int ready = poll(&p, 1, 8000);
    uint64_t ms = now_ms() - t0;
    int type = -1;
    struct rdma_cm_event *ev;
    if (ready == 1 && rdma_get_cm_event(k.ch, &ev) == 0) {
        type = ev->event;
        rdma_ack_cm_event(ev);
    }
    print_message("half-open: the target ended it after %llu ms (%s)\n", (unsigned long long)ms,
                  type >= 0 ? rdma_event_str(type) : "nothing within 8 s");
    assert_true(type >= 0);
    rdma_destroy_id(k.id);
    rdma_destroy_event_channel(k.ch);
    assert_int_equal(child_stop(&c), 0);
}

/* Our own initiator with a real RC QP (rdma_cm's), the handshake done by
 * hand; nrecv zero-length receives posted for the target's probes. */
typedef struct raw_conn {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_cq *cq;
} raw_conn;

static void raw_connect(const metablob *m, int nrecv, raw_conn *rc) {
    uint8_t b[64], ans[64];
    size_t alen = 0;
    challenge ch;
    assert_int_equal(request(m, b, hello(b, vt_meta_instance(m)), ans, &alen), RDMA_CM_EVENT_REJECTED);
    assert_true(parse_challenge(ans, alen, &ch));
    rc->ch = rdma_create_event_channel();
    assert_non_null(rc->ch);
    rc->id = resolved_id(m, rc->ch);
    rc->cq = ibv_create_cq(rc->id->verbs, 16, NULL, NULL, 0);
    assert_non_null(rc->cq);
    struct ibv_qp_init_attr qa = {.send_cq = rc->cq, .recv_cq = rc->cq, .qp_type = IBV_QPT_RC};
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    assert_int_equal(rdma_create_qp(rc->id, NULL, &qa), 0);
    for (int i = 0; i < nrecv; i++) {
        struct ibv_recv_wr w = {.wr_id = (uint64_t)i}, *bad;
        assert_int_equal(ibv_post_recv(rc->id->qp, &w, &bad), 0);
    }
    /* as kvxfer asks since 0.4.2: rxe retries forever with 7 */
    struct rdma_conn_param cp = {.private_data = b, .private_data_len = (uint8_t)auth(b, m, &ch), .retry_count = 6,
                                 .rnr_retry_count = 7};
    assert_int_equal(rdma_connect(rc->id, &cp), 0);
    struct rdma_cm_event *ev;
    assert_int_equal(rdma_get_cm_event(rc->ch, &ev), 0);
    assert_int_equal(ev->event, RDMA_CM_EVENT_ESTABLISHED);
    rdma_ack_cm_event(ev);
}

/* Waits up to ms for a CM event on rc (-1: none); counts the receives that
 * completed meanwhile (the target's probes) into *probes. */
static int raw_wait(raw_conn *rc, int ms, int *probes) {
    uint64_t until = now_ms() + (uint64_t)ms;
    for (;;) {
        struct ibv_wc wc[4];
        int n = ibv_poll_cq(rc->cq, 4, wc);
        for (int i = 0; i < n; i++) *probes += wc[i].status == IBV_WC_SUCCESS && (wc[i].opcode & IBV_WC_RECV);
        struct pollfd p = {rc->ch->fd, POLLIN, 0};
        if (poll(&p, 1, 20) == 1) {
            struct rdma_cm_event *ev;
            assert_int_equal(rdma_get_cm_event(rc->ch, &ev), 0);
            int type = ev->event;
            rdma_ack_cm_event(ev);
            return type;
        }
        if (now_ms() >= until) return -1;
    }
}

static void raw_close(raw_conn *rc) {
    rdma_destroy_qp(rc->id);
    rdma_destroy_id(rc->id);
    ibv_destroy_cq(rc->cq);
    rdma_destroy_event_channel(rc->ch);
}

/* An initiator host that vanishes without a DREQ: the target probes each
 * established connection (a zero-length SEND every half transfer_timeout_ms)
 * and closes it once the initiator's NIC stops answering. Our QP answers
 * first with receives (3 probes land), then with RNR NAKs (alive, no
 * receives left: an initiator before 0.4.2), and must keep its connection
 * through both; then it goes to RESET, which drops every packet as a
 * vanished host would, and the target's DREQ must come within twice the
 * timeout. Then the target still serves a kvxfer initiator, which keeps
 * receives posted and survives its own probes. */
#define LIVE_TIMEOUT_MS 2000
static void test_vanished_initiator(void **state) {
    (void)state;
    static const char *const opts[] = {"transfer_timeout_ms=2000", NULL};
    child_target c;
    child_start_exec(&c, NB, BL, NULL, opts); /* it sends: not a fork of this process (harness.h) */
    raw_conn rc;
    raw_connect(&c.meta, 3, &rc);
    int probes = 0;
    int ev = raw_wait(&rc, 3 * LIVE_TIMEOUT_MS, &probes);
    print_message("vanished: %d probe(s) answered with receives and RNR NAKs over %d ms, CM event: %s\n", probes,
                  3 * LIVE_TIMEOUT_MS, ev < 0 ? "none" : rdma_event_str(ev));
    assert_int_equal(ev, -1);  /* alive: answered, then RNR NAKs */
    assert_int_equal(probes, 3); /* one a second: every receive taken */
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_RESET};
    assert_int_equal(ibv_modify_qp(rc.id->qp, &at, IBV_QP_STATE), 0);
    uint64_t t0 = now_ms();
    ev = raw_wait(&rc, 2 * LIVE_TIMEOUT_MS + 2000, &probes);
    print_message("vanished: the target ended the connection %llu ms after the QP went silent (%s)\n",
                  (unsigned long long)(now_ms() - t0), ev < 0 ? "nothing" : rdma_event_str(ev));
    assert_int_equal(ev, RDMA_CM_EVENT_DISCONNECTED);
    raw_close(&rc);
    /* A kvxfer initiator idles through several probes, then writes. */
    region r = region_new(NB, BL, 0x31);
    kvx_options *o = vt_options("transfer_timeout_ms=2000", NULL);
    kvx_transport *a = vt_transport(&r, NULL, o);
    kvx_options_destroy(o);
    CHECK_OK(vt_add(a, "t", &c.meta));
    usleep(3 * LIVE_TIMEOUT_MS * 1000 / 2);
    uint64_t z = 0, id;
    fill_block(r.base, BL, 0, 5);
    CHECK_OK(kvx_write_blocks(&id, a, "t", &z, &z, 1));
    size_t nf = 9;
    assert_int_equal(wait_ids(a, "t", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_int_equal(child_verify(&c, 0, 0, 5), 1);
    kvx_transport_destroy(a);
    region_free(&r);
    assert_int_equal(child_stop(&c), 0);
}

/* A peer slow between HELLO and AUTH while others send thousands of HELLOs:
 * its challenge is still good, and good once. */
static void test_slow_auth(void **state) {
    (void)state;
    /* challenges live for at least connect_timeout_ms: longer than the flood */
    static const char *const opts[] = {"connect_timeout_ms=60000", NULL};
    child_target c;
    child_start_opts(&c, NB, BL, NULL, opts, 0);
    uint8_t ip[4];
    uint16_t port;
    vt_meta_endpoint(&c.meta, ip, &port);
    setup_sources(ip);
    uint8_t b[64], ans[64];
    size_t alen = 0;
    challenge ch;
    assert_int_equal(request(&c.meta, b, hello(b, vt_meta_instance(&c.meta)), ans, &alen), RDMA_CM_EVENT_REJECTED);
    assert_true(parse_challenge(ans, alen, &ch));
    static flood f;
    flood_init(&f, &c.meta, 1 << K_HELLO);
    f.limit = 2500;
    pthread_t th;
    uint64_t t0 = now_ms();
    assert_int_equal(pthread_create(&th, NULL, flood_main, &f), 0);
    pthread_join(th, NULL);
    print_flood("HELLOs between a HELLO and its AUTH", &f);
    print_message("  ... in %llu ms\n", (unsigned long long)(now_ms() - t0));
    assert_true(f.challenged > 2048); /* well past any table of 1024 */
    size_t n = auth(b, &c.meta, &ch);
    int got = request(&c.meta, b, n, ans, &alen);
    if (got != RDMA_CM_EVENT_CONNECT_RESPONSE)
        fail_msg("the AUTH after the flood got %s (%s), not accepted", rdma_event_str(got),
                 parse_challenge(ans, alen, &ch) ? "a fresh challenge: its own was gone" : "no challenge");
    /* the same AUTH again: a replay, never accepted */
    assert_int_equal(request(&c.meta, b, n, ans, &alen), RDMA_CM_EVENT_REJECTED);
    assert_int_equal(child_stop(&c), 0);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* One legitimate add (then a remove); its latency in ms, or UINT64_MAX when it failed. */
static uint64_t legit_add(kvx_transport *a, const metablob *m) {
    uint64_t t = now_ms();
    int rc = vt_add(a, "t", m);
    uint64_t ms = now_ms() - t;
    if (rc != 0) {
        print_message("legit add failed after %llu ms: %s\n", (unsigned long long)ms, kvx_last_error_message());
        return UINT64_MAX;
    }
    CHECK_OK(kvx_remove_remote_peer(a, "t"));
    return ms;
}

#define FLOODERS 2
/* Attempts a second, per flooder: 200 in all, the rate the tcp flood test
 * uses too (KVX_VERBS_FLOOD_RATE sets the per-flooder rate, 0 = as fast as
 * answered). In the VM the hostile side's own kernel work (address and route
 * resolution, CM messages) runs on the same two emulated vCPUs as the target
 * and the honest initiator, and the VM shares a 2-core host. Measured at 200
 * a second: host quiet, all 100 adds within 1 s (max 26 and 18 ms, two
 * boots); one host core kept busy by another process, all 100 (median 54 ms,
 * max 216 ms). Earlier, with the host at load average 6 to 9 (other VMs and
 * builds at once), 89 to 96 of 100 made 1 s; make test runs the VM stage
 * alone. With the host quiet all 100 also made it at 1,200 to 1,600 a
 * second. */
#define FLOOD_RATE 100

/* n legitimate adds, gap_ms apart: how many within 1 s; the latencies,
 * sorted, in ms[]. */
static int legit_adds(kvx_transport *a, const metablob *m, uint64_t *ms, int n, int gap_ms) {
    int ok = 0;
    for (int i = 0; i < n; i++) {
        ms[i] = legit_add(a, m);
        ok += ms[i] <= 1000;
        usleep((useconds_t)gap_ms * 1000);
    }
    qsort(ms, (size_t)n, sizeof ms[0], cmp_u64);
    return ok;
}

static void test_flood(void **state) {
    (void)state;
    child_target c;
    child_start(&c, NB, BL, NULL);
    uint8_t ip[4];
    uint16_t port;
    vt_meta_endpoint(&c.meta, ip, &port);
    setup_sources(ip);
    region r = region_new(NB, BL, 0);
    kvx_transport *a = vt_transport(&r, NULL, NULL);
    uint64_t ms[100];
    /* the same without a flood, for comparison (emulated RDMA on a shared host) */
    int ok = legit_adds(a, &c.meta, ms, 100, 0);
    print_message("no flood: %d of 100 adds within 1 s; latency median %llu ms, p99 %llu ms, max %llu ms\n", ok,
                  (unsigned long long)ms[50], (unsigned long long)ms[98], (unsigned long long)ms[99]);
    const char *env = getenv("KVX_VERBS_FLOOD_RATE");
    static flood f[FLOODERS];
    pthread_t th[FLOODERS];
    for (int i = 0; i < FLOODERS; i++) {
        flood_init(&f[i], &c.meta, (1 << K_KINDS) - 1);
        f[i].seed += (unsigned)i;
        f[i].rate = env ? atoi(env) : FLOOD_RATE;
        assert_int_equal(pthread_create(&th[i], NULL, flood_main, &f[i]), 0);
    }
    usleep(1000000);
    long before = f[0].answered + f[1].answered;
    uint64_t t0 = now_ms();
    ok = legit_adds(a, &c.meta, ms, 100, 50); /* >= 5 s under the flood */
    long during = f[0].answered + f[1].answered - before;
    uint64_t took = now_ms() - t0;
    for (int i = 0; i < FLOODERS; i++) atomic_store(&f[i].stop, 1);
    for (int i = 0; i < FLOODERS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < FLOODERS; i++) print_flood("flood", &f[i]);
    print_message("flood: %d of 100 adds within 1 s; latency median %llu ms, p99 %llu ms, max %llu ms; "
                  "%ld hostile requests answered meanwhile (%ld a second)\n",
                  ok, (unsigned long long)ms[50], (unsigned long long)ms[98], (unsigned long long)ms[99], during,
                  took ? during * 1000 / (long)took : 0);
    /* the flood really ran: at least half its rate, all the while */
    int rate = FLOODERS * (env ? atoi(env) : FLOOD_RATE);
    assert_true(during >= 100 && during * 1000 / (long)(took ? took : 1) >= (rate ? rate / 2 : 100));
    assert_true(ok >= 99);
    /* the added peer still moves bytes */
    CHECK_OK(vt_add(a, "t", &c.meta));
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

/* ---- many at once */

typedef struct crowd {
    pthread_barrier_t ready;
    const metablob *m;
    atomic_int ok, created;
    atomic_ullong worst_ms;
} crowd;

static void *crowd_main(void *arg) {
    crowd *cw = arg;
    region r = region_new(1, BL, 0);
    /* emulated RDMA is slow: the bar here is that all get in, not how fast */
    kvx_options *o = vt_options("connect_timeout_ms=120000", NULL);
    kvx_transport *t = NULL;
    int rc = kvx_transport_create(&t, r.base, 1, BL, NULL, o);
    kvx_options_destroy(o);
    if (rc != 0) fprintf(stderr, "crowd: create failed: %s\n", kvx_last_error_message());
    else atomic_fetch_add(&cw->created, 1);
    pthread_barrier_wait(&cw->ready);
    if (rc == 0) {
        uint64_t t0 = now_ms();
        rc = vt_add(t, "t", cw->m);
        unsigned long long ms = now_ms() - t0, w = atomic_load(&cw->worst_ms);
        if (rc != 0) fprintf(stderr, "crowd: add failed after %llu ms: %s\n", ms, kvx_last_error_message());
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
    const char *env = getenv("KVX_VERBS_CROWD");
    int n = env ? atoi(env) : CROWD_DEFAULT;
    child_target c;
    child_start(&c, NB, BL, NULL);
    static crowd cw;
    memset(&cw, 0, sizeof cw);
    cw.m = &c.meta;
    pthread_barrier_init(&cw.ready, NULL, (unsigned)n);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    uint64_t t0 = now_ms();
    for (int i = 0; i < n; i++) assert_int_equal(pthread_create(&th[i], &at, crowd_main, &cw), 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    print_message("crowd: %d of %d transports added one target at once (%d created); slowest add %llu ms; "
                  "%llu ms in all\n", atomic_load(&cw.ok), n, atomic_load(&cw.created),
                  (unsigned long long)atomic_load(&cw.worst_ms), (unsigned long long)(now_ms() - t0));
    assert_int_equal(atomic_load(&cw.ok), n);
    free(th);
    pthread_barrier_destroy(&cw.ready);
    assert_int_equal(child_stop(&c), 0);
}

int main(int argc, char **argv) {
    child_exec_dispatch(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slow_auth),
        cmocka_unit_test(test_half_open),
        cmocka_unit_test(test_vanished_initiator),
        cmocka_unit_test(test_flood),
        cmocka_unit_test(test_crowd),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
