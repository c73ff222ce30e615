/*
 * Initiator role: per block size, asks the target (over the control channel)
 * for a region, creates its own transport, registers the target and writes
 * blocks into it with kvx_write_blocks/kvx_poll, keeping up to --inflight
 * transfers outstanding. Then tells the target what each remote block must
 * contain and reports throughput, latency and the verification result.
 *
 * Verification contract: no two outstanding transfers ever target the same
 * remote block, so "the last write submitted to remote block r" is well
 * defined; expected[r] records its local block index. Local blocks never
 * change during a run, so the target can recompute the expected bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "ctl.h"
#include "report.h"

#define PEER_ID "target"
#define POLL_CAP 256
#define MAX_SAMPLES (1u << 22)            /* reservoir: 32 MiB of samples at most */
#define CTL_TIMEOUT_MS 300000             /* target work: region fill, verify, connect */
#define STUCK_NS (120ull * 1000000000u)   /* no completion for this long: give up */
#define PROGRESS_NS (200ull * 1000000u)
/* Idle wait: ~200 sched_yield()s (tens of us) keep RDMA-class latencies
 * unaffected; after that 20 us sleeps stop us from eating a core that the
 * backend threads (and on one host, the target) need. */
#define IDLE_YIELDS 200u
#define IDLE_SLEEP_NS 20000u
#define IDLE_WAIT_MS 100 /* --idle wait: the longest sleep between looks at the clock */

/* ------------------------------------------------------------ id -> slot map */

/* Open addressing with linear probing; ids are never 0, so 0 marks empty. */
struct idmap {
    uint64_t *keys;
    uint32_t *vals;
    size_t mask;
};

static size_t idmap_home(const struct idmap *m, uint64_t id) { return (size_t)mix64(id) & m->mask; }

static void idmap_put(struct idmap *m, uint64_t id, uint32_t v)
{
    size_t i = idmap_home(m, id);
    while (m->keys[i]) {
        if (m->keys[i] == id)
            die("kvx_write_blocks returned transfer id %llu while it was still outstanding",
                (unsigned long long)id);
        i = (i + 1) & m->mask;
    }
    m->keys[i] = id;
    m->vals[i] = v;
}

static bool idmap_take(struct idmap *m, uint64_t id, uint32_t *v)
{
    size_t i = idmap_home(m, id);
    while (m->keys[i] != id) {
        if (!m->keys[i])
            return false;
        i = (i + 1) & m->mask;
    }
    *v = m->vals[i];
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    for (size_t j = (i + 1) & m->mask; m->keys[j]; j = (j + 1) & m->mask) {
        size_t h = idmap_home(m, m->keys[j]);
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    return true;
}

/* ------------------------------------------------------------ engine */

struct engine {
    const struct bench_opts *o;
    kvx_transport *t;
    uint64_t nblocks, bs, batch, inflight;
    enum bench_pattern pattern;
    uint64_t *expected;      /* per remote block; NULL without --verify */
    uint8_t *busy;           /* seq: remote block is in an outstanding transfer */
    uint64_t *pool, pool_n;  /* random: remote blocks not in flight */
    uint64_t cursor;
    uint64_t rng;
    /* outstanding transfers: slot s owns lidx/ridx[s*batch .. +batch) */
    uint64_t *slot_t0;
    uint64_t *slot_call;     /* ns the kvx_write_blocks call took */
    uint64_t *lidx, *ridx;
    uint32_t *free_slots, n_free;
    struct idmap map;
    uint64_t outstanding;
    /* accounting of the current phase */
    bool measure;
    uint64_t n_done, n_failed, bytes, t_start, t_last;
    uint64_t *samples;
    /* per sample, a lower bound of the library's latency: the sample minus
     * its write_blocks call and the time since the previous kvx_poll began
     * (the most the completion can have waited to be polled) */
    uint64_t *floors;
    uint64_t last_poll, poll_bound;
    size_t n_samples, cap_samples;
    uint64_t seen_samples;
    struct call_samples calls; /* time inside kvx_write_blocks, measured calls */
    uint64_t first_failed;
};

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p)
        die("out of memory (%zu x %zu bytes)", n, sz);
    return p;
}

