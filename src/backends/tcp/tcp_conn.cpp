// One accepted connection of the tcp target, driven by readiness events on
// the loop thread: bytes land in the region from here, with no call from the
// application.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::tcp {

namespace {

constexpr int kTurnReads = 64;           // reads per readiness event, then other sources get a turn
constexpr size_t kMaxUnsent = 64 << 10;  // acks the peer does not take: stop reading beyond this
constexpr size_t kHeadLen = kFrameHeaderLen + kSegLen;  // every frame has a segment: always safe to read

// A read's outcome: the byte count; 0 when nothing is there now (the loop
// calls again); -1 when the connection is closed or failed.
ssize_t outcome(ssize_t r) {
    if (r > 0) return r;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    return -1;
}

// The one call that writes payload into the region. Named in tests/tsan.supp:
// the application orders its reads of the region through its own control plane.
ssize_t readv_into_region(int fd, const iovec *iov, size_t cnt) {
    return outcome(::readv(fd, iov, static_cast<int>(cnt)));
}

template <class M>
void append(std::vector<uint8_t> &out, const M &m) {
    handshake::Bytes b;
    out.insert(out.end(), b.data(), b.data() + handshake::encode(m, b.data()));
}

}  // namespace

TcpConn::TcpConn(TcpServer &server, net::Fd fd, const SourceAddr &src)
    : server_(server), ctx_(server.ctx()), fd_(std::move(fd)), src_(src), need_(handshake::kHeaderLen) {}

bool TcpConn::start(Clock::time_point deadline) {
    events_ = EPOLLIN;
    token_ = ctx_.loop->attach(fd_.get(), events_, this, 0);
    if (token_ == 0) return false;
    deadline_ = ctx_.loop->add_timer(deadline, this, 0);
    return true;
}

void TcpConn::stop() {
    ctx_.loop->detach(token_);
    ctx_.loop->cancel_timer(deadline_);
    token_ = deadline_ = 0;
}

void TcpConn::on_timer(int) {
    deadline_ = 0;
    KVX_LOG(debug, "tcp: closing a connection that did not authenticate within %llu ms",
            (unsigned long long)ctx_.options->uint("tcp.handshake_timeout_ms"));
    server_.close(*this);
}

void TcpConn::on_event(int, uint32_t events) {
    Next n = Next::wait;
    if (state_ != State::refused && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) n = read_turn();
    else if (events & (EPOLLERR | EPOLLHUP)) n = Next::close;
    // Acks of the frames read before a failure still go out, if the socket takes them.
    bool ok = flush() && n != Next::close && !(state_ == State::refused && out_.empty());
    if (!ok) return server_.close(*this);  // frees this
    update_interest();
}

TcpConn::Next TcpConn::read_turn() {
    for (int i = 0; i < kTurnReads; i++) {
        Next n = Next::wait;
        switch (state_) {
        case State::hello:
        case State::auth: n = read_handshake(); break;
        case State::frame_head:
        case State::frame_segs: n = read_head(); break;
        case State::payload: n = read_payload(); break;
        case State::refused: break;
        }
        if (n != Next::more || out_.size() - out_at_ >= kMaxUnsent) return n;
    }
    return Next::wait;
}

TcpConn::Next TcpConn::read_handshake() {
    ssize_t r = outcome(::recv(fd_.get(), msg_.data() + have_, need_ - have_, 0));
    if (r <= 0) return r < 0 ? Next::close : Next::wait;
    have_ += static_cast<size_t>(r);
    return have_ < need_ ? Next::wait : answer();
}

// A whole header (then: read the rest its kind needs) or message is in msg_.
// HELLO -> CHALLENGE, AUTH -> ACCEPT, or a REFUSE at either step.
TcpConn::Next TcpConn::answer() {
    int status = KVX_EAUTH;
    try {
        if (need_ == handshake::kHeaderLen) {
            need_ = handshake::message_len(msg_.data());
            return Next::more;
        }
        handshake::Message m = handshake::decode(msg_.data(), have_);
        have_ = 0;
        need_ = handshake::kHeaderLen;
        if (state_ == State::hello) {
            status = m.kind == handshake::Kind::hello ? handshake::on_hello(ctx_.identity, m.hello) : KVX_EAUTH;
            if (status == 0) {
                uint32_t one_per_connection = 0;
                challenge_ = handshake::new_challenge(&one_per_connection);
                append(out_, challenge_);
                state_ = State::auth;
                return Next::more;
            }
        } else {
            handshake::Accept acc;
            status = m.kind == handshake::Kind::auth
                         ? handshake::verify(ctx_.identity, challenge_, m.auth, &acc, "a tcp connection")
                         : KVX_EAUTH;
            if (status == 0) {
                if (!on_authenticated()) return Next::close;
                append(out_, acc);
                return Next::more;
            }
        }
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: bad handshake message: %s", e.what());
        status = handshake::failure_code(e.code());
    }
    append(out_, handshake::Refuse{status});
    state_ = State::refused;  // closed once the refusal is out, or at the deadline
    return Next::wait;
}

