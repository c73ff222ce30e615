// Initiator side of the tcp backend: streams to one peer, connected and
// authenticated in the caller's thread, then served by the event loop.
#include <netinet/in.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <thread>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/handshake.h"

namespace kvx::tcp {

namespace {

constexpr uint64_t kSplitMin = 1 << 20;  // an op is spread over streams in parts of at least this
constexpr size_t kBatchParts = 32;        // parts one sendmsg may carry ...
constexpr uint64_t kBatchBytes = 1 << 20; // ... up to about this many bytes
constexpr int kTurnBatches = 8;           // batches per writable event, then other sources get a turn
constexpr size_t kAckBatch = 256;         // acks one recv may return

// The handshake's carrier on a connected socket: a message is its header,
// then the rest its kind needs.
class StreamCarrier final : public handshake::Carrier {
public:
    StreamCarrier(int fd, const net::Deadline &deadline) : fd_(fd), deadline_(deadline) {}
    int send(const uint8_t *p, size_t n) override { return net::write_full_by(fd_, p, n, deadline_); }
    int receive(handshake::Bytes &buf, size_t *len) override {
        int rc = net::read_full_by(fd_, buf.data(), handshake::kHeaderLen, deadline_);
        if (rc != 0) return rc;
        try {
            *len = handshake::message_len(buf.data());
        } catch (const Error &) {
            *len = handshake::kHeaderLen;  // the engine reports it
            return 0;
        }
        return net::read_full_by(fd_, buf.data() + handshake::kHeaderLen, *len - handshake::kHeaderLen, deadline_);
    }

private:
    int fd_;
    const net::Deadline &deadline_;
};

// A target that answers "no such transport here": the next endpoint, never again.
constexpr int kOtherTransport = 1;
// A target that does not know our optional flags (before 0.8): again without them.
constexpr int kOlderTarget = 2;

// The handshake on a connected socket, offering our flags but `without`:
// 0, kOtherTransport, kOlderTarget, a -errno of the socket, or throws Error
// with the code of a refusal or a failed proof. c->keys: the data path's
// keys when the peers chose protection; c->flags: the flags agreed.
int authenticate(int fd, const BackendContext &ctx, const PeerContext &pc, const std::string &where,
                 uint32_t without, Authenticated *c) {
    handshake::DataPathOptions opts = data_path_options(*ctx.options);
    opts.flags &= ~without;
    handshake::Initiator in(*pc.meta, ctx.identity.fingerprint, opts, where);
    StreamCarrier carrier(fd, pc.deadline);
    try {
        if (int rc = handshake::initiate(in, carrier)) return rc;
    } catch (const Error &e) {
        // HELLO refused: another transport listens there now
        if (e.code() == KVX_ECONNREFUSED && !in.challenged()) return kOtherTransport;
        // Refused for a flag it does not know: a target before 0.8, if its
        // metadata (which the application carried, authenticated by its
        // checksum and the handshake's secret) says so. A refusal is not
        // authenticated: from a target whose metadata says it takes staged
        // records, it is someone on the path asking for the older layout.
        if (e.code() == KVX_EVERSION && in.challenged() && (opts.flags & opts.optional)) {
            if (section_flags(*pc.section) & kSectionRecords)
                fail(KVX_EAUTH, "%s: refused staged records, which its metadata says it takes (a forged refusal?)",
                     where.c_str());
            return kOlderTarget;
        }
        throw;
    }
    if (opts.flags & kFlagAead) c->keys = in.keys();
    c->flags = opts.flags;
    return 0;
}

// A busy or flooded target resets or closes before the handshake is done
// (it sheds unauthenticated connections): worth another try before the
// deadline. A refusal of the connection itself means nothing listens on
// that port (a target that exited or restarted; a full backlog drops, it
// does not refuse): retried kRefusedRounds times only, a few milliseconds.
bool transient(int rc) { return rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNABORTED; }
constexpr int kRefusedRounds = 3;

// Sleeps 1..2 ms, doubling per attempt up to 64..128 ms (jittered, so a crowd
// spreads out), never past the deadline, and in slices when it can be called off.
void back_off(int attempt, const net::Deadline &deadline) {
    static thread_local uint32_t jitter = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
    jitter = jitter * 1664525u + 1013904223u;
    const int64_t base_us = int64_t{1000} << std::min(attempt, 6);
    auto pause = std::chrono::microseconds(base_us + (jitter >> 8) % base_us);
    const Clock::time_point until = std::min<Clock::time_point>(Clock::now() + pause, deadline.at());
    while (!deadline.cancelled() && Clock::now() < until)
        std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(),
                                                              std::chrono::milliseconds(net::Deadline::kCancelSliceMs)));
}

