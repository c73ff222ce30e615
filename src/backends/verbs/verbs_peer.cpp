// Initiator side of the verbs backend: authenticated RC connections to one
// peer and the data path. Every Run becomes one RDMA WRITE WR (split at the
// port's max_msg_sz) with one SGE; a transfer's WRs go to the send queue as
// one chained list. What does not fit waits in a software queue and is posted
// by the progress thread as completions free send-queue slots.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "backends/verbs/verbs.h"
#include "handshake/handshake.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

namespace {

constexpr uint64_t kDrainWrId = UINT64_MAX;   // shutdown's marker WR
constexpr uint64_t kSplitMin = 256 << 10;     // with several QPs, ops of 2x this are spread over them
constexpr int kMaxAuthRounds = 3;             // fresh challenges accepted before giving up
constexpr int kCqPollBatch = 32;
enum { kTagCq = 1, kTagCm = 2 };

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    return left > INT32_MAX ? INT32_MAX : static_cast<int>(left);
}

bool ends_connection(rdma_cm_event_type t) {
    return t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL || t == RDMA_CM_EVENT_CONNECT_ERROR ||
           t == RDMA_CM_EVENT_UNREACHABLE || t == RDMA_CM_EVENT_REJECTED;
}

// Destroys a cm_id (and its QP) unless released: connect's error paths.
struct IdGuard {
    rdma_cm_id *id = nullptr;
    IdGuard() = default;
    IdGuard(const IdGuard &) = delete;
    IdGuard &operator=(const IdGuard &) = delete;
    ~IdGuard() {
        if (!id) return;
        if (id->qp) rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
    rdma_cm_id *release() {
        rdma_cm_id *r = id;
        id = nullptr;
        return r;
    }
};

struct CmEv {
    rdma_cm_event_type type;
    int status;
    std::vector<uint8_t> pdata;
};

}  // namespace

int connect_failure_code(rdma_cm_event_type type, int status) {
    switch (type) {
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR: return KVX_ECONNREFUSED;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE: return status == -ETIMEDOUT ? KVX_ETIMEDOUT : KVX_EHOSTUNREACH;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return KVX_ECONNRESET;
    default: return KVX_ECONNREFUSED;
    }
}

// ------------------------------------------------------------------ connect

VerbsPeer::VerbsPeer(std::shared_ptr<Device> dev, EventLoop *loop, const PeerConfig &cfg,
                     const PeerContext &pc)
    : dev_(std::move(dev)), loop_(loop), cfg_(cfg), peer_id_(pc.peer_id), sink_(pc.sink) {
    const SectionInfo v = decode_section(*pc.section, *pc.meta);
    where_ = strfmt("peer '%s' at %s", peer_id_.c_str(), v.cm.str().c_str());
    cm_ = v.cm;
    remote_addr_ = v.mr_addr;
    rkey_ = v.rkey;
    wr_buf_.resize(cfg_.sq_depth);
    sge_buf_.resize(cfg_.sq_depth);
}

VerbsPeer::~VerbsPeer() { shutdown(); }

std::unique_ptr<VerbsPeer> VerbsPeer::dial(const BackendContext &ctx, std::shared_ptr<Device> dev,
                                           EventLoop *loop, const PeerConfig &cfg,
                                           const PeerContext &pc) {
    std::unique_ptr<VerbsPeer> p(new VerbsPeer(std::move(dev), loop, cfg, pc));
    try {
        p->setup_channels();
        for (uint32_t i = 0; i < cfg.qps; i++) p->connect_qp(ctx, pc, i);
    } catch (...) {
        p->shutdown();  // not started: tears down what exists, calls no sink
        throw;
    }
    KVX_LOG(info, "verbs: connected to %s with %u QP(s) on %s port %u", p->where_.c_str(), cfg.qps,
            p->dev_->name.c_str(), p->qps_.front().id->port_num);
    return p;
}

