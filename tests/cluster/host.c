/* One host of the cluster, a forked process already in its network
 * namespace: a tcp transport listening on its namespace address, every other
 * host a peer, and a workload of batches of 4-16 blocks to random peers, at
 * most CL_INFLIGHT transfers in flight. A verifier thread checks every block
 * written into this host's region against the scoreboard. A peer whose
 * transfer failed, or whose kvx_write_blocks says it is broken, is re-added
 * (KVX_PEER_REPLACE) until that succeeds; a peer the driver killed is removed,
 * and adding its old metadata again must be refused. Nothing here asserts: the
 * host counts into the scoreboard and the driver judges. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cluster.h"
#include "kvxfer.h"

#define POISON 0x5C
#define GUARD_BYTE 0xA5
#define SEEN_RING 4096

enum { P_OK, P_READD, P_WAIT, P_GONE };

typedef struct peer {
    char id[16];
    int state;      /* P_* */
    uint32_t gen;   /* registrations of it so far: a failure of an older one is no news */
    uint64_t reg;   /* the re-add in progress (P_READD) */
    uint64_t retry_ms;
    uint8_t busy[CL_SLOTS];
    unsigned cursor;
} peer;

typedef struct xfer {
    int used, peer, n;
    uint32_t gen;
    uint64_t id, t0_ns;
    uint16_t slot[CL_MAX_BATCH];
    uint64_t seq[CL_MAX_BATCH];
} xfer;

typedef struct host {
    cl_board *b;
    cl_host *me_sb;
    int me, n;
    kvx_transport *t;
    uint8_t *mem, *base;
    uint64_t nb, src0, rng, seq;
    peer peers[CL_MAX_HOSTS];
    xfer x[CL_INFLIGHT];
    int ninflight;
    uint64_t seen[SEEN_RING];
    unsigned seen_at;
    atomic_int vstop, pstop;
    pthread_t verifier, prober;
    int prober_running;
} host;

