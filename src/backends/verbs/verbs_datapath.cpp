// The verbs initiator's data path. Every Run becomes one RDMA WRITE WR (split
// at the port's max_msg_sz) with one SGE; a transfer's WRs go to the send
// queue as one chained list. What does not fit waits in a software queue and
// is posted from the event loop as completions free send-queue slots.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <random>

#include "backends/verbs/verbs.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

namespace {

constexpr uint64_t kSplitMin = 256 << 10;  // with several QPs, ops of 2x this are spread over them

}  // namespace

// ------------------------------------------------------------------ data path

uint64_t VerbsPeer::wrs_for(const Runs &runs) const {
    uint64_t n = 0;
    for (const Run &r : runs) n += (r.len + dev_->max_msg - 1) / dev_->max_msg;
    return n;
}

// QP indexes, least loaded (posted plus waiting WRs) first.
std::vector<size_t> VerbsPeer::least_loaded() const {
    std::vector<size_t> order(qps_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return qps_[a].used + qps_[a].waiting_wrs < qps_[b].used + qps_[b].waiting_wrs;
    });
    return order;
}

void VerbsPeer::submit(Op op) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (broken_ || stopping_ || op.runs.empty()) {
        if (op.state->report()) out.add(op.state->id, op.runs.empty() ? 0 : stopping_ ? KVX_ECONNRESET : KVX_EPEERBROKEN);
        deliver(lk, out);
        return;
    }
    const std::vector<size_t> order = least_loaded();
    std::vector<Part> parts = split_op(std::move(op), qps_.size(), kSplitMin, dev_->region.block_len);
    for (size_t i = 0; i < parts.size(); i++) {
        Qp &q = qps_[order[i % order.size()]];
        QueuedPart queued;
        queued.wrs_left = wrs_for(parts[i].runs);
        queued.part = std::move(parts[i]);
        q.waiting_wrs += queued.wrs_left;
        q.waiting.push_back(std::move(queued));
    }
    for (size_t i = 0; i < parts.size() && i < order.size(); i++)
        if (!should_wait(qps_[order[i]])) post_ready(qps_[order[i]], out);
    deliver(lk, out);
}

// Whether what was just queued may wait for the QP's next completion: enough
// stays in flight behind it that the link is still busy when poll_cq posts
// everything that waited as one chain (one doorbell, one signalled WR
// instead of one per transfer). A signalled WR is then always in flight, so
// the completion that posts them comes. mu_ held.
bool VerbsPeer::should_wait(const Qp &q) const {
    return cfg_.post_batch_bytes != 0 && q.seg_bytes.size() >= 2 &&
           q.inflight_bytes - q.seg_bytes.front() >= cfg_.post_batch_bytes;
}

