// Target side of the tcp backend: the listener and the admission of accepted
// connections (TcpConn does the rest), all on the transport's event loop.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::tcp {

namespace {

constexpr int kBacklog = 4096;          // a burst of connects waits here, not in SYN retransmits
constexpr int kAcceptBurst = 64;        // accepts per readiness event, then other sources get a turn
constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // after running out of descriptors

// What the metadata advertises: tcp.advertise (PORT 0 = ours), else for a
// wildcard listener the host's IPv4 addresses and loopback, else the listener.
std::vector<net::Endpoint> advertise_list(const std::string &advertise, const net::Endpoint &me) {
    std::vector<net::Endpoint> out;
    if (!advertise.empty()) {
        size_t start = 0;
        while (start <= advertise.size()) {
            size_t comma = advertise.find(',', start);
            std::string item = advertise.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            net::Endpoint e = net::to_endpoint(net::parse_hostport(item, "option tcp.advertise", false));
            if (e.port == 0) e.port = me.port;
            if (out.size() == wire::kMaxEndpoints)
                fail(KVX_EINVAL, "option tcp.advertise: more than %zu addresses", wire::kMaxEndpoints);
            out.push_back(e);
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
        return out;
    }
    bool wildcard = true;
    for (size_t i = 0; i < (me.family == 6 ? 16u : 4u); i++) wildcard &= me.addr[i] == 0;
    if (!wildcard) return {me};
    out = net::local_ipv4_endpoints(me.port);
    if (out.size() > wire::kMaxEndpoints - 1) out.resize(wire::kMaxEndpoints - 1);
    net::Endpoint lo;
    lo.family = me.family;
    if (me.family == 6) lo.addr[15] = 1;
    else lo.addr = {127, 0, 0, 1};
    lo.port = me.port;
    out.push_back(lo);
    return out;
}

SourceAddr source_of(const sockaddr_storage &ss) {
    SourceAddr a{};
    if (ss.ss_family == AF_INET6) {
        memcpy(a.data(), &reinterpret_cast<const sockaddr_in6 &>(ss).sin6_addr, 16);
    } else {
        a[10] = a[11] = 0xff;
        memcpy(a.data() + 12, &reinterpret_cast<const sockaddr_in &>(ss).sin_addr, 4);
    }
    return a;
}

}  // namespace

size_t SourceHash::operator()(const SourceAddr &a) const noexcept {
    uint64_t lo, hi;
    memcpy(&lo, a.data(), 8);
    memcpy(&hi, a.data() + 8, 8);
    return std::hash<uint64_t>()(lo * 0x9e3779b97f4a7c15ull ^ hi);
}

void set_liveness(int fd, uint64_t timeout_ms) {
    // Unacknowledged data: the kernel gives up after the user timeout. An
    // idle connection: the first probe goes out after idle_s of silence (half
    // the timeout, whole seconds), then one a second, and with a user timeout
    // set the kernel gives up at the first one past it (the count is then
    // unused; it is set to match). Before either, the watchdog has failed the
    // peer's transfers (stall_grace_ms).
    const uint64_t user_ms = kernel_give_up_ms(timeout_ms);
    const uint64_t idle_s = std::max<uint64_t>(1, timeout_ms / 2000);
    const int one = 1, idle = static_cast<int>(std::min<uint64_t>(idle_s, 32767)), intvl = 1;
    const int cnt = static_cast<int>(std::clamp<uint64_t>(user_ms / 1000 - std::min(idle_s, user_ms / 1000), 1, 127));
    const unsigned user = static_cast<unsigned>(std::min<uint64_t>(user_ms, INT_MAX));  // the kernel reads an int
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof user);
}

TcpServer::TcpServer(const BackendContext &ctx)
    : ctx_(ctx),
      responder_(ctx.identity, data_path_options(*ctx.options), "tcp"),
      max_handshakes_(ctx.options->uint("tcp.max_handshakes")),
      max_per_source_(ctx.options->uint("tcp.max_handshakes_per_source")),
      max_connections_(ctx.options->uint("tcp.max_connections")),
      handshake_timeout_(ctx.options->uint("tcp.handshake_timeout_ms")) {
    const std::string listen = ctx.options->str("tcp.listen");
    sockaddr_storage ss = net::parse_hostport(listen, "option tcp.listen", true);
    listen_fd_ = net::Fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!listen_fd_) fail(KVX_EBACKEND, "tcp: socket(): %s", strerror(errno));
    int one = 1;
    setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), net::sa_len(ss)) != 0)
        fail(KVX_EBACKEND, "tcp: cannot listen on '%s': %s", listen.c_str(), strerror(errno));
    if (::listen(listen_fd_.get(), kBacklog) != 0) fail(KVX_EBACKEND, "tcp: listen(): %s", strerror(errno));
    sockaddr_storage bound{};
    socklen_t bl = sizeof bound;
    getsockname(listen_fd_.get(), reinterpret_cast<sockaddr *>(&bound), &bl);
    net::Endpoint me = net::to_endpoint(bound);
    advertised_ = advertise_list(ctx.options->str("tcp.advertise"), me);
    listen_tok_ = ctx_.loop->attach(listen_fd_.get(), EPOLLIN, this, 0);
    if (listen_tok_ == 0) fail(KVX_EBACKEND, "tcp: the event loop is stopped");
    KVX_LOG(info, "tcp: listening on %s", me.str().c_str());
}

