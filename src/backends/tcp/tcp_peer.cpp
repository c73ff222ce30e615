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
#include <cinttypes>

#include "util/clock.h"
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
constexpr std::chrono::milliseconds kWatchEvery{100};  // the look at the streams while fencing
constexpr std::chrono::milliseconds kNudgeAfter{250};  // a stream owed acks, nothing in flight this long: a NOP
constexpr std::chrono::milliseconds kAnsweredWithin{1000};  // a stream with an ACK this recent is answered

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
    // Fencing where the target's metadata says it knows it, unless not wanted.
    if (section_flags(*pc.section) & kSectionFence) opts.flags |= kFlagFence;
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
// fence: offer kFlagFence (a peer of several streams or rails).
Authenticated open_stream(const BackendContext &ctx, const PeerContext &pc, const TcpRail &rail, bool fence) {
    const uint32_t no_fence = fence ? 0 : kFlagFence;
    const std::vector<net::Endpoint> &eps = rail.to;
    const net::Endpoint *from = rail.from ? &*rail.from : nullptr;
    std::string tried;
    bool timed_out = false, refused_only = true;
    for (int round = 0;; round++) {
        bool again = false;
        tried.clear();
        timed_out = false;
        refused_only = true;
        for (const net::Endpoint &ep : eps) {
            const std::string where = strfmt("peer '%s' at %s%s%s", pc.peer_id.c_str(), ep.str().c_str(),
                                             rail.name.empty() ? "" : " over ", rail.name.c_str());
            Authenticated c;
            int rc = net::connect_by(ep, pc.deadline, &c.fd, from);
            if (rc == 0) rc = authenticate(c.fd.get(), ctx, pc, where, no_fence, &c);
            if (rc == kOlderTarget) {  // once more, without what it does not know
                KVX_LOG(info, "tcp: %s is older (it does not know staged records): connecting without them",
                        where.c_str());
                c = Authenticated{};
                rc = net::connect_by(ep, pc.deadline, &c.fd, from);
                if (rc == 0) rc = authenticate(c.fd.get(), ctx, pc, where, kFlagAeadRecords | no_fence, &c);
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
    fail(code, "peer '%s': cannot connect%s%s (%s)", pc.peer_id.c_str(), rail.name.empty() ? "" : " over ",
         rail.name.c_str(), tried.c_str());
}

// The rails of tcp.interfaces: each local address (of an interface that is
// up and running, in interface order, or in the order listed) paired with
// the first of the peer's addresses in its subnet that no rail has yet.
// None pairs (or the option is unset): the one path over every address.
std::vector<TcpRail> plan_rails(const Options &o, const std::string &peer, const std::vector<net::Endpoint> &eps) {
    const std::vector<std::string> names = interfaces_option(o);
    std::vector<TcpRail> rails;
    if (!names.empty()) {
        const std::vector<net::IfAddr> ifs = net::interface_addrs();
        std::vector<bool> taken(eps.size());
        auto pair = [&](const net::IfAddr &a) {
            for (size_t k = 0; k < eps.size(); k++) {
                if (taken[k] || !net::same_subnet(a.addr, eps[k], a.prefix)) continue;
                taken[k] = true;
                std::string addr = a.addr.str();
                addr.resize(addr.rfind(':'));  // without the port
                rails.push_back(TcpRail{strfmt("%s %s -> %s", a.name.c_str(), addr.c_str(), eps[k].str().c_str()),
                                        a.addr, {eps[k]}});
                return;
            }
        };
        if (names.front() == "all") {
            for (const auto &a : ifs) if (a.running) pair(a);
        } else {
            for (const auto &n : names)
                for (const auto &a : ifs) if (a.name == n && a.running) pair(a);
        }
        if (rails.empty())
            KVX_LOG(info, "tcp: peer '%s': no interface of tcp.interfaces=%s has an address in the subnet of one of "
                          "its addresses: one path", peer.c_str(), o.str("tcp.interfaces").c_str());
    }
    if (rails.empty()) rails.push_back(TcpRail{"", std::nullopt, eps});
    return rails;
}

}  // namespace

std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc) {
    std::vector<TcpRail> rails = plan_rails(*ctx.options, pc.peer_id, decode_section(*pc.section));
    const uint64_t streams = ctx.options->uint("tcp.streams");
    // Every rail that connects, each in a thread of its own: a rail whose
    // path drops everything would otherwise spend the whole deadline before
    // the next one is tried. A rail that does not connect is dialled again
    // in the background once the peer is up.
    // Fencing (a stream lost is taken out, not the peer) only with more than
    // one: a stream that agrees to it must JOIN before anything else.
    const bool fence = streams > 1 || rails.size() > 1;
    std::vector<std::vector<Authenticated>> got(rails.size());
    std::vector<std::exception_ptr> errs(rails.size());
    auto dial = [&](size_t r) {
        try {
            for (uint64_t i = 0; i < streams; i++) {
                got[r].push_back(open_stream(ctx, pc, rails[r], fence));
                got[r].back().rail = r;
            }
        } catch (...) {
            errs[r] = std::current_exception();
        }
    };
    if (rails.size() == 1) {
        dial(0);
    } else {
        std::vector<std::thread> threads;
        for (size_t r = 0; r < rails.size(); r++) threads.emplace_back(dial, r);
        for (auto &t : threads) t.join();
    }
    std::vector<Authenticated> conns;
    for (auto &g : got)
        for (auto &c : g) conns.push_back(std::move(c));
    for (size_t r = 0; r < rails.size(); r++) {
        if (!errs[r]) continue;
        if (conns.empty()) std::rethrow_exception(errs[r]);  // the first rail's reason
        try {
            std::rethrow_exception(errs[r]);
        } catch (const Error &e) {
            KVX_LOG(warn, "tcp: %s; going on without it for now (%zu of %" PRIu64 " connections)", e.what(),
                    got[r].size(), streams);
        }
    }
    if (rails.size() > 1)
        KVX_LOG(info, "tcp: peer '%s': %zu rail(s) of %" PRIu64 " stream(s): %s", pc.peer_id.c_str(), rails.size(),
                streams, [&] {
                    std::string all;
                    for (const auto &r : rails) all += (all.empty() ? "" : "; ") + r.name;
                    return all;
                }().c_str());
    auto peer = std::make_unique<TcpPeer>(ctx, pc, std::move(rails), std::move(conns));
    peer->start();
    return peer;
}

TcpPeer::TcpPeer(const BackendContext &ctx, const PeerContext &pc, std::vector<TcpRail> rails,
                 std::vector<Authenticated> conns)
    : loop_(ctx.loop), ctx_(ctx), pc_(pc), region_(ctx.region), peer_id_(pc.peer_id), sink_(pc.sink),
      rail_paths_(std::move(rails)), alive_(std::make_shared<char>()) {
    // Offered only with several streams or rails, and all go to one target:
    // every connection agreed, or none did.
    fence_ = !conns.empty();
    for (const auto &c : conns) fence_ &= (c.flags & kFlagFence) != 0;
    if (fence_) {
        // Kept for redials: the core's copies may go before this peer does.
        meta_ = *pc.meta;
        section_ = *pc.section;
        pc_.meta = &meta_;
        pc_.section = &section_;
        while (session_ == 0) handshake::random_fill(reinterpret_cast<uint8_t *>(&session_), sizeof session_);
    } else {  // never dialled again: nothing may point at the core's copies
        pc_.meta = nullptr;
        pc_.section = nullptr;
    }
    rail_state_.resize(rail_paths_.size());
    for (size_t r = 0; r < rail_paths_.size(); r++) {
        rail_state_[r].stats.name = rail_paths_[r].name.empty() ? "tcp" : rail_paths_[r].name;
        rail_state_[r].stats.up = false;
        rail_state_[r].stats.changed_ns = realtime_ns();
    }
    for (auto &c : conns) add_stream(std::move(c), false);
}

// A connection becomes a stream (numbered when fencing); join: it sends its
// JOIN now (on the loop thread, the peer started).
void TcpPeer::add_stream(Authenticated c, bool join) {
    auto s = std::make_unique<Stream>(*this, std::move(c.fd), region_);
    if (c.keys) {
        const AeadImpl impl = aead_impl(*ctx_.options);
        s->writer.protect(c.keys->to_target, impl, c.flags & kFlagAeadRecords);
        s->rx = std::make_unique<Aead>(c.keys->to_initiator, false, impl);
    }
    s->rail = c.rail;
    s->index = next_index_++;
    // Every stream taken out so far, too: parts it owed may still be queued.
    s->fenced = 0;
    if (fence_) s->writer.control(Control{kFrameJoin, session_, s->index});
    Stream &st = *s;
    {
        std::lock_guard<std::mutex> lk(mu_);
        streams_.push_back(std::move(s));
        live_++;
        idle_streams_++;
    }
    rail_changed(st.rail, +1, false);
    if (!join) return;
    st.events = EPOLLIN;
    st.token = loop_->attach(st.fd.get(), st.events, &st, 0);
    if (st.token == 0) return;  // the loop is stopping: shutdown fails what is queued
    send_more(st);
}

TcpPeer::~TcpPeer() { shutdown(); }

// On the loop thread: an event of the first stream may fail the peer, which
// must then find every stream's token in place. The JOINs leave at once.
void TcpPeer::start() {
    bool attached = true;
    loop_->call([&] {
        for (auto &s : streams_) {
            s->events = EPOLLIN;
            s->token = loop_->attach(s->fd.get(), s->events, s.get(), 0);
            attached &= s->token != 0;
        }
        if (!attached) return;
        for (size_t i = 0; i < streams_.size(); i++)
            if (streams_[i]->live) send_more(*streams_[i]);
        if (fence_) arm_watch();
    });
    if (!attached) fail(KVX_ECLOSED, "peer '%s': the transport is closing", peer_id_.c_str());
    // Rails that did not connect: dialled again in the background.
    if (fence_)
        for (size_t r = 0; r < rail_paths_.size(); r++) {
            bool none;
            {
                std::lock_guard<std::mutex> lk(stats_mu_);
                none = rail_state_[r].live == 0;
            }
            if (none) redial(r);
        }
}

void TcpPeer::submit(Op op) {
    size_t live;
    {
        std::lock_guard<std::mutex> lk(mu_);
        live = std::max<size_t>(live_, 1);
    }
    std::vector<Part> parts = split_op(std::move(op), live, kSplitMin, region_.block_len);
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
    // By index: a stream that fails may be taken out, and a redial may add one.
    for (size_t i = 0; i < streams_.size(); i++)
        if (streams_[i]->token && streams_[i]->writer.idle()) send_more(*streams_[i]);
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
        if (rc < 0) return lose_stream(s, strfmt("send failed: %s", strerror(-rc)));
        if (rc == 0) return want_writable(s, true);
        // Past the turn's budget, come back on the next writable event.
        if (turn == kTurnBatches) return want_writable(s, true);
        bool more;
        try {
            more = take_batch(s);
        } catch (const Error &e) {  // sealing a control frame failed (OpenSSL)
            KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
            return fail_now(KVX_ECONNRESET);
        }
        if (!more) return want_writable(s, false);
    }
}