// Opens one authenticated connection to the first endpoint that takes it,
// in rounds until the deadline while an endpoint reset or closed (or, for
// kRefusedRounds, refused). The error says what the last round saw of each
// endpoint: KVX_ECONNREFUSED when every one refused (or is another
// transport's), KVX_ETIMEDOUT when one did not answer in time or the
// deadline passed while resets were retried, KVX_EHOSTUNREACH otherwise.
Authenticated open_stream(const BackendContext &ctx, const PeerContext &pc, const std::vector<net::Endpoint> &eps) {
    std::string tried;
    bool timed_out = false, refused_only = true;
    for (int round = 0;; round++) {
        bool again = false;
        tried.clear();
        timed_out = false;
        refused_only = true;
        for (const net::Endpoint &ep : eps) {
            const std::string where = strfmt("peer '%s' at %s", pc.peer_id.c_str(), ep.str().c_str());
            Authenticated c;
            int rc = net::connect_by(ep, pc.deadline, &c.fd);
            if (rc == 0) rc = authenticate(c.fd.get(), ctx, pc, where, 0, &c);
            if (rc == kOlderTarget) {  // once more, without what it does not know
                KVX_LOG(info, "tcp: %s is older (it does not know staged records): connecting without them",
                        where.c_str());
                c = Authenticated{};
                rc = net::connect_by(ep, pc.deadline, &c.fd);
                if (rc == 0) rc = authenticate(c.fd.get(), ctx, pc, where, kFlagAeadRecords, &c);
            }
            if (rc == 0) {
                net::set_nodelay(c.fd.get());  // stays non-blocking: it goes on the event loop
                set_liveness(c.fd.get(), ctx.options->uint("transfer_timeout_ms"));
                KVX_LOG(info, "tcp: connected to %s after %d retries%s", where.c_str(), round,
                        c.keys ? "" : " (tcp.protection=none)");
                return c;
            }
            const char *why = rc == kOtherTransport ? "another transport" : strerror(-rc);
            tried += strfmt("%s%s: %s", tried.empty() ? "" : ", ", ep.str().c_str(), why);
            refused_only &= rc == -ECONNREFUSED || rc == kOtherTransport;
            timed_out |= rc == -ETIMEDOUT;
            again |= transient(rc) || (rc == -ECONNREFUSED && round + 1 < kRefusedRounds);
            if (pc.deadline.passed()) break;
        }
        if (!again || pc.deadline.passed()) break;
        back_off(round, pc.deadline);
    }
    // Out of time while still retrying resets (a target shedding load): a timeout too.
    const bool out_of_time = pc.deadline.passed() && !pc.deadline.cancelled();
    const int code = refused_only ? KVX_ECONNREFUSED : timed_out || out_of_time ? KVX_ETIMEDOUT : KVX_EHOSTUNREACH;
    fail(code, "peer '%s': cannot connect (%s)", pc.peer_id.c_str(), tried.c_str());
}

}  // namespace

std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc) {
    const std::vector<net::Endpoint> eps = decode_section(*pc.section);
    std::vector<Authenticated> conns;
    const uint64_t streams = ctx.options->uint("tcp.streams");
    for (uint64_t i = 0; i < streams; i++) conns.push_back(open_stream(ctx, pc, eps));
    auto peer = std::make_unique<TcpPeer>(ctx, pc, std::move(conns));
    peer->start();
    return peer;
}