/* Default window: about AUTO_WINDOW bytes outstanding, 8..128 transfers:
 * the queue depth of the reference tools (ib_write_bw keeps 128 writes in
 * flight by default; iperf3 a full socket buffer, up to 4 MiB sent and more
 * received on Linux). Fewer leaves small blocks latency-bound on any backend:
 * with 2 MiB (0.3) 4 KiB random batch 16 over tcp moved 0.88 of iperf3 -P 2
 * against 0.96 with 8 MiB in the same rounds (bench/README.md). */
#define AUTO_WINDOW (8u << 20)
static uint64_t auto_inflight(uint64_t bs, uint64_t batch)
{
    uint64_t per = bs * batch, n = per ? AUTO_WINDOW / per : 128;
    return n < 8 ? 8 : n > 128 ? 128 : n;
}

static void engine_init(struct engine *e, const struct bench_opts *o, kvx_transport *t,
                        uint64_t nblocks, uint64_t bs, uint64_t batch, uint64_t seed)
{
    memset(e, 0, sizeof *e);
    e->o = o;
    e->t = t;
    e->nblocks = nblocks;
    e->bs = bs;
    e->batch = batch;
    e->inflight = o->inflight ? o->inflight : auto_inflight(bs, batch);
    e->pattern = o->pattern;
    e->rng = seed;
    if (o->verify) {
        e->expected = xcalloc(nblocks, sizeof *e->expected);
        for (uint64_t i = 0; i < nblocks; i++)
            e->expected[i] = EXP_UNWRITTEN;
    }
    if (o->pattern == PATTERN_SEQ) {
        e->busy = xcalloc(nblocks, 1);
    } else {
        e->pool = xcalloc(nblocks, sizeof *e->pool);
        for (uint64_t i = 0; i < nblocks; i++)
            e->pool[i] = i;
        e->pool_n = nblocks;
    }
    e->slot_t0 = xcalloc(e->inflight, sizeof *e->slot_t0);
    e->slot_call = xcalloc(e->inflight, sizeof *e->slot_call);
    e->lidx = xcalloc(e->inflight * batch, sizeof *e->lidx);
    e->ridx = xcalloc(e->inflight * batch, sizeof *e->ridx);
    e->free_slots = xcalloc(e->inflight, sizeof *e->free_slots);
    for (uint32_t i = 0; i < e->inflight; i++)
        e->free_slots[e->n_free++] = (uint32_t)(e->inflight - 1 - i);
    size_t cap = 16;
    while (cap < 4 * e->inflight)
        cap *= 2;
    e->map.keys = xcalloc(cap, sizeof *e->map.keys);
    e->map.vals = xcalloc(cap, sizeof *e->map.vals);
    e->map.mask = cap - 1;
}

static void engine_free(struct engine *e)
{
    free(e->expected);
    free(e->busy);
    free(e->pool);
    free(e->slot_t0);
    free(e->slot_call);
    free(e->floors);
    free(e->lidx);
    free(e->ridx);
    free(e->free_slots);
    free(e->map.keys);
    free(e->map.vals);
    free(e->samples);
    free(e->calls.ns);
    free(e->calls.cpu);
    memset(e, 0, sizeof *e);
}

/* Choose the indexes of the next call into l/r; false if the remote blocks it
 * needs are still in flight (wait for completions first). */
static bool pick(struct engine *e, uint64_t *l, uint64_t *r)
{
    uint64_t n = e->batch, nb = e->nblocks;
    if (e->pattern == PATTERN_SEQ) {
        uint64_t c = e->cursor + n > nb ? 0 : e->cursor;
        for (uint64_t k = 0; k < n; k++)
            if (e->busy[c + k])
                return false;
        /* Local run starts half a region away from the remote one, so a
         * library that confused local and remote indexes fails verification. */
        uint64_t ls = (c + nb / 2) % nb;
        if (ls + n > nb)
            ls = 0;
        for (uint64_t k = 0; k < n; k++) {
            l[k] = ls + k;
            r[k] = c + k;
            e->busy[c + k] = 1;
        }
        e->cursor = c + n;
        return true;
    }
    if (e->pool_n < n)
        return false;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t j = rng_below(&e->rng, e->pool_n);
        r[k] = e->pool[j];
        e->pool[j] = e->pool[--e->pool_n]; /* distinct remote indexes per call */
        l[k] = rng_below(&e->rng, nb);     /* local may repeat: reads only */
    }
    return true;
}