// Small parts queued together leave in one sendmsg: fewer syscalls and
// wake-ups per transfer (64 KiB blocks, batch 1).
bool TcpPeer::take_batch(Stream &s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return false;
    // Streams taken out are closed at the target before this one carries
    // anything more: a part they owed may be next in the queue.
    bool fenced = false;
    for (; s.fenced < dead_.size(); s.fenced++, fenced = true) s.writer.control(Control{kFrameFence, session_, dead_[s.fenced]});
    uint64_t bytes = 0;
    size_t n = 0;
    while (!queue_.empty() && n < kBatchParts && (n == 0 || bytes < kBatchBytes)) {
        Part p = std::move(queue_.front());
        queue_.pop_front();
        if (!p.op->try_start()) continue;  // cancelled while queued
        const uint64_t seq = next_seq_++;
        const uint64_t b = p.bytes();
        bytes += b;
        s.awaiting.push_back(Awaiting{p.op, seq, b, fence_ ? p.runs : Runs{}});
        s.writer.add(std::move(p), seq);
        n++;
    }
    if (s.idle != (n == 0)) {
        s.idle = n == 0;
        s.idle ? idle_streams_++ : idle_streams_--;
    }
    return n > 0 || fenced;
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
        if (r == 0 && live_streams() <= 1)
            KVX_LOG(info, "tcp: peer '%s': the target closed the connection", peer_id_.c_str());
        lose_stream(s, r == 0 ? std::string("the target closed the connection")
                              : strfmt("connection lost: %s", strerror(errno)));
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
        uint64_t bytes = 0;
        for (size_t i = 0; i <= n; i++) {
            bytes += s.awaiting.front().bytes;
            done.part_done(*s.awaiting.front().op, 0);
            s.awaiting.pop_front();
        }
        std::lock_guard<std::mutex> lk(stats_mu_);
        RailStats &st = rail_state_[s.rail].stats;
        st.bytes += bytes;
        st.parts += n + 1;
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
    loop_->cancel_timer(watch_.timer);
    watch_.timer = 0;
    {
        std::lock_guard<std::mutex> lk(dial_mu_);
        dial_stop_ = true;
        dial_cancel_ = true;
    }
    dial_cv_.notify_all();
    uint32_t settle_us = 0;
    for (auto &s : streams_) {
        // Bytes in flight: wait for the reset (at least kSettleMin: the 1).
        if (s->fd && (!s->awaiting.empty() || !s->writer.idle()))
            settle_us = std::max({settle_us, net::reset_travel_us(s->fd.get()), 1u});
        for (auto &a : s->awaiting) victims.fail(*a.op, status);
        s->awaiting.clear();
        s->writer.clear();
        if (s->token) loop_->detach(s->token);
        s->token = 0;
        if (s->live) rail_changed(s->rail, -1, false);
        s->live = false;
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
        {
            std::unique_lock<std::mutex> lk(mu_);
            aborted_.wait(lk, [&] { return aborting_ == 0; });
        }
        // fail_on_loop stopped it; a redial under way is called off.
        std::thread dialler;
        {
            std::lock_guard<std::mutex> lk(dial_mu_);
            dialler = std::move(dialler_);
        }
        if (dialler.joinable()) dialler.join();
    });
}

