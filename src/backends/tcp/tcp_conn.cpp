// One accepted connection of the tcp target, driven by readiness events on
// the loop thread: bytes land in the region from here, with no call from the
// application.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <ctime>

#include "backends/tcp/tcp.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::tcp {

namespace {

constexpr int kTurnReads = 64;           // reads per readiness event, then other sources get a turn
constexpr size_t kMaxUnsent = 64 << 10;  // acks the peer does not take: stop reading beyond this
constexpr size_t kHeadLen = kFrameHeaderLen + kSegLen;  // every frame has a segment or a control body: always safe to read
constexpr size_t kMaxHead = kFrameHeaderLen + kFrameMaxSegs * kSegLen;
constexpr size_t kSealedHeadLen = 4 + kHeadLen + kTagLen;  // the smallest head record
constexpr size_t kAheadMax = kTagLen + 4 + kMaxHead + kTagLen;  // a tag and the largest head record

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
// The same for bytes read aside first (stale_landing); also in tests/tsan.supp.
__attribute__((noinline)) void copy_into_region(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }
// Staged records land by the kernel: the plaintext goes into a pipe, then
// the pipe into the region (TcpConn::land_kernel). The readv is the landing;
// named in tests/tsan.supp as the other calls that write the region.
__attribute__((noinline)) ssize_t read_region_from_pipe(int fd, const iovec *region, size_t cnt) {
    return ::readv(fd, region, static_cast<int>(cnt));
}


// The kernel's receive timestamp (SO_TIMESTAMPNS) in a received message's
// control data, CLOCK_REALTIME ns; 0 when there is none.
int64_t rx_stamp_ns(msghdr &m) {
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
        timespec ts;
        memcpy(&ts, CMSG_DATA(c), sizeof ts);
        return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
    }
    return 0;
}

// At most kChunk bytes in at most kChunkIovs iovecs from the front of iov:
// one readv() lands no more than that (the late-write bound).
constexpr size_t kChunk = 256 << 10;
constexpr size_t kChunkIovs = 64;
constexpr size_t kLowat = 128 << 10;
// Payload that waited this long in the socket while the loop did not read it
// (the process was frozen or starved) is probed before it lands.
constexpr auto kStaleAfter = std::chrono::milliseconds(20);

// The front of iov, cut to one chunk (kChunk, kChunkIovs).
size_t take_chunk(const iovec *iov, size_t cnt, iovec *chunk) {
    size_t n = 0, bytes = 0;
    for (; n < cnt && n < kChunkIovs && bytes < kChunk; n++) {
        chunk[n] = iov[n];
        chunk[n].iov_len = std::min(iov[n].iov_len, kChunk - bytes);
        bytes += chunk[n].iov_len;
    }
    return n;
}

size_t chunk_len(const iovec *chunk, size_t cnt) {
    size_t bytes = 0;
    for (size_t i = 0; i < cnt; i++) bytes += chunk[i].iov_len;
    return bytes;
}

// "tcp 192.0.2.7:41234": where the connection comes from, for the handshake's log.
std::string peer_text(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "tcp ?";
    return "tcp " + net::to_endpoint(ss).str();
}

}  // namespace

TcpConn::TcpConn(TcpServer &server, net::Fd fd, const SourceAddr &src)
    : server_(server), ctx_(server.ctx()), fd_(std::move(fd)), src_(src), need_(handshake::kHeaderLen) {}

bool TcpConn::start(Clock::time_point deadline) {
    events_ = EPOLLIN;
    token_ = ctx_.loop->attach(fd_.get(), events_, this, 0);
    if (token_ == 0) return false;
    deadline_ = ctx_.loop->add_timer(deadline, this, kDeadline);
    return true;
}

void TcpConn::stop() {
    ctx_.loop->detach(token_);
    ctx_.loop->cancel_timer(deadline_);
    ctx_.loop->cancel_timer(probe_timer_);
    token_ = deadline_ = probe_timer_ = 0;
}

void TcpConn::on_timer(int tag) {
    if (tag == kProbe) return probe_over();
    deadline_ = 0;
    KVX_LOG(debug, "tcp: closing a connection that did not authenticate within %llu ms",
            (unsigned long long)ctx_.options->uint("tcp.handshake_timeout_ms"));
    server_.close(*this);
}

void TcpConn::on_event(int, uint32_t events) {
    // Probing, nothing is read; an error or hang-up (a reset) ends the probe
    // at once, as it would end the round trips it waits for.
    if (state_ == State::probe && (events & (EPOLLERR | EPOLLHUP))) return probe_over();
    Next n = Next::wait;
    try {
        if (state_ != State::refused && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) n = read_turn();
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: closing a connection: %s", e.what());
        n = Next::close;
    }
    if (state_ == State::refused && (events & (EPOLLERR | EPOLLHUP))) n = Next::close;
    // Acks of the frames read before a failure still go out, if the socket takes them.
    bool ok = flush() && n != Next::close && !(state_ == State::refused && out_.empty());
    if (!ok) return server_.close(*this);  // frees this
    update_interest();
}