TcpPeer::TcpPeer(const BackendContext &ctx, const PeerContext &pc, std::vector<Authenticated> conns)
    : loop_(ctx.loop), region_(ctx.region), peer_id_(pc.peer_id), sink_(pc.sink), alive_(std::make_shared<char>()) {
    for (auto &c : conns) {
        streams_.push_back(std::make_unique<Stream>(*this, std::move(c.fd), region_));
        if (!c.keys) continue;
        const AeadImpl impl = aead_impl(*ctx.options);
        streams_.back()->writer.protect(c.keys->to_target, impl, c.flags & kFlagAeadRecords);
        streams_.back()->rx = std::make_unique<Aead>(c.keys->to_initiator, false, impl);
    }
    idle_streams_ = streams_.size();
}

TcpPeer::~TcpPeer() { shutdown(); }

// On the loop thread: an event of the first stream may fail the peer, which
// must then find every stream's token in place.
void TcpPeer::start() {
    bool attached = true;
    loop_->call([&] {
        for (auto &s : streams_) {
            s->events = EPOLLIN;
            s->token = loop_->attach(s->fd.get(), s->events, s.get(), 0);
            attached &= s->token != 0;
        }
    });
    if (!attached) fail(KVX_ECLOSED, "peer '%s': the transport is closing", peer_id_.c_str());
}

void TcpPeer::submit(Op op) {
    std::vector<Part> parts = split_op(std::move(op), streams_.size(), kSplitMin, region_.block_len);
    std::weak_ptr<void> alive;
    bool queued = false, kick = false;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stop_) {
            for (auto &p : parts) queue_.push_back(std::move(p));
            queued = true;
            // A busy stream takes more by itself once its batch is out.
            kick = idle_streams_ > 0 && !kicked_;
            kicked_ |= kick;
            alive = alive_;
        }
    }
    // One pump per burst of submits; it runs only while the peer is alive.
    if (kick) loop_->post([this, alive] {
        if (auto a = alive.lock()) pump();
    });
    if (queued) return;
    CompletionBatch out;
    out.fail(*parts.front().op, break_status_.load() ? break_status_.load() : KVX_EPEERBROKEN);
    out.deliver(*sink_);
}

// Loop thread: every idle stream takes queued parts. A stream still writing
// its batch takes more when it becomes writable again.
void TcpPeer::pump() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        kicked_ = false;
    }
    for (auto &s : streams_)
        if (s->token && s->writer.idle()) send_more(*s);
}

void TcpPeer::on_stream(Stream &s, uint32_t events) {
    if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !read_acks(s)) return;
    if (events & EPOLLOUT) send_more(s);
}

void TcpPeer::send_more(Stream &s) {
    for (int turn = 0;; turn++) {
        int rc;
        try {
            rc = s.writer.write(s.fd.get());
        } catch (const Error &e) {  // sealing failed (OpenSSL, a record's bound): the stream cannot go on
            KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
            return fail_now(KVX_ECONNRESET);
        }
        if (rc < 0) {
            KVX_LOG(warn, "tcp: peer '%s': send failed: %s", peer_id_.c_str(), strerror(-rc));
            return fail_now(KVX_ECONNRESET);
        }
        if (rc == 0) return want_writable(s, true);
        // Past the turn's budget, come back on the next writable event.
        if (turn == kTurnBatches) return want_writable(s, true);
        if (!take_batch(s)) return want_writable(s, false);
    }
}

// Small parts queued together leave in one sendmsg: fewer syscalls and
// wake-ups per transfer (64 KiB blocks, batch 1).
bool TcpPeer::take_batch(Stream &s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return false;
    uint64_t bytes = 0;
    size_t n = 0;
    while (!queue_.empty() && n < kBatchParts && (n == 0 || bytes < kBatchBytes)) {
        Part p = std::move(queue_.front());
        queue_.pop_front();
        if (!p.op->try_start()) continue;  // cancelled while queued
        const uint64_t seq = next_seq_++;
        bytes += p.bytes();
        s.awaiting.push_back(Awaiting{p.op, seq});
        s.writer.add(std::move(p), seq);
        n++;
    }
    if (s.idle != (n == 0)) {
        s.idle = n == 0;
        s.idle ? idle_streams_++ : idle_streams_--;
    }
    return n > 0;
}