// Fills wr_buf_/sge_buf_ with up to room WRs of the waiting parts, front
// first, as one chain, and pushes their marks. A WR is signalled when
// signal_every WRs passed since the last signalled one (slots keep coming
// back), and the chain's last WR whenever it ends where a part ends: what
// waits behind it may be cancelled before a later chain goes out, and then
// no later WR would complete that part. A part that ends inside the chain
// leaves an unsignalled mark: the next signalled WR completes it. A chain
// that ends inside a part needs no signal there: the rest of that part has
// started, cannot be cancelled, and goes out later with its own.
// Skips cancelled parts. Commits nothing but the marks and counters:
// post_ready advances the queue once the post succeeded.
VerbsPeer::Chain VerbsPeer::build_chain(Qp &q, uint32_t room) {
    Chain c;
    uint32_t &n = c.n;
    size_t i = 0;
    bool stopped = false;  // inside a part: no room for the rest
    for (; i < q.waiting.size() && n < room; i++) {
        const QueuedPart &p = q.waiting[i];
        if (i > 0 && !p.part.op->try_start()) continue;  // cancelled: post_ready drops it
        size_t run = p.run;
        uint64_t off = p.off;
        const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(room - n, p.wrs_left));
        for (uint32_t k = 0; k < take; k++, n++) {
            const Run &r = p.part.runs[run];
            const uint64_t len = std::min(r.len - off, dev_->max_msg);
            ibv_sge &sg = sge_buf_[n];
            sg.addr = reinterpret_cast<uintptr_t>(dev_->region.base) + r.local_off + off;
            sg.length = static_cast<uint32_t>(len);
            sg.lkey = dev_->lkey;
            ibv_send_wr &w = wr_buf_[n];
            w = ibv_send_wr{};
            w.sg_list = &sg;
            w.num_sge = 1;
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr.rdma.remote_addr = remote_addr_ + r.remote_off + off;
            w.wr.rdma.rkey = rkey_;
            w.next = nullptr;
            if (n > 0) wr_buf_[n - 1].next = &w;
            off += len;
            if (off == r.len) {
                run++;
                off = 0;
            }
            q.since_signal++;
            q.since_mark++;
            q.tail_bytes += len;
            q.inflight_bytes += len;
            const bool part_end = k + 1 == p.wrs_left;
            const bool signal = q.since_signal >= cfg_.signal_every;
            if (part_end || signal) {
                if (signal) {
                    w.send_flags = IBV_SEND_SIGNALED;
                    w.wr_id = q.next_seq;
                    q.seg_bytes.push_back(q.tail_bytes);
                    q.tail_bytes = 0;
                    q.since_signal = 0;
                }
                q.marks.push_back(Mark{q.next_seq++, q.since_mark, signal, part_end ? p.part.op : OpRef()});
                q.since_mark = 0;
            }
        }
        if (take < p.wrs_left) {
            stopped = true;
            c.run = run;
            c.off = off;
            break;
        }
    }
    // The chain ends where a part ends (its mark is the last one): signalled,
    // whether or not more waits (room ran out right there).
    if (!stopped && n > 0 && !(wr_buf_[n - 1].send_flags & IBV_SEND_SIGNALED)) {
        Mark &mk = q.marks.back();
        mk.signalled = true;
        wr_buf_[n - 1].send_flags = IBV_SEND_SIGNALED;
        wr_buf_[n - 1].wr_id = mk.seq;
        q.seg_bytes.push_back(q.tail_bytes);
        q.tail_bytes = 0;
        q.since_signal = 0;
    }
    return c;
}

// Posts waiting WRs while the send queue has room, as few chains as the
// room allows (one ibv_post_send each). mu_ held.
void VerbsPeer::post_ready(Qp &q, CompletionBatch &out) {
    const uint32_t depth = cfg_.sq_depth;
    while (!broken_ && !q.dead && !q.waiting.empty() && q.used < depth) {
        QueuedPart &front = q.waiting.front();
        if (!front.part.op->try_start()) {  // cancelled while waiting: never posted, never reported
            q.waiting_wrs -= front.wrs_left;
            q.waiting.pop_front();
            continue;
        }
        const size_t marks_before = q.marks.size();
        const Chain c = build_chain(q, depth - q.used);
        const uint32_t n = c.n;
        ibv_send_wr *bad = nullptr;
        if (int rc = ibv_post_send(q.qp, wr_buf_.data(), &bad)) {
            // Whatever was posted before bad flushes with the QP; track none of it.
            q.marks.erase(q.marks.begin() + static_cast<std::ptrdiff_t>(marks_before), q.marks.end());
            KVX_LOG(warn, "verbs: %s: ibv_post_send of %u WRs: %s", where_.c_str(), n, strerror(rc));
            break_peer(KVX_ECONNRESET, out);
            return;
        }
        q.used += n;
        q.waiting_wrs -= n;
        // Advance the queue over what the chain took: whole parts, the
        // cancelled ones it skipped (try_start() says false for those alone),
        // and where it ended inside a part.
        for (uint32_t left = n; left > 0;) {
            QueuedPart &p = q.waiting.front();
            if (!p.part.op->try_start()) {
                q.waiting_wrs -= p.wrs_left;
                q.waiting.pop_front();
            } else if (left >= p.wrs_left) {
                left -= static_cast<uint32_t>(p.wrs_left);
                q.waiting.pop_front();
            } else {
                p.run = c.run;
                p.off = c.off;
                p.wrs_left -= left;
                left = 0;
            }
        }
    }
}