// false: the transport holds tcp.max_connections already; close without an ACCEPT.
bool TcpConn::on_authenticated() {
    if (!server_.authenticated(*this)) {
        KVX_LOG(warn, "tcp: closing an authenticated connection: tcp.max_connections are open");
        return false;
    }
    ctx_.loop->cancel_timer(deadline_);
    deadline_ = 0;
    net::set_nodelay(fd_.get());
    head_.resize(kHeadLen);
    have_ = 0;
    need_ = kHeadLen;
    state_ = State::frame_head;
    return true;
}

// Header and first segment, then the rest of the segment table; nothing of
// the payload is read before all of it is validated.
TcpConn::Next TcpConn::read_head() {
    ssize_t r = outcome(::recv(fd_.get(), head_.data() + have_, need_ - have_, 0));
    if (r <= 0) return r < 0 ? Next::close : Next::wait;
    have_ += static_cast<size_t>(r);
    if (have_ < need_) return Next::wait;
    try {
        if (state_ == State::frame_head) {
            frame_ = decode_frame_header(head_.data(), ctx_.region.block_len);
            if (frame_.nseg > 1) {
                need_ = kFrameHeaderLen + frame_.nseg * kSegLen;
                head_.resize(need_);
                state_ = State::frame_segs;
                return Next::more;
            }
        }
        start_payload();
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: closing a connection after a bad frame: %s", e.what());
        return Next::close;
    }
    return Next::more;
}

void TcpConn::start_payload() {
    const Region &rg = ctx_.region;
    std::vector<Segment> segs = decode_segments(head_.data() + kFrameHeaderLen, frame_, rg.block_len, rg.size());
    iov_.resize(segs.size());
    for (size_t i = 0; i < segs.size(); i++) iov_[i] = iovec{rg.base + segs[i].offset, segs[i].len};
    iov_at_ = 0;
    state_ = State::payload;
}

TcpConn::Next TcpConn::read_payload() {
    iovec *iov = iov_.data() + iov_at_;
    size_t left = iov_.size() - iov_at_;
    ssize_t r = readv_into_region(fd_.get(), iov, left);
    if (r <= 0) return r < 0 ? Next::close : Next::wait;
    left = net::advance_iov(iov, left, static_cast<size_t>(r));
    iov_at_ = static_cast<size_t>(iov - iov_.data());
    if (left > 0) return Next::wait;  // a short read: the socket is drained
    if (frame_.flags & kFlagAck) {
        uint8_t ack[kAckLen];
        encode_ack(Ack{0, frame_.seq}, ack);
        out_.insert(out_.end(), ack, ack + kAckLen);
    }
    have_ = 0;
    need_ = kHeadLen;
    state_ = State::frame_head;
    return Next::more;
}

// Sends what the socket takes now; false when the connection failed.
bool TcpConn::flush() {
    while (out_at_ < out_.size()) {
        ssize_t r = ::send(fd_.get(), out_.data() + out_at_, out_.size() - out_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) out_at_ += static_cast<size_t>(r);
        else if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        else if (errno != EINTR) return false;
    }
    out_.clear();
    out_at_ = 0;
    return true;
}

// Read unless refused or the peer does not take its acks; wait to write
// only while something is unsent.
void TcpConn::update_interest() {
    const size_t unsent = out_.size() - out_at_;
    const uint32_t want = (state_ != State::refused && unsent < kMaxUnsent ? uint32_t{EPOLLIN} : 0) |
                         (unsent ? uint32_t{EPOLLOUT} : 0);
    if (want != events_) ctx_.loop->modify(token_, events_ = want);
}

}  // namespace kvx::tcp
