/*
 * Target role (--serve): owns the region that the initiator writes into.
 * Per block size it creates a transport over a fresh region filled with a
 * poison pattern, hands out metadata + geometry over the control channel,
 * stays idle while the initiator writes (one-sided: nothing to call here),
 * then checks every block against the initiator's list of what it wrote.
 * Everything received is untrusted: a bad request gets an ERR reply and never
 * kills the server.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "ctl.h"

struct session {
    int fd;
    const struct bench_opts *o;
    bool quiet;
    /* current run */
    kvx_transport *t;
    void *region;
    uint64_t region_bytes, num_blocks, block_len, seed;
    uint32_t run;
    bool verify, peer_added;
    /* verification of the current run */
    uint64_t checked, written, mismatches;
    char problem[512];
};

static int reply_err(struct session *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int reply_err(struct session *s, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!s->quiet)
        warnx_("%s", msg);
    struct wbuf b = {0};
    wb_u32(&b, (uint32_t)code);
    wb_str(&b, msg);
    int rc = ctl_send(s->fd, CTL_ERR, &b);
    wb_free(&b);
    return rc;
}

static int reply(struct session *s, uint8_t type, struct wbuf *b)
{
    int rc = ctl_send(s->fd, type, b);
    if (rc < 0 && !s->quiet)
        warnx_("control connection: send failed: %s", strerror(errno));
    return rc;
}

static void end_run(struct session *s)
{
    if (s->t) {
        /* Remove the peer explicitly: exercises the API; destroy would too. */
        if (s->peer_added) {
            int rc = kvx_remove_remote_peer(s->t, "initiator");
            if (rc)
                warnx_("kvx_remove_remote_peer: %s: %s", kvx_strerror(rc), kvx_last_error_message());
        }
        kvx_transport_destroy(s->t);
    }
    if (s->o->target_region == REGION_SHARED)
        kvx_region_free(s->region);
    else
        region_free(s->region, s->region_bytes);
    s->t = NULL;
    s->region = NULL;
    s->region_bytes = s->num_blocks = s->block_len = 0;
    s->peer_added = false;
    s->checked = s->written = s->mismatches = 0;
    s->problem[0] = '\0';
}

/* Half of physical memory: an initiator may not make us allocate more. */
static uint64_t max_region_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0)
        return 1ull << 34;
    return (uint64_t)pages * (uint64_t)psz / 2;
}

/* A RUN request as received; backend and config are malloc'd (may be NULL). */
struct run_request {
    uint32_t run;
    uint64_t block_len, num_blocks, seed;
    bool verify, has_config;
    char *backend, *config;
};

static void read_run_request(struct rbuf *r, struct run_request *q)
{
    q->run = rb_u32(r);
    q->block_len = rb_u64(r);
    q->num_blocks = rb_u64(r);
    q->seed = rb_u64(r);
    q->verify = rb_u8(r) != 0;
    q->backend = rb_str(r, 64);
    q->has_config = rb_u8(r) != 0;
    q->config = rb_str(r, CTL_MAX_STR);
}

/* The steps below return 0 or the code for an ERR reply, with its message in err. */

/* A request this session cannot start, before anything is allocated. */
static int refuse_run(const struct session *s, const struct rbuf *r, const struct run_request *q,
                      char *err, size_t cap)
{
    if (!rb_done(r)) {
        snprintf(err, cap, "malformed RUN request");
        return KVX_EINVAL;
    }
    if (s->t) {
        snprintf(err, cap, "RUN while run %u is still active", s->run);
        return KVX_EBUSY;
    }
    if (q->block_len == 0 || q->num_blocks == 0 || q->block_len > UINT64_MAX / q->num_blocks) {
        snprintf(err, cap, "bad geometry: %llu blocks of %llu bytes",
                 (unsigned long long)q->num_blocks, (unsigned long long)q->block_len);
        return KVX_EINVAL;
    }
    if (q->block_len * q->num_blocks > max_region_bytes()) {
        snprintf(err, cap, "region of %llu bytes is more than half of this host's memory",
                 (unsigned long long)(q->block_len * q->num_blocks));
        return KVX_ENOMEM;
    }
    return 0;
}

/* The run's region, every page touched now so page faults are not part of
 * the measurement; with verification the poison makes unwritten blocks
 * recognisable. */
