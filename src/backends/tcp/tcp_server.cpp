// Target side of the tcp backend: bytes land in the region from here, on the
// library's own threads, with no call from the application.
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/handshake.h"

namespace kvx::tcp {

namespace {

constexpr size_t kMaxHandshaking = 64;  // unauthenticated connections at once

// readv until every iovec is full; 0 or -errno (-ECONNRESET on EOF).
int readv_full(int fd, iovec *iov, int cnt) {
    while (cnt > 0) {
        ssize_t r = ::readv(fd, iov, cnt);
        if (r == 0) return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        cnt = static_cast<int>(net::advance_iov(iov, static_cast<size_t>(cnt), static_cast<size_t>(r)));
    }
    return 0;
}

}  // namespace

TcpServer::TcpServer(const BackendContext &ctx) : ctx_(ctx) {
    const std::string listen = ctx.options->str("tcp.listen");
    const std::string advertise = ctx.options->str("tcp.advertise");
    sockaddr_storage ss = net::parse_hostport(listen, "option tcp.listen", true);
    listen_fd_ = net::Fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
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

    if (!advertise.empty()) {
        size_t start = 0;
        while (start <= advertise.size()) {
            size_t comma = advertise.find(',', start);
            std::string item = advertise.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
            net::Endpoint e = net::to_endpoint(net::parse_hostport(item, "option tcp.advertise", false));
            if (e.port == 0) e.port = me.port;
            if (advertised_.size() == wire::kMaxEndpoints)
                fail(KVX_EINVAL, "option tcp.advertise: more than %zu addresses", wire::kMaxEndpoints);
            advertised_.push_back(e);
            if (comma == std::string::npos) break;
            start = comma + 1;
        }
    } else {
        bool wildcard = true;
        for (size_t i = 0; i < (me.family == 6 ? 16u : 4u); i++) wildcard &= me.addr[i] == 0;
        if (wildcard) {
            advertised_ = net::local_ipv4_endpoints(me.port);
            if (advertised_.size() > wire::kMaxEndpoints - 1) advertised_.resize(wire::kMaxEndpoints - 1);
            net::Endpoint lo;
            lo.family = me.family;
            if (me.family == 6) lo.addr[15] = 1;
            else lo.addr = {127, 0, 0, 1};
            lo.port = me.port;
            advertised_.push_back(lo);
        } else {
            advertised_.push_back(me);
        }
    }
    if (::pipe2(wake_, O_CLOEXEC) != 0) fail(KVX_EBACKEND, "tcp: pipe(): %s", strerror(errno));
    KVX_LOG(info, "tcp: listening on %s", me.str().c_str());
    acceptor_ = std::thread([this] { accept_loop(); });
}

TcpServer::~TcpServer() {
    shutdown();
    if (wake_[0] >= 0) ::close(wake_[0]);
    if (wake_[1] >= 0) ::close(wake_[1]);
}

void TcpServer::shutdown() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) return;
        stopping_ = true;
    }
    char b = 1;
    (void)!::write(wake_[1], &b, 1);
    if (acceptor_.joinable()) acceptor_.join();
    reap(true);
    listen_fd_ = net::Fd();
}

void TcpServer::reap(bool all) {
    std::list<std::unique_ptr<Conn>> dead;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = conns_.begin(); it != conns_.end();) {
            if (all || (*it)->finished.load()) {
                dead.push_back(std::move(*it));
                it = conns_.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto &c : dead) {
        ::shutdown(c->fd.get(), SHUT_RDWR);  // wakes a blocked recv
        c->thread.join();
    }
}