void TcpPeer::want_writable(Stream &s, bool on) {
    const uint32_t ev = EPOLLIN | (on ? uint32_t{EPOLLOUT} : 0);
    if (ev != s.events) loop_->modify(s.token, s.events = ev);
}

// Acks are read in batches: one recv returns every ack that has arrived.
// false: the peer failed.
bool TcpPeer::read_acks(Stream &s) {
    uint8_t buf[kAckBatch * (kAckLen + kTagLen)];
    memcpy(buf, s.ack_part.data(), s.ack_have);
    ssize_t r = ::recv(s.fd.get(), buf + s.ack_have, sizeof buf - s.ack_have, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (r <= 0) {
        // A close is how a target that shuts down says goodbye: the core
        // says at warn what that does to the peer (reconnecting, broken).
        if (r == 0) KVX_LOG(info, "tcp: peer '%s': the target closed the connection", peer_id_.c_str());
        else KVX_LOG(warn, "tcp: peer '%s': connection lost: %s", peer_id_.c_str(), strerror(errno));
        fail_now(KVX_ECONNRESET);
        return false;
    }
    const size_t have = s.ack_have + static_cast<size_t>(r);
    size_t used = 0;
    CompletionBatch done;
    try {
        take_acks(s, buf, have, &used, done);
    } catch (const Error &e) {
        done.deliver(*sink_);  // acknowledged before the bad one
        KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
        fail_now(KVX_ECONNRESET);
        return false;
    }
    s.ack_have = have - used;
    memcpy(s.ack_part.data(), buf + used, s.ack_have);
    // Parts of a larger transfer acknowledged: progress, though nothing completed.
    if (used > 0 && done.empty()) sink_->progress();
    done.deliver(*sink_);
    return true;
}

// The whole acks (sealed: ack records) in buf, in order; throws for one that
// is forged, out of order or not a success.
void TcpPeer::take_acks(Stream &s, uint8_t *buf, size_t have, size_t *used, CompletionBatch &done) {
    const size_t rec = s.rx ? kAckLen + kTagLen : kAckLen;
    for (; have - *used >= rec; *used += rec) {
        uint8_t *p = buf + *used;
        const uint8_t aad[1] = {kRecordAck};
        if (s.rx && !s.rx->open(aad, sizeof aad, p, kAckLen, p))
            fail(KVX_EAUTH, "an acknowledgement fails authentication (forged, replayed or reordered)");
        Ack a = decode_ack(p);
        // A frame may carry several parts: its ack names the last of them.
        size_t n = 0;
        while (n < s.awaiting.size() && s.awaiting[n].seq < a.seq) n++;
        if (n == s.awaiting.size() || s.awaiting[n].seq != a.seq || a.status != 0)
            fail(KVX_ECONNRESET, "unexpected acknowledgement %llu", (unsigned long long)a.seq);
        for (size_t i = 0; i <= n; i++) {
            done.part_done(*s.awaiting.front().op, 0);
            s.awaiting.pop_front();
        }
    }
}

// Loop thread (or inline once the loop is stopped): breaks the peer and
// collects every pending part's transfer as failed. Returns how long the
// resets may take to reach the target (0: no stream had bytes in flight).
uint32_t TcpPeer::fail_on_loop(int status, CompletionBatch &victims) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!broken_.exchange(true)) break_status_.store(status);
        stop_ = true;
        for (auto &p : queue_) victims.fail(*p.op, status);
        queue_.clear();
    }
    uint32_t settle_us = 0;
    for (auto &s : streams_) {
        // Bytes in flight: wait for the reset (at least kSettleMin: the 1).
        if (s->fd && (!s->awaiting.empty() || !s->writer.idle()))
            settle_us = std::max({settle_us, net::reset_travel_us(s->fd.get()), 1u});
        for (auto &a : s->awaiting) victims.fail(*a.op, status);
        s->awaiting.clear();
        s->writer.clear();
        loop_->detach(s->token);
        s->token = 0;
        // A reset, not a FIN: what the kernel still holds for this stream is
        // dropped, and the target lands nothing more of it (docs/semantics.md).
        net::abort_close(s->fd);
    }
    return settle_us;
}

