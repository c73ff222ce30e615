// The writer's side of a staging ring (private memory the kernel does not let
// it reach, or shm.private=staged): a stager thread per link copies as much
// of a queued part as a free slot holds (up to kMaxCopySegs runs) into it,
// posts it (the slot's state word becomes a new ticket) and announces it
// with COPY, which lists where each run goes; the
// target's loop copies it into its region and answers COPIED, which frees the
// slot and, for a part's last piece, completes the part. kvx_write_blocks()
// posts one slot of the front queued transfer when that is a small one
// (kSubmitBytes, kSubmitRuns: its own, or one queued before), and leaves
// anything else to the stager: no thread of the application waits for the
// target, or copies much.
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "backends/shm/shm.h"
#include "util/log.h"

namespace kvx::shm {

namespace {

std::atomic_ref<uint64_t> slot_state(Link &l, uint32_t s) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t *>(l.ring + uint64_t{s} * 64));
}

// Reports a part whose pieces were all answered (l.mu held on entry and exit;
// the report itself goes out without it, counted in l.active so that
// fail_all waits for it).
void complete(Link &l, std::unique_lock<std::mutex> &lk, Link::Staged &st) {
    CompletionBatch b;
    b.part_done(*st.part.op, 0);
    if (!b.empty()) l.ops.erase(st.part.op->id);
    l.active++;
    lk.unlock();
#ifndef __SANITIZE_THREAD__
    std::atomic_thread_fence(std::memory_order_release);
#endif
    l.sink->progress();
    b.deliver(*l.sink);
    lk.lock();
    l.active--;
    l.cv.notify_all();
}

// As much of the part as a slot holds, from where posting stopped: pieces of
// its runs in order (segments of m, their sources in src). l.mu held.
void take_pieces(const Link &l, Link::Staged &st, CtlMsg *m, const uint8_t **src) {
    uint64_t used = 0;
    while (st.run < st.part.runs.size() && m->nseg < kMaxCopySegs && used < l.slot_len) {
        const Run &r = st.part.runs[st.run];
        const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(l.slot_len - used, r.len - st.off));
        src[m->nseg] = l.local.base + r.local_off + st.off;
        m->segs[m->nseg++] = CtlMsg::Seg{r.remote_off + st.off, n};
        used += n;
        st.off += n;
        if (st.off == r.len) {
            st.run++;
            st.off = 0;
        }
    }
}

// Stops the link at its first failure and fails what it had (l.mu not held):
// its socket failed or the target broke the protocol, so no wait for slots
// the target took (an honest one copies before it answers or closes).
void stop_link(Link &l, int status) {
    {
        std::lock_guard<std::mutex> lk(l.mu);
        if (!l.stop) {
            l.stop = true;
            l.status = status;
        }
        l.halt.store(true);
    }
    l.fail_all(status, Clock::duration::zero());
}

}  // namespace

int post_slot(Link &l, std::unique_lock<std::mutex> &lk) {
    std::shared_ptr<Link::Staged> st = l.stage_queue.front();
    if (!st->started) {
        if (!st->part.op->try_start()) {  // cancelled before a byte moved
            l.ops.erase(st->part.op->id);
            l.stage_queue.pop_front();
            return 0;
        }
        st->started = true;
    }
    if (st->run == st->part.runs.size()) {  // nothing to move (an empty transfer)
        st->all_posted = true;
        l.stage_queue.pop_front();
        complete(l, lk, *st);
        return 0;
    }
    CtlMsg m{Ctl::copy};
    const uint8_t *src[kMaxCopySegs];
    take_pieces(l, *st, &m, src);
    if (st->run == st->part.runs.size()) {
        st->all_posted = true;
        l.stage_queue.pop_front();
    }
    uint32_t s = 0;
    while (l.in_flight[s] != 0) s++;
    const uint64_t t = l.next_ticket++;
    l.in_flight[s] = t;
    l.owner[s] = st;
    l.free_slots--;
    st->outstanding++;
    l.active++;  // copying into the ring: fail_all waits for it
    lk.unlock();
    // The ring is the target's file: a huge-page one it punched a hole into
    // faults here, which fails the link instead of the process.
    const int copied = guarded({l.ring, l.ring_len}, {}, [&] {
        uint8_t *dst = l.ring + ring_data_off(l.slots) + uint64_t{s} * l.slot_len;
        for (uint32_t i = 0; i < m.nseg; dst += m.segs[i].len, i++) memcpy(dst, src[i], m.segs[i].len);
        slot_state(l, s).store(t, std::memory_order_release);
        return 0;
    });
    m.slot = s;
    m.ticket = t;
    uint8_t msg[kCtlMaxLen];
    const int rc = copied < 0 ? -EFAULT : send_msg(l.sock, msg, encode_ctl(m, msg), -1);
    lk.lock();
    l.active--;
    l.cv.notify_all();
    if (rc == 0) return 0;
    if (copied < 0)
        KVX_LOG(warn, "shm: peer '%s': its staging ring faulted (SIGBUS: its pages are gone)", l.peer_id.c_str());
    else
        KVX_LOG(info, "shm: peer '%s': COPY not sent: %s", l.peer_id.c_str(), strerror(-rc));
    return KVX_ECONNRESET;
}

