// Initiator side of the tcp backend: authenticated streams to one peer, a
// sender and an acknowledgement reader per stream.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/handshake.h"

namespace kvx::tcp {

namespace {

constexpr uint64_t kSplitMin = 1 << 20;  // an op is spread over streams in parts of at least this
constexpr size_t kSendMaxSegs = kFrameMaxSegs - 1;  // + the header iovec <= IOV_MAX
constexpr size_t kSendIovMax = kFrameMaxSegs;       // iovecs per sendmsg (IOV_MAX)
constexpr size_t kSendHeadBytes = 32 << 10;               // frame headers + segment tables per sendmsg
constexpr size_t kBatchParts = 32;                        // parts one sendmsg may carry ...
constexpr uint64_t kBatchBytes = 1 << 20;                 // ... up to about this many bytes

int sendmsg_full(int fd, iovec *iov, size_t cnt) {
    while (cnt > 0) {
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = cnt;
        ssize_t r = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        cnt = net::advance_iov(iov, cnt, static_cast<size_t>(r));
    }
    return 0;
}

// Reads one handshake message (header, then the rest its kind needs) into buf.
int read_message(int fd, handshake::Bytes &buf, size_t *len, Clock::time_point deadline) {
    int rc = net::read_full_by(fd, buf.data(), handshake::kHeaderLen, deadline);
    if (rc != 0) return rc;
    try {
        *len = handshake::message_len(buf.data());
    } catch (const Error &) {
        *len = handshake::kHeaderLen;  // expect_*() report it
        return 0;
    }
    return net::read_full_by(fd, buf.data() + handshake::kHeaderLen, *len - handshake::kHeaderLen, deadline);
}

// The shared handshake on a connected socket: 0, a -errno of the socket, or
// throws Error with the code of a refusal or a failed proof. A target that
// says "no such transport here" (ECONNREFUSED) comes back as -ECONNREFUSED,
// so that the next endpoint is tried.
int authenticate(int fd, const BackendContext &ctx, const PeerContext &pc, const std::string &where) {
    const wire::AgentMetadata &m = *pc.meta;
    handshake::Bytes buf;
    size_t len = 0;
    int rc = net::write_full_by(fd, buf.data(), handshake::encode(handshake::Hello{m.instance_id}, buf.data()), pc.deadline);
    if (rc == 0) rc = read_message(fd, buf, &len, pc.deadline);
    if (rc != 0) return rc;
    handshake::Challenge ch;
    try {
        ch = handshake::expect_challenge(buf.data(), len, where.c_str());
    } catch (const Error &e) {
        if (e.code() == KVX_ECONNREFUSED) return -ECONNREFUSED;  // another transport listens there now
        throw;
    }
    handshake::Auth a = handshake::answer(ch, m.instance_id, m.secret, ctx.identity.fingerprint);
    rc = net::write_full_by(fd, buf.data(), handshake::encode(a, buf.data()), pc.deadline);
    if (rc == 0) rc = read_message(fd, buf, &len, pc.deadline);
    if (rc != 0) return rc;
    handshake::expect_accept(buf.data(), len, ch, a, m.secret, where.c_str());
    return 0;
}

// Opens one authenticated connection to the first endpoint that takes it.
net::Fd open_stream(const BackendContext &ctx, const PeerContext &pc, const std::vector<net::Endpoint> &eps) {
    std::string tried;
    int worst = 0;
    bool refused_only = true;
    for (const net::Endpoint &ep : eps) {
        const std::string where = strfmt("peer '%s' at %s", pc.peer_id.c_str(), ep.str().c_str());
        net::Fd fd;
        int rc = net::connect_by(ep, pc.deadline, &fd);
        if (rc == 0) rc = authenticate(fd.get(), ctx, pc, where);
        if (rc == 0) {
            net::set_blocking(fd.get(), true);
            net::set_nodelay(fd.get());
            KVX_LOG(info, "tcp: connected to %s", where.c_str());
            return fd;
        }
        tried += strfmt("%s%s: %s", tried.empty() ? "" : ", ", ep.str().c_str(), strerror(-rc));
        refused_only &= rc == -ECONNREFUSED;
        if (rc == -ETIMEDOUT) worst = KVX_ETIMEDOUT;
        if (Clock::now() >= pc.deadline) {
            worst = KVX_ETIMEDOUT;
            break;
        }
    }
    int code = worst ? worst : refused_only ? KVX_ECONNREFUSED : KVX_EHOSTUNREACH;
    fail(code, "peer '%s': cannot connect (%s)", pc.peer_id.c_str(), tried.c_str());
}

}  // namespace

std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc) {
    const std::vector<net::Endpoint> eps = decode_section(*pc.section);
    std::vector<net::Fd> fds;
    const uint64_t streams = ctx.options->uint("tcp.streams");
    for (uint64_t i = 0; i < streams; i++) fds.push_back(open_stream(ctx, pc, eps));
    return std::make_unique<TcpPeer>(ctx, pc, std::move(fds));
}