void VerbsPeer::setup_channels() {
    cm_ch_ = rdma_create_event_channel();
    if (!cm_ch_) fail(KVX_EBACKEND, "verbs: rdma_create_event_channel: %s", strerror(errno));
    net::set_nonblocking(cm_ch_->fd, "rdma_cm event channel");
    comp_ch_ = ibv_create_comp_channel(dev_->ctx);
    if (!comp_ch_) fail(KVX_EBACKEND, "verbs: ibv_create_comp_channel: %s", strerror(errno));
    net::set_nonblocking(comp_ch_->fd, "completion channel");
    // One CQ per peer: its lifetime is the peer's, so removing a peer never
    // leaves stale completions in a shared CQ, and a broken peer's flushes
    // cannot crowd out another peer's completions. Every WR may complete
    // (flushes complete unsignalled WRs too), plus one drain marker per QP.
    int cqe = static_cast<int>(cfg_.qps * (cfg_.sq_depth + 1));
    cq_ = ibv_create_cq(dev_->ctx, cqe, this, comp_ch_, 0);
    if (!cq_) fail(KVX_EBACKEND, "verbs: ibv_create_cq(%d): %s", cqe, strerror(errno));
    if (ibv_req_notify_cq(cq_, 0) != 0) fail(KVX_EBACKEND, "verbs: ibv_req_notify_cq failed");
}