static uint64_t rnd(host *h) {
    uint64_t z = (h->rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t run_ms(const host *h) { return cl_now_ms() - CL_LD(h->b->t_run_ms); }

static void api_error(host *h, const char *what, int rc) {
    CL_ADD(h->me_sb->api_errors, 1);
    cl_note(h->me_sb->msg, "host %d: %s -> %d (%s): %s", h->me, what, rc, kvx_strerror(rc), kvx_last_error_message());
}

static void die(host *h, const char *what, int rc) __attribute__((noreturn));
static void die(host *h, const char *what, int rc) {
    api_error(h, what, rc);
    fprintf(stderr, "%s\n", h->me_sb->msg);
    _exit(3);
}

static void wait_phase(host *h, int phase) {
    while (CL_LD(h->b->phase) < phase) usleep(1000);
}

/* ---- setup ---- */

static void make_region(host *h) {
    h->src0 = (uint64_t)h->n * CL_SLOTS;
    h->nb = h->src0 + (uint64_t)CL_INFLIGHT * CL_MAX_BATCH;
    size_t len = h->nb * CL_BL + 2 * CL_GUARD;
    h->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h->mem == MAP_FAILED) die(h, "mmap of the region", -errno);
    h->base = h->mem + CL_GUARD;
    memset(h->mem, GUARD_BYTE, CL_GUARD);
    memset(h->base + h->nb * CL_BL, GUARD_BYTE, CL_GUARD);
    memset(h->base, POISON, h->src0 * CL_BL);
}

static int guards_ok(const host *h) {
    const uint8_t *tail = h->base + h->nb * CL_BL;
    for (size_t i = 0; i < CL_GUARD; i++)
        if (h->mem[i] != GUARD_BYTE || tail[i] != GUARD_BYTE) return 0;
    return 1;
}

static void make_transport(host *h, int net) {
    kvx_options *o = NULL;
    char listen[48];
    snprintf(listen, sizeof listen, "10.%d.0.%d:0", net, h->me + 1);
    int rc = kvx_options_create(&o);
    if (rc) die(h, "kvx_options_create", rc);
    const char *kv[][2] = {{"backend", "tcp"}, /* all hosts share a boot id: shm would be chosen */
                           {"tcp.listen", listen},
                           {"transfer_timeout_ms", "2000"},
                           {"connect_timeout_ms", "3000"}};
    for (size_t k = 0; k < sizeof kv / sizeof kv[0]; k++)
        if ((rc = kvx_options_set(o, kv[k][0], kv[k][1])) != 0) die(h, "kvx_options_set", rc);
    if ((rc = kvx_transport_create(&h->t, h->base, h->nb, CL_BL, NULL, o)) != 0) die(h, "kvx_transport_create", rc);
    kvx_options_destroy(o);
    cl_host *s = h->me_sb;
    size_t len = 0;
    if ((rc = kvx_get_agent_metadata(&len, h->t, s->meta, sizeof s->meta)) != 0) die(h, "kvx_get_agent_metadata", rc);
    s->meta_len = len;
    s->base = (uint64_t)(uintptr_t)h->base;
    s->nb = h->nb;
    s->bl = CL_BL;
    CL_ST(s->ready, 1);
}

static int add_peer_sync(host *h, int j) {
    const cl_host *o = &h->b->hosts[j];
    return kvx_add_remote_peer(h->t, h->peers[j].id, o->meta, o->meta_len, o->base, o->nb, o->bl);
}

static void add_peers(host *h) {
    for (int j = 0; j < h->n; j++) {
        snprintf(h->peers[j].id, sizeof h->peers[j].id, "h%d", j);
        if (j == h->me) continue;
        int rc = add_peer_sync(h, j);
        if (rc) die(h, "kvx_add_remote_peer at setup", rc);
        h->peers[j].gen = 1;
    }
    CL_ST(h->me_sb->added, 1);
}

/* ---- verifier ---- */

/* One pass over the slices of every writer: each slot written since it was
 * last checked is checked now. reverify: also slots checked before whose last
 * write did not fail (a stray or late write would have changed them), except
 * those of a writer that died (killed, or crashed): a write it had on the wire
 * may land after it died, unrecorded. */
static int verify_pass(host *h, int reverify) {
    int found = 0;
    for (int w = 0; w < h->n; w++) {
        if (w == h->me) continue;
        cl_pair *pr = cl_pair_at(h->b, w, h->me);
        uint64_t heal = CL_LD(h->b->hosts[w].heal_seq);
        const int recheck = reverify && !CL_LD(h->b->hosts[w].gone);
        for (int s = 0; s < CL_SLOTS; s++) {
            cl_slot *sl = cl_slot_at(h->b, w, h->me, s);
            uint64_t wr = CL_LD(sl->written), ck = atomic_load_explicit(&sl->checked, memory_order_relaxed);
            const uint8_t *p = h->base + ((uint64_t)w * CL_SLOTS + (uint64_t)s) * CL_BL;
            char why[200];
            if (wr > ck) {
                found++;
                int ok = cl_check(p, w, h->me, s, wr, why, sizeof why);
                CL_ST(sl->checked, wr);
                CL_ADD(pr->verified, 1);
                CL_ADD(h->me_sb->checked, 1);
                if (wr > heal) CL_ADD(pr->verified_after_heal, 1);
                if (!ok) {
                    CL_ADD(pr->wrong, 1);
                    CL_ADD(h->me_sb->wrong, 1);
                    cl_note(h->me_sb->wrong_msg, "host %d: block of writer %d slot %d seq %llu: %s", h->me, w, s,
                            (unsigned long long)wr, why);
                }
            } else if (recheck && wr > 0 && wr == ck && !CL_LD(sl->dirty)) {
                if (!cl_check(p, w, h->me, s, wr, why, sizeof why)) {
                    CL_ADD(h->me_sb->reverify_bad, 1);
                    cl_note(h->me_sb->wrong_msg, "host %d: re-check at the end, writer %d slot %d seq %llu: %s",
                            h->me, w, s, (unsigned long long)wr, why);
                }
            }
        }
    }
    return found;
}

static void *verifier_main(void *arg) {
    host *h = arg;
    for (unsigned pass = 0; !atomic_load(&h->vstop); pass++) {
        if (!verify_pass(h, 0)) usleep(500);
        if (pass % 256 == 0 && !guards_ok(h)) CL_ST(h->me_sb->guard_bad, 1);
    }
    return NULL;
}

/* ---- peers: re-add, removal of the dead ---- */

static void start_readd(host *h, int j) {
    peer *p = &h->peers[j];
    const cl_host *o = &h->b->hosts[j];
    p->gen++;
    CL_ADD(h->me_sb->readds_started, 1);
    CL_ADD(cl_pair_at(h->b, h->me, j)->readds_started, 1);
    int rc = kvx_add_remote_peer_async(&p->reg, h->t, p->id, o->meta, o->meta_len, o->base, o->nb, o->bl,
                                       KVX_PEER_REPLACE);
    if (rc == 0) {
        p->state = P_READD;
        return;
    }
    cl_code_count(h->me_sb->reg_codes, rc);
    CL_ADD(h->me_sb->reg_failures, 1);
    p->state = P_WAIT;
    p->retry_ms = cl_now_ms() + CL_RETRY_MS;
}

/* A peer whose connection failed: re-add it, unless the driver killed it. */
static void peer_broken(host *h, int j) {
    if (h->peers[j].state == P_OK && !CL_LD(h->b->hosts[j].dead)) start_readd(h, j);
}

static void progress_readds(host *h) {
    for (int j = 0; j < h->n; j++) {
        peer *p = &h->peers[j];
        if (j == h->me || CL_LD(h->b->hosts[j].dead)) continue;
        if (p->state == P_WAIT && cl_now_ms() >= p->retry_ms) start_readd(h, j);
        if (p->state != P_READD) continue;
        int st = 0, err = 0;
        int rc = kvx_registration_status(&st, &err, h->t, p->reg, 0);
        if (rc) {
            api_error(h, "kvx_registration_status", rc);
            p->state = P_WAIT;
            p->retry_ms = cl_now_ms() + CL_RETRY_MS;
        } else if (st == KVX_REGISTRATION_DONE) {
            p->state = P_OK;
            CL_ADD(h->me_sb->readds_done, 1);
            CL_ADD(cl_pair_at(h->b, h->me, j)->readds_done, 1);
        } else if (st == KVX_REGISTRATION_FAILED) {
            cl_code_count(h->me_sb->reg_codes, err);
            CL_ADD(h->me_sb->reg_failures, 1);
            p->state = P_WAIT;
            p->retry_ms = cl_now_ms() + CL_RETRY_MS;
        }
    }
}

/* The prober (kill scenario): for each dead peer this host removed,
 * kvx_add_remote_peer with its old metadata, which must be refused; the code
 * and message go to the pair for the driver. Runs beside the workload (the
 * refusal may take connect_timeout_ms) until the drain. */
static void *prober_main(void *arg) {
    host *h = arg;
    for (;;) {
        int stop = atomic_load(&h->pstop), pending = 0;
        for (int j = 0; j < h->n; j++) {
            cl_pair *pr = cl_pair_at(h->b, h->me, j);
            if (j == h->me || CL_LD(pr->probe_done)) continue;
            if (!CL_LD(pr->removed)) {
                pending |= CL_LD(h->b->hosts[j].dead);
                continue;
            }
            int rc = add_peer_sync(h, j);
            snprintf(pr->probe_msg, sizeof pr->probe_msg, "%s", rc ? kvx_last_error_message() : "added");
            if (rc == 0) kvx_remove_remote_peer(h->t, h->peers[j].id);
            CL_ST(pr->probe_rc, rc);
            CL_ST(pr->probe_done, 1);
        }
        if (stop && !pending) return NULL;
        usleep(10000);
    }
}

static void remove_dead(host *h) {
    for (int j = 0; j < h->n; j++) {
        if (j == h->me || h->peers[j].state == P_GONE || !CL_LD(h->b->hosts[j].dead)) continue;
        int rc = kvx_remove_remote_peer(h->t, h->peers[j].id);
        /* ENOENT: a failed re-add had already dropped it */
        if (rc != 0 && rc != KVX_ENOENT) api_error(h, "kvx_remove_remote_peer of a dead peer", rc);
        h->peers[j].state = P_GONE;
        CL_ST(cl_pair_at(h->b, h->me, j)->removed, 1);
    }
}

/* ---- transfers ---- */

static int free_slot(host *h, int j, int s) {
    const cl_slot *sl = cl_slot_at(h->b, h->me, j, s);
    return !h->peers[j].busy[s] && CL_LD(sl->written) == CL_LD(sl->checked);
}

/* Up to want free slots of peer j (a slot is reused only once its last done
 * write was checked); returns how many. */
static int take_slots(host *h, int j, int want, uint16_t *out) {
    peer *p = &h->peers[j];
    int got = 0;
    for (int k = 0; k < CL_SLOTS && got < want; k++) {
        int s = (int)((p->cursor + (unsigned)k) % CL_SLOTS);
        if (free_slot(h, j, s)) out[got++] = (uint16_t)s;
    }
    if (got) p->cursor = (unsigned)(out[got - 1] + 1) % CL_SLOTS;
    return got;
}

/* A random usable peer with room for a batch (CL_MIN_BATCH free slots), or -1. */
static int pick_peer(host *h) {
    int start = (int)(rnd(h) % (uint64_t)h->n);
    for (int k = 0; k < h->n; k++) {
        int j = (start + k) % h->n, room = 0;
        if (j == h->me || h->peers[j].state != P_OK) continue;
        for (int s = 0; s < CL_SLOTS && room < CL_MIN_BATCH; s++) room += free_slot(h, j, s);
        if (room == CL_MIN_BATCH) return j;
    }
    return -1;
}

/* One kvx_write_blocks of a fresh batch to a random peer; 0 when nothing went. */
static int submit(host *h) {
    int k = 0;
    while (k < CL_INFLIGHT && h->x[k].used) k++;
    int j = k < CL_INFLIGHT ? pick_peer(h) : -1;
    if (j < 0) return 0;
    xfer *x = &h->x[k];
    int want = CL_MIN_BATCH + (int)(rnd(h) % (CL_MAX_BATCH - CL_MIN_BATCH + 1));
    x->n = take_slots(h, j, want, x->slot);
    uint64_t loc[CL_MAX_BATCH], rem[CL_MAX_BATCH];
    for (int i = 0; i < x->n; i++) {
        x->seq[i] = ++h->seq;
        loc[i] = h->src0 + (uint64_t)k * CL_MAX_BATCH + (uint64_t)i;
        rem[i] = (uint64_t)h->me * CL_SLOTS + x->slot[i];
        cl_fill(h->base + loc[i] * CL_BL, h->me, j, x->slot[i], x->seq[i]);
    }
    CL_ST(h->me_sb->seq, h->seq);
    x->t0_ns = cl_now_ns();
    int rc = kvx_write_blocks(&x->id, h->t, h->peers[j].id, loc, rem, (size_t)x->n);
    if (rc) {
        CL_ADD(h->me_sb->submit_errors, 1);
        CL_ADD(cl_pair_at(h->b, h->me, j)->submit_errors, 1);
        cl_code_count(h->me_sb->submit_codes, rc);
        if (kvx_error_scope_of(rc) == KVX_SCOPE_PEER) peer_broken(h, j);
        else api_error(h, "kvx_write_blocks", rc);
        return 0; /* nothing more this round */
    }
    x->used = 1;
    x->peer = j;
    x->gen = h->peers[j].gen;
    for (int i = 0; i < x->n; i++) h->peers[j].busy[x->slot[i]] = 1;
    h->ninflight++;
    return 1;
}

static int seen_before(const host *h, uint64_t id) {
    for (unsigned i = 0; i < SEEN_RING; i++)
        if (h->seen[i] == id) return 1;
    return 0;
}

static void count_done(host *h, const xfer *x) {
    cl_pair *pr = cl_pair_at(h->b, h->me, x->peer);
    CL_ADD(h->me_sb->lat[cl_lat_bucket(cl_now_ns() - x->t0_ns)], 1);
    for (int i = 0; i < x->n; i++) {
        cl_slot *sl = cl_slot_at(h->b, h->me, x->peer, x->slot[i]);
        CL_ST(sl->dirty, 0);
        CL_ST(sl->written, x->seq[i]);
    }
    CL_ADD(pr->done_xfers, 1);
    CL_ADD(pr->done_blocks, (uint64_t)x->n);
    CL_ADD(h->me_sb->xfers_done, 1);
    CL_ADD(h->me_sb->bytes_done, (uint64_t)x->n * CL_BL);
}

static void count_failed(host *h, const xfer *x) {
    cl_pair *pr = cl_pair_at(h->b, h->me, x->peer);
    for (int i = 0; i < x->n; i++) CL_ST(cl_slot_at(h->b, h->me, x->peer, x->slot[i])->dirty, 1);
    uint64_t ms = run_ms(h);
    if (CL_LD(pr->failed_xfers) == 0) CL_ST(pr->first_fail_ms, ms);
    CL_ST(pr->last_fail_ms, ms);
    CL_ADD(pr->failed_xfers, 1);
    CL_ADD(pr->failed_blocks, (uint64_t)x->n);
    CL_ADD(h->me_sb->xfers_failed, 1);
    CL_ADD(h->me_sb->blocks_failed, (uint64_t)x->n);
    if (x->gen == h->peers[x->peer].gen) peer_broken(h, x->peer);
}

/* An id kvx_poll reported: exactly one of ours in flight, else counted. */
static void surfaced(host *h, uint64_t id, int ok) {
    int k = 0;
    while (k < CL_INFLIGHT && !(h->x[k].used && h->x[k].id == id)) k++;
    if (k == CL_INFLIGHT) {
        if (seen_before(h, id)) CL_ADD(h->me_sb->dup_ids, 1);
        else CL_ADD(h->me_sb->unknown_ids, 1);
        cl_note(h->me_sb->msg, "host %d: kvx_poll reported id %llu %s", h->me, (unsigned long long)id,
                seen_before(h, id) ? "a second time" : "that was never submitted");
        return;
    }
    h->seen[h->seen_at++ % SEEN_RING] = id;
    xfer *x = &h->x[k];
    if (ok) count_done(h, x);
    else count_failed(h, x);
    for (int i = 0; i < x->n; i++) h->peers[x->peer].busy[x->slot[i]] = 0;
    x->used = 0;
    h->ninflight--;
}

static void reap(host *h) {
    uint64_t done[64], failed[64];
    size_t nd = 0, nf = 0;
    do {
        int rc = kvx_poll(&nd, &nf, h->t, NULL, done, 64, failed, 64);
        if (rc) {
            api_error(h, "kvx_poll", rc);
            return;
        }
        for (size_t i = 0; i < nd; i++) surfaced(h, done[i], 1);
        for (size_t i = 0; i < nf; i++) surfaced(h, failed[i], 0);
    } while (nd == 64 || nf == 64);
}

static void workload(host *h) {
    while (CL_LD(h->b->phase) < PH_STOP) {
        remove_dead(h);
        progress_readds(h);
        int sent = 0;
        while (h->ninflight < CL_INFLIGHT && submit(h)) sent = 1;
        if (!sent || h->ninflight == CL_INFLIGHT) {
            size_t ready = 0;
            int rc = kvx_wait(&ready, h->t, h->ninflight ? 20 : 2);
            if (rc) api_error(h, "kvx_wait", rc);
        }
        reap(h);
    }
}

/* Every id in flight surfaces (done or failed) within the stall timeout. */
static void drain(host *h) {
    remove_dead(h); /* a death the loop had not seen yet: the prober waits for it */
    for (int j = 0; j < h->n; j++) /* re-adds still going: called off */
        if (j != h->me && (h->peers[j].state == P_READD || h->peers[j].state == P_WAIT)) {
            int rc = kvx_remove_remote_peer(h->t, h->peers[j].id);
            if (rc && rc != KVX_ENOENT) api_error(h, "kvx_remove_remote_peer at the end", rc);
            h->peers[j].state = P_GONE;
        }
    uint64_t end = cl_now_ms() + 3 * CL_TIMEOUT_MS + 2000;
    while (h->ninflight > 0 && cl_now_ms() < end) {
        size_t ready = 0;
        kvx_wait(&ready, h->t, 50);
        reap(h);
    }
    if (h->ninflight) {
        CL_ADD(h->me_sb->missing_ids, (uint64_t)h->ninflight);
        cl_note(h->me_sb->msg, "host %d: %d transfer ids never surfaced", h->me, h->ninflight);
    }
    atomic_store(&h->pstop, 1);
    if (h->prober_running) pthread_join(h->prober, NULL);
    h->prober_running = 0;
}

void cl_host_main(cl_board *b, int i, int net) {
    static host hs;
    host *h = &hs;
    h->b = b;
    h->me = i;
    h->n = b->n;
    h->me_sb = &b->hosts[i];
    h->rng = ((uint64_t)i << 32) ^ (uint64_t)getpid() ^ cl_now_ns();
    make_region(h);
    make_transport(h, net);
    wait_phase(h, PH_ADD);
    add_peers(h);
    wait_phase(h, PH_RUN);
    if (pthread_create(&h->verifier, NULL, verifier_main, h) != 0) die(h, "pthread_create", -errno);
    if (b->scenario == SC_KILL) h->prober_running = pthread_create(&h->prober, NULL, prober_main, h) == 0;
    workload(h);
    drain(h);
    CL_ST(h->me_sb->drained, 1);
    wait_phase(h, PH_FINAL);
    atomic_store(&h->vstop, 1);
    pthread_join(h->verifier, NULL);
    verify_pass(h, 0);
    verify_pass(h, 1);
    if (!guards_ok(h)) CL_ST(h->me_sb->guard_bad, 1);
    kvx_stats st = KVX_STATS_INIT;
    if (kvx_get_stats(&st, h->t, NULL) == 0) CL_ST(h->me_sb->peers_final, st.peers);
    CL_ST(h->me_sb->finished, 1);
    fprintf(stderr, "%s\n", CL_LOG_SHUTDOWN); /* what the library logs after this is the teardown's */
    kvx_transport_destroy(h->t);
    fflush(NULL);
    _exit(0);
}