void VerbsPeer::fail_waiting(Qp &q, int status, CompletionBatch &out) {
    for (QueuedPart &p : q.waiting) out.fail(*p.part.op, status);
    q.waiting.clear();
    q.waiting_wrs = 0;
}

void VerbsPeer::fail_all_waiting(int status, CompletionBatch &out) {
    for (Qp &q : qps_) fail_waiting(q, status, out);
}

void VerbsPeer::fail_inflight(Qp &q, int status, CompletionBatch &out) {
    // Marks without op belong to parts still (partly) waiting: failed there.
    for (Mark &mk : q.marks)
        if (mk.op) out.fail(*mk.op, status);
    q.marks.clear();
    q.used = 0;  // the WRs are flushing; a dead QP is never posted to again
    q.since_signal = q.since_mark = 0;
    q.seg_bytes.clear();
    q.tail_bytes = q.inflight_bytes = 0;
}

// The QP is done for: to ERR (what is posted flushes, and those completions
// find nothing to report), its transfers in flight fail. mu_ held.
void VerbsPeer::kill_qp(Qp &q, int status, CompletionBatch &out) {
    if (!q.dead) {
        q.dead = true;
        to_error(q);
    }
    fail_inflight(q, status, out);
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
// Signalled WRs that completed no transfer (a large one is under way) are
// progress too: the transfer timeout measures a stall, so the sink hears of it.
void VerbsPeer::deliver(std::unique_lock<std::mutex> &lk, CompletionBatch &out) {
    const bool progressed = std::exchange(progressed_, false);
    if (out.empty() && !progressed) return;
    delivering_++;
    lk.unlock();
    if (progressed) sink_->progress();
    out.deliver(*sink_);
    lk.lock();
    if (--delivering_ == 0) cv_.notify_all();
}

// RC completes in order: the WR with this seq and everything posted before
// it are done; their slots come back and the parts that end there finish.
void VerbsPeer::complete_marks(Qp &q, uint64_t seq, CompletionBatch &out) {
    while (!q.marks.empty() && q.marks.front().seq <= seq) {
        Mark &mk = q.marks.front();
        q.used -= mk.wrs;
        if (mk.signalled && !q.seg_bytes.empty()) {
            q.inflight_bytes -= q.seg_bytes.front();
            q.seg_bytes.pop_front();
        }
        if (mk.op) out.part_done(*mk.op, 0);
        q.marks.pop_front();
        progressed_ = true;
    }
}

// A zero-length receive for the target's liveness probes (verbs.h): it takes
// no bytes, so a SEND with any payload fails it (and breaks the peer).
// 0 or an errno value.
int VerbsPeer::post_probe_recv(ibv_qp *qp) {
    ibv_recv_wr w{};
    w.wr_id = kRecvWrId;
    ibv_recv_wr *bad = nullptr;
    return ibv_post_recv(qp, &w, &bad);
}

void VerbsPeer::handle_wc(const ibv_wc &wc, CompletionBatch &out) {
    Qp *q = nullptr;
    for (Qp &c : qps_)
        if (c.qp && c.qp->qp_num == wc.qp_num) q = &c;
    if (!q || wc.wr_id == kDrainWrId) return;
    if (wc.wr_id == kRecvWrId) {
        // A probe arrived: the receive goes back. A flushed one means the QP
        // went to ERR, which the send side reports.
        if (wc.status == IBV_WC_WR_FLUSH_ERR) return;
        if (wc.status == IBV_WC_SUCCESS) {
            if (q->dead || broken_) return;
            int rc = post_probe_recv(q->qp);
            if (rc == 0) return;
            KVX_LOG(warn, "verbs: %s: ibv_post_recv on QP %u: %s; the peer is broken until re-added", where_.c_str(),
                    wc.qp_num, strerror(rc));
            break_peer(KVX_EBACKEND, out);
            return;
        }
    } else if (wc.status == IBV_WC_SUCCESS) {
        complete_marks(*q, wc.wr_id, out);
        return;
    }
    // The first error breaks the peer: every QP to ERR, then everything in
    // flight or queued fails (a transfer split over QPs must not keep
    // landing from another QP after it was reported failed).
    if (!q->dead && !broken_)
        KVX_LOG(warn, "verbs: %s: %s (vendor error 0x%x) on QP %u; the peer is broken until re-added",
                where_.c_str(), ibv_wc_status_str(wc.status), wc.vendor_err, wc.qp_num);
    break_peer(KVX_ECONNRESET, out);
}

// The connection is gone (a disconnect, a failed completion channel): what
// finished before is in the CQ and is reported done first (broken, so
// nothing more is posted). Then every QP to ERR and the rest fails now
// rather than through flushed completions: a part whose last WR was
// unsignalled and already executed flushes nothing that would end it. mu_ held.
void VerbsPeer::drain_and_break(int status, CompletionBatch &out) {
    set_broken(status);
    for (bool more = true; more;) more = poll_cq(out);
    break_peer(status, out);
}

// Every QP to ERR (the NIC starts nothing more of ours), then every transfer
// in flight or queued fails with the peer's break status. mu_ held.
void VerbsPeer::break_peer(int status, CompletionBatch &out) {
    set_broken(status);
    for (Qp &q : qps_) kill_qp(q, break_status_, out);
    fail_all_waiting(break_status_, out);
}

// ------------------------------------------------------------------ events

void VerbsPeer::on_event(int tag, uint32_t events) {
    if (tag != kTagCq) return on_cm_event();
    if (events & (EPOLLERR | EPOLLHUP)) {
        // The device went away (disassociated): the channel stays in error
        // and would wake the loop for ever. Nothing completes any more.
        loop_->detach(tok_cq_);
        tok_cq_ = 0;
        CompletionBatch out;
        std::unique_lock<std::mutex> lk(mu_);
        if (!broken_) KVX_LOG(warn, "verbs: %s: the completion channel failed (device removed?)", where_.c_str());
        drain_and_break(KVX_ECONNRESET, out);
        deliver(lk, out);
        return;
    }
    on_cq_event();
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
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    for (bool more = true; more;) {
        more = poll_cq(out);
        deliver(lk, out);
    }
}

// One batch of completions, then queued work into the slots that came back.
// true when the CQ may hold more. mu_ held.
bool VerbsPeer::poll_cq(CompletionBatch &out) {
    ibv_wc wc[kCqPollBatch];
    int n = ibv_poll_cq(cq_, kCqPollBatch, wc);
    if (n < 0) {
        KVX_LOG(error, "verbs: %s: ibv_poll_cq failed", where_.c_str());
        break_peer(KVX_EBACKEND, out);
        return false;
    }
    for (int i = 0; i < n; i++) handle_wc(wc[i], out);
    for (Qp &q : qps_) post_ready(q, out);  // slots came back: software queue -> send queue
    return n == kCqPollBatch;
}

void VerbsPeer::on_cm_event() {
    CmEvent ev;
    while (next_cm_event(cm_ch_, &ev)) {
        if (!ends_connection(ev.type)) continue;
        CompletionBatch out;
        std::unique_lock<std::mutex> lk(mu_);
        if (stopping_) continue;
        if (!broken_) KVX_LOG(warn, "verbs: %s: connection lost (%s)", where_.c_str(), rdma_event_str(ev.type));
        drain_and_break(KVX_ECONNRESET, out);
        deliver(lk, out);
    }
}

void VerbsPeer::abort(int status) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (stopping_) return;
    set_broken(status);
    for (Qp &q : qps_) kill_qp(q, status, out);
    fail_all_waiting(status, out);
    deliver(lk, out);
}

}  // namespace kvx::verbs