void VerbsPeer::connect_qp(const BackendContext &ctx, const PeerContext &pc, size_t index) {
    const wire::AgentMetadata &m = *pc.meta;
    const Clock::time_point deadline = pc.deadline;

    // Next event of id; events of the peer's earlier QPs are handled in passing.
    auto wait_for = [&](rdma_cm_id *id, const char *what) -> CmEv {
        for (;;) {
            rdma_cm_event *ev = nullptr;
            if (rdma_get_cm_event(cm_ch_, &ev) == 0) {
                CmEv out{ev->event, ev->status, {}};
                bool conn = ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_ESTABLISHED ||
                            ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE;
                if (conn && ev->param.conn.private_data && ev->param.conn.private_data_len) {
                    const auto *b = static_cast<const uint8_t *>(ev->param.conn.private_data);
                    out.pdata.assign(b, b + ev->param.conn.private_data_len);
                }
                rdma_cm_id *eid = ev->id;
                rdma_ack_cm_event(ev);
                if (eid == id) return out;
                if (ends_connection(out.type))
                    fail(KVX_ECONNRESET, "%s: an earlier connection closed while connecting QP %zu (%s)",
                         where_.c_str(), index, rdma_event_str(out.type));
                continue;
            }
            if (errno != EAGAIN && errno != EINTR)
                fail(KVX_EBACKEND, "verbs: rdma_get_cm_event: %s", strerror(errno));
            int ms = remaining_ms(deadline);
            if (ms == 0) fail(KVX_ETIMEDOUT, "%s: no answer within the connect timeout (%s)", where_.c_str(), what);
            pollfd pfd{cm_ch_->fd, POLLIN, 0};
            ::poll(&pfd, 1, ms);
        }
    };
    auto expect = [&](const CmEv &e, rdma_cm_event_type want, const char *what) {
        if (e.type == want) return;
        fail(connect_failure_code(e.type, e.status), "%s: %s failed: %s (status %d)", where_.c_str(), what,
             rdma_event_str(e.type), e.status);
    };
    // A fresh cm_id, address and route resolved; from our RDMA address, so
    // the connection uses the device that holds our MR.
    auto resolve = [&](IdGuard &g) {
        if (rdma_create_id(cm_ch_, &g.id, this, RDMA_PS_TCP) != 0)
            fail(KVX_EBACKEND, "verbs: rdma_create_id: %s", strerror(errno));
        socklen_t dlen = 0;
        sockaddr_storage dst = net::from_endpoint(cm_, &dlen);
        sockaddr_storage src = dev_->addr;
        int ms = std::max(1, remaining_ms(deadline));
        if (rdma_resolve_addr(g.id, src.ss_family == dst.ss_family ? reinterpret_cast<sockaddr *>(&src) : nullptr,
                              reinterpret_cast<sockaddr *>(&dst), ms) != 0)
            fail(KVX_EHOSTUNREACH, "%s: rdma_resolve_addr: %s", where_.c_str(), strerror(errno));
        expect(wait_for(g.id, "address resolution"), RDMA_CM_EVENT_ADDR_RESOLVED, "address resolution");
        if (g.id->verbs != dev_->ctx)
            fail(KVX_EHOSTUNREACH, "%s is reached through device %s, but the region is registered on %s",
                 where_.c_str(), g.id->verbs ? ibv_get_device_name(g.id->verbs->device) : "?", dev_->name.c_str());
        ms = std::max(1, remaining_ms(deadline));
        if (rdma_resolve_route(g.id, ms) != 0)
            fail(KVX_EHOSTUNREACH, "%s: rdma_resolve_route: %s", where_.c_str(), strerror(errno));
        expect(wait_for(g.id, "route resolution"), RDMA_CM_EVENT_ROUTE_RESOLVED, "route resolution");
    };
    auto base_param = [](rdma_conn_param &cp, const void *pd, size_t len) {
        cp = rdma_conn_param{};
        cp.private_data = pd;
        cp.private_data_len = static_cast<uint8_t>(len);
        cp.responder_resources = 0;  // write-only: no RDMA READ/atomic resources either way
        cp.initiator_depth = 0;
        cp.retry_count = 7;
        cp.rnr_retry_count = 7;
    };
    // A challenge from the target, out of REJECT private data; anything
    // else that does not decode is a reject by something that is no kvxfer
    // target (nobody listening: IB CM pads its private data with zeros).
    auto parse_reject = [&](const CmEv &e, const char *what) -> handshake::Challenge {
        try {
            handshake::decode(e.pdata.data(), e.pdata.size());
        } catch (const Error &) {
            fail(KVX_ECONNREFUSED, "%s refused the connection (%s, reject reason %d)", where_.c_str(), what, e.status);
        }
        return handshake::expect_challenge(e.pdata.data(), e.pdata.size(), where_.c_str());
    };

    // 1. HELLO: the target rejects it with a fresh challenge. No QP yet.
    handshake::Challenge ch;
    {
        IdGuard g;
        resolve(g);
        handshake::Bytes hb;
        rdma_conn_param cp;
        base_param(cp, hb.data(), handshake::encode(handshake::Hello{m.instance_id}, hb.data()));
        cp.qp_num = 1;  // no QP exists: the target never accepts a HELLO
        if (rdma_connect(g.id, &cp) != 0) fail(KVX_EBACKEND, "%s: rdma_connect: %s", where_.c_str(), strerror(errno));
        CmEv e = wait_for(g.id, "HELLO");
        if (e.type == RDMA_CM_EVENT_CONNECT_RESPONSE || e.type == RDMA_CM_EVENT_ESTABLISHED)
            fail(KVX_EAUTH, "%s accepted an unauthenticated HELLO: not a kvxfer verbs target", where_.c_str());
        if (e.type != RDMA_CM_EVENT_REJECTED)
            fail(connect_failure_code(e.type, e.status), "%s: connect failed: %s (status %d)", where_.c_str(),
                 rdma_event_str(e.type), e.status);
        ch = parse_reject(e, "HELLO");
    }

    // 2. AUTH with the QP: the target verifies before it creates its own QP.
    for (int round = 1;; round++) {
        IdGuard g;
        resolve(g);
        ibv_qp_init_attr qa{};
        qa.send_cq = cq_;
        qa.recv_cq = cq_;
        qa.qp_type = IBV_QPT_RC;
        qa.sq_sig_all = 0;  // selective signalling
        qa.cap.max_send_wr = cfg_.sq_depth + 1;  // +1: shutdown's drain marker
        qa.cap.max_recv_wr = 1;
        qa.cap.max_send_sge = 1;  // one SGE per WR (a Run is contiguous locally)
        qa.cap.max_recv_sge = 1;
        if (rdma_create_qp(g.id, dev_->pd, &qa) != 0)
            fail(KVX_EBACKEND, "%s: rdma_create_qp (send queue %u): %s", where_.c_str(), cfg_.sq_depth + 1,
                 strerror(errno));
        handshake::Auth a = handshake::answer(ch, m.instance_id, m.secret, ctx.identity.fingerprint);
        handshake::Bytes ab;
        rdma_conn_param cp;
        base_param(cp, ab.data(), handshake::encode(a, ab.data()));
        if (rdma_connect(g.id, &cp) != 0) fail(KVX_EBACKEND, "%s: rdma_connect: %s", where_.c_str(), strerror(errno));
        CmEv e = wait_for(g.id, "AUTH");
        if (e.type == RDMA_CM_EVENT_REJECTED) {
            ch = parse_reject(e, "AUTH");  // returns only for a new challenge
            if (round >= kMaxAuthRounds)
                fail(KVX_EAUTH, "%s keeps challenging (%d rounds)", where_.c_str(), round);
            continue;
        }
        if (e.type != RDMA_CM_EVENT_ESTABLISHED)
            fail(connect_failure_code(e.type, e.status), "%s: connect failed: %s (status %d)", where_.c_str(),
                 rdma_event_str(e.type), e.status);
        handshake::expect_accept(e.pdata.data(), e.pdata.size(), ch, a, m.secret, where_.c_str());
        // rdma_cm granted our QP remote write access too; nobody may use it.
        ibv_qp_attr at{};
        at.qp_access_flags = 0;
        if (ibv_modify_qp(g.id->qp, &at, IBV_QP_ACCESS_FLAGS) != 0)
            KVX_LOG(debug, "verbs: cannot drop remote access of an outbound QP: %s", strerror(errno));
        Qp q;
        q.qp = g.id->qp;
        q.id = g.release();
        KVX_LOG(debug, "verbs: %s: QP %zu (qp %u) authenticated", where_.c_str(), index, q.qp->qp_num);
        qps_.push_back(std::move(q));
        return;
    }
}

