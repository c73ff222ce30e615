// Initiator side of the tcp backend: authenticated streams to one peer, a
// sender and an acknowledgement reader per stream.
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"
#include "wire/frame.h"

namespace kvx::tcp {

namespace {

constexpr uint64_t kSplitMin = 1 << 20;  // an op is spread over streams in parts of at least this
constexpr size_t kSendMaxSegs = wire::kFrameMaxSegs - 1;  // + the header iovec <= IOV_MAX
constexpr size_t kSendIovMax = wire::kFrameMaxSegs;       // iovecs per sendmsg (IOV_MAX)
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
        auto left = static_cast<size_t>(r);
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = static_cast<uint8_t *>(iov->iov_base) + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

// Opens one authenticated connection to the first endpoint that takes it.
net::Fd open_stream(const BackendContext &ctx, const PeerContext &pc) {
    const wire::AgentMetadata &m = *pc.meta;
    std::string tried;
    int worst = 0;
    bool refused_only = true;
    for (const wire::Endpoint &ep : m.tcp) {
        net::Fd fd;
        int rc = net::connect_by(ep, pc.deadline, &fd);
        if (rc == 0) {
            wire::ServerHello sh;
            uint8_t shb[wire::kServerHelloLen];
            rc = net::read_full_by(fd.get(), shb, sizeof shb, pc.deadline);
            if (rc == 0) {
                try {
                    sh = wire::decode_server_hello(shb);
                } catch (const Error &e) {
                    fail(e.code() == KVX_EVERSION ? KVX_EVERSION : KVX_EAUTH, "peer '%s' at %s: %s", pc.peer_id.c_str(),
                         ep.str().c_str(), e.what());
                }
                if (sh.instance_id != m.instance_id) {
                    rc = -ECONNREFUSED;  // another transport listens there now
                } else {
                    wire::ClientHello ch;
                    ch.instance_id = m.instance_id;
                    if (RAND_bytes(ch.nonce.data(), static_cast<int>(ch.nonce.size())) != 1)
                        fail(KVX_EINTERNAL, "RAND_bytes failed");
                    memcpy(ch.fingerprint.data(), ctx.fingerprint.data(), std::min<size_t>(16, ctx.fingerprint.size()));
                    ch.mac = wire::client_mac(m.secret, sh, ch);
                    uint8_t chb[wire::kClientHelloLen];
                    wire::encode_client_hello(ch, chb);
                    uint8_t vb[wire::kVerdictLen];
                    rc = net::write_full_by(fd.get(), chb, sizeof chb, pc.deadline);
                    if (rc == 0) rc = net::read_full_by(fd.get(), vb, sizeof vb, pc.deadline);
                    if (rc == 0) {
                        wire::ServerVerdict v;
                        try {
                            v = wire::decode_verdict(vb);
                        } catch (const Error &e) {
                            fail(KVX_EAUTH, "peer '%s' at %s: %s", pc.peer_id.c_str(), ep.str().c_str(), e.what());
                        }
                        if (v.status != 0) {
                            // Untrusted (the refusal carries no proof): only the
                            // codes a server may send pass through; anything else
                            // reads as an authentication failure.
                            int code = v.status == KVX_EFINGERPRINT || v.status == KVX_EVERSION ? v.status
                                                                                                  : KVX_EAUTH;
                            fail(code, "peer '%s' at %s refused the connection (status %d: %s)", pc.peer_id.c_str(),
                                 ep.str().c_str(), (int)v.status, kvx_strerror(v.status));
                        }
                        if (CRYPTO_memcmp(wire::server_mac(m.secret, sh, ch).data(), v.mac.data(), wire::kMacLen) != 0)
                            fail(KVX_EAUTH, "peer '%s' at %s could not prove it holds the metadata's secret",
                                 pc.peer_id.c_str(), ep.str().c_str());
                        net::set_blocking(fd.get(), true);
                        net::set_nodelay(fd.get());
                        KVX_LOG(info, "tcp: connected to peer '%s' at %s", pc.peer_id.c_str(), ep.str().c_str());
                        return fd;
                    }
                }
            }
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
    if (pc.meta->tcp.empty())
        fail(KVX_ENOTSUP, "peer '%s' offers no tcp endpoint (its backend is %s)", pc.peer_id.c_str(),
             wire::backend_kind_name(pc.meta->backend));
    std::vector<net::Fd> fds;
    for (uint32_t i = 0; i < ctx.options->tcp_streams; i++) fds.push_back(open_stream(ctx, pc));
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
    auto st = std::make_shared<OpState>();
    st->id = op.id;
    std::vector<Part> parts;
    uint64_t nparts = std::min<uint64_t>(streams_.size(), std::max<uint64_t>(1, op.bytes / kSplitMin));
    if (nparts <= 1) {
        parts.push_back(Part{st, std::move(op.runs), 0});
    } else {
        const uint64_t bl = region_.block_len;
        uint64_t target = (op.bytes / nparts + bl - 1) / bl * bl;
        Part cur{st, {}, 0};
        uint64_t cur_bytes = 0;
        for (Run r : op.runs) {
            while (r.len > 0) {
                uint64_t take = std::min(r.len, target - cur_bytes);
                cur.runs.push_back(Run{r.local_off, r.remote_off, take});
                r.local_off += take;
                r.remote_off += take;
                r.len -= take;
                cur_bytes += take;
                if (cur_bytes == target) {
                    parts.push_back(std::move(cur));
                    cur = Part{st, {}, 0};
                    cur_bytes = 0;
                }
            }
        }
        if (!cur.runs.empty()) parts.push_back(std::move(cur));
    }
    st->parts_left.store(static_cast<int>(parts.size()));
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!stop_) {
            for (auto &p : parts) queue_.push_back(std::move(p));
            cv_.notify_all();
            return;
        }
    }
    finish_part(parts.front(), break_status_.load() ? break_status_.load() : KVX_EPEERBROKEN);
}

bool TcpPeer::drop_if_not_started(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    bool found = false;
    for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->op->id != id) {
            ++it;
            continue;
        }
        if (it->op->started.load()) return false;
        found = true;
        it->op->reported.store(true);
        it = queue_.erase(it);
    }
    return found;
}