size_t TcpPeer::live_streams() const {
    size_t n = 0;
    for (const auto &s : streams_) n += s->live;
    return n;
}

// Loop thread. Fencing lets a failed stream go while others are left; the
// parts it owed are queued again, first, and go out behind the FENCE every
// other stream sends before its next parts. Otherwise the peer fails.
void TcpPeer::lose_stream(Stream &s, const std::string &why) {
    if (!s.live) return;
    const size_t others = live_streams() - 1;
    if (!fence_ || others == 0 || dead_.size() >= TcpServer::kMaxFenced) {
        if (why != "the target closed the connection") KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), why.c_str());
        return fail_now(KVX_ECONNRESET);
    }
    s.live = false;
    loop_->detach(s.token);
    s.token = 0;
    net::abort_close(s.fd);  // a reset where it still arrives; the FENCE where it does not
    std::vector<Part> owed;
    owed.reserve(s.awaiting.size());
    for (auto &a : s.awaiting) owed.push_back(Part{std::move(a.op), std::move(a.runs)});
    s.awaiting = {};
    s.writer = FrameWriter(region_);  // its buffers go now (the stream object goes at the next watch)
    s.rx.reset();
    s.ack_have = 0;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto it = owed.rbegin(); it != owed.rend(); ++it) queue_.push_front(std::move(*it));
        dead_.push_back(s.index);
        live_--;
        if (s.idle) idle_streams_--;
        s.idle = false;  // never woken again
    }
    const std::string &rail = rail_paths_[s.rail].name;
    KVX_LOG(warn, "tcp: peer '%s': stream %u%s%s taken out: %s; the %zu part(s) it owed go to the %zu other stream(s), "
                  "each of which closes it at the target first",
            peer_id_.c_str(), s.index, rail.empty() ? "" : " over ", rail.c_str(), why.c_str(), owed.size(), others);
    rail_changed(s.rail, -1, true);
    pump();
    redial(s.rail);  // back to tcp.streams connections on it
}