static bool try_submit(struct engine *e)
{
    if (e->n_free == 0)
        return false;
    uint32_t s = e->free_slots[e->n_free - 1];
    uint64_t *l = e->lidx + (size_t)s * e->batch, *r = e->ridx + (size_t)s * e->batch;
    if (!pick(e, l, r))
        return false;
    e->n_free--;
    uint64_t id = 0, c0 = cpu_ns(), t0 = now_ns();
    int rc = kvx_write_blocks(&id, e->t, PEER_ID, l, r, (size_t)e->batch);
    if (rc)
        die_kvx("kvx_write_blocks", rc);
    if (id == 0)
        die("kvx_write_blocks returned transfer id 0");
    if (e->measure && !e->t_start)
        e->t_start = t0;
    e->slot_t0[s] = t0;
    e->slot_call[s] = now_ns() - t0;
    if (e->measure)
        call_sample(&e->calls, e->slot_call[s], cpu_ns() - c0, &e->rng);
    if (e->expected)
        for (uint64_t k = 0; k < e->batch; k++)
            e->expected[r[k]] = l[k];
    idmap_put(&e->map, id, s);
    e->outstanding++;
    return true;
}

static void add_sample(struct engine *e, uint64_t ns, uint64_t floor)
{
    e->seen_samples++;
    if (e->n_samples < MAX_SAMPLES) {
        if (e->n_samples == e->cap_samples) {
            size_t cap = e->cap_samples ? e->cap_samples * 2 : 4096;
            uint64_t *p = realloc(e->samples, cap * sizeof *p), *f = p ? realloc(e->floors, cap * sizeof *f) : NULL;
            if (!p || !f)
                die("out of memory for latency samples");
            e->samples = p;
            e->floors = f;
            e->cap_samples = cap;
        }
        e->floors[e->n_samples] = floor;
        e->samples[e->n_samples++] = ns;
        return;
    }
    /* Reservoir sampling: bounded memory, unbiased percentiles. */
    uint64_t j = rng_below(&e->rng, e->seen_samples);
    if (j < MAX_SAMPLES) {
        e->samples[j] = ns;
        e->floors[j] = floor;
    }
}

static void complete(struct engine *e, uint64_t id, uint64_t t1, bool ok)
{
    uint32_t s;
    if (!idmap_take(&e->map, id, &s))
        die("kvx_poll reported transfer id %llu, which is not outstanding (reported twice?)",
            (unsigned long long)id);
    const uint64_t *r = e->ridx + (size_t)s * e->batch;
    for (uint64_t k = 0; k < e->batch; k++) {
        if (e->pattern == PATTERN_SEQ)
            e->busy[r[k]] = 0;
        else
            e->pool[e->pool_n++] = r[k];
        if (!ok && e->expected)
            e->expected[r[k]] = EXP_UNKNOWN; /* no statement about failed bytes */
    }
    e->free_slots[e->n_free++] = s;
    e->outstanding--;
    if (!ok) {
        if (!e->n_failed && !e->first_failed)
            e->first_failed = id;
        e->n_failed++;
        return;
    }
    if (!e->measure)
        return;
    e->n_done++;
    e->bytes += e->batch * e->bs;
    e->t_last = t1;
    uint64_t ns = t1 - e->slot_t0[s], slack = e->poll_bound + e->slot_call[s];
    add_sample(e, ns, ns > slack ? ns - slack : 0);
}

/* Collect everything finished; true if anything was. */
static bool poll_all(struct engine *e)
{
    uint64_t done[POLL_CAP], failed[POLL_CAP];
    size_t nd, nf;
    bool any = false;
    do {
        nd = nf = 0;
        uint64_t t0 = now_ns();
        int rc = kvx_poll(&nd, &nf, e->t, NULL, done, POLL_CAP, failed, POLL_CAP);
        if (rc)
            die_kvx("kvx_poll", rc);
        if (nd > POLL_CAP || nf > POLL_CAP)
            die("kvx_poll reported %zu done / %zu failed with room for %d", nd, nf, POLL_CAP);
        uint64_t t1 = now_ns();
        /* what this poll reports finished after the previous one began */
        e->poll_bound = t1 - (e->last_poll ? e->last_poll : t0);
        e->last_poll = t0;
        for (size_t i = 0; i < nd; i++)
            complete(e, done[i], t1, true);
        for (size_t i = 0; i < nf; i++)
            complete(e, failed[i], t1, false);
        any |= nd || nf;
    } while (nd == POLL_CAP || nf == POLL_CAP);
    return any;
}