bool VerbsPeer::start() {
    tok_cq_ = loop_->attach(comp_ch_->fd, EPOLLIN, this, kTagCq);
    tok_cm_ = loop_->attach(cm_ch_->fd, EPOLLIN, this, kTagCm);
    if (tok_cq_ && tok_cm_) return true;
    loop_->detach(tok_cq_);
    loop_->detach(tok_cm_);
    tok_cq_ = tok_cm_ = 0;
    return false;
}

// ------------------------------------------------------------------ data path

uint64_t VerbsPeer::wrs_for(const std::vector<Run> &runs) const {
    uint64_t n = 0;
    for (const Run &r : runs) n += (r.len + dev_->max_msg - 1) / dev_->max_msg;
    return n;
}

void VerbsPeer::submit(Op op) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (broken_ || stopping_ || op.runs.empty()) {
        out.add(op.id, op.runs.empty() ? 0 : stopping_ ? KVX_ECONNRESET : KVX_EPEERBROKEN);
        deliver(lk, out);
        return;
    }
    // Least loaded QPs first.
    std::vector<size_t> order(qps_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return qps_[a].used + qps_[a].waiting_wrs < qps_[b].used + qps_[b].waiting_wrs;
    });
    std::vector<Part> parts = split_op(std::move(op), qps_.size(), kSplitMin, dev_->region.block_len);
    for (size_t i = 0; i < parts.size(); i++) {
        Qp &q = qps_[order[i % order.size()]];
        QueuedPart queued;
        queued.wrs_left = wrs_for(parts[i].runs);
        queued.part = std::move(parts[i]);
        q.waiting_wrs += queued.wrs_left;
        q.waiting.push_back(std::move(queued));
    }
    for (size_t i = 0; i < parts.size() && i < order.size(); i++) post_ready(qps_[order[i]], out);
    deliver(lk, out);
}