static int map_region(struct session *s, const struct run_request *q, char *err, size_t cap)
{
    uint64_t bytes = q->block_len * q->num_blocks;
    if (s->o->target_region == REGION_SHARED) {
        void *p = NULL;
        int rc = kvx_region_alloc(&p, bytes, 0);
        if (rc) {
            fmt_kvx_error(err, cap, "kvx_region_alloc", rc);
            return rc;
        }
        s->region = p;
    } else {
        s->region = region_alloc(bytes, s->o->target_region == REGION_THP);
    }
    if (!s->region) {
        snprintf(err, cap, "cannot map a region of %llu bytes: %s", (unsigned long long)bytes,
                 strerror(errno));
        return KVX_ENOMEM;
    }
    s->region_bytes = bytes;
    s->num_blocks = q->num_blocks;
    s->block_len = q->block_len;
    s->seed = q->seed;
    s->verify = q->verify;
    s->run = q->run;
    if (q->verify) {
        uint64_t ps = poison_seed(q->seed);
        for (uint64_t i = 0; i < q->num_blocks; i++)
            pattern_fill((uint8_t *)s->region + i * q->block_len, q->block_len, ps, i);
    } else {
        memset(s->region, 0, bytes);
    }
    return 0;
}

/* Our own --backend/--config win; otherwise follow the initiator. */
static int create_transport(struct session *s, const struct run_request *q, char *err, size_t cap)
{
    const char *be = s->o->backend_given ? s->o->backend : q->backend;
    const char *cfg = s->o->config_given ? s->o->config : (q->has_config ? q->config : NULL);
    kvx_options *opts = NULL;
    if (make_kvx_options(s->o, be && *be ? be : NULL, &opts, err, cap) < 0)
        return KVX_EINVAL;
    int rc = kvx_transport_create(&s->t, s->region, q->num_blocks, q->block_len, cfg, opts);
    if (rc) {
        fmt_kvx_error(err, cap, "kvx_transport_create", rc);
        s->t = NULL;
    }
    kvx_options_destroy(opts);
    return rc;
}

/* The RUN_OK payload: geometry as the transport reports it, backend, metadata. */
static int describe_run(struct session *s, struct wbuf *b, char *err, size_t cap)
{
    size_t mlen = 0;
    int rc = kvx_get_agent_metadata(&mlen, s->t, NULL, 0);
    uint8_t *meta = NULL;
    if (rc == KVX_ENOBUFS || rc == 0) {
        meta = malloc(mlen ? mlen : 1);
        rc = meta ? kvx_get_agent_metadata(&mlen, s->t, meta, mlen) : KVX_ENOMEM;
    }
    if (rc) {
        fmt_kvx_error(err, cap, "kvx_get_agent_metadata", rc);
        free(meta);
        return rc;
    }
    uint64_t base = 0, nb = 0, bl = 0;
    if ((rc = kvx_transport_base_addr(&base, s->t)) != 0 ||
        (rc = kvx_transport_num_blocks(&nb, s->t)) != 0 ||
        (rc = kvx_transport_block_len(&bl, s->t)) != 0) {
        fmt_kvx_error(err, cap, "kvx_transport_* property", rc);
        free(meta);
        return rc;
    }
    wb_u64(b, base);
    wb_u64(b, nb);
    wb_u64(b, bl);
    wb_str(b, kvx_transport_backend(s->t));
    wb_blob(b, meta, mlen);
    free(meta);
    return 0;
}

/* Region, transport and the RUN_OK reply; on failure an ERR reply, and the
 * run is torn down again. */
static int start_run(struct session *s, const struct run_request *q)
{
    char err[1024];
    struct wbuf b = {0};
    int code = map_region(s, q, err, sizeof err);
    if (!code)
        code = create_transport(s, q, err, sizeof err);
    if (!code)
        code = describe_run(s, &b, err, sizeof err);
    int ret;
    if (code) {
        ret = reply_err(s, code, "%s", err);
        end_run(s);
    } else {
        ret = reply(s, CTL_RUN_OK, &b);
    }
    wb_free(&b);
    return ret;
}

static int handle_run(struct session *s, struct rbuf *r)
{
    struct run_request q;
    char err[1024];
    read_run_request(r, &q);
    int code = refuse_run(s, r, &q, err, sizeof err);
    int ret = code ? reply_err(s, code, "%s", err) : start_run(s, &q);
    free(q.backend);
    free(q.config);
    return ret;
}