static void show_progress(const struct engine *e, const char *label, uint64_t now)
{
    double secs = e->t_start && now > e->t_start ? (double)(now - e->t_start) / 1e9 : 0;
    if (!e->measure) {
        fprintf(stderr, "\r\033[K%s: warming up", label);
    } else {
        double gbps = secs > 0 ? (double)e->bytes / secs / 1e9 : 0;
        double xps = secs > 0 ? (double)e->n_done / secs : 0;
        fprintf(stderr, "\r\033[K%s: %5.1f s  %8.3f GB/s  %10.0f xfers/s  %llu in flight", label,
                secs, gbps, xps, (unsigned long long)e->outstanding);
    }
    fflush(stderr);
}

/*
 * Submit until the deadline (or total bytes), then drain. When nothing can be
 * submitted and nothing completed, yield the CPU first (the backend threads
 * may share our core), then sleep briefly so an idle wait costs little CPU.
 */
static void run_phase(struct engine *e, bool measure, uint64_t deadline, uint64_t total,
                      const char *label, bool progress)
{
    e->measure = measure;
    e->n_done = e->n_failed = e->bytes = e->t_start = e->t_last = 0;
    e->n_samples = 0;
    e->seen_samples = 0;
    e->calls.n = 0;
    e->calls.seen = 0;
    uint64_t submitted = 0, last_progress = now_ns(), last_show = 0;
    bool stopping = false;
    unsigned idle = 0;
    for (;;) {
        uint64_t now = now_ns();
        if (!stopping && ((deadline && now >= deadline) || (total && submitted >= total)))
            stopping = true;
        if (stopping && e->outstanding == 0)
            break;
        bool progressed = false;
        while (!stopping && e->outstanding < e->inflight && try_submit(e)) {
            submitted += e->batch * e->bs;
            progressed = true;
            if (total && submitted >= total)
                stopping = true;
        }
        if (poll_all(e))
            progressed = true;
        if (progressed) {
            idle = 0;
            last_progress = now;
        } else if (now - last_progress > STUCK_NS) {
            die("%s: no transfer completed for %llu s with %llu outstanding", label,
                (unsigned long long)(STUCK_NS / 1000000000u), (unsigned long long)e->outstanding);
        } else if (e->o->idle_wait) {
            size_t ready;
            int rc = kvx_wait(&ready, e->t, IDLE_WAIT_MS);
            if (rc)
                die_kvx("kvx_wait", rc);
        } else if (++idle < IDLE_YIELDS) {
            sched_yield();
        } else {
            sleep_ns(IDLE_SLEEP_NS);
        }
        if (progress && now - last_show >= PROGRESS_NS) {
            show_progress(e, label, now);
            last_show = now;
        }
    }
    if (progress) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
}

/* One-off status on the progress line ("preparing", "verifying"). */
static void show_status(bool progress, const char *label, const char *what)
{
    if (!progress)
        return;
    fprintf(stderr, "\r\033[K%s: %s", label, what);
    fflush(stderr);
}

/* ------------------------------------------------------------ control helpers */

static int g_fd = -1;

static void send_or_die(uint8_t type, const struct wbuf *b)
{
    if (ctl_send(g_fd, type, b) < 0)
        die("control connection to target: send failed: %s", strerror(errno));
}

/* Receive the reply to a request; an ERR reply or anything unexpected is fatal. */
static uint8_t *expect(uint8_t want, struct rbuf *r, const char *what)
{
    uint8_t type, *p = NULL;
    size_t len = 0;
    if (ctl_recv(g_fd, CTL_TIMEOUT_MS, &type, &p, &len) < 0)
        die("control connection to target: %s while waiting for the reply to %s",
            errno == EPROTO ? "bad frame length" : errno == ECONNRESET ? "target closed the connection"
                                                                        : strerror(errno),
            what);
    *r = (struct rbuf){.p = p, .len = len};
    if (type == CTL_ERR) {
        int code = (int)rb_u32(r);
        char *msg = rb_str(r, CTL_MAX_STR);
        char buf[1200];
        snprintf(buf, sizeof buf, "%s", msg ? msg : "(malformed error)");
        free(msg);
        free(p);
        (void)code; /* the message already names it */
        die("target: %s (answering %s)", buf, what);
    }
    if (type != want) {
        free(p);
        die("control protocol: reply 0x%02x to %s, expected 0x%02x", type, what, want);
    }
    return p;
}