TcpPeer::TcpPeer(const BackendContext &ctx, const PeerContext &pc, std::vector<net::Fd> fds)
    : region_(ctx.region), peer_id_(pc.peer_id), sink_(pc.sink) {
    for (auto &fd : fds) {
        auto s = std::make_unique<Stream>();
        s->fd = std::move(fd);
        s->head.resize(kSendHeadBytes);
        s->iov.resize(kSendIovMax);
        streams_.push_back(std::move(s));
    }
    for (auto &s : streams_) {
        Stream *raw = s.get();
        raw->sender = std::thread([this, raw] { send_loop(raw); });
        raw->acker = std::thread([this, raw] { ack_loop(raw); });
    }
}

TcpPeer::~TcpPeer() { shutdown(); }

void TcpPeer::submit(Op op) {
    std::vector<Part> parts = split_op(std::move(op), streams_.size(), kSplitMin, region_.block_len);
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stop_) {
            for (auto &p : parts) queue_.push_back(std::move(p));
            cv_.notify_all();
            return;
        }
    }
    CompletionBatch out;
    out.fail(*parts.front().op, break_status_.load() ? break_status_.load() : KVX_EPEERBROKEN);
    out.deliver(*sink_);
}

bool TcpPeer::drop_if_not_started(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    OpRef op;
    for (const Part &p : queue_)
        if (p.op->id == id) op = p.op;
    if (!op || !op->claim_unstarted()) return false;
    std::erase_if(queue_, [&](const Part &p) { return p.op == op; });
    return true;
}

void TcpPeer::send_loop(Stream *s) {
    std::vector<Part> batch;
    std::vector<uint64_t> seqs;
    for (;;) {
        batch.clear();
        seqs.clear();
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (stop_) return;
            // Small parts queued together leave in one sendmsg: fewer
            // syscalls and wake-ups per transfer (64 KiB blocks, batch 1).
            uint64_t bytes = 0;
            std::lock_guard<std::mutex> slk(s->mu);
            while (!queue_.empty() && batch.size() < kBatchParts && (batch.empty() || bytes < kBatchBytes)) {
                Part p = std::move(queue_.front());
                queue_.pop_front();
                p.op->started.store(true);
                seqs.push_back(next_seq_++);
                bytes += p.bytes;
                s->awaiting.push_back(Awaiting{p.op, seqs.back()});
                batch.push_back(std::move(p));
            }
        }
        int rc = send_parts(s, batch, seqs);
        if (rc != 0) {
            KVX_LOG(warn, "tcp: peer '%s': send failed: %s", peer_id_.c_str(), strerror(-rc));
            fail_all(KVX_ECONNRESET);
            return;
        }
    }
}