TcpServer::~TcpServer() { shutdown(); }

void TcpServer::shutdown() {
    ctx_.loop->call([this] {
        if (stopped_) return;
        stopped_ = true;
        ctx_.loop->detach(listen_tok_);
        ctx_.loop->cancel_timer(resume_timer_);
        for (auto &[raw, c] : conns_) raw->stop();
        conns_.clear();
        handshaking_.clear();
        per_source_.clear();
        streams_.clear();
        bars_ = 0;
        listen_fd_ = net::Fd();
    });
}

void TcpServer::on_event(int, uint32_t) {
    for (int i = 0; i < kAcceptBurst; i++) {
        sockaddr_storage ss{};
        socklen_t sl = sizeof ss;
        int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            admit(net::Fd(fd), source_of(ss));
        } else if (net::accept_exhausted(errno)) {
            return pause_accepting();
        } else if (errno != ECONNABORTED && errno != EINTR) {
            return;  // EAGAIN: none left
        }
    }
}

// The level-triggered listener would wake the loop without end while no
// descriptor is free: stop listening for a while instead.
void TcpServer::pause_accepting() {
    KVX_LOG(warn, "tcp: cannot accept: %s; pausing for %lld ms", strerror(errno), (long long)kAcceptPause.count());
    ctx_.loop->modify(listen_tok_, 0);
    resume_timer_ = ctx_.loop->add_timer(Clock::now() + kAcceptPause, this, 0);
}

void TcpServer::on_timer(int) {
    resume_timer_ = 0;
    ctx_.loop->modify(listen_tok_, EPOLLIN);
}

// Admission of a new connection: refused when its source already has its
// share of handshakes or the authenticated connections are at their bound;
// when every handshake slot is taken, the oldest handshake makes room.
void TcpServer::admit(net::Fd fd, const SourceAddr &src) {
    auto known = per_source_.find(src);
    if ((known != per_source_.end() && known->second >= max_per_source_) || authenticated_ >= max_connections_) {
        if (refused_++ % 1024 == 0)
            KVX_LOG(warn, "tcp: refused %llu connections (a source over %zu handshakes, or %zu connections open)",
                    (unsigned long long)refused_, max_per_source_, max_connections_);
        return;
    }
    if (handshaking_.size() >= max_handshakes_) {
        if (shed_++ % 1024 == 0)
            KVX_LOG(warn, "tcp: %zu connections are authenticating: shed the oldest (%llu so far)", max_handshakes_,
                    (unsigned long long)shed_);
        close(*handshaking_.front());
    }
    auto c = std::make_unique<TcpConn>(*this, std::move(fd), src);
    if (!c->start(Clock::now() + handshake_timeout_)) return;
    per_source_[src]++;  // close() above may have rehashed the map
    c->queued = handshaking_.insert(handshaking_.end(), c.get());
    TcpConn *raw = c.get();
    conns_.emplace(raw, std::move(c));
}

void TcpServer::forget_handshake(TcpConn &c) {
    handshaking_.erase(c.queued);
    auto it = per_source_.find(c.source());
    if (it != per_source_.end() && --it->second == 0) per_source_.erase(it);
}

bool TcpServer::authenticated(TcpConn &c) {
    if (authenticated_ >= max_connections_) return false;
    forget_handshake(c);
    authenticated_++;
    set_liveness(c.fd(), ctx_.options->uint("transfer_timeout_ms"));
    return true;
}

bool TcpServer::join(TcpConn &c, uint64_t session, uint32_t stream) {
    return streams_.emplace(std::make_pair(session, stream), &c).second;
}

bool TcpServer::fence(uint64_t session, uint32_t stream) {
    auto it = streams_.find({session, stream});
    if (it != streams_.end()) {
        if (!it->second) return true;  // barred already
        TcpConn &c = *it->second;
        KVX_LOG(info, "tcp: closing stream %u of a session at its initiator's word (it was taken out there): what it "
                      "holds unlanded is dropped", stream);
        close(c);
        return true;
    }
    size_t bars = 0;
    for (auto b = streams_.lower_bound({session, 0}); b != streams_.end() && b->first.first == session; ++b)
        bars += b->second == nullptr;
    if (bars >= kMaxFenced || bars_ >= kMaxBars) return false;
    streams_.emplace(std::make_pair(session, stream), nullptr);
    bars_++;
    return true;
}

void TcpServer::close(TcpConn &c) {
    if (c.session() != 0) {
        streams_.erase({c.session(), c.stream()});
        // The session's last stream: its bars go too.
        auto first = streams_.lower_bound({c.session(), 0}), b = first;
        bool live = false;
        size_t bars = 0;
        for (; b != streams_.end() && b->first.first == c.session(); ++b) {
            live |= b->second != nullptr;
            bars += b->second == nullptr;
        }
        if (!live) {
            streams_.erase(first, b);
            bars_ -= bars;
        }
    }
    if (c.authenticated()) authenticated_--;
    else forget_handshake(c);
    c.stop();
    conns_.erase(&c);
}

}  // namespace kvx::tcp