TcpConn::Next TcpConn::read_turn() {
    for (int i = 0; i < kTurnReads || ahead() > 0; i++) {
        Next n = Next::wait;
        switch (state_) {
        case State::hello:
        case State::auth: n = read_handshake(); break;
        case State::frame_head:
        case State::frame_segs: n = read_head(); break;
        case State::payload: n = read_payload(); break;
        case State::payload_tag: n = read_tag(); break;
        case State::refused:
        case State::probe: break;
        }
        if (n != Next::more || (out_.size() - out_at_ >= kMaxUnsent && ahead() == 0)) return n;
    }
    // The turn ends with the socket maybe not drained. Mid-payload, the mark
    // must not ask for more than the frame still brings: one left from an
    // earlier, larger rest (drained()) would never be reached, the rest of
    // the frame would sit in the socket, and its ack with it.
    if (state_ == State::payload) wake_at(payload_left_);
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
    if (need_ == handshake::kHeaderLen) {
        try {
            need_ = handshake::message_len(msg_.data());
            if (need_ > have_) return Next::more;
        } catch (const Error &) {
            need_ = have_;  // the engine refuses it
        }
    }
    const handshake::Step st = server_.responder().on_message(session_, msg_.data(), have_, peer_text(fd_.get()).c_str());
    have_ = 0;
    need_ = handshake::kHeaderLen;
    if (st.outcome == handshake::Step::Outcome::accepted && !on_authenticated(st)) return Next::close;
    out_.insert(out_.end(), st.reply.data(), st.reply.data() + st.reply_len);  // the ACCEPT travels in clear
    switch (st.outcome) {
    case handshake::Step::Outcome::challenged: state_ = State::auth; return Next::more;
    case handshake::Step::Outcome::accepted: return Next::more;
    case handshake::Step::Outcome::refused: break;
    }
    state_ = State::refused;  // closed once the refusal is out, or at the deadline
    return Next::wait;
}

// false: the transport holds tcp.max_connections already; close without an ACCEPT.
bool TcpConn::on_authenticated(const handshake::Step &accepted) {
    // Keys first: what may throw (OpenSSL) does so while the connection still
    // counts as handshaking, so a refusal leaves the server's books right.
    if (accepted.accept.flags & kFlagAead) {
        handshake::Keys k = server_.responder().keys(accepted);
        const AeadImpl impl = aead_impl(*ctx_.options);
        rx_ = std::make_unique<Aead>(k.to_target, false, impl);
        tx_ = std::make_unique<Aead>(k.to_initiator, true, impl);
        plain_.resize(kMaxHead);
        staged_ = (accepted.accept.flags & kFlagAeadRecords) != 0;
    }
    fence_ = (accepted.accept.flags & kFlagFence) != 0;
    if (!server_.authenticated(*this)) {
        KVX_LOG(warn, "tcp: closing an authenticated connection: tcp.max_connections are open");
        return false;
    }
    ctx_.loop->cancel_timer(deadline_);
    deadline_ = 0;
    net::set_nodelay(fd_.get());
    const int on = 1;  // receive timestamps: how long payload waited (read_payload)
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
    need_ = rx_ ? kSealedHeadLen : kHeadLen;
    head_.resize(need_);
    have_ = 0;
    ahead_.resize(kAheadMax);
    state_ = State::frame_head;
    return true;
}

// Sealed mode, a whole head record in head_: its plaintext, authenticated.
// Throws Error(KVX_EAUTH) for a record that is not.
const uint8_t *TcpConn::open_head() {
    const size_t len = need_ - 4 - kTagLen;
    uint8_t aad[5] = {kRecordHead};
    memcpy(aad + 1, head_.data(), 4);
    if (!rx_->open(aad, sizeof aad, head_.data() + 4, len, plain_.data()))
        fail(KVX_EAUTH, "frame head record fails authentication (forged, replayed or reordered)");
    frame_ = decode_frame_header(plain_.data(), ctx_.region.block_len, fence_);
    const size_t body = is_control(frame_) ? kControlLen : frame_.nseg * kSegLen;
    if (kFrameHeaderLen + body != len) fail(KVX_EINVAL, "frame: head record length mismatch");
    return plain_.data() + kFrameHeaderLen;
}