/* ------------------------------------------------------------ one block size */

/* Append text to res->problem ("a; b"), truncating what does not fit. */
static void add_problem(struct result *res, const char *text)
{
    size_t have = strlen(res->problem), room = sizeof res->problem - 1 - have;
    if (have && room >= 2) {
        memcpy(res->problem + have, "; ", 2);
        have += 2;
        room -= 2;
    }
    size_t n = strlen(text);
    if (n > room)
        n = room;
    memcpy(res->problem + have, text, n);
    res->problem[have + n] = '\0';
}

static void verify_remote(const struct engine *e, struct result *res)
{
    struct wbuf b = {0};
    for (uint64_t first = 0; first < e->nblocks; first += CTL_VERIFY_CHUNK) {
        uint64_t n = e->nblocks - first < CTL_VERIFY_CHUNK ? e->nblocks - first : CTL_VERIFY_CHUNK;
        wb_reset(&b);
        wb_u64(&b, first);
        wb_u32(&b, (uint32_t)n);
        for (uint64_t i = 0; i < n; i++)
            wb_u64(&b, e->expected[first + i]);
        send_or_die(CTL_VERIFY, &b);
    }
    wb_free(&b);
    send_or_die(CTL_VERIFY_END, NULL);
    struct rbuf r;
    uint8_t *p = expect(CTL_VERIFY_RESULT, &r, "VERIFY");
    uint64_t checked = rb_u64(&r), written = rb_u64(&r), bad = rb_u64(&r);
    char *problem = rb_str(&r, CTL_MAX_STR);
    if (!rb_done(&r))
        die("control protocol: malformed VERIFY_RESULT");
    uint64_t want_written = 0, want_checked = 0;
    for (uint64_t i = 0; i < e->nblocks; i++) {
        want_checked += e->expected[i] != EXP_UNKNOWN;
        want_written += e->expected[i] < e->nblocks;
    }
    if (bad || checked != want_checked || written != want_written) {
        char msg[sizeof res->problem];
        res->verified = "no";
        snprintf(msg, sizeof msg, "%llu of %llu blocks bad (target checked %llu, %llu written): %.400s",
                 (unsigned long long)bad, (unsigned long long)want_checked,
                 (unsigned long long)checked, (unsigned long long)written,
                 problem && *problem ? problem : "count mismatch");
        add_problem(res, msg);
    } else {
        res->verified = "yes";
    }
    free(problem);
    free(p);
}

/* One block size, end to end: what its steps share. */
struct size_run {
    const struct bench_opts *o;
    uint32_t run;
    uint64_t bs, batch, nblocks, seed;
    char sz[32], label[64];
    bool progress;
    void *local;
    kvx_transport *t;
};

/* The target's side of a run, from its RUN_OK reply (meta points into payload). */
struct target_region {
    uint8_t *payload;
    uint64_t base, nblocks, block_len;
    char *backend;
    const uint8_t *meta;
    size_t meta_len;
};

static void plan_run(struct size_run *sr, const struct bench_opts *o, uint32_t run, uint64_t bs,
                     uint64_t base_seed)
{
    char err[1024];
    memset(sr, 0, sizeof *sr);
    sr->o = o;
    sr->run = run;
    sr->bs = bs;
    fmt_size(sr->sz, sizeof sr->sz, bs);
    snprintf(sr->label, sizeof sr->label, "%s blocks", sr->sz);
    if (plan_size(o, bs, &sr->batch, &sr->nblocks, err, sizeof err) < 0)
        die("%s", err); /* checked in main already */
    sr->seed = mix64(base_seed + run);
    sr->progress = o->progress && isatty(2);
}