static int handle_peer(struct session *s, struct rbuf *r)
{
    uint64_t base = rb_u64(r), nb = rb_u64(r), bl = rb_u64(r);
    size_t mlen;
    const uint8_t *meta = rb_blob(r, CTL_MAX_META, &mlen);
    if (!rb_done(r))
        return reply_err(s, KVX_EINVAL, "malformed PEER request");
    if (!s->t)
        return reply_err(s, KVX_EINVAL, "PEER without RUN");
    if (s->peer_added)
        return reply_err(s, KVX_EEXIST, "PEER sent twice");
    /* Registering the initiator too checks its metadata and the connection
     * in the other direction, as a vLLM deployment exchanges both ways. */
    int rc = kvx_add_remote_peer(s->t, "initiator", meta, mlen, base, nb, bl);
    if (rc) {
        char err[1024];
        fmt_kvx_error(err, sizeof err, "kvx_add_remote_peer", rc);
        return reply_err(s, rc, "%s", err);
    }
    s->peer_added = true;
    return reply(s, CTL_OK, NULL);
}

static void note_problem(struct session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note_problem(struct session *s, const char *fmt, ...)
{
    s->mismatches++;
    if (s->problem[0])
        return; /* the first one is the useful one */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->problem, sizeof s->problem, fmt, ap);
    va_end(ap);
}

static void check_block(struct session *s, uint64_t r, uint64_t expect)
{
    const uint8_t *blk = (const uint8_t *)s->region + r * s->block_len;
    uint64_t off = 0, off2 = 0;
    unsigned long long ur = (unsigned long long)r;
    if (expect == EXP_UNKNOWN)
        return; /* a failed transfer wrote it: no statement possible */
    s->checked++;
    if (expect == EXP_UNWRITTEN) {
        if (!pattern_check(blk, s->block_len, poison_seed(s->seed), r, &off))
            note_problem(s, "remote block %llu was never written but changed at byte %llu", ur,
                         (unsigned long long)off);
        return;
    }
    s->written++;
    if (!pattern_check(blk, s->block_len, s->seed, expect, &off)) {
        bool unwritten = pattern_check(blk, s->block_len, poison_seed(s->seed), r, &off2);
        note_problem(s, "remote block %llu: expected the data of local block %llu, %s at byte %llu", ur,
                     (unsigned long long)expect,
                     unwritten ? "but it still holds its initial poison (never landed)" : "differs",
                     (unsigned long long)off);
    }
}

static int handle_verify(struct session *s, struct rbuf *r)
{
    uint64_t first = rb_u64(r);
    uint32_t count = rb_u32(r);
    if (r->bad || count > CTL_VERIFY_CHUNK || (uint64_t)count * 8 != r->len - r->off)
        return reply_err(s, KVX_EINVAL, "malformed VERIFY request");
    if (!s->t)
        return reply_err(s, KVX_EINVAL, "VERIFY without RUN");
    if (!s->verify)
        return reply_err(s, KVX_EINVAL, "VERIFY in a run started without verification");
    if (first > s->num_blocks || count > s->num_blocks - first)
        return reply_err(s, KVX_ERANGE, "VERIFY blocks %llu+%u beyond %llu blocks",
                         (unsigned long long)first, count, (unsigned long long)s->num_blocks);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t e = rb_u64(r);
        if (e >= s->num_blocks && e != EXP_UNWRITTEN && e != EXP_UNKNOWN)
            return reply_err(s, KVX_ERANGE, "VERIFY names local block %llu of %llu",
                             (unsigned long long)e, (unsigned long long)s->num_blocks);
        check_block(s, first + i, e);
    }
    return 0; /* no reply: chunks are pipelined */
}

static int handle_verify_end(struct session *s, struct rbuf *r)
{
    if (!rb_done(r))
        return reply_err(s, KVX_EINVAL, "malformed VERIFY_END request");
    if (!s->t)
        return reply_err(s, KVX_EINVAL, "VERIFY_END without RUN");
    if (!s->quiet) {
        char sz[32];
        fmt_size(sz, sizeof sz, s->block_len);
        printf("run %u: %s x %llu blocks (%s): checked %llu blocks, %llu written, %llu bad%s%s\n",
               s->run, sz, (unsigned long long)s->num_blocks, kvx_transport_backend(s->t),
               (unsigned long long)s->checked, (unsigned long long)s->written,
               (unsigned long long)s->mismatches, s->problem[0] ? ": " : "", s->problem);
        fflush(stdout);
    }
    struct wbuf b = {0};
    wb_u64(&b, s->checked);
    wb_u64(&b, s->written);
    wb_u64(&b, s->mismatches);
    wb_str(&b, s->problem);
    int rc = reply(s, CTL_VERIFY_RESULT, &b);
    wb_free(&b);
    s->checked = s->written = s->mismatches = 0;
    s->problem[0] = '\0';
    return rc;
}