void TcpServer::accept_loop() {
    pollfd p[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
    for (;;) {
        int rc = ::poll(p, 2, 1000);
        if (rc < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        reap(false);
        if (rc <= 0 || !(p[0].revents & POLLIN)) continue;
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        auto c = std::make_unique<Conn>();
        c->fd = net::Fd(fd);
        Conn *raw = c.get();
        std::lock_guard<std::mutex> lk(mu_);
        if (stopping_) break;
        if (handshaking_.load() >= kMaxHandshaking) {
            KVX_LOG(warn, "tcp: %zu connections are authenticating, refusing one more", kMaxHandshaking);
            continue;
        }
        handshaking_++;
        conns_.push_back(std::move(c));
        raw->thread = std::thread([this, raw] {
            serve(raw);
            raw->finished.store(true);
        });
    }
}

namespace {

// Reads one handshake message (header, then the rest its kind needs).
int read_message(int fd, handshake::Bytes &buf, Clock::time_point deadline) {
    int rc = net::read_full_by(fd, buf.data(), handshake::kHeaderLen, deadline);
    if (rc != 0) return rc;
    size_t len = handshake::message_len(buf.data());
    return net::read_full_by(fd, buf.data() + handshake::kHeaderLen, len - handshake::kHeaderLen, deadline);
}

}  // namespace

// HELLO -> CHALLENGE, AUTH -> ACCEPT, or a REFUSE at either step.
bool TcpServer::handshake(int fd) {
    auto deadline = Clock::now() + std::chrono::milliseconds(ctx_.options->uint("connect_timeout_ms"));
    handshake::Bytes in, out;
    handshake::Challenge ch;
    int status = 0;
    try {
        if (read_message(fd, in, deadline) != 0) return false;
        handshake::Message m = handshake::decode(in.data(), in.size());
        status = m.kind == handshake::Kind::hello ? handshake::on_hello(ctx_.identity, m.hello) : KVX_EAUTH;
        if (status == 0) {
            uint32_t one_per_connection = 0;
            ch = handshake::new_challenge(&one_per_connection);
            if (net::write_full_by(fd, out.data(), handshake::encode(ch, out.data()), deadline) != 0) return false;
            if (read_message(fd, in, deadline) != 0) return false;
            m = handshake::decode(in.data(), in.size());
            handshake::Accept acc;
            status = m.kind == handshake::Kind::auth ? handshake::verify(ctx_.identity, ch, m.auth, &acc, "a tcp connection")
                                                     : KVX_EAUTH;
            if (status == 0) return net::write_full_by(fd, out.data(), handshake::encode(acc, out.data()), deadline) == 0;
        }
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: bad handshake message: %s", e.what());
        status = handshake::failure_code(e.code());
    }
    net::write_full_by(fd, out.data(), handshake::encode(handshake::Refuse{status}, out.data()), deadline);
    return false;
}

void TcpServer::serve(Conn *c) {
    const int fd = c->fd.get();
    bool ok = handshake(fd);
    handshaking_--;
    if (!ok) return;
    net::set_blocking(fd, true);
    net::set_nodelay(fd);
    const uint64_t block_len = ctx_.region.block_len;
    const uint64_t region_len = ctx_.region.size();
    // header and segment table in one buffer; every frame has at least one
    // segment, so header + first segment is always safe to read at once
    std::vector<uint8_t> head(kFrameHeaderLen + kFrameMaxSegs * kSegLen);
    uint8_t *const segbuf = head.data() + kFrameHeaderLen;
    std::vector<iovec> iov(kFrameMaxSegs);
    for (;;) {
        if (net::read_full(fd, head.data(), kFrameHeaderLen + kSegLen) != 0) break;
        try {
            FrameHeader h = decode_frame_header(head.data(), block_len);
            if (h.nseg > 1 && net::read_full(fd, segbuf + kSegLen, (h.nseg - 1) * kSegLen) != 0) break;
            std::vector<Segment> segs = decode_segments(segbuf, h, block_len, region_len);
            for (size_t i = 0; i < segs.size(); i++)
                iov[i] = iovec{ctx_.region.base + segs[i].offset, segs[i].len};
            if (readv_full(fd, iov.data(), static_cast<int>(segs.size())) != 0) break;
            if (h.flags & kFlagAck) {
                uint8_t ack[kAckLen];
                encode_ack(Ack{0, h.seq}, ack);
                if (net::write_full(fd, ack, sizeof ack) != 0) break;
            }
        } catch (const Error &e) {
            KVX_LOG(warn, "tcp: closing a connection after a bad frame: %s", e.what());
            break;
        }
    }
    ::shutdown(fd, SHUT_RDWR);
}

}  // namespace kvx::tcp