/* 1. the target creates its region + transport and sends metadata + geometry */
static void request_region(const struct size_run *sr, struct target_region *tr)
{
    const struct bench_opts *o = sr->o;
    struct wbuf b = {0};
    wb_u32(&b, sr->run);
    wb_u64(&b, sr->bs);
    wb_u64(&b, sr->nblocks);
    wb_u64(&b, sr->seed);
    wb_u8(&b, o->verify);
    wb_str(&b, o->backend);
    wb_u8(&b, o->config != NULL);
    wb_str(&b, o->config ? o->config : "");
    send_or_die(CTL_RUN, &b);
    wb_free(&b);
    struct rbuf r;
    tr->payload = expect(CTL_RUN_OK, &r, "RUN");
    tr->base = rb_u64(&r);
    tr->nblocks = rb_u64(&r);
    tr->block_len = rb_u64(&r);
    tr->backend = rb_str(&r, 64);
    tr->meta = rb_blob(&r, CTL_MAX_META, &tr->meta_len);
    if (!rb_done(&r))
        die("control protocol: malformed RUN_OK");
    if (tr->nblocks != sr->nblocks || tr->block_len != sr->bs)
        die("target created %llu blocks of %llu bytes, asked for %llu of %llu",
            (unsigned long long)tr->nblocks, (unsigned long long)tr->block_len,
            (unsigned long long)sr->nblocks, (unsigned long long)sr->bs);
}