/* One initiator conversation. 0 when it ended with DONE. */
static int session(const struct bench_opts *o, int fd, bool quiet)
{
    struct session s = {.fd = fd, .o = o, .quiet = quiet};
    int result = -1;
    for (;;) {
        uint8_t type, *payload = NULL;
        size_t len;
        /* No timeout: a run may last as long as the initiator wants; a dead
         * initiator shows up as EOF. */
        if (ctl_recv(fd, -1, &type, &payload, &len) < 0) {
            if (!quiet || errno != ECONNRESET)
                warnx_("control connection: %s", errno == EPROTO ? "bad frame length" : strerror(errno));
            break;
        }
        struct rbuf r = {.p = payload, .len = len};
        int rc = 0;
        bool stop = false;
        switch (type) {
        case CTL_HELLO: {
            uint32_t magic = rb_u32(&r), ver = rb_u32(&r);
            char *lib = rb_str(&r, 64);
            if (!rb_done(&r) || magic != CTL_MAGIC) {
                rc = reply_err(&s, KVX_EINVAL, "not a kvxfer-bench initiator");
                stop = true;
            } else if (ver != CTL_VERSION) {
                rc = reply_err(&s, KVX_EVERSION, "control protocol %u, this target speaks %u", ver,
                               CTL_VERSION);
                stop = true;
            } else {
                struct wbuf b = {0};
                wb_u32(&b, CTL_MAGIC);
                wb_u32(&b, CTL_VERSION);
                wb_str(&b, kvx_version_string());
                rc = reply(&s, CTL_HELLO, &b);
                wb_free(&b);
            }
            free(lib);
            break;
        }
        case CTL_RUN: rc = handle_run(&s, &r); break;
        case CTL_PEER: rc = handle_peer(&s, &r); break;
        case CTL_VERIFY: rc = handle_verify(&s, &r); break;
        case CTL_VERIFY_END: rc = handle_verify_end(&s, &r); break;
        case CTL_END_RUN:
            end_run(&s);
            rc = reply(&s, CTL_OK, NULL);
            break;
        case CTL_DONE:
            end_run(&s);
            rc = reply(&s, CTL_OK, NULL);
            stop = true;
            if (rc == 0)
                result = 0;
            break;
        default:
            rc = reply_err(&s, KVX_EINVAL, "unknown control message type 0x%02x", type);
            stop = true;
        }
        free(payload);
        if (rc < 0 || stop)
            break;
    }
    end_run(&s);
    return result;
}

int run_target(const struct bench_opts *o)
{
    char bound[CTL_ADDR_LEN];
    int port = 0;
    int lfd = ctl_listen(o->serve, bound, sizeof bound, &port);
    if (lfd < 0)
        die("--serve %s: cannot listen: %s", o->serve, strerror(errno));
    bool quiet = o->port_fd >= 0;
    if (quiet) {
        /* Local mode: tell the parent our port through the pipe, then be silent. */
        char buf[16];
        int n = snprintf(buf, sizeof buf, "%d\n", port);
        if (write(o->port_fd, buf, (size_t)n) != n)
            die("cannot report port to parent: %s", strerror(errno));
        close(o->port_fd);
    } else {
        printf("kvxfer-bench %s: serving on %s (Ctrl-C to stop)\n", kvx_version_string(), bound);
        printf("  initiator: kvxfer-bench --connect THIS_HOST:%d [options]\n", port);
        fflush(stdout);
    }
    int status = 0;
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            die("accept: %s", strerror(errno));
        }
        ctl_nodelay(fd);
        char peer[CTL_ADDR_LEN];
        ctl_peer_name(fd, peer, sizeof peer);
        if (!quiet) {
            printf("session from %s\n", peer);
            fflush(stdout);
        }
        int rc = session(o, fd, quiet);
        close(fd);
        if (!quiet) {
            printf("session from %s %s\n", peer, rc == 0 ? "finished" : "aborted");
            fflush(stdout);
        }
        if (o->once) {
            status = rc == 0 ? 0 : 1;
            break;
        }
    }
    close(lfd);
    return status;
}