void post_now(Link &l, std::unique_lock<std::mutex> &lk) {
    const int rc = l.free_slots > 0 ? post_slot(l, lk) : 0;  // one slot at most: a small transfer's
    if (!l.stage_queue.empty()) l.cv.notify_all();  // the rest is the stager's
    if (rc != 0) {
        lk.unlock();
        stop_link(l, rc);
        lk.lock();
    }
}

void stage_loop(Link &l) {
    std::unique_lock<std::mutex> lk(l.mu);
    for (;;) {
        l.cv.wait(lk, [&] { return l.stop || (!l.stage_queue.empty() && l.free_slots > 0); });
        if (l.stop) return;
        if (int rc = post_slot(l, lk)) {
            lk.unlock();
            stop_link(l, rc);
            return;
        }
    }
}

void Link::answered(uint32_t slot, uint64_t ticket, uint32_t st_code) {
    std::unique_lock<std::mutex> lk(mu);
    if (slot >= in_flight.size() || in_flight[slot] != ticket) return;  // not ours, or withdrawn: ignored
    in_flight[slot] = 0;
    free_slots++;
    std::shared_ptr<Staged> st = std::move(owner[slot]);
    st->outstanding--;
    cv.notify_all();
    if (stop) return;
    if (st_code != 0) {  // skipped though we did not take it back: the target's ring state is not ours
        lk.unlock();
        KVX_LOG(warn, "shm: peer '%s' skipped a staging slot it was asked to copy", peer_id.c_str());
        stop_link(*this, KVX_EBACKEND);
        return;
    }
    if (st->all_posted && st->outstanding == 0) complete(*this, lk, *st);
    else {
        lk.unlock();
        sink->progress();
    }
}

void Link::withdraw(const std::vector<std::pair<uint32_t, uint64_t>> &posted, Clock::time_point until) {
    if (posted.empty()) return;
    size_t copying = 0;  // slots the target took and had not copied by `until`
    const int rc = guarded({ring, ring_len}, {}, [&] {
        for (const auto &[s, t] : posted) {
            uint64_t v = t;
            if (slot_state(*this, s).compare_exchange_strong(v, 0, std::memory_order_acq_rel) || v != (t | kTaken))
                continue;
            while (slot_state(*this, s).load(std::memory_order_acquire) == (t | kTaken) && Clock::now() < until)
                usleep(50);
            if (slot_state(*this, s).load(std::memory_order_acquire) == (t | kTaken)) copying++;
        }
        return 0;
    });
    // A fault leaves the slots after it posted: their pages are gone, and
    // a target that punched them out can do what it likes with its region.
    if (rc < 0)
        KVX_LOG(warn, "shm: peer '%s': its staging ring faulted (SIGBUS) while taking slots back", peer_id.c_str());
    else if (copying > 0)
        KVX_LOG(warn, "shm: peer '%s' is still copying %zu staging slots of %u bytes: they may land after their "
                      "transfers are reported failed", peer_id.c_str(), copying, slot_len);
}

}  // namespace kvx::shm