// Writes the frames of several parts with as few sendmsg calls as the iovec
// and header budgets allow. A part's frames are consecutive; its last frame
// asks for the acknowledgement. Each frame's header and segment table are
// contiguous in s->head and travel in one iovec before the frame's data.
int TcpPeer::send_parts(Stream *s, const std::vector<Part> &parts, const std::vector<uint64_t> &seqs) {
    const uint64_t bl = region_.block_len;
    const uint64_t maxp = std::max<uint64_t>(kFrameMaxPayload / bl * bl, bl);
    uint8_t *const heads = s->head.data();
    iovec *const iov = s->iov.data();
    const size_t hcap = s->head.size(), icap = s->iov.size();
    size_t hused = 0, iused = 0;
    auto flush_io = [&]() -> int {
        int rc = iused ? sendmsg_full(s->fd.get(), iov, iused) : 0;
        hused = iused = 0;
        return rc;
    };
    for (size_t pi = 0; pi < parts.size(); pi++) {
        const Part &p = parts[pi];
        size_t ri = 0;
        Run r = p.runs.empty() ? Run{0, 0, 0} : p.runs[0];
        bool last = false;
        while (!last) {
            // Open a frame: room for its header, one segment and its iovecs.
            if (hused + kFrameHeaderLen + kSegLen > hcap || iused + 2 > icap) {
                int rc = flush_io();
                if (rc) return rc;
            }
            const size_t hpos = hused, hiov = iused++;
            hused += kFrameHeaderLen;
            size_t nseg = 0;
            uint64_t total = 0;
            for (;;) {
                if (r.len == 0 && ri + 1 >= p.runs.size()) {
                    last = true;
                    break;
                }
                if (r.len == 0) {
                    r = p.runs[++ri];
                    continue;
                }
                if (nseg == kSendMaxSegs || total == maxp || hused + kSegLen > hcap || iused + 1 > icap) break;
                uint64_t take = std::min(r.len, maxp - total);
                encode_segment(Segment{r.remote_off, take}, heads + hused);
                hused += kSegLen;
                iov[iused++] = iovec{region_.base + r.local_off, take};
                nseg++;
                total += take;
                r.local_off += take;
                r.remote_off += take;
                r.len -= take;
            }
            FrameHeader h;
            h.flags = last ? kFlagAck : 0;
            h.seq = seqs[pi];
            h.nseg = static_cast<uint32_t>(nseg);
            h.total_len = total;
            encode_frame_header(h, heads + hpos);
            iov[hiov] = iovec{heads + hpos, kFrameHeaderLen + nseg * kSegLen};
        }
    }
    return flush_io();
}

void TcpPeer::ack_loop(Stream *s) {
    // Acks are read in batches: one recv returns every ack that has arrived.
    constexpr size_t kBatch = 64;
    uint8_t buf[kBatch * kAckLen];
    size_t have = 0;
    CompletionBatch done;
    for (;;) {
        ssize_t r = ::recv(s->fd.get(), buf + have, sizeof buf - have, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            if (!stop_flag_seen())
                KVX_LOG(warn, "tcp: peer '%s': connection lost: %s", peer_id_.c_str(), r == 0 ? "closed" : strerror(errno));
            fail_all(KVX_ECONNRESET);
            return;
        }
        have += static_cast<size_t>(r);
        size_t used = 0;
        try {
            std::lock_guard<std::mutex> lk(s->mu);
            for (; have - used >= kAckLen; used += kAckLen) {
                Ack a = decode_ack(buf + used);
                if (s->awaiting.empty() || s->awaiting.front().seq != a.seq || a.status != 0)
                    fail(KVX_ECONNRESET, "unexpected acknowledgement %llu", (unsigned long long)a.seq);
                done.part_done(*s->awaiting.front().op, 0);
                s->awaiting.pop_front();
            }
        } catch (const Error &e) {
            done.deliver(*sink_);  // acknowledged before the bad one
            KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
            fail_all(KVX_ECONNRESET);
            return;
        }
        memmove(buf, buf + used, have - used);
        have -= used;
        done.deliver(*sink_);
    }
}

bool TcpPeer::stop_flag_seen() {
    std::lock_guard<std::mutex> lk(mu_);
    return stop_;
}

void TcpPeer::fail_all(int status) {
    CompletionBatch victims;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!broken_.exchange(true)) break_status_.store(status);
        stop_ = true;
        cv_.notify_all();
        for (auto &p : queue_) victims.fail(*p.op, status);
        queue_.clear();
        for (auto &s : streams_) {
            std::lock_guard<std::mutex> slk(s->mu);
            for (auto &a : s->awaiting) victims.fail(*a.op, status);
            s->awaiting.clear();
            ::shutdown(s->fd.get(), SHUT_RDWR);
        }
    }
    victims.deliver(*sink_);
}

void TcpPeer::abort(int status) { fail_all(status); }

void TcpPeer::shutdown() {
    std::call_once(shutdown_once_, [this] {
        fail_all(KVX_ECONNRESET);
        for (auto &s : streams_) {
            if (s->sender.joinable()) s->sender.join();
            if (s->acker.joinable()) s->acker.join();
        }
    });
}

}  // namespace kvx::tcp