void TcpPeer::send_loop(Stream *s) {
    std::vector<Part> batch;
    for (;;) {
        batch.clear();
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
                p.seq = next_seq_++;
                for (const Run &r : p.runs) bytes += r.len;
                s->awaiting.push_back(Part{p.op, {}, p.seq});
                batch.push_back(std::move(p));
            }
        }
        int rc = send_parts(s, batch);
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
int TcpPeer::send_parts(Stream *s, const std::vector<Part> &parts) {
    const uint64_t bl = region_.block_len;
    const uint64_t maxp = std::max<uint64_t>(wire::kFrameMaxPayload / bl * bl, bl);
    uint8_t *const heads = s->head.data();
    iovec *const iov = s->iov.data();
    const size_t hcap = s->head.size(), icap = s->iov.size();
    size_t hused = 0, iused = 0;
    auto flush_io = [&]() -> int {
        int rc = iused ? sendmsg_full(s->fd.get(), iov, iused) : 0;
        hused = iused = 0;
        return rc;
    };
    for (const Part &p : parts) {
        size_t ri = 0;
        Run r = p.runs.empty() ? Run{0, 0, 0} : p.runs[0];
        bool last = false;
        while (!last) {
            // Open a frame: room for its header, one segment and its iovecs.
            if (hused + wire::kFrameHeaderLen + wire::kSegLen > hcap || iused + 2 > icap) {
                int rc = flush_io();
                if (rc) return rc;
            }
            const size_t hpos = hused, hiov = iused++;
            hused += wire::kFrameHeaderLen;
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
                if (nseg == kSendMaxSegs || total == maxp || hused + wire::kSegLen > hcap || iused + 1 > icap) break;
                uint64_t take = std::min(r.len, maxp - total);
                wire::encode_segment(wire::Segment{r.remote_off, take}, heads + hused);
                hused += wire::kSegLen;
                iov[iused++] = iovec{region_.base + r.local_off, take};
                nseg++;
                total += take;
                r.local_off += take;
                r.remote_off += take;
                r.len -= take;
            }
            wire::FrameHeader h;
            h.flags = last ? wire::kFlagAck : 0;
            h.seq = p.seq;
            h.nseg = static_cast<uint32_t>(nseg);
            h.total_len = total;
            wire::encode_frame_header(h, heads + hpos);
            iov[hiov] = iovec{heads + hpos, wire::kFrameHeaderLen + nseg * wire::kSegLen};
        }
    }
    return flush_io();
}

void TcpPeer::ack_loop(Stream *s) {
    // Acks are read in batches: one recv returns every ack that has arrived.
    constexpr size_t kBatch = 64;
    uint8_t buf[kBatch * wire::kAckLen];
    size_t have = 0;
    std::vector<Part> done;
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
            for (; have - used >= wire::kAckLen; used += wire::kAckLen) {
                wire::Ack a = wire::decode_ack(buf + used);
                if (s->awaiting.empty() || s->awaiting.front().seq != a.seq || a.status != 0)
                    fail(KVX_ECONNRESET, "unexpected acknowledgement %llu", (unsigned long long)a.seq);
                done.push_back(std::move(s->awaiting.front()));
                s->awaiting.pop_front();
            }
        } catch (const Error &e) {
            for (auto &p : done) finish_part(p, 0);  // acknowledged before the bad one
            KVX_LOG(warn, "tcp: peer '%s': %s", peer_id_.c_str(), e.what());
            fail_all(KVX_ECONNRESET);
            return;
        }
        memmove(buf, buf + used, have - used);
        have -= used;
        for (auto &p : done) finish_part(p, 0);
        done.clear();
    }
}

bool TcpPeer::stop_flag_seen() {
    std::lock_guard<std::mutex> lk(mu_);
    return stop_;
}

void TcpPeer::finish_part(const Part &p, int status) {
    if (status != 0) {
        if (!p.op->reported.exchange(true)) sink_->complete(p.op->id, status);
        return;
    }
    if (p.op->parts_left.fetch_sub(1) == 1 && !p.op->reported.exchange(true)) sink_->complete(p.op->id, 0);
}

void TcpPeer::fail_all(int status) {
    std::vector<Part> victims;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!broken_.exchange(true)) break_status_.store(status);
        stop_ = true;
        cv_.notify_all();
        for (auto &p : queue_) victims.push_back(std::move(p));
        queue_.clear();
        for (auto &s : streams_) {
            std::lock_guard<std::mutex> slk(s->mu);
            for (auto &p : s->awaiting) victims.push_back(std::move(p));
            s->awaiting.clear();
            ::shutdown(s->fd.get(), SHUT_RDWR);
        }
    }
    for (auto &p : victims) finish_part(p, status);
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
