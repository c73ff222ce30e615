#include "util/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace kvx::net {

Fd &Fd::operator=(Fd &&o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.release();
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0) ::close(fd_);
}

namespace {

// Splits HOST:PORT / [V6]:PORT and checks the port; the syntax of both parsers.
void split_hostport(const std::string &s, const char *what, std::string *host, std::string *port) {
    if (!s.empty() && s[0] == '[') {
        size_t rb = s.find(']');
        if (rb == std::string::npos || rb + 1 >= s.size() || s[rb + 1] != ':')
            fail(KVX_EINVAL, "%s: '%s' is not [IPV6]:PORT", what, s.c_str());
        *host = s.substr(1, rb - 1);
        *port = s.substr(rb + 2);
    } else {
        size_t c = s.rfind(':');
        if (c == std::string::npos || s.find(':') != c)
            fail(KVX_EINVAL, "%s: '%s' is not HOST:PORT", what, s.c_str());
        *host = s.substr(0, c);
        *port = s.substr(c + 1);
    }
    if (port->empty() || port->size() > 5 || port->find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(*port) > 65535)
        fail(KVX_EINVAL, "%s: port '%s' in '%s' is not 0..65535", what, port->c_str(), s.c_str());
}

}  // namespace

std::string Endpoint::str() const {
    char buf[INET6_ADDRSTRLEN] = "?";
    inet_ntop(family == 6 ? AF_INET6 : AF_INET, addr.data(), buf, sizeof buf);
    return family == 6 ? strfmt("[%s]:%u", buf, port) : strfmt("%s:%u", buf, port);
}

void check_hostport_syntax(const std::string &s, const char *what, bool allow_empty_host) {
    std::string host, port;
    split_hostport(s, what, &host, &port);
    if (host.empty() && !allow_empty_host) fail(KVX_EINVAL, "%s: '%s' has no host", what, s.c_str());
    if (host.find_first_of(" \t/[]") != std::string::npos)
        fail(KVX_EINVAL, "%s: host '%s' in '%s' is not an address or a name", what, host.c_str(), s.c_str());
}

sockaddr_storage parse_hostport(const std::string &s, const char *what, bool passive) {
    std::string host, port;
    split_hostport(s, what, &host, &port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    addrinfo *res = nullptr;
    int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0 || !res)
        fail(KVX_EINVAL, "%s: cannot resolve '%s': %s", what, host.c_str(), gai_strerror(rc));
    sockaddr_storage ss{};
    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return ss;
}

socklen_t sa_len(const sockaddr_storage &ss) {
    return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

Endpoint to_endpoint(const sockaddr_storage &ss) {
    Endpoint e;
    if (ss.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&ss);
        e.family = 6;
        memcpy(e.addr.data(), &a->sin6_addr, 16);
        e.port = ntohs(a->sin6_port);
    } else {
        const auto *a = reinterpret_cast<const sockaddr_in *>(&ss);
        e.family = 4;
        memcpy(e.addr.data(), &a->sin_addr, 4);
        e.port = ntohs(a->sin_port);
    }
    return e;
}

sockaddr_storage from_endpoint(const Endpoint &e, socklen_t *len) {
    sockaddr_storage ss{};
    if (e.family == 6) {
        auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
        a->sin6_family = AF_INET6;
        memcpy(&a->sin6_addr, e.addr.data(), 16);
        a->sin6_port = htons(e.port);
        *len = sizeof(sockaddr_in6);
    } else {
        auto *a = reinterpret_cast<sockaddr_in *>(&ss);
        a->sin_family = AF_INET;
        memcpy(&a->sin_addr, e.addr.data(), 4);
        a->sin_port = htons(e.port);
        *len = sizeof(sockaddr_in);
    }
    return ss;
}

std::vector<Endpoint> local_ipv4_endpoints(uint16_t port) {
    std::vector<Endpoint> out;
    ifaddrs *ifs = nullptr;
    if (getifaddrs(&ifs) != 0) return out;
    for (ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        sockaddr_storage ss{};
        memcpy(&ss, i->ifa_addr, sizeof(sockaddr_in));
        Endpoint e = to_endpoint(ss);
        e.port = port;
        bool dup = false;
        for (const auto &o : out) dup |= o == e;
        if (!dup) out.push_back(e);
    }
    freeifaddrs(ifs);
    return out;
}