// Posts waiting WRs while the send queue has room: each part's WRs (or as
// many as fit) as one chain with one ibv_post_send. Signalled: the last WR of
// a part, and every signal_every-th WR so slots keep coming back. mu_ held.
void VerbsPeer::post_ready(Qp &q, CompletionBatch &out) {
    const uint32_t depth = cfg_.sq_depth;
    while (!broken_ && !q.dead && !q.waiting.empty() && q.used < depth) {
        QueuedPart &p = q.waiting.front();
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(depth - q.used, p.wrs_left));
        const size_t marks_before = q.marks.size();
        uint32_t since = q.since_signal;
        uint64_t seq = q.next_seq;
        size_t run = p.run;
        uint64_t off = p.off;
        for (uint32_t i = 0; i < n; i++) {
            const Run &r = p.part.runs[run];
            const uint64_t len = std::min(r.len - off, dev_->max_msg);
            ibv_sge &s = sge_buf_[i];
            s.addr = reinterpret_cast<uintptr_t>(dev_->region.base) + r.local_off + off;
            s.length = static_cast<uint32_t>(len);
            s.lkey = dev_->lkey;
            ibv_send_wr &w = wr_buf_[i];
            w = ibv_send_wr{};
            w.sg_list = &s;
            w.num_sge = 1;
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr.rdma.remote_addr = remote_addr_ + r.remote_off + off;
            w.wr.rdma.rkey = rkey_;
            w.next = i + 1 < n ? &wr_buf_[i + 1] : nullptr;
            off += len;
            if (off == r.len) {
                run++;
                off = 0;
            }
            since++;
            const bool part_end = i + 1 == n && n == p.wrs_left;
            if (part_end || since >= cfg_.signal_every) {
                w.send_flags = IBV_SEND_SIGNALED;
                w.wr_id = seq;
                q.marks.push_back(Mark{seq, since, part_end ? p.part.op : nullptr});
                seq++;
                since = 0;
            }
        }
        ibv_send_wr *bad = nullptr;
        int rc = ibv_post_send(q.qp, wr_buf_.data(), &bad);
        if (rc != 0) {
            // Whatever was posted before bad flushes with the QP; track none of it.
            q.marks.erase(q.marks.begin() + static_cast<std::ptrdiff_t>(marks_before), q.marks.end());
            KVX_LOG(warn, "verbs: %s: ibv_post_send of %u WRs: %s", where_.c_str(), n, strerror(rc));
            set_broken(KVX_ECONNRESET);
            q.dead = true;
            to_error(q);
            fail_inflight(q, break_status_, out);
            fail_waiting(q, break_status_, out);
            for (Qp &o : qps_) fail_waiting(o, break_status_, out);
            return;
        }
        p.part.op->started.store(true);
        q.used += n;
        q.since_signal = since;
        q.next_seq = seq;
        p.run = run;
        p.off = off;
        p.wrs_left -= n;
        q.waiting_wrs -= n;
        if (p.wrs_left == 0) q.waiting.pop_front();
    }
}

bool VerbsPeer::drop_if_not_started(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    OpRef op;
    for (Qp &q : qps_)
        for (QueuedPart &p : q.waiting)
            if (p.part.op->id == id) op = p.part.op;
    if (!op || !op->claim_unstarted()) return false;  // claimed: never reaches the sink
    for (Qp &q : qps_)
        for (auto it = q.waiting.begin(); it != q.waiting.end();) {
            if (it->part.op == op) {
                q.waiting_wrs -= it->wrs_left;
                it = q.waiting.erase(it);
            } else {
                ++it;
            }
        }
    return true;
}

void VerbsPeer::fail_waiting(Qp &q, int status, CompletionBatch &out) {
    for (QueuedPart &p : q.waiting) out.fail(*p.part.op, status);
    q.waiting.clear();
    q.waiting_wrs = 0;
}

void VerbsPeer::fail_inflight(Qp &q, int status, CompletionBatch &out) {
    // Marks without op belong to parts still (partly) waiting: failed there.
    for (Mark &mk : q.marks)
        if (mk.op) out.fail(*mk.op, status);
    q.marks.clear();
    q.used = 0;  // the WRs are flushing; a dead QP is never posted to again
    q.since_signal = 0;
}