// Header and first segment, then the rest of the segment table; nothing of
// the payload is read before all of it is validated. Sealed: the head is one
// record, opened only once whole.
TcpConn::Next TcpConn::read_head() {
    ssize_t r = read_small(head_.data() + have_, need_ - have_);
    if (r <= 0) return r < 0 ? Next::close : Next::wait;
    have_ += static_cast<size_t>(r);
    if (have_ < need_) return Next::wait;
    try {
        if (state_ == State::frame_head && rx_) {
            const size_t len = get_le(head_.data(), 4);
            if (len < kHeadLen || len > kMaxHead || (len - kFrameHeaderLen) % kSegLen != 0)
                fail(KVX_EINVAL, "frame: head record of %zu bytes", len);
            if (len > kHeadLen) {
                need_ = 4 + len + kTagLen;
                head_.resize(need_);
                state_ = State::frame_segs;
                return Next::more;
            }
        } else if (state_ == State::frame_head) {
            frame_ = decode_frame_header(head_.data(), ctx_.region.block_len, fence_);
            if (frame_.nseg > 1) {
                need_ = kFrameHeaderLen + frame_.nseg * kSegLen;
                head_.resize(need_);
                state_ = State::frame_segs;
                return Next::more;
            }
        }
        const uint8_t *rest = rx_ ? open_head() : head_.data() + kFrameHeaderLen;
        if (is_control(frame_)) return control(rest);
        // With fencing agreed a stream joins first: one that could not be
        // fenced must not carry anything.
        if (fence_ && joined_ == 0) fail(KVX_EINVAL, "frame: a WRITE before the stream's JOIN");
        start_payload(rest);
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: closing a connection after a bad frame: %s", e.what());
        return Next::close;
    }
    return Next::more;
}

// A control frame (kFlagFence): JOIN names this stream; FENCE closes another
// stream of its session before anything after it on this one lands. Both
// read on the loop thread, which lands every stream's bytes: the stream
// fenced is between two reads, and nothing of it lands from here on.
// Throws Error(KVX_EINVAL) for one that breaks the rules (read_head closes).
TcpConn::Next TcpConn::control(const uint8_t *body) {
    static_assert(kFrameHeaderLen + kControlLen == kHeadLen, "a control frame is the smallest head");
    const Control c = decode_control(frame_, body);
    if (c.type == kFrameNop) {
        if (joined_ == 0 || c.session != joined_) fail(KVX_EINVAL, "control frame: NOP for a session this stream did not join");
    } else if (c.type == kFrameJoin) {
        if (joined_ != 0) fail(KVX_EINVAL, "control frame: a second JOIN on one stream");
        if (!server_.join(*this, c.session, c.stream))
            fail(KVX_EINVAL, "control frame: JOIN as stream %u, which its session has open or fenced", c.stream);
        joined_ = c.session;
        stream_ = c.stream;
    } else {
        if (joined_ == 0 || c.session != joined_)
            fail(KVX_EINVAL, "control frame: FENCE for a session this stream did not join");
        if (c.stream == stream_) fail(KVX_EINVAL, "control frame: FENCE of the stream it came on");
        if (!server_.fence(joined_, c.stream))
            fail(KVX_EINVAL, "control frame: FENCE of stream %u past %zu streams fenced before joining", c.stream,
                 TcpServer::kMaxFenced);
    }
    return next_head();
}

void TcpConn::start_payload(const uint8_t *seg_table) {
    const Region &rg = ctx_.region;
    std::vector<Segment> segs = decode_segments(seg_table, frame_, rg.block_len, rg.size());
    iov_.resize(segs.size());
    for (size_t i = 0; i < segs.size(); i++) iov_[i] = iovec{rg.base + segs[i].offset, segs[i].len};
    iov_at_ = 0;
    payload_left_ = frame_.total_len;
    // Expect the next head to be as large as this one, but never read ahead
    // more of a next payload than one block, which any frame has.
    const size_t expect = std::min<size_t>(frame_.nseg, 1 + rg.block_len / kSegLen);
    tail_ = kFrameHeaderLen + expect * kSegLen + (rx_ ? 4 + 2 * kTagLen : 0);
    state_ = State::payload;
    if (rx_ && !staged_) {
        const uint8_t aad[1] = {kRecordPayload};
        rx_->begin(aad, sizeof aad);
    }
}

// Before each kChunk of payload lands (in one readv or several), the
// connection must not have been reset: the initiator resets it before it
// reports the transfers on it failed, and a target that was frozen (or slow)
// still holds received bytes in its socket then. So at most one chunk's worth
// lands after the failure is reported (docs/semantics.md). Bytes that waited in
// the socket while this thread did not run may belong to transfers the
// initiator has failed even though its reset was lost (RFC 5961 drops a reset
// whose sequence number is not exact, and rate-limits the challenge that
// would fix it): they land only after a probe (stale_landing).
TcpConn::Next TcpConn::read_payload() {
    if (staged_) return read_record();
    if (ahead() > 0) return land_ahead();
    iovec chunk[kChunkIovs + 1];
    size_t cnt = take_chunk(iov_.data() + iov_at_, iov_.size() - iov_at_, chunk);
    const size_t want = chunk_len(chunk, cnt);
    if (reset_before(want)) return Next::close;
    const Clock::time_point now = Clock::now();
    if (now - last_landed_ > kStaleAfter && waited_since(now - kStaleAfter)) return stale_landing(chunk, cnt);
    last_landed_ = now;
    if (want == payload_left_) chunk[cnt++] = iovec{ahead_.data(), tail_};  // the rest: read ahead too
    ssize_t got = readv_into_region(fd_.get(), chunk, cnt);
    if (got <= 0) return got < 0 ? Next::close : drained();
    const size_t r = std::min(static_cast<size_t>(got), want);
    ahead_at_ = 0;
    ahead_len_ = static_cast<size_t>(got) - r;
    unchecked_ += r;
    if (rx_ && !decrypt_chunk(chunk, r)) return Next::close;
    return payload_landed(r, want);
}