/* 2. our region, with the pattern the target will check against */
static void map_local_region(struct size_run *sr)
{
    uint64_t bytes = sr->bs * sr->nblocks;
    sr->local = region_alloc(bytes, false);
    if (!sr->local)
        die("cannot map a local region of %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    if (sr->o->verify)
        for (uint64_t i = 0; i < sr->nblocks; i++)
            pattern_fill((uint8_t *)sr->local + i * sr->bs, sr->bs, sr->seed, i);
    else
        memset(sr->local, 0x5a, bytes); /* fault pages in; never send the shared zero page */
}

/* 3. our transport; register the target, then let it register us */
static void create_transport(struct size_run *sr, struct result *res)
{
    char err[1024];
    kvx_options *opts = NULL;
    if (make_kvx_options(sr->o, sr->o->backend, &opts, err, sizeof err) < 0)
        die("%s", err);
    int rc = kvx_transport_create(&sr->t, sr->local, sr->nblocks, sr->bs, sr->o->config, opts);
    if (rc) {
        fmt_kvx_error(err, sizeof err, "kvx_transport_create", rc);
        kvx_options_destroy(opts);
        die("%s", err);
    }
    kvx_options_destroy(opts);
    res->backend = kvx_transport_backend(sr->t);
}

/* Adds the target; res->backend becomes the path the library picked for it
 * (a transport serves on several backends and picks one per peer). */
static void register_target(const struct size_run *sr, struct target_region *tr, struct result *res)
{
    int rc = kvx_add_remote_peer(sr->t, PEER_ID, tr->meta, tr->meta_len, tr->base, tr->nblocks,
                                 tr->block_len);
    if (rc)
        die_kvx("kvx_add_remote_peer(target)", rc);
    const char *path = "";
    rc = kvx_peer_backend(&res->backend, &path, sr->t, PEER_ID);
    if (rc)
        die_kvx("kvx_peer_backend(target)", rc);
    if (*path && !sr->o->json)
        fprintf(stderr, "%s: backend %s, path %s\n", sr->sz, res->backend, path);
    res->path = path;
    if (tr->backend && sr->o->backend_given && strcmp(sr->o->backend, "auto") != 0 &&
        strcmp(tr->backend, res->backend) != 0)
        warnx_("%s: target serves on '%s' first, this peer uses '%s'", sr->sz, tr->backend, res->backend);
    free(tr->backend);
    free(tr->payload);
}

static void register_with_target(const struct size_run *sr)
{
    size_t mlen = 0;
    int rc = kvx_get_agent_metadata(&mlen, sr->t, NULL, 0);
    if (rc && rc != KVX_ENOBUFS)
        die_kvx("kvx_get_agent_metadata(size)", rc);
    uint8_t *meta = xcalloc(mlen, 1);
    if ((rc = kvx_get_agent_metadata(&mlen, sr->t, meta, mlen)) != 0)
        die_kvx("kvx_get_agent_metadata", rc);
    uint64_t base = 0;
    if ((rc = kvx_transport_base_addr(&base, sr->t)) != 0)
        die_kvx("kvx_transport_base_addr", rc);
    struct wbuf b = {0};
    wb_u64(&b, base);
    wb_u64(&b, sr->nblocks);
    wb_u64(&b, sr->bs);
    wb_blob(&b, meta, mlen);
    free(meta);
    send_or_die(CTL_PEER, &b);
    wb_free(&b);
    struct rbuf r;
    free(expect(CTL_OK, &r, "PEER"));
}

/* Throughput and latency of the measured phase; failures of both phases. */
static void summarize(struct engine *e, uint64_t warm_failed, uint64_t warm_first_failed,
                      struct result *res)
{
    res->block_size = e->bs;
    res->batch = e->batch;
    res->blocks = e->nblocks;
    res->inflight = e->inflight;
    res->bytes = e->bytes;
    res->transfers = e->n_done;
    res->failed = e->n_failed + warm_failed;
    res->seconds = e->t_last > e->t_start ? (double)(e->t_last - e->t_start) / 1e9 : 0;
    res->gbps = res->seconds > 0 ? (double)e->bytes / res->seconds / 1e9 : 0;
    res->xps = res->seconds > 0 ? (double)e->n_done / res->seconds : 0;
    qsort(e->samples, e->n_samples, sizeof *e->samples, cmp_u64);
    res->p50 = pct_us(e->samples, e->n_samples, 500);
    res->p99 = pct_us(e->samples, e->n_samples, 990);
    res->p999 = pct_us(e->samples, e->n_samples, 999);
    res->max_us = e->n_samples ? (double)e->samples[e->n_samples - 1] / 1e3 : 0;
    qsort(e->floors, e->n_samples, sizeof *e->floors, cmp_u64);
    res->floor_p50 = pct_us(e->floors, e->n_samples, 500);
    res->floor_p99 = pct_us(e->floors, e->n_samples, 990);
    call_summary(&e->calls, &res->submit);
    res->verified = "off";
    if (res->failed)
        snprintf(res->problem, sizeof res->problem, "%llu transfers failed (first id %llu)",
                 (unsigned long long)res->failed,
                 (unsigned long long)(warm_first_failed ? warm_first_failed : e->first_failed));
}

/* What checking a call's index lists costs (p50 of 31 calls, us): calls
 * that repeat their first remote index at the end, so that the library
 * checks everything, as for a transfer, and then refuses them (nothing is
 * outstanding: slot 0's lists are those of a call made). */
static double time_validation(struct engine *e)
{
    uint64_t ns[31], *r = e->ridx, keep = r[e->batch - 1];
    if (e->batch < 2 || e->outstanding)
        return 0;
    r[e->batch - 1] = r[0];
    for (size_t i = 0; i < 31; i++) {
        uint64_t id = 0, t0 = now_ns();
        int rc = kvx_write_blocks(&id, e->t, PEER_ID, e->lidx, r, (size_t)e->batch);
        ns[i] = now_ns() - t0;
        if (rc != KVX_EINVAL)
            die("kvx_write_blocks with a remote index twice returned %d, not KVX_EINVAL", rc);
    }
    r[e->batch - 1] = keep;
    qsort(ns, 31, sizeof *ns, cmp_u64);
    return pct_us(ns, 31, 500);
}

/* 4. optionally measure cold, warm up (connections, caches), then measure */
static void measure(const struct size_run *sr, struct engine *e, struct result *res)
{
    const struct bench_opts *o = sr->o;
    engine_init(e, o, sr->t, sr->nblocks, sr->bs, sr->batch, sr->seed ^ 0x72616e646f6dull);
    res->cold_gbps = 0;
    if (o->cold) { /* the peer was added just now: nothing has moved yet */
        run_phase(e, true, 0, o->cold, sr->label, sr->progress);
        if (e->t_last > e->t_start)
            res->cold_gbps = (double)e->bytes / ((double)(e->t_last - e->t_start) / 1e9) / 1e9;
    }
    if (o->warmup > 0)
        run_phase(e, false, now_ns() + (uint64_t)(o->warmup * 1e9), 0, sr->label, sr->progress);
    uint64_t warm_failed = e->n_failed, warm_first_failed = e->first_failed;
    kvx_stats before, after;
    bool lib = lib_snapshot(sr->t, PEER_ID, &before);
    run_phase(e, true, o->total ? 0 : now_ns() + (uint64_t)(o->duration * 1e9), o->total, sr->label,
              sr->progress);
    summarize(e, warm_failed, warm_first_failed, res);
    res->lib.agrees = "n/a";
    if (lib && lib_snapshot(sr->t, PEER_ID, &after))
        lib_view(&before, &after, res, &res->lib);
    res->submit.validate = time_validation(e);
    if (strcmp(res->lib.agrees, "no") == 0) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "the library's view differs: %llu transfers, %llu bytes, p50 %.1f us, p99 %.1f us "
                 "(kvx_get_stats) vs %llu, %llu, %.1f us (at least %.1f), %.1f us (at least %.1f) (measured)",
                 (unsigned long long)res->lib.transfers, (unsigned long long)res->lib.bytes, res->lib.p50,
                 res->lib.p99, (unsigned long long)res->transfers, (unsigned long long)res->bytes, res->p50,
                 res->floor_p50, res->p99, res->floor_p99);
        add_problem(res, msg);
    }
}