void VerbsPeer::set_broken(int status) {
    if (broken_) return;
    broken_ = true;
    break_status_ = status;
    broken_flag_.store(true, std::memory_order_release);
}

void VerbsPeer::to_error(Qp &q) {
    if (!q.qp) return;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(q.qp, &a, IBV_QP_STATE) != 0)
        KVX_LOG(debug, "verbs: %s: modify QP %u to ERR: %s", where_.c_str(), q.qp->qp_num, strerror(errno));
}

// Calls the sink for out without holding mu_; shutdown() waits for these.
void VerbsPeer::deliver(std::unique_lock<std::mutex> &lk, CompletionBatch &out) {
    if (out.empty()) return;
    delivering_++;
    lk.unlock();
    out.deliver(*sink_);
    lk.lock();
    if (--delivering_ == 0) cv_.notify_all();
}

void VerbsPeer::handle_wc(const ibv_wc &wc, CompletionBatch &out) {
    Qp *q = nullptr;
    for (Qp &c : qps_)
        if (c.qp && c.qp->qp_num == wc.qp_num) q = &c;
    if (!q || wc.wr_id == kDrainWrId) return;
    if (wc.status == IBV_WC_SUCCESS) {
        // RC completes in order: this WR and everything posted before it are done.
        while (!q->marks.empty() && q->marks.front().seq <= wc.wr_id) {
            Mark &mk = q->marks.front();
            q->used -= mk.wrs;
            if (mk.op) out.part_done(*mk.op, 0);
            q->marks.pop_front();
        }
        return;
    }
    // The first error fails this QP's transfers from the oldest unfinished
    // on; the rest of its queue flushes. Other QPs finish what they posted.
    if (!q->dead) {
        if (!broken_)
            KVX_LOG(warn, "verbs: %s: %s (vendor error 0x%x) on QP %u; the peer is broken until re-added",
                    where_.c_str(), ibv_wc_status_str(wc.status), wc.vendor_err, wc.qp_num);
        set_broken(KVX_ECONNRESET);
        q->dead = true;
        to_error(*q);
    }
    fail_inflight(*q, break_status_, out);
    for (Qp &o : qps_) fail_waiting(o, break_status_, out);
}

void VerbsPeer::on_event(int tag, uint32_t) {
    if (tag == kTagCq) on_cq_event();
    else on_cm_event();
}

void VerbsPeer::on_cq_event() {
    ibv_cq *cq = nullptr;
    void *cq_ctx = nullptr;
    while (ibv_get_cq_event(comp_ch_, &cq, &cq_ctx) == 0) cq_unacked_++;
    if (cq_unacked_) {
        ibv_ack_cq_events(cq_, cq_unacked_);
        cq_unacked_ = 0;
    }
    // Re-arm first, then drain: a completion after the last poll raises a new event.
    if (ibv_req_notify_cq(cq_, 0) != 0) KVX_LOG(error, "verbs: %s: ibv_req_notify_cq failed", where_.c_str());
    ibv_wc wc[kCqPollBatch];
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        int n = ibv_poll_cq(cq_, kCqPollBatch, wc);
        if (n < 0) {
            KVX_LOG(error, "verbs: %s: ibv_poll_cq failed", where_.c_str());
            set_broken(KVX_EBACKEND);
            for (Qp &q : qps_) {
                q.dead = true;
                to_error(q);
                fail_inflight(q, break_status_, out);
                fail_waiting(q, break_status_, out);
            }
            deliver(lk, out);
            return;
        }
        for (int i = 0; i < n; i++) handle_wc(wc[i], out);
        for (Qp &q : qps_) post_ready(q, out);  // slots came back: software queue -> send queue
        deliver(lk, out);
        if (n < kCqPollBatch) return;
    }
}

