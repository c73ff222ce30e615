// Target side of the tcp backend: the listener and the admission of accepted
// connections (TcpConn does the rest), all on the transport's event loop.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::tcp {

namespace {

constexpr size_t kMaxHandshaking = 64;  // unauthenticated connections at once
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

}  // namespace

TcpServer::TcpServer(const BackendContext &ctx) : ctx_(ctx) {
    const std::string listen = ctx.options->str("tcp.listen");
    sockaddr_storage ss = net::parse_hostport(listen, "option tcp.listen", true);
    listen_fd_ = net::Fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!listen_fd_) fail(KVX_EBACKEND, "tcp: socket(): %s", strerror(errno));
    int one = 1;
    setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), net::sa_len(ss)) != 0)
        fail(KVX_EBACKEND, "tcp: cannot listen on '%s': %s", listen.c_str(), strerror(errno));
    if (::listen(listen_fd_.get(), 128) != 0) fail(KVX_EBACKEND, "tcp: listen(): %s", strerror(errno));
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
        listen_fd_ = net::Fd();
    });
}

void TcpServer::on_event(int, uint32_t) {
    for (int i = 0; i < kAcceptBurst; i++) {
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            admit(net::Fd(fd));
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
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

// Admission of a new connection. The seam for a policy against hostile
// networks: handshaking_ counts the unauthenticated connections, and each
// gets a deadline after which TcpConn closes it.
void TcpServer::admit(net::Fd fd) {
    if (handshaking_ >= kMaxHandshaking) {
        KVX_LOG(warn, "tcp: %zu connections are authenticating, refusing one more", kMaxHandshaking);
        return;
    }
    auto c = std::make_unique<TcpConn>(*this, std::move(fd));
    if (!c->start(Clock::now() + std::chrono::milliseconds(ctx_.options->uint("connect_timeout_ms")))) return;
    handshaking_++;
    TcpConn *raw = c.get();
    conns_.emplace(raw, std::move(c));
}

void TcpServer::authenticated() { handshaking_--; }

void TcpServer::close(TcpConn &c) {
    if (!c.authenticated()) handshaking_--;
    c.stop();
    conns_.erase(&c);
}

}  // namespace kvx::tcp