// Payload read ahead with the previous frame's tail (at most a block, so
// within this payload): it lands from the buffer, under the same look for
// a reset as a readv.
TcpConn::Next TcpConn::land_ahead() {
    const size_t n = std::min(ahead(), payload_left_);
    if (reset_before(n)) return Next::close;
    land_from(ahead_.data() + ahead_at_, n, iov_.data() + iov_at_);
    ahead_at_ += n;
    unchecked_ += n;
    return payload_landed(n, n);
}

// A reset is looked for once per kChunk landed, not before every read: still
// at most one chunk lands after it arrived. True: reset (drop the rest).
bool TcpConn::reset_before(size_t landing) {
    if (unchecked_ + landing <= kChunk) return false;
    if (int err = net::pending_error(fd_.get())) {
        KVX_LOG(debug, "tcp: dropping a frame's payload: the connection was %s",
                err == ECONNRESET ? "reset by the initiator" : strerror(err));
        return true;
    }
    unchecked_ = 0;
    return false;
}

// n bytes read aside (src) land in the region at iov: copied, or decrypted
// when sealed.
void TcpConn::land_from(const uint8_t *src, size_t n, const iovec *iov) {
    for (size_t i = 0, at = 0; at < n; i++) {
        const size_t take = std::min(n - at, iov[i].iov_len);
        auto *dst = static_cast<uint8_t *>(iov[i].iov_base);
        if (rx_) rx_->update(src + at, dst, take);
        else copy_into_region(dst, src + at, take);
        at += take;
    }
}

// Small reads (a frame head, a tag): from the bytes read ahead, else from
// the socket. Returns as outcome() does.
ssize_t TcpConn::read_small(uint8_t *dst, size_t n) {
    if (ahead() == 0) return outcome(::recv(fd_.get(), dst, n, 0));
    n = std::min(n, ahead());
    memcpy(dst, ahead_.data() + ahead_at_, n);
    ahead_at_ += n;
    return static_cast<ssize_t>(n);
}

// r of the want bytes of a chunk are in the region.
TcpConn::Next TcpConn::payload_landed(size_t r, size_t want) {
    payload_left_ -= r;
    iovec *iov = iov_.data() + iov_at_;
    const size_t left = net::advance_iov(iov, iov_.size() - iov_at_, r);
    iov_at_ = static_cast<size_t>(iov - iov_.data());
    if (left > 0) return r >= want ? Next::more : drained();
    wake_at(1);
    if (!rx_) return frame_done();
    have_ = 0;
    state_ = State::payload_tag;
    return Next::more;
}

// Mid-payload, the socket is drained (a short read, or none at all after a
// read that took a whole chunk): sleep until a good part of the rest is
// there, not for every segment that arrives. The mark is set on every such
// wait: one left from an earlier, larger rest would wait for bytes that
// never come (the frame's tail is smaller), and the transfer would stall.
TcpConn::Next TcpConn::drained() {
    wake_at(payload_left_);
    return Next::wait;
}

// The loop wakes this connection for reading once `bytes` (at most kLowat)
// have arrived (SO_RCVLOWAT; a reset or close wakes it regardless). Never
// more than the rest of the frame's payload: nothing else may follow before
// the ack.
void TcpConn::wake_at(size_t bytes) {
    const int want = static_cast<int>(std::min(bytes, kLowat));
    if (want == lowat_) return;
    if (::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) lowat_ = want;
}