void VerbsPeer::on_cm_event() {
    for (;;) {
        rdma_cm_event *ev = nullptr;
        if (rdma_get_cm_event(cm_ch_, &ev) != 0) return;
        rdma_cm_event_type type = ev->event;
        rdma_ack_cm_event(ev);
        if (!ends_connection(type)) continue;
        CompletionBatch out;
        std::unique_lock<std::mutex> lk(mu_);
        if (stopping_) continue;
        if (!broken_) KVX_LOG(warn, "verbs: %s: connection lost (%s)", where_.c_str(), rdma_event_str(type));
        set_broken(KVX_ECONNRESET);
        // Not yet posted: fail now. Posted: ERR flushes them through the CQ,
        // after the completions of whatever did finish.
        for (Qp &q : qps_) {
            fail_waiting(q, break_status_, out);
            to_error(q);
        }
        deliver(lk, out);
    }
}

void VerbsPeer::abort(int status) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (stopping_) return;
    set_broken(status);
    for (Qp &q : qps_) {
        q.dead = true;
        to_error(q);  // everything posted flushes; those completions find nothing to report
        fail_inflight(q, status, out);
        fail_waiting(q, status, out);
    }
    deliver(lk, out);
}

void VerbsPeer::shutdown() {
    std::call_once(shutdown_once_, [this] {
        loop_->detach(tok_cq_);  // from here on the progress thread never calls us
        loop_->detach(tok_cm_);
        tok_cq_ = tok_cm_ = 0;
        {
            CompletionBatch out;
            std::unique_lock<std::mutex> lk(mu_);
            stopping_ = true;
            set_broken(KVX_ECONNRESET);
            for (Qp &q : qps_) {
                fail_inflight(q, KVX_ECONNRESET, out);
                fail_waiting(q, KVX_ECONNRESET, out);
            }
            deliver(lk, out);
            cv_.wait(lk, [&] { return delivering_ == 0; });  // e.g. an abort() delivering right now
        }
        teardown();
    });
}

// Disconnect, drain, destroy. Runs with the peer detached and idle.
void VerbsPeer::teardown() {
    for (Qp &q : qps_) {
        if (q.id) rdma_disconnect(q.id);  // DREQ; moves the QP to ERR on IB/RoCE
        to_error(q);                      // iWARP only goes to SQD there
    }
    // A signalled marker behind everything on each QP: once it completes
    // (flushed), the device no longer touches the region for this peer.
    int want = 0;
    for (Qp &q : qps_) {
        if (!q.qp) continue;
        ibv_send_wr w{};
        w.wr_id = kDrainWrId;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = IBV_SEND_SIGNALED;
        w.wr.rdma.remote_addr = remote_addr_;
        w.wr.rdma.rkey = rkey_;
        ibv_send_wr *bad = nullptr;
        if (ibv_post_send(q.qp, &w, &bad) == 0) want++;
    }
    auto until = Clock::now() + std::chrono::seconds(2);
    ibv_wc wc[kCqPollBatch];
    while (want > 0 && cq_ && Clock::now() < until) {
        int n = ibv_poll_cq(cq_, kCqPollBatch, wc);
        if (n < 0) break;
        for (int i = 0; i < n; i++) want -= wc[i].wr_id == kDrainWrId;
        if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (want > 0) KVX_LOG(warn, "verbs: %s: %d QP(s) did not drain within 2 s", where_.c_str(), want);
    for (Qp &q : qps_) {
        if (!q.id) continue;
        if (q.id->qp) rdma_destroy_qp(q.id);
        rdma_destroy_id(q.id);
        q.id = nullptr;
        q.qp = nullptr;
    }
    if (cq_) {
        if (cq_unacked_) ibv_ack_cq_events(cq_, cq_unacked_);
        cq_unacked_ = 0;
        if (int rc = ibv_destroy_cq(cq_)) KVX_LOG(error, "verbs: ibv_destroy_cq: %s", strerror(rc));
        cq_ = nullptr;
    }
    if (comp_ch_) {
        ibv_destroy_comp_channel(comp_ch_);
        comp_ch_ = nullptr;
    }
    if (cm_ch_) {
        rdma_destroy_event_channel(cm_ch_);
        cm_ch_ = nullptr;
    }
}

}  // namespace kvx::verbs
