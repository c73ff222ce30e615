/* Control channel framing and sockets; see ctl.h for the protocol. */
#define _GNU_SOURCE
#include "ctl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"

/* ------------------------------------------------------------ buffers */

/* Every integer on the wire, frame lengths included, is n bytes big-endian. */
static void put_be(uint8_t *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

static uint64_t get_be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

void wb_reset(struct wbuf *b) { b->len = 0; b->oom = false; }

void wb_free(struct wbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static uint8_t *wb_grow(struct wbuf *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (n > CTL_MAX_FRAME || b->len > CTL_MAX_FRAME - n) {
        b->oom = true; /* would exceed a frame anyway */
        return NULL;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->len;
    b->len += n;
    return at;
}

void wb_u8(struct wbuf *b, uint8_t v)
{
    uint8_t *p = wb_grow(b, 1);
    if (p)
        p[0] = v;
}

static void wb_be(struct wbuf *b, uint64_t v, size_t n)
{
    uint8_t *p = wb_grow(b, n);
    if (p)
        put_be(p, v, n);
}

void wb_u32(struct wbuf *b, uint32_t v) { wb_be(b, v, 4); }

void wb_u64(struct wbuf *b, uint64_t v) { wb_be(b, v, 8); }

void wb_blob(struct wbuf *b, const void *src, size_t n)
{
    if (n > UINT32_MAX) {
        b->oom = true;
        return;
    }
    wb_u32(b, (uint32_t)n);
    uint8_t *p = wb_grow(b, n);
    if (p && n)
        memcpy(p, src, n);
}

void wb_str(struct wbuf *b, const char *s) { wb_blob(b, s, s ? strlen(s) : 0); }

static const uint8_t *rb_take(struct rbuf *b, size_t n)
{
    if (b->bad || n > b->len - b->off) {
        b->bad = true;
        return NULL;
    }
    const uint8_t *p = b->p + b->off;
    b->off += n;
    return p;
}

uint8_t rb_u8(struct rbuf *b)
{
    const uint8_t *p = rb_take(b, 1);
    return p ? p[0] : 0;
}

static uint64_t rb_be(struct rbuf *b, size_t n)
{
    const uint8_t *p = rb_take(b, n);
    return p ? get_be(p, n) : 0;
}

uint32_t rb_u32(struct rbuf *b) { return (uint32_t)rb_be(b, 4); }

uint64_t rb_u64(struct rbuf *b) { return rb_be(b, 8); }

const uint8_t *rb_blob(struct rbuf *b, size_t max, size_t *n)
{
    uint32_t len = rb_u32(b);
    if (b->bad || len > max) {
        b->bad = true;
        *n = 0;
        return NULL;
    }
    *n = len;
    return rb_take(b, len);
}

char *rb_str(struct rbuf *b, size_t max)
{
    size_t n;
    const uint8_t *p = rb_blob(b, max, &n);
    if (b->bad)
        return NULL;
    if (n && memchr(p, 0, n)) { /* an embedded NUL would truncate silently */
        b->bad = true;
        return NULL;
    }
    char *s = malloc(n + 1);
    if (!s) {
        b->bad = true;
        return NULL;
    }
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

bool rb_done(const struct rbuf *b) { return !b->bad && b->off == b->len; }

/* ------------------------------------------------------------ framing */

/* Wait until fd is readable/writable; deadline 0 = forever. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline) {
            uint64_t now = now_ns();
            if (now >= deadline) {
                errno = ETIMEDOUT;
                return -1;
            }
            ms = (int)((deadline - now) / 1000000u) + 1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static int write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN && wait_fd(fd, POLLOUT, 0) == 0)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t n, uint64_t deadline)
{
    uint8_t *p = buf;
    while (n) {
        if (wait_fd(fd, POLLIN, deadline) < 0)
            return -1;
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0) {
            errno = ECONNRESET; /* peer closed mid-conversation */
            return -1;
        }
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int ctl_send(int fd, uint8_t type, const struct wbuf *payload)
{
    size_t plen = payload ? payload->len : 0;
    if ((payload && payload->oom) || plen + 1 > CTL_MAX_FRAME) {
        errno = EMSGSIZE;
        return -1;
    }
    uint8_t hdr[5];
    put_be(hdr, plen + 1, 4);
    hdr[4] = type;
    if (write_full(fd, hdr, sizeof hdr) < 0)
        return -1;
    return plen ? write_full(fd, payload->p, plen) : 0;
}

int ctl_recv(int fd, int timeout_ms, uint8_t *type, uint8_t **payload, size_t *len)
{
    uint64_t deadline = timeout_ms < 0 ? 0 : now_ns() + (uint64_t)timeout_ms * 1000000u;
    uint8_t hdr[5];
    if (read_full(fd, hdr, sizeof hdr, deadline) < 0)
        return -1;
    uint32_t l = (uint32_t)get_be(hdr, 4);
    if (l < 1 || l > CTL_MAX_FRAME) {
        errno = EPROTO; /* untrusted length: refuse before allocating */
        return -1;
    }
    size_t plen = l - 1;
    uint8_t *p = malloc(plen ? plen : 1);
    if (!p)
        return -1;
    if (plen && read_full(fd, p, plen, deadline) < 0) {
        int e = errno;
        free(p);
        errno = e;
        return -1;
    }
    *type = hdr[4];
    *payload = p;
    *len = plen;
    return 0;
}

/* ------------------------------------------------------------ sockets */

/* Split "HOST:PORT" / "[V6]:PORT" / "PORT" into host (may be "") and port. */
static int split_hostport(const char *spec, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon;
    host[0] = '\0';
    if (spec[0] == '[') {
        const char *end = strchr(spec, ']');
        if (!end || end[1] != ':')
            return -1;
        if ((size_t)(end - spec - 1) >= hcap)
            return -1;
        memcpy(host, spec + 1, (size_t)(end - spec - 1));
        host[end - spec - 1] = '\0';
        colon = end + 1;
    } else {
        colon = strrchr(spec, ':');
        if (colon) {
            if ((size_t)(colon - spec) >= hcap)
                return -1;
            memcpy(host, spec, (size_t)(colon - spec));
            host[colon - spec] = '\0';
            if (strchr(host, ':'))
                return -1; /* bare IPv6 needs brackets */
        } else {
            colon = spec - 1; /* whole spec is the port */
        }
    }
    const char *ps = colon + 1;
    if (!*ps || strlen(ps) >= pcap || strspn(ps, "0123456789") != strlen(ps))
        return -1;
    if (strtoul(ps, NULL, 10) > 65535)
        return -1;
    strcpy(port, ps);
    return 0;
}

/* Numeric only, so the text fits CTL_ADDR_LEN; getnameinfo fails rather than
 * truncate. */
static void fmt_sockaddr(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap)
{
    char h[INET6_ADDRSTRLEN + IF_NAMESIZE], s[sizeof "65535"];
    if (getnameinfo(sa, len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, cap, "?");
        return;
    }
    if (sa->sa_family == AF_INET6)
        snprintf(buf, cap, "[%s]:%s", h, s);
    else
        snprintf(buf, cap, "%s:%s", h, s);
}

int ctl_listen(const char *spec, char *bound, size_t bound_cap, int *port)
{
    char host[256], serv[16];
    if (split_hostport(spec, host, sizeof host, serv, sizeof serv) < 0) {
        errno = EINVAL;
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, serv, &hints, &res);
    if (gai != 0) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    int fd = -1, err = EADDRNOTAVAIL;
    /* Prefer IPv4 for a bare port: that is what peers usually type. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
            if ((pass == 0) != (ai->ai_family == AF_INET))
                continue;
            int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (s < 0) {
                err = errno;
                continue;
            }
            int one = 1;
            setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (bind(s, ai->ai_addr, ai->ai_addrlen) < 0 || listen(s, 4) < 0) {
                err = errno;
                close(s);
                continue;
            }
            fd = s;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = err;
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    fmt_sockaddr((struct sockaddr *)&ss, sl, bound, bound_cap);
    *port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

void ctl_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int ctl_connect(const char *spec, int timeout_ms, char *err, size_t err_cap)
{
    char host[256], serv[16];
    if (split_hostport(spec, host, sizeof host, serv, sizeof serv) < 0 || !host[0]) {
        snprintf(err, err_cap, "'%s' is not HOST:PORT", spec);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, serv, &hints, &res);
    if (gai != 0) {
        snprintf(err, err_cap, "cannot resolve '%s': %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    snprintf(err, err_cap, "no address for '%s'", spec);
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       ai->ai_protocol);
        if (s < 0)
            continue;
        /* Non-blocking connect so a silent host costs timeout_ms, not minutes. */
        int rc = connect(s, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            if (wait_fd(s, POLLOUT, deadline) == 0) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                errno = soerr;
                rc = soerr ? -1 : 0;
            }
        }
        if (rc < 0) {
            char a[CTL_ADDR_LEN];
            fmt_sockaddr(ai->ai_addr, ai->ai_addrlen, a, sizeof a);
            snprintf(err, err_cap, "connect to %s: %s", a, strerror(errno));
            close(s);
            continue;
        }
        /* Back to blocking: ctl_recv/ctl_send do their own waiting. */
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
        ctl_nodelay(s);
        fd = s;
    }
    freeaddrinfo(res);
    return fd;
}

void ctl_peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    fmt_sockaddr((struct sockaddr *)&ss, sl, buf, cap);
}