// True when the bytes that were to wake this connection had all arrived
// before `since` (kernel receive timestamps, SO_TIMESTAMPNS, read with
// MSG_PEEK: that of the last segment peeked). With SO_RCVLOWAT above one
// byte the first bytes wait for the rest by our choice, not because this
// thread did not run: what counts is when the lowat-th byte came (on a slow
// or long path it may come long after the first; counting from the first
// made every slow stream look frozen and probed it, 4 round trips each).
bool TcpConn::waited_since(Clock::time_point since) {
    int avail = 0, lowat = 1;
    socklen_t len = sizeof lowat;
    if (::ioctl(fd_.get(), FIONREAD, &avail) != 0 || avail <= 0) return false;
    // What the kernel uses: it caps SO_RCVLOWAT at half the receive buffer.
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_RCVLOWAT, &lowat, &len) != 0) lowat = 1;
    const size_t want = std::clamp<size_t>(std::min<size_t>(static_cast<size_t>(lowat), static_cast<size_t>(avail)), 1,
                                           kLowat);
    static thread_local std::unique_ptr<uint8_t[]> scratch = std::make_unique_for_overwrite<uint8_t[]>(kLowat);
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
    iovec iov{scratch.get(), want};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (::recvmsg(fd_.get(), &m, MSG_PEEK | MSG_DONTWAIT) <= 0) return false;
    const int64_t stamp = rx_stamp_ns(m);
    if (stamp == 0) return true;  // no timestamp: assume the worst
    return Clock::now() - std::chrono::nanoseconds(realtime_ns() - stamp) < since;
}

// The probe's wait: a few round trips (four times the smoothed RTT, at
// least 2 ms, at most 200 ms) on this connection's own timer (State::probe:
// it reads nothing meanwhile); probe_over() decides.
TcpConn::Next TcpConn::start_probe() {
    tcp_info ti{};
    socklen_t len = sizeof ti;
    const int rtt_us = ::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 ? int(ti.tcpi_rtt) : 0;
    const auto wait = std::chrono::milliseconds(std::clamp(4 * rtt_us / 1000 + 1, 2, 200));
    probe_due_ = Clock::now() + wait;
    probe_timer_ = ctx_.loop->add_timer(probe_due_, this, kProbe);
    if (probe_timer_ == 0) return Next::close;  // the loop is stopping
    state_ = State::probe;
    return Next::wait;
}

// Stale bytes: the chunk is read aside (which opens the receive window, so
// the kernel acknowledges, and a dead initiator's kernel answers with a reset
// that is exact), then lands only if no reset came within a few round trips.
// The wait is this connection's alone (State::probe, a timer on the loop):
// it reads nothing meanwhile, and every other source of the loop goes on.
TcpConn::Next TcpConn::stale_landing(const iovec *chunk, size_t cnt) {
    static_assert(std::tuple_size_v<decltype(probe_iov_)> >= kChunkIovs);
    probe_want_ = chunk_len(chunk, cnt);
    aside_.resize(probe_want_);  // released when the probe is over: 4096 connections x a chunk is 1 GiB
    ssize_t r = outcome(::recv(fd_.get(), aside_.data(), probe_want_, 0));
    if (r <= 0) return r < 0 ? Next::close : drained();
    aside_len_ = static_cast<size_t>(r);
    std::copy(chunk, chunk + cnt, probe_iov_.begin());
    return start_probe();
}

// The probe's wait is over (its timer, or an error or hang-up before it):
// the bytes read aside land unless the initiator reset the connection.
// Reading then goes on as after any landing.
void TcpConn::probe_over() {
    ctx_.loop->cancel_timer(probe_timer_);
    probe_timer_ = 0;
    // The clocks before the look for a reset: a thread stopped on its way out
    // of that getsockopt finds the record stale in land_record and probes again.
    const Clock::time_point looked = Clock::now();
    const int64_t looked_ns = realtime_ns();
    if (int err = net::pending_error(fd_.get())) {
        KVX_LOG(info, "tcp: dropped %zu bytes that waited in the socket: the initiator reset the connection (%s)",
                staged_ ? record_len_ : aside_len_, strerror(err));
        return server_.close(*this);  // frees this
    }
    // This thread did not run through the end of the wait (stopped, starved):
    // the acknowledgement the probe drew left before that, and an initiator
    // that reset the connection meanwhile may have had its reset dropped
    // (RFC 5961). The probe says nothing then: probe again.
    if (looked - probe_due_ > kStaleAfter) {
        if ((staged_ ? probe_record() : start_probe()) == Next::close) return server_.close(*this);
        return;
    }
    if (staged_) {
        state_ = State::payload;
        arrived_ns_ = looked_ns;  // alive as of the look: the record (and what the probe read aside) is fresh
        if (land_record() == Next::close) return server_.close(*this);
        return on_event(0, EPOLLIN);  // what arrived meanwhile; may free this
    }
    state_ = State::payload;
    unchecked_ = aside_len_;
    last_landed_ = looked;
    land_from(aside_.data(), aside_len_, probe_iov_.data());
    std::vector<uint8_t>().swap(aside_);
    if (payload_landed(aside_len_, probe_want_) == Next::close) return server_.close(*this);
    on_event(0, EPOLLIN);  // what arrived meanwhile; may free this
}