// Loop thread, every kWatchEvery: a stream whose kernel resends into silence
// (two retransmission timeouts in a row without an answer, window probes or
// keepalive probes unanswered) while another stream is not is taken out.
// When every stream is silent the network is, and the stall timeout decides.
void TcpPeer::watch() {
    watch_.timer = 0;
    // Streams taken out are freed here, between rounds of the loop, where
    // nothing of this peer is on the stack.
    std::erase_if(streams_, [](const std::unique_ptr<Stream> &s) { return !s->live && !s->token; });
    std::vector<Stream *> silent, quiet;
    size_t answered = 0;
    const auto now = Clock::now();
    for (auto &s : streams_) {
        if (!s->live || !s->token) continue;
        tcp_info ti{};
        socklen_t len = sizeof ti;
        int unsent = 0;
        if (::getsockopt(s->fd.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
            ::ioctl(s->fd.get(), SIOCOUTQNSD, &unsent) != 0)
            continue;
        const bool resending = ti.tcpi_unacked > 0 && ti.tcpi_retransmits >= 2;
        const bool probes_unanswered = ti.tcpi_probes >= 2 && ti.tcpi_unacked == 0;
        if (resending || probes_unanswered) {
            silent.push_back(s.get());
            continue;
        }
        // Answered: an ACK came lately. One with nothing to say (idle, or
        // everything acknowledged long ago) proves nothing either way.
        if (ti.tcpi_last_ack_recv < kAnsweredWithin.count()) answered++;
        else quiet.push_back(s.get());
        // Parts out, every byte taken by the target's kernel, and no ack for
        // a while: the acks may be lost on a dead path, which shows only once
        // bytes are in flight. A NOP puts some there.
        if (!s->awaiting.empty() && s->writer.idle() && ti.tcpi_unacked == 0 && unsent == 0 &&
            ti.tcpi_last_ack_recv >= kNudgeAfter.count() && now - s->nudged >= kNudgeAfter)
            nudge(*s);
    }
    if (!silent.empty() && answered > 0) {
        for (Stream *s : silent) lose_stream(*s, "its kernel resends into silence while other streams are answered");
    } else if (!silent.empty()) {
        // None answered lately: the quiet ones are asked (a NOP draws an
        // ACK), so the next look can tell a dead path from a dead network.
        for (Stream *s : quiet)
            if (s->live && s->writer.idle() && now - s->nudged >= kNudgeAfter) nudge(*s);
    }
    arm_watch();
}

// A NOP on a stream whose writer is idle; a sealing failure fails the peer.
void TcpPeer::nudge(Stream &s) {
    s.nudged = Clock::now();
    try {
        s.writer.control(Control{kFrameNop, session_, s.index});
    } catch (const Error &e) {
        KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
        return fail_now(KVX_ECONNRESET);
    }
    send_more(s);
}

void TcpPeer::arm_watch() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
    }
    if (watch_.timer == 0 && live_streams() > 1) watch_.timer = loop_->add_timer(Clock::now() + kWatchEvery, &watch_, 0);
    else if (watch_.timer == 0) watch_.timer = loop_->add_timer(Clock::now() + kWatchEvery * 5, &watch_, 0);
}

