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
    for (const Run &r : runs) {
        const uint64_t last = r.len ? r.len - 1 : 0;
        if (!sliced_ || (r.local_off / local_slice_ == (r.local_off + last) / local_slice_ &&
                         r.remote_off / remote_slice_ == (r.remote_off + last) / remote_slice_)) {
            n += (r.len + max_msg_ - 1) / max_msg_;  // inside one slice on both sides
            continue;
        }
        for (uint64_t off = 0; off < r.len; n++) off += wr_len(r, off);
    }
    return n;
}

// The bytes of run r's WR from off: at most max_msg_, and none across a
// slice of the registration, ours (its lkey) or the peer's (its rkey).
uint64_t VerbsPeer::wr_len(const Run &r, uint64_t off) const {
    if (!sliced_) return std::min(r.len - off, max_msg_);
    const uint64_t lo = r.local_off + off, ro = r.remote_off + off;
    return std::min({r.len - off, max_msg_, local_slice_ - lo % local_slice_, remote_slice_ - ro % remote_slice_});
}

void VerbsPeer::submit(Op op) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (broken_ || stopping_ || op.runs.empty()) {
        if (op.state->report()) out.add(op.state->id, op.runs.empty() ? 0 : stopping_ ? KVX_ECONNRESET : KVX_EPEERBROKEN);
        deliver(lk, out);
        return;
    }
    // Large transfers are split over the QPs that would finish them first,
    // in shares weighed by their rails' rates; small ones go whole.
    size_t usable_qps = 0;
    for (const Qp &q : qps_) usable_qps += usable(q);
    const uint64_t k = op.bytes >= 2 * kSplitMin ? std::min<uint64_t>(usable_qps, op.bytes / kSplitMin) : 1;
    const std::vector<size_t> chosen = fastest(k, op.bytes / std::max<uint64_t>(k, 1));
    std::vector<Part> parts;
    std::vector<size_t> to;
    if (chosen.size() <= 1) {
        parts = split_op(std::move(op), 1, kSplitMin, block_len_);
        to = chosen;
    } else {
        std::vector<double> shares;
        for (size_t i : chosen) shares.push_back(rate_of(qps_[i].rail));
        std::vector<size_t> which;
        parts = split_shares(std::move(op), shares, block_len_, &which);
        for (size_t w : which) to.push_back(chosen[w]);
    }
    place(std::move(parts), to, out);
    // What completed meanwhile, reported now: the event loop may wait for mu_
    // behind a stream of submits (rxe even moves the bytes inside the post),
    // and the stall timeout must not take that wait for a stalled peer.
    for (size_t r = 0; r < rails_.size() && !broken_; r++)
        if (rails_[r].state == Rail::State::up) poll_cq(r, out);
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
        const Rail &rail = rails_[q.rail];
        size_t run = p.run;
        uint64_t off = p.off;
        const uint32_t take = static_cast<uint32_t>(std::min<uint64_t>(room - n, p.wrs_left));
        for (uint32_t k = 0; k < take; k++, n++) {
            const Run &r = p.part.runs[run];
            const uint64_t len = wr_len(r, off);
            ibv_sge &sg = sge_buf_[n];
            sg.addr = reinterpret_cast<uintptr_t>(rail.dev->region.base) + r.local_off + off;
            sg.length = static_cast<uint32_t>(len);
            sg.lkey = rail.dev->lkey_at(r.local_off + off);
            ibv_send_wr &w = wr_buf_[n];
            w = ibv_send_wr{};
            w.sg_list = &sg;
            w.num_sge = 1;
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr.rdma.remote_addr = remote_addr_ + r.remote_off + off;
            w.wr.rdma.rkey = rail.remote.rkeys[(r.remote_off + off) / remote_slice_];
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
            q.waiting_bytes -= len;
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
            q.waiting_bytes -= front.part.bytes();
            q.waiting.pop_front();
            continue;
        }
        const size_t marks_before = q.marks.size();
        const Chain c = build_chain(q, depth - q.used);
        const uint32_t n = c.n;
        ibv_send_wr *bad = nullptr;
        if (int rc = ibv_post_send(q.qp, wr_buf_.data(), &bad)) {
            // Whatever was posted before bad flushes with the QP (its rail
            // drains) and is posted again with the rest of its parts.
            q.marks.erase(q.marks.begin() + static_cast<std::ptrdiff_t>(marks_before), q.marks.end());
            fail_rail(q.rail, strfmt("ibv_post_send of %u WRs: %s", n, strerror(rc)), false, out);
            return;
        }
        q.used += n;
        q.waiting_wrs -= n;
        if (rails_.size() > 1 && rails_[q.rail].last_ns == 0) start_clock(rails_[q.rail]);
        // Advance the queue over what the chain took: whole parts, the
        // cancelled ones it skipped (try_start() says false for those alone),
        // and where it ended inside a part.
        for (uint32_t left = n; left > 0;) {
            QueuedPart &p = q.waiting.front();
            if (!p.part.op->try_start()) {
                q.waiting_wrs -= p.wrs_left;
                q.waiting_bytes -= p.part.bytes();
                q.waiting.pop_front();
            } else if (left >= p.wrs_left) {
                left -= static_cast<uint32_t>(p.wrs_left);
                q.posted.push_back(std::move(p.part));
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
    q.waiting_bytes = 0;
}

void VerbsPeer::fail_all_waiting(int status, CompletionBatch &out) {
    for (Qp &q : qps_) fail_waiting(q, status, out);
}

void VerbsPeer::fail_inflight(Qp &q, int status, CompletionBatch &out) {
    // Marks without op belong to parts still (partly) waiting: failed there.
    for (Mark &mk : q.marks)
        if (mk.op) out.fail(*mk.op, status);
    q.marks.clear();
    q.posted.clear();
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
    // Its rails are not dialled again one by one: the core dials the peer.
    std::lock_guard<std::mutex> lk(dial_mu_);
    dial_queue_.clear();
    dialling_.assign(dialling_.size(), false);
    dial_cancel_.store(true);
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
            if (rails_.size() > 1) measure(rails_[q.rail], q.seg_bytes.front());
            q.seg_bytes.pop_front();
        }
        if (mk.op) {
            Rail &r = rails_[q.rail];
            if (!q.posted.empty()) {
                r.bytes += q.posted.front().bytes();
                q.posted.pop_front();
            }
            r.parts++;
            out.part_done(*mk.op, 0);
        }
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

void VerbsPeer::handle_wc(Rail &rail, const ibv_wc &wc, CompletionBatch &out) {
    const size_t r = static_cast<size_t>(&rail - rails_.data());
    if (wc.wr_id == kDrainWrId) {  // a failed rail's marker: flushed behind everything it had
        if (rail.state == Rail::State::draining && --rail.drains_left == 0) rail_drained(r, out);
        return;
    }
    Qp *q = nullptr;
    for (Qp &c : qps_)
        if (c.rail == r && c.qp && c.qp->qp_num == wc.qp_num) q = &c;
    if (!q) return;
    if (wc.wr_id == kRecvWrId) {
        // A probe arrived: the receive goes back. A flushed one means the QP
        // went to ERR, which the send side reports.
        if (wc.status == IBV_WC_WR_FLUSH_ERR) return;
        if (wc.status == IBV_WC_SUCCESS) {
            if (q->dead || broken_) return;
            int rc = post_probe_recv(q->qp);
            if (rc == 0) return;
            fail_rail(r, strfmt("ibv_post_recv on QP %u: %s", wc.qp_num, strerror(rc)), false, out);
            return;
        }
    } else if (wc.status == IBV_WC_SUCCESS) {
        complete_marks(*q, wc.wr_id, out);
        return;
    }
    // An error takes the rail out: every QP of it to ERR, and once they are
    // drained what they owed goes to the other rails; without another rail
    // the peer breaks (a transfer split over QPs must not keep landing from
    // another QP after it was reported failed).
    if (q->dead) return;  // flushes of a rail already taken out
    fail_rail(r, strfmt("%s (vendor error 0x%x) on QP %u", ibv_wc_status_str(wc.status), wc.vendor_err, wc.qp_num),
              false, out);
}

// Every QP to ERR (the NIC starts nothing more of ours), then every transfer
// in flight or queued fails with the peer's break status. mu_ held.
void VerbsPeer::break_peer(int status, CompletionBatch &out) {
    set_broken(status);
    for (Qp &q : qps_) kill_qp(q, break_status_, out);
    fail_all_waiting(break_status_, out);
    fail_orphans(break_status_, out);
}

// ------------------------------------------------------------------ events

void VerbsPeer::on_event(int tag, uint32_t events) {
    if (tag == kTagCm) return on_cm_event();
    const size_t r = static_cast<size_t>(tag - kTagCq0);
    if (r >= rails_.size()) return;
    if (events & (EPOLLERR | EPOLLHUP)) {
        // The device went away (disassociated): the channel stays in error
        // and would wake the loop for ever. Nothing completes or lands from it.
        loop_->detach(rails_[r].tok);
        rails_[r].tok = 0;
        CompletionBatch out;
        std::unique_lock<std::mutex> lk(mu_);
        if (rails_[r].state == Rail::State::draining) rail_drained(r, out);  // its markers never come now
        else fail_rail(r, "the completion channel failed (device removed?)", true, out);
        deliver(lk, out);
        return;
    }
    on_cq_event(r);
}

void VerbsPeer::on_cq_event(size_t r) {
    Rail &rail = rails_[r];
    ibv_cq *cq = nullptr;
    void *cq_ctx = nullptr;
    while (ibv_get_cq_event(rail.comp_ch, &cq, &cq_ctx) == 0) rail.cq_unacked++;
    if (rail.cq_unacked) {
        ibv_ack_cq_events(rail.cq, rail.cq_unacked);
        rail.cq_unacked = 0;
    }
    // Re-arm first, then drain: a completion after the last poll raises a new event.
    if (ibv_req_notify_cq(rail.cq, 0) != 0)
        KVX_LOG(error, "verbs: %s: ibv_req_notify_cq on rail %s failed", where_.c_str(), rail.name.c_str());
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    for (bool more = true; more;) {
        more = poll_cq(r, out);
        deliver(lk, out);
    }
}

// One batch of rail r's completions, then queued work into the slots that
// came back. true when the CQ may hold more. mu_ held.
bool VerbsPeer::poll_cq(size_t r, CompletionBatch &out, bool post) {
    Rail &rail = rails_[r];
    ibv_wc wc[kCqPollBatch];
    int n = ibv_poll_cq(rail.cq, kCqPollBatch, wc);
    if (n < 0) {
        fail_rail(r, "ibv_poll_cq failed", false, out);
        return false;
    }
    for (int i = 0; i < n; i++) handle_wc(rail, wc[i], out);
    if (post)
        for (Qp &q : qps_) post_ready(q, out);  // slots came back: software queue -> send queue
    return n == kCqPollBatch;
}

// A connection of ours ended (the target closed it, or it died): its rail
// goes, after what already completed there is reported.
void VerbsPeer::on_cm_event() {
    CmEvent ev;
    while (next_cm_event(cm_ch_, &ev)) {
        if (!ends_connection(ev.type)) continue;
        CompletionBatch out;
        std::unique_lock<std::mutex> lk(mu_);
        if (stopping_) continue;
        size_t r = rails_.size();
        for (const Qp &q : qps_)
            if (q.id.get() == ev.id) r = q.rail;
        if (r == rails_.size() || rails_[r].state != Rail::State::up) continue;
        // what completed there first, posting nothing more to it
        for (bool more = true; more && rails_[r].state == Rail::State::up;) more = poll_cq(r, out, false);
        fail_rail(r, strfmt("connection lost (%s)", rdma_event_str(ev.type)), false, out);
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
    fail_orphans(status, out);
    deliver(lk, out);
}

}  // namespace kvx::verbs