// Sealed: the chunk's ciphertext, decrypted in place; the tag at the end of
// the frame decides. One look for a reset first: a target frozen between the
// readv and here (SIGSTOP, a long preemption) whose initiator has meanwhile
// failed the transfer leaves the chunk as ciphertext. Frozen while
// decrypting, it changes at most the rest of this chunk: within the bound of
// one chunk (docs/semantics.md). false: reset.
bool TcpConn::decrypt_chunk(const iovec *chunk, size_t n) {
    if (net::pending_error(fd_.get()) != 0) return false;
    for (size_t i = 0; n > 0; i++) {
        const size_t take = std::min(n, chunk[i].iov_len);
        auto *p = static_cast<uint8_t *>(chunk[i].iov_base);
        rx_->update(p, p, take);
        n -= take;
    }
    return true;
}

// Staged records (kFlagAeadRecords, docs/wire-format.md): each record of
// the payload (kSealedRecordMax bytes, the last one less) and its tag are
// read aside into stage_ and opened there; a record that fails its tag
// closes the connection with nothing of it in the region. An opened record
// lands only if the connection was not reset meanwhile (the initiator
// resets before it reports the transfer failed), and by one kernel copy
// (land_kernel): a stop signal cannot cut it in half, so a target frozen
// at any instruction lands all of a record or none of it after its
// initiator gave up. Payload that waited in the socket is probed first, as
// in read_payload. The region is written once per byte, with plaintext.
TcpConn::Next TcpConn::read_record() {
    if (stage_have_ == 0) {
        record_len_ = std::min<size_t>(payload_left_, kSealedRecordMax);
        if (!stage_) start_staging();
        else if (ahead() == 0 && ahead_.size() > kAheadMax) {  // a probe grew it: back to its usual size
            ahead_.resize(kAheadMax);
            ahead_.shrink_to_fit();
        }
    }
    const size_t want = record_len_ + kTagLen, missing = want - stage_have_;
    size_t got = 0;
    if (ahead() > 0) {
        got = std::min(ahead(), missing);
        memcpy(stage_.get() + stage_have_, ahead_.data() + ahead_at_, got);
        ahead_at_ += got;
    } else {
        // The frame's last record: the next head is read ahead with it.
        const bool last = record_len_ == payload_left_;
        iovec v[2] = {{stage_.get() + stage_have_, missing}, {ahead_.data(), last ? tail_ : 0}};
        const ssize_t r = recv_stamped(v, last ? 2 : 1);
        if (r < 0) return Next::close;
        got = std::min(static_cast<size_t>(r), missing);
        ahead_at_ = 0;
        ahead_len_ = static_cast<size_t>(r) - got;
    }
    stage_have_ += got;
    if (stage_have_ < want) {
        wake_at(want - stage_have_);
        return got == missing ? Next::more : Next::wait;
    }
    const uint8_t aad[1] = {kRecordPayload};
    if (!rx_->open(aad, sizeof aad, stage_.get(), record_len_, stage_.get())) {
        KVX_LOG(warn, "tcp: closing a connection: a payload record fails authentication (nothing of it landed)");
        return Next::close;
    }
    return land_record();
}

// recvmsg into v, noting in arrived_ns_ when the last bytes it took arrived
// (the kernel's receive timestamp, SO_TIMESTAMPNS; none: long ago, so that
// the record is probed). Returns as outcome() does.
ssize_t TcpConn::recv_stamped(iovec *v, size_t n) {
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    const ssize_t r = outcome(::recvmsg(fd_.get(), &m, MSG_DONTWAIT));
    if (r <= 0) return r;
    arrived_ns_ = rx_stamp_ns(m);
    return r;
}

// The opened record in stage_ lands, unless the connection was reset. A
// record whose last bytes arrived more than kStaleAfter ago (they waited in
// the socket, or here after they were read: this thread did not run, a
// freeze, a long preemption) is probed first: the initiator may have reset the connection meanwhile, and a reset
// that met a full receive window is dropped (RFC 5961). Reading what waits
// in the socket aside (into ahead_, up to a chunk) opens the window; the
// acknowledgement of that draws a reset whose sequence number is exact from
// a dead initiator's kernel; the record lands only if none came within a few
// round trips. After the look at the clock, only the look for a reset and
// the kernel copy remain: a freeze there is the window cleartext has too
// (between its look and its readv).
TcpConn::Next TcpConn::land_record() {
    // The clock first, then the look for a reset: a thread stopped anywhere
    // after the clock was read (on its way out of that getsockopt, or before
    // the first syscall of the landing) sees the gap and probes (land_kernel
    // measures from `looked`).
    const Clock::time_point looked = Clock::now();
    if (int err = net::pending_error(fd_.get())) {
        KVX_LOG(debug, "tcp: dropping an opened record: the connection was %s",
                err == ECONNRESET ? "reset by the initiator" : strerror(err));
        return Next::close;
    }
    // Stale: its bytes arrived more than kStaleAfter ago, and nothing landed
    // (nor did a probe find the connection alive) within kStaleAfter either.
    // Bytes that queued in the socket behind others while this thread kept
    // landing (a backlog: the sender is faster) did not wait for a frozen
    // target, as cleartext's last_landed_ says too; probing each of them
    // would cost a probe's wait (four smoothed round trips, which delayed
    // acknowledgements stretch to tens of ms) per record, the backlog would
    // never drain, and the connection would crawl at a few MB/s.
    const int64_t stale_ns = std::chrono::nanoseconds(kStaleAfter).count();
    if (realtime_ns() - arrived_ns_ > stale_ns && looked - last_landed_ > kStaleAfter) return probe_record();
    switch (land_kernel(stage_.get() + record_at_, record_len_ - record_at_, looked)) {
    case Landing::failed: return Next::close;
    case Landing::stopped: return probe_record();  // the rest lands after a probe
    case Landing::done: break;
    }
    last_landed_ = looked;  // the look this landing was made under, not its end: a stop after it shows
    stage_have_ = record_at_ = 0;
    payload_left_ -= record_len_;
    if (payload_left_ > 0) return Next::more;
    wake_at(1);
    return frame_done();
}