// A rail with no stream left is dialled again in the background, first after
// peer_redial_ms, then at doubling intervals up to 8 times that, until it
// connects or the peer goes; 0 turns this off.
void TcpPeer::redial(size_t rail) {
    const uint64_t base = ctx_.options->uint("peer_redial_ms");
    if (base == 0) return;
    std::lock_guard<std::mutex> lk(dial_mu_);
    if (dial_stop_ || rail_state_[rail].dialling) return;
    rail_state_[rail].dialling = true;
    dial_queue_.push_back(Dial{rail, Clock::now() + std::chrono::milliseconds(base), 0});
    if (!dialler_.joinable()) dialler_ = std::thread([this] { dial_loop(); });
    dial_cv_.notify_all();
}

void TcpPeer::dial_loop() {
    const std::chrono::milliseconds base(ctx_.options->uint("peer_redial_ms"));
    const std::chrono::milliseconds connect(ctx_.options->uint("connect_timeout_ms"));
    const uint64_t per_rail = ctx_.options->uint("tcp.streams");
    std::unique_lock<std::mutex> lk(dial_mu_);
    Dial d{};
    while (take_due(dial_queue_, lk, dial_cv_, dial_stop_, &d)) {
        lk.unlock();
        size_t live;
        {
            std::lock_guard<std::mutex> g(stats_mu_);
            live = rail_state_[d.rail].live;
        }
        PeerContext pc = pc_;
        pc.deadline = net::Deadline(Clock::now() + connect, &dial_cancel_);
        std::vector<Authenticated> conns;
        std::string err;
        try {
            for (uint64_t i = live; i < per_rail; i++) {
                conns.push_back(open_stream(ctx_, pc, rail_paths_[d.rail], true));
                conns.back().rail = d.rail;
                if (!(conns.back().flags & kFlagFence)) fail(KVX_EVERSION, "the target no longer takes fencing");
            }
        } catch (const Error &e) {
            err = e.what();
        }
        const bool complete = err.empty();
        bool added = false;
        if (!conns.empty()) {
            loop_->call([&] {
                {
                    std::lock_guard<std::mutex> g(mu_);
                    if (stop_) return;
                }
                if (complete) {
                    // Before the streams go live: one lost from here on is
                    // dialled again (redial() skips a rail being dialled).
                    std::lock_guard<std::mutex> g(dial_mu_);
                    rail_state_[d.rail].dialling = false;
                }
                try {
                    for (auto &c : conns) add_stream(std::move(c), true);
                } catch (const Error &e) {  // sealing the JOIN failed (OpenSSL)
                    KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
                    return fail_now(KVX_ECONNRESET);
                }
                added = true;
            });
        }
        lk.lock();
        if (added && complete) {
            KVX_LOG(warn, "tcp: peer '%s': rail %s is back (%d attempt(s)): it carries parts again", peer_id_.c_str(),
                    rail_paths_[d.rail].name.c_str(), d.attempt + 1);
            continue;
        }
        if (dial_stop_) break;
        if (d.attempt == 0)
            KVX_LOG(info, "tcp: peer '%s': rail %s not back yet: %s (dialled again every %lld ms at most)",
                    peer_id_.c_str(), rail_paths_[d.rail].name.c_str(), err.c_str(), (long long)(kRedialMaxFactor * base).count());
        d.attempt++;
        d.due = Clock::now() + base * redial_factor(static_cast<uint32_t>(d.attempt));
        dial_queue_.push_back(d);
    }
}

void TcpPeer::rail_changed(size_t rail, int delta_live, bool failed) {
    std::lock_guard<std::mutex> lk(stats_mu_);
    RailState &r = rail_state_[rail];
    r.live = static_cast<size_t>(static_cast<ptrdiff_t>(r.live) + delta_live);
    if (failed) r.stats.failures++;
    if (r.stats.up != (r.live > 0)) {
        r.stats.up = r.live > 0;
        r.stats.changed_ns = realtime_ns();
    }
}

void TcpPeer::rails(std::vector<RailStats> *out) const {
    if (rail_paths_.size() == 1 && !rail_paths_[0].from) return;  // the one path: no rails (tcp.interfaces unset)
    std::lock_guard<std::mutex> lk(stats_mu_);
    for (const RailState &r : rail_state_) out->push_back(r.stats);
}

}  // namespace kvx::tcp