std::vector<IfAddr> interface_addrs() {
    std::vector<IfAddr> out;
    ifaddrs *ifs = nullptr;
    if (getifaddrs(&ifs) != 0) return out;
    for (ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_netmask || !i->ifa_name) continue;
        const int fam = i->ifa_addr->sa_family;
        if ((fam != AF_INET && fam != AF_INET6) || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        sockaddr_storage ss{}, mask{};
        const size_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        memcpy(&ss, i->ifa_addr, len);
        memcpy(&mask, i->ifa_netmask, len);
        mask.ss_family = static_cast<sa_family_t>(fam);
        if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_addr)) continue;
        IfAddr a;
        a.name = i->ifa_name;
        a.addr = to_endpoint(ss);
        a.addr.port = 0;
        const Endpoint m = to_endpoint(mask);
        for (size_t b = 0; b < (fam == AF_INET ? 4u : 16u); b++) a.prefix += static_cast<uint8_t>(__builtin_popcount(m.addr[b]));
        a.running = (i->ifa_flags & IFF_RUNNING) != 0;
        out.push_back(std::move(a));
    }
    freeifaddrs(ifs);
    return out;
}

bool same_subnet(const Endpoint &a, const Endpoint &b, unsigned prefix) {
    if (a.family != b.family || prefix == 0) return false;
    prefix = std::min(prefix, a.family == 4 ? 32u : 128u);
    for (unsigned i = 0; i < prefix; i++) {
        const unsigned byte = i / 8, bit = 7 - i % 8;
        if (((a.addr[byte] >> bit) & 1) != ((b.addr[byte] >> bit) & 1)) return false;
    }
    return true;
}

void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void abort_close(Fd &fd) {
    if (!fd) return;
    const linger lg{1, 0};  // on, 0 s: close() sends RST and drops the send queue
    setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    fd = Fd();
}

uint32_t reset_travel_us(int fd) {
    tcp_info ti{};
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return 0;
    return ti.tcpi_rtt + 4 * ti.tcpi_rttvar;
}

int pending_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
}

void set_nonblocking(int fd, const char *what) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
        fail(KVX_EBACKEND, "cannot make the %s non-blocking: %s", what, strerror(errno));
}

size_t advance_iov(iovec *&iov, size_t cnt, size_t n) {
    while (cnt > 0 && n >= iov->iov_len) {
        n -= iov->iov_len;
        iov++;
        cnt--;
    }
    if (cnt > 0) {
        iov->iov_base = static_cast<uint8_t *>(iov->iov_base) + n;
        iov->iov_len -= n;
    }
    return cnt;
}

int ms_left(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

int Deadline::slice_ms() const {
    if (cancelled()) return 0;
    const int ms = ms_left(at_);
    return cancel_ != nullptr ? std::min(ms, kCancelSliceMs) : ms;
}

int wait_fd(int fd, short events, const Deadline &deadline) {
    for (;;) {
        if (deadline.cancelled()) return -ECANCELED;
        int ms = deadline.slice_ms();
        if (ms == 0) return -ETIMEDOUT;
        pollfd p{fd, events, 0};
        int rc = ::poll(&p, 1, ms);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) return -errno;
    }
}

int connect_by(const Endpoint &e, const Deadline &deadline, Fd *out, const Endpoint *from) {
    socklen_t len = 0;
    sockaddr_storage ss = from_endpoint(e, &len);
    Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return -errno;
    if (from) {
        socklen_t flen = 0;
        sockaddr_storage src = from_endpoint(*from, &flen);
        if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&src), flen) != 0) return -errno;
    }
    if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&ss), len) != 0) {
        if (errno != EINPROGRESS) return -errno;
        int rc = wait_fd(fd.get(), POLLOUT, deadline);
        if (rc != 0) return rc;
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el) != 0) return -errno;
        if (err != 0) return -err;
    }
    *out = std::move(fd);
    return 0;
}

int read_full_by(int fd, void *buf, size_t n, const Deadline &deadline) {
    auto *p = static_cast<uint8_t *>(buf);
    while (n > 0) {
        ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= static_cast<size_t>(r);
        } else if (r == 0) {
            return -ECONNRESET;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc != 0) return rc;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

int write_full_by(int fd, const void *buf, size_t n, const Deadline &deadline) {
    const auto *p = static_cast<const uint8_t *>(buf);
    while (n > 0) {
        ssize_t r = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r >= 0) {
            p += r;
            n -= static_cast<size_t>(r);
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc != 0) return rc;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

bool accept_exhausted(int err) { return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM; }

}  // namespace kvx::net