// The record waited (or this thread was stopped): read what waits in the
// socket aside (into ahead_, up to a chunk), which opens the receive window;
// the acknowledgement of that draws a reset whose sequence number is exact
// from a dead initiator's kernel; the rest of the record lands only if none
// came within a few round trips (probe_over).
TcpConn::Next TcpConn::probe_record() {
    const size_t keep = ahead();
    if (keep > 0 && ahead_at_ > 0) memmove(ahead_.data(), ahead_.data() + ahead_at_, keep);
    ahead_at_ = 0;
    ahead_len_ = keep;
    // Up to a chunk aside in all: enough to open the window, and what a
    // row of probes keeps here stays bounded.
    const size_t room = keep < kChunk ? kChunk - keep : 0;
    if (ahead_.size() < keep + room) ahead_.resize(keep + room);
    iovec v{ahead_.data() + keep, room};
    const ssize_t r = room > 0 ? recv_stamped(&v, 1) : 0;
    if (r < 0) return Next::close;  // reset (the read took the error: SO_ERROR has none now), or closed
    ahead_len_ += static_cast<size_t>(r);
    return start_probe();
}

// The first record of a connection: its buffer (page-aligned: vmsplice
// takes whole pages) and the pipe its landings go through.
void TcpConn::start_staging() {
    const size_t page = static_cast<size_t>(std::max(4096L, ::sysconf(_SC_PAGESIZE)));
    const size_t bytes = (kSealedRecordMax + kTagLen + page - 1) / page * page;
    stage_.reset(static_cast<uint8_t *>(std::aligned_alloc(page, bytes)));
    if (!stage_) fail(KVX_ENOMEM, "tcp: no memory for a record's buffer");
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) fail(KVX_EBACKEND, "tcp: pipe2 for landing records: %s", strerror(errno));
    pipe_r_ = net::Fd(p[0]);
    pipe_w_ = net::Fd(p[1]);
    (void)::fcntl(p[1], F_SETPIPE_SZ, static_cast<int>(kSealedRecordMax));  // else as much as it holds
}

// n bytes from src into the region where iov_ says (from iov_at_ on, which
// advances) by the kernel: src is spliced into the pipe (vmsplice; a copy by
// write() where that is refused), as much as the pipe takes, and the pipe is
// read into the region, until all of it landed. A stop can come at any
// instruction, so the clock (steady, from `since`, read before the look for
// a reset) is read after each syscall: a gap means the thread was stopped
// (or did not run), and the landing stops before the next read into the
// region: `stopped`, with what landed counted in record_at_. A stop between
// the last clock read and the readv is the window that remains.
TcpConn::Landing TcpConn::land_kernel(const uint8_t *src, size_t n, Clock::time_point since) {
    static std::atomic<bool> no_vmsplice{false};
    auto gap = [&since] {
        const Clock::time_point now = Clock::now();
        const bool g = now - since > kStaleAfter;
        since = now;
        return g;
    };
    for (size_t at = 0; at < n;) {
        iovec v{const_cast<uint8_t *>(src + at), n - at};
        ssize_t put = no_vmsplice.load(std::memory_order_relaxed)
                          ? ::write(pipe_w_.get(), v.iov_base, v.iov_len)
                          : ::vmsplice(pipe_w_.get(), &v, 1, SPLICE_F_NONBLOCK);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0 && !no_vmsplice.load() && (errno == EPERM || errno == ENOSYS || errno == EINVAL)) {
            if (!no_vmsplice.exchange(true))
                KVX_LOG(info, "tcp: vmsplice is refused here (%s): protected records land by write and read of a pipe",
                        strerror(errno));
            continue;
        }
        if (put <= 0) {  // the pipe is empty here: it always takes something
            KVX_LOG(warn, "tcp: closing a connection: filling the landing pipe: %s", put < 0 ? strerror(errno) : "full");
            return Landing::failed;
        }
        if (gap()) {  // stopped around the splice: empty the pipe, land nothing more now
            uint8_t sink[4096];
            for (size_t left = static_cast<size_t>(put); left > 0;) {
                const ssize_t r = ::read(pipe_r_.get(), sink, std::min(left, sizeof sink));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) return Landing::failed;
                left -= static_cast<size_t>(r);
            }
            return Landing::stopped;
        }
        for (size_t took = 0; took < static_cast<size_t>(put);) {
            iovec cut[kFrameMaxSegs];
            size_t k = 0;
            for (size_t want = static_cast<size_t>(put) - took; iov_at_ + k < iov_.size() && k < kFrameMaxSegs && want > 0;
                 k++) {
                cut[k] = iovec{iov_[iov_at_ + k].iov_base, std::min(iov_[iov_at_ + k].iov_len, want)};
                want -= cut[k].iov_len;
            }
            const ssize_t r = read_region_from_pipe(pipe_r_.get(), cut, k);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                KVX_LOG(warn, "tcp: closing a connection: reading the landing pipe: %s", r < 0 ? strerror(errno) : "empty");
                return Landing::failed;
            }
            took += static_cast<size_t>(r);
            record_at_ += static_cast<size_t>(r);
            iovec *iov = iov_.data() + iov_at_;
            net::advance_iov(iov, iov_.size() - iov_at_, static_cast<size_t>(r));
            iov_at_ = static_cast<size_t>(iov - iov_.data());
            if (took < static_cast<size_t>(put) && gap()) return Landing::failed;  // stopped mid-piece: cannot resume it
        }
        at += static_cast<size_t>(put);
        if (at < n && gap()) return Landing::stopped;  // stopped at the read's end: probe before the next piece
    }
    return Landing::done;
}