/* 5. the target checks every block; then both sides tear down */
static void finish_run(struct size_run *sr, struct engine *e, struct result *res)
{
    if (sr->o->verify) {
        show_status(sr->progress, sr->label, "target is verifying");
        verify_remote(e, res);
    }
    engine_free(e);
    int rc = kvx_remove_remote_peer(sr->t, PEER_ID);
    if (rc)
        die_kvx("kvx_remove_remote_peer(target)", rc);
    send_or_die(CTL_END_RUN, NULL);
    struct rbuf r;
    free(expect(CTL_OK, &r, "END_RUN"));
    kvx_transport_destroy(sr->t);
    region_free(sr->local, sr->bs * sr->nblocks);
    if (sr->progress) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
}

static void run_size(const struct bench_opts *o, uint32_t run, uint64_t bs, uint64_t base_seed,
                     struct result *res)
{
    struct size_run sr;
    struct target_region tr;
    struct engine e;
    plan_run(&sr, o, run, bs, base_seed);
    show_status(sr.progress, sr.label, "preparing regions and connections");
    request_region(&sr, &tr);
    map_local_region(&sr);
    create_transport(&sr, res);
    register_target(&sr, &tr, res);
    register_with_target(&sr);
    measure(&sr, &e, res);
    finish_run(&sr, &e, res);
}

int run_initiator(const struct bench_opts *o, int ctl_fd, const char *target_desc)
{
    g_fd = ctl_fd;
    struct wbuf b = {0};
    wb_u32(&b, CTL_MAGIC);
    wb_u32(&b, CTL_VERSION);
    wb_str(&b, kvx_version_string());
    send_or_die(CTL_HELLO, &b);
    wb_free(&b);
    struct rbuf r;
    uint8_t *p = expect(CTL_HELLO, &r, "HELLO");
    uint32_t magic = rb_u32(&r), ver = rb_u32(&r);
    char *tlib = rb_str(&r, 64);
    if (!rb_done(&r) || magic != CTL_MAGIC || ver != CTL_VERSION)
        die("%s is not a kvxfer-bench target speaking control protocol %u", target_desc, CTL_VERSION);
    free(p);

    uint64_t base_seed = o->seed_given ? o->seed : mix64(now_ns() ^ ((uint64_t)getpid() << 32));
    if (!o->json) {
        char dur[64];
        if (o->total)
            fmt_size(dur, sizeof dur, o->total), strcat(dur, " per size");
        else
            snprintf(dur, sizeof dur, "%g s per size", o->duration);
        char infl[48];
        if (o->inflight)
            snprintf(infl, sizeof infl, "%llu", (unsigned long long)o->inflight);
        else
            snprintf(infl, sizeof infl, "auto (8 MiB outstanding, 8..128)");
        printf("kvxfer-bench %s: target %s, library %s; backend %s, inflight %s, %s, "
               "verify %s\n",
               kvx_version_string(), target_desc, tlib, o->backend, infl, dur, o->verify ? "on" : "off");
        print_header();
        fflush(stdout);
    }
    free(tlib);

    int failures = 0;
    for (size_t i = 0; i < o->n_sizes; i++) {
        struct result res;
        memset(&res, 0, sizeof res);
        run_size(o, (uint32_t)(i + 1), o->block_sizes[i], base_seed, &res);
        if (o->json)
            print_json(o, &res);
        else
            print_row(o, &res);
        if (res.problem[0]) {
            char sz[32];
            fmt_size(sz, sizeof sz, res.block_size);
            warnx_("%s blocks: FAILED: %s", sz, res.problem);
        }
        if (res.failed || strcmp(res.verified, "no") == 0 || strcmp(res.lib.agrees, "no") == 0)
            failures++;
    }
    send_or_die(CTL_DONE, NULL);
    free(expect(CTL_OK, &r, "DONE"));
    g_fd = -1;
    return failures ? 1 : 0;
}