// The resets travel behind the bytes already sent, and a target that keeps
// reading lands those until its kernel sees the reset: the failures are
// reported once a reset has had time to get there (a round trip and its
// deviation, at least kSettleMin for a busy host's late softirq, at most
// kSettleMax).
void TcpPeer::settle(uint32_t us) {
    if (us == 0) return;
    std::this_thread::sleep_for(std::clamp(std::chrono::microseconds(us), kSettleMin, kSettleMax));
}

void TcpPeer::fail_now(int status) {
    CompletionBatch victims;
    fail_on_loop(status, victims);  // the connection broke: the target already knows
    victims.deliver(*sink_);
}

void TcpPeer::abort(int status) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        aborting_++;
    }
    CompletionBatch victims;
    uint32_t us = 0;
    loop_->call([&] { us = fail_on_loop(status, victims); });
    settle(us);
    victims.deliver(*sink_);
    std::lock_guard<std::mutex> lk(mu_);
    if (--aborting_ == 0) aborted_.notify_all();
}

// The kernel's view of each stream (TCP_INFO): resending into silence in
// any of the three ways it asks the target's kernel for an answer (that
// kernel answers while its process is frozen or starved, so a frozen target
// on a healthy network shows none of them):
// - data in flight: a retransmission timeout (tcpi_retransmits, the loss
//   state);
// - nothing in flight, nothing unsent: keepalive probes without an answer;
// - nothing in flight, data unsent behind a zero window (a target that fell
//   behind when the network went silent): window probes, two without an
//   answer between them. tcpi_probes counts the probes since the last ACK
//   (any ACK resets it, a zero window's too). One alone proves nothing: the
//   target's kernel does not answer a probe that comes within
//   tcp_invalid_ratelimit (its sysctl, 500 ms) of its previous answer, and
//   the probe after the first one past an answer comes 3 intervals (at
//   least 3 x 200 ms) after it, past that limit.
// The timeout returned is the largest base rto: tcpi_rto is backed off by
// the retransmission timer only, window probes back off their interval
// from it unchanged.
uint64_t TcpPeer::network_silent_rto_us() {
    uint64_t rto_us = 0;
    loop_->call([&] {
        for (auto &s : streams_) {
            tcp_info ti{};
            socklen_t len = sizeof ti;
            int unsent = 0;
            if (!s->token || ::getsockopt(s->fd.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
                ::ioctl(s->fd.get(), SIOCOUTQNSD, &unsent) != 0)
                continue;
            const bool keepalive_unanswered = ti.tcpi_probes > 0 && ti.tcpi_unacked == 0 && unsent == 0;
            const bool window_probes_unanswered = ti.tcpi_probes >= 2 && ti.tcpi_unacked == 0 && unsent > 0;
            if (ti.tcpi_retransmits > 0 || ti.tcpi_ca_state == TCP_CA_Loss || keepalive_unanswered)
                rto_us = std::max<uint64_t>({rto_us, ti.tcpi_rto >> std::min<uint8_t>(ti.tcpi_backoff, 31), 1});
            else if (window_probes_unanswered)
                rto_us = std::max<uint64_t>({rto_us, ti.tcpi_rto, 1});
        }
    });
    return rto_us;
}

void TcpPeer::shutdown() {
    std::call_once(shutdown_once_, [this] {
        {
            // A pump posted from here on, or not started yet, never runs.
            std::lock_guard<std::mutex> lk(mu_);
            alive_.reset();
        }
        CompletionBatch victims;
        uint32_t us = 0;
        loop_->call([&] { us = fail_on_loop(KVX_ECONNRESET, victims); });  // resets and closes every stream
        settle(us);
        victims.deliver(*sink_);
        // An abort (the stall watchdog) may have taken the victims first and
        // be settling still: the sink hears nothing of this peer after we return.
        std::unique_lock<std::mutex> lk(mu_);
        aborted_.wait(lk, [&] { return aborting_ == 0; });
    });
}

}  // namespace kvx::tcp