// A payload that fails its tag fails its transfer: no ack, the connection closes.
TcpConn::Next TcpConn::read_tag() {
    ssize_t r = read_small(tag_.data() + have_, kTagLen - have_);
    if (r <= 0) return r < 0 ? Next::close : Next::wait;
    have_ += static_cast<size_t>(r);
    if (have_ < kTagLen) return Next::wait;
    if (!rx_->finish_open(tag_.data())) {
        KVX_LOG(warn, "tcp: closing a connection: a frame's payload fails authentication");
        return Next::close;
    }
    return frame_done();
}

TcpConn::Next TcpConn::frame_done() {
    if (frame_.flags & kFlagAck) {
        uint8_t ack[kAckLen + kTagLen];
        encode_ack(Ack{0, frame_.seq}, ack);
        if (tx_) {
            const uint8_t aad[1] = {kRecordAck};
            tx_->seal(aad, sizeof aad, ack, kAckLen, ack);
        }
        out_.insert(out_.end(), ack, ack + (tx_ ? kAckLen + kTagLen : kAckLen));
        // Acks leave once a chunk's worth of payload is behind them, not only
        // at the end of the turn: a turn can take many frames, and the
        // initiator refills its window only as acks arrive.
        if ((acked_unsent_ += frame_.total_len) >= kChunk && !flush()) return Next::close;
    }
    return next_head();
}

TcpConn::Next TcpConn::next_head() {
    have_ = 0;
    need_ = rx_ ? kSealedHeadLen : kHeadLen;
    head_.resize(need_);
    state_ = State::frame_head;
    return Next::more;
}

// Sends what the socket takes now; false when the connection failed.
bool TcpConn::flush() {
    acked_unsent_ = 0;
    while (out_at_ < out_.size()) {
        ssize_t r = ::send(fd_.get(), out_.data() + out_at_, out_.size() - out_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r > 0) out_at_ += static_cast<size_t>(r);
        else if (errno == EAGAIN || errno == EWOULDBLOCK) return compact_out(), true;
        else if (errno != EINTR) return false;
    }
    out_.clear();
    out_at_ = 0;
    return true;
}

// What the socket took leaves the buffer once it is half of it: a peer that
// reads its acks slowly but steadily never lets the buffer drain, and
// kMaxUnsent bounds only the unsent part.
void TcpConn::compact_out() {
    if (out_at_ == 0 || out_at_ * 2 < out_.size()) return;
    out_.erase(out_.begin(), out_.begin() + static_cast<std::ptrdiff_t>(out_at_));
    out_at_ = 0;
}

// Read unless refused, probing, or the peer does not take its acks; wait to
// write only while something is unsent.
void TcpConn::update_interest() {
    const size_t unsent = out_.size() - out_at_;
    const bool reading = state_ != State::refused && state_ != State::probe;
    const uint32_t want = (reading && unsent < kMaxUnsent ? uint32_t{EPOLLIN} : 0) |
                         (unsent ? uint32_t{EPOLLOUT} : 0);
    if (want != events_) ctx_.loop->modify(token_, events_ = want);
}

}  // namespace kvx::tcp
