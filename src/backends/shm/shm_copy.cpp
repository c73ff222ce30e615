// The writer's data path: copy threads, the copy of one part (into the
// mapping, through process_vm_writev, or through the target's staging ring),
// and the SIGBUS guard that turns a fault in memory another process can
// shrink or empty (the peer's file truncated, a huge page punched out of it
// or out of a ring) into a failed transfer instead of a dead process.
#include <sys/mman.h>
#include <sys/uio.h>

#include <climits>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <chrono>
#include <mutex>

#include "backends/shm/shm.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::shm {

namespace {

constexpr uint64_t kChunk = 8u << 20;  // a halt is seen at least this often while copying

// Set only while a thread copies guarded (guarded() in shm.h), with the two
// ranges it guards. initial-exec: the signal handler must not allocate
// thread storage.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf *t_guard = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local uintptr_t t_guard_lo[2] = {}, t_guard_hi[2] = {};
struct sigaction g_prev_sigbus;

// Ours: a fault of a mapping that lost its page (BUS_ADRERR: past the end
// of a file, a hole no page can fill; BUS_OBJERR) at an address of the
// memory this thread is copying guarded. Anything else (a fault in the
// writer's own source region, a hardware memory error, kill -BUS) goes where
// it went before us.
void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const bool sent = !si || si->si_code <= 0;  // SI_USER, SI_QUEUE, SI_TKILL...
    const bool lost_page = si && (si->si_code == BUS_ADRERR || si->si_code == BUS_OBJERR);
    if (sigjmp_buf *jb = t_guard; jb && lost_page) {
        const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
        if ((a >= t_guard_lo[0] && a < t_guard_hi[0]) || (a >= t_guard_lo[1] && a < t_guard_hi[1])) {
            t_guard = nullptr;
            siglongjmp(*jb, 1);
        }
    }
    // sa_handler and sa_sigaction share storage: SIG_DFL/SIG_IGN are seen
    // the same with or without SA_SIGINFO.
    // A fault repeats when we return; a signal someone sent, or a memory
    // error reported ahead of any access (BUS_MCEERR_AO), does not.
    const bool repeats = si && !sent && si->si_code != BUS_MCEERR_AO;
    const struct sigaction &p = g_prev_sigbus;
    if (p.sa_handler == SIG_IGN && !repeats) return;  // ignored, as before us
    if (p.sa_handler == SIG_DFL || p.sa_handler == SIG_IGN) {
        signal(SIGBUS, SIG_DFL);
        if (!repeats) raise(SIGBUS);  // the default action now (SA_NODEFER: not blocked here)
        return;                       // the fault repeats on return and kills, as without us
    }
    if (p.sa_flags & SA_SIGINFO) p.sa_sigaction(sig, si, uc);
    else p.sa_handler(sig);
}

// Calls f(local, remote offset, len) for every piece of at most kChunk of
// the parts' runs, in order, until f returns false; false then.
template <class F> bool each_chunk(const Link &l, const Part *parts, size_t n, F f) {
    for (size_t i = 0; i < n; i++)
        for (const Run &r : parts[i].runs)
            for (uint64_t done = 0; done < r.len; done += kChunk)
                if (!f(l.local.base + r.local_off + done, r.remote_off + done, std::min(kChunk, r.len - done)))
                    return false;
    return true;
}

// The runs of the parts into the mapping: 0, 1 when halted, -1 on a fault.
int copy_mapped(Link &l, const Part *parts, size_t n) {
    return guarded({l.map_base, l.map_len}, {}, [&] {
        const bool whole = each_chunk(l, parts, n, [&](const uint8_t *from, uint64_t to, uint64_t len) {
            if (l.halt.load(std::memory_order_relaxed)) return false;
            memcpy(l.dst + to, from, len);
            return true;
        });
        return whole ? 0 : 1;
    });
}

// All the parts' runs in as few process_vm_writev calls as IOV_MAX and
// kChunk allow (one for a batch of small parts).
int copy_kernel(Link &l, const Part *parts, size_t n) {
    thread_local std::vector<iovec> lv, rv;  // kept between batches: no allocation per copy
    if (lv.capacity() > 4 * IOV_MAX) {  // after a transfer of many runs: give the memory back
        lv = std::vector<iovec>();
        rv = std::vector<iovec>();
    }
    lv.clear();
    rv.clear();
    each_chunk(l, parts, n, [&](const uint8_t *from, uint64_t to, uint64_t len) {
        lv.push_back(iovec{const_cast<uint8_t *>(from), len});
        rv.push_back(iovec{reinterpret_cast<void *>(l.remote_base + to), len});
        return true;
    });
    for (size_t at = 0; at < lv.size();) {
        if (l.halt.load(std::memory_order_relaxed)) return KVX_ECANCELED;
        // The pid names our target only while it lives: once it exited,
        // another process may have it (a forked child keeps the socket open).
        if (process_exited(l.pidfd.get())) {
            KVX_LOG(info, "shm: peer '%s': its process (pid %d) exited", l.peer_id.c_str(), static_cast<int>(l.pid));
            return KVX_ECONNRESET;
        }
        size_t cnt = 0;  // at most IOV_MAX iovecs and about kChunk bytes per call: a halt is seen soon
        for (uint64_t bytes = 0; at + cnt < lv.size() && cnt < IOV_MAX && bytes < kChunk; cnt++)
            bytes += lv[at + cnt].iov_len;
        ssize_t w = process_vm_writev(l.pid, &lv[at], cnt, &rv[at], cnt, 0);
        if (w < 0) {
            if (errno == EINTR) continue;
            KVX_LOG(info, "shm: process_vm_writev to peer '%s' (pid %d): %s", l.peer_id.c_str(), static_cast<int>(l.pid),
                    strerror(errno));
            return errno == EPERM ? KVX_EPERM : KVX_ECONNRESET;
        }
        // A short write ends at an iovec boundary only if the next one faulted:
        // advance over what landed, and retry the rest (a fault repeats as an error).
        size_t left = static_cast<size_t>(w);
        while (left > 0 && at < lv.size()) {
            size_t take = std::min(left, lv[at].iov_len);
            lv[at].iov_base = static_cast<uint8_t *>(lv[at].iov_base) + take;
            rv[at].iov_base = static_cast<uint8_t *>(rv[at].iov_base) + take;
            lv[at].iov_len -= take;
            rv[at].iov_len -= take;
            left -= take;
            if (lv[at].iov_len == 0) at++;
        }
    }
    return 0;
}

}  // namespace

void Link::unmap() {
    if (map_base) munmap(map_base, map_len);
    if (ring) munmap(ring, ring_len);
    map_base = nullptr;
    dst = nullptr;
    ring = nullptr;
}

void arm_fault_guard(sigjmp_buf *jb, FaultRange a, FaultRange b) {
    t_guard_lo[0] = reinterpret_cast<uintptr_t>(a.base);
    t_guard_hi[0] = t_guard_lo[0] + a.len;
    t_guard_lo[1] = reinterpret_cast<uintptr_t>(b.base);
    t_guard_hi[1] = t_guard_lo[1] + b.len;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t_guard = jb;
}

void disarm_fault_guard() {
    t_guard = nullptr;
    std::atomic_signal_fence(std::memory_order_seq_cst);
}

void fault_taken() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &s, nullptr);  // in case the mask at the jump had it blocked (SA_NODEFER: it should not)
}

// Installs the guard, or installs it again when the application replaced it
// since (its handler is then the one we chain to). Cheap when in place.
void install_sigbus_guard() {
    struct sigaction cur {};
    sigaction(SIGBUS, nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus) return;
    static std::mutex mu;
    std::lock_guard<std::mutex> lk(mu);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;  // ONSTACK: where the application (Go's runtime) has an alternate stack
    sigemptyset(&sa.sa_mask);
    struct sigaction prev {};
    sigaction(SIGBUS, &sa, &prev);
    if (!((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == on_sigbus)) g_prev_sigbus = prev;
}

int copy_parts(Link &l, const Part *parts, size_t n) {
    if (l.mode == Mode::kernel) return copy_kernel(l, parts, n);
    const int rc = copy_mapped(l, parts, n);
    if (rc < 0) {
        KVX_LOG(warn, "shm: peer '%s': its mapping faulted (SIGBUS: the file was truncated, or its pages punched out)",
                l.peer_id.c_str());
        return KVX_ECONNRESET;
    }
    return rc == 0 ? 0 : KVX_ECANCELED;
}

Link::~Link() { unmap(); }

void Link::fail_all(int st, Clock::duration wait) {
    const Clock::time_point until = Clock::now() + wait;
    std::unordered_map<uint64_t, OpRef> victims;
    std::vector<std::pair<uint32_t, uint64_t>> posted;
    {
        std::unique_lock<std::mutex> lk(mu);
        if (!stop) {
            stop = true;
            status = st;
        }
        halt.store(true);
        cv.notify_all();  // copies waiting for a slot or an answer stop
        cv.wait(lk, [&] { return active == 0; });
        victims.swap(ops);
        stage_queue.clear();
        for (uint32_t s = 0; s < in_flight.size(); s++) {
            if (in_flight[s] != 0) posted.emplace_back(s, in_flight[s]);
            in_flight[s] = 0;  // taken back once, here; late answers are ignored
            owner[s].reset();
        }
        active++;  // reporting: a concurrent fail_all (shutdown) waits for us
    }
    withdraw(posted, until);  // staged: nothing the target has not taken lands any more
    CompletionBatch b;
    for (auto &[id, op] : victims) b.fail(*op, status);
    if (!b.empty()) b.deliver(*sink);  // a later call (the peer may be gone) has nothing to report
    std::lock_guard<std::mutex> lk(mu);
    active--;
    cv.notify_all();
}

CopyPool::CopyPool(unsigned threads) : copiers_(std::max(1u, threads)) {
    for (unsigned i = 0; i < copiers_; i++) threads_.emplace_back([this, i] { run(i == 0); });
}

CopyPool::~CopyPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_.store(true);
    }
    cv_.notify_all();
    helpers_cv_.notify_all();
    for (auto &t : threads_) t.join();
}

namespace {

constexpr uint64_t kBatchBytes = 1u << 20;  // a batch's bound: a halt is seen within about 100 us of copying
constexpr size_t kPartRuns = IOV_MAX;  // a part's runs: one process_vm_writev
constexpr uint64_t kBacklogBytes = 2u << 20;  // queued while copy threads are awake: the submitter copies a little too
constexpr uint64_t kHelpBytes = 4u << 20;     // queued transfers of one part: a helper is woken per this much
constexpr auto kIdleSpin = std::chrono::microseconds(50);

// Moves the next part of q into out: at most max_bytes in at most max_runs
// runs, counted in its transfer's parts (one stands for the rest until the
// last is taken). What is left of a transfer that will not be copied any
// more (the link halted, it was cancelled or failed) goes whole, for
// begin() to drop. Returns the bytes taken from q.
uint64_t carve(Queued &q, uint64_t max_bytes, size_t max_runs, bool halted, std::vector<Part> &out) {
    const bool whole = q.next == 0 && q.off == 0 && q.left <= max_bytes && q.runs.size() <= max_runs;
    if (whole || halted || q.op->state.load(std::memory_order_relaxed) == OpState::kReported) {
        const uint64_t b = q.left;
        out.push_back(Part{std::move(q.op), std::move(q.runs)});
        q.left = 0;
        return b;
    }
    Part p{q.op, {}};
    p.runs.reserve(std::min(max_runs, q.runs.size() - q.next));
    uint64_t b = 0;
    while (q.next < q.runs.size() && b < max_bytes && p.runs.size() < max_runs) {
        const Run &r = q.runs[q.next];
        const uint64_t n = std::min(r.len - q.off, max_bytes - b);
        p.runs.push_back(Run{r.local_off + q.off, r.remote_off + q.off, n});
        b += n;
        q.off += n;
        if (q.off == r.len) {
            q.next++;
            q.off = 0;
        }
    }
    q.left -= b;
    if (q.left > 0) q.op->parts_left.fetch_add(1);  // before the part can finish
    out.push_back(std::move(p));
    return b;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// Starts the parts of a batch that their link and transfers still want,
// dropping the others; true when some are left to copy (counted once in
// link.active).
bool begin(Link &l, std::vector<Part> &parts) {
    std::lock_guard<std::mutex> lk(l.mu);
    if (l.stop) {  // fail_all reports what the link had
        parts.clear();
        return false;
    }
    size_t keep = 0;
    for (size_t i = 0; i < parts.size(); i++) {
        if (!parts[i].op->try_start()) {  // cancelled before a byte moved
            l.ops.erase(parts[i].op->id);
            continue;
        }
        if (i != keep) parts[keep] = std::move(parts[i]);
        keep++;
    }
    parts.resize(keep);
    if (keep == 0) return false;
    l.active++;
    return true;
}

// Reports a copied batch (or stops the link at its first failure).
void end(Link &l, std::vector<Part> &parts, int rc) {
#ifndef __SANITIZE_THREAD__  // TSan does not model fences; l.mu's unlock below releases the bytes as well
    std::atomic_thread_fence(std::memory_order_release);  // the bytes before the report
#endif
    CompletionBatch b;
    bool first_failure = false;
    {
        std::lock_guard<std::mutex> lk(l.mu);
        if (rc != 0 && !l.stop) {
            l.stop = true;
            l.status = rc;
            l.halt.store(true);
            l.cv.notify_all();
            first_failure = true;
        } else if (rc == 0 && !l.stop) {
            for (Part &p : parts) {
                const size_t before = b.size();
                b.part_done(*p.op, 0);
                if (b.size() != before) l.ops.erase(p.op->id);
            }
        }
    }
    parts.clear();
    if (rc == 0) l.sink->progress();
    b.deliver(*l.sink);
    {
        std::lock_guard<std::mutex> lk(l.mu);
        l.active--;
        l.cv.notify_all();
    }
    if (first_failure) l.fail_all(rc, Clock::duration::zero());  // once every copy of the link let go (no ring here)
}

void copy_batch(Link &l, std::vector<Part> &parts) {
    if (parts.empty() || !begin(l, parts)) return;
    end(l, parts, copy_parts(l, parts.data(), parts.size()));
}

}  // namespace

uint64_t CopyPool::take(std::shared_ptr<Link> *link, std::vector<Part> &out, std::vector<Runs> &spent,
                        bool submitter, bool *large_out) {
    out.clear();
    link->reset();
    if (large_out) *large_out = false;
    if (ready_.empty()) return 0;
    const uint64_t max_bytes = submitter ? kSubmitBytes : kBatchBytes;
    const size_t max_runs = submitter ? kSubmitRuns : IOV_MAX;
    const auto fits = [&](const Queued &e, uint64_t bytes, size_t runs) {
        return bytes + e.left <= max_bytes && runs + (e.runs.size() - e.next) <= max_runs;
    };
    Link &l = *ready_.front();
    if (submitter && (l.pool_small.empty() || !fits(l.pool_small.front(), 0, 0))) return 0;
    *link = std::move(ready_.front());
    ready_.pop_front();
    // Transfers of one part and parts of larger ones take turns (the
    // submitting thread takes only the former, whole).
    const bool large = !submitter && (l.pool_small.empty() || (!l.pool_large.empty() && l.pool_large_turn));
    if (!submitter && !l.pool_small.empty() && !l.pool_large.empty()) l.pool_large_turn = !large;
    std::deque<Queued> &q = large ? l.pool_large : l.pool_small;
    if (large_out) *large_out = large;
    const bool halted = l.halt.load(std::memory_order_relaxed);
    const size_t share = (queued_.load(std::memory_order_relaxed) + copiers_ - 1) / copiers_;
    uint64_t bytes = 0;
    size_t runs = 0, done = 0;
    while (!q.empty() && done < share) {
        Queued &e = q.front();
        if (!out.empty() && !fits(e, bytes, runs)) break;
        bytes += carve(e, std::min(max_bytes - bytes, large ? e.piece : max_bytes), std::min(max_runs - runs, kPartRuns),
                       halted, out);
        runs += out.back().runs.size();
        if (e.left > 0) break;  // one part of a larger transfer per batch; the rest stays in front
        if (e.runs.size() > 1) spent.push_back(std::move(e.runs));  // freed without the lock (a munmap, maybe)
        q.pop_front();
        done++;
    }
    if (l.pool_small.empty() && l.pool_large.empty()) l.pool_listed = false;
    else ready_.push_back(*link);  // its turn comes again after the others'
    queued_.fetch_sub(done, std::memory_order_relaxed);
    queued_bytes_ -= bytes;
    return bytes;
}

void CopyPool::spin_for_work(std::chrono::steady_clock::time_point until) const {
    for (unsigned i = 1;; i++) {
        if (queued_.load(std::memory_order_relaxed) != 0 || stop_.load(std::memory_order_relaxed)) return;
        cpu_relax();
        if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return;
    }
}

void CopyPool::submit(const std::shared_ptr<Link> &link, Op op, uint64_t min_part, uint64_t granule) {
    std::vector<Part> own, batch;
    std::vector<Runs> spent;
    std::shared_ptr<Link> from;
    op.state->parts_left.store(1);  // one part, or one for the rest while they are carved
    const bool small = op.bytes <= kSubmitBytes && op.runs.size() <= kSubmitRuns;
    {
        std::lock_guard<std::mutex> lk(mu_);
        // This thread copies a small transfer when every copy thread sleeps:
        // waking one costs more than the copy. Otherwise the transfer queues
        // for the copy threads, which are awake (copying a batch, or
        // watching the queue) or woken; once kBacklogBytes wait, this thread
        // then copies the next small transfer of the queue, if it is one.
        // A stream of calls (the last within kIdleSpin) wakes a sleeping
        // copy thread to watch for the next.
        const auto now = std::chrono::steady_clock::now();
        const bool streaming = now - last_submit_ < kIdleSpin;
        last_submit_ = now;
        const unsigned awake = spinning_ + busy_;
        size_t parts = 0;  // the transfer's parts, when queued
        if (small && awake == 0) {
            own.push_back(Part{std::move(op.state), std::move(op.runs)});
        } else {
            // One part per copy thread from 2 x min_part, at most kBatchBytes each.
            const uint64_t n = std::clamp<uint64_t>(op.bytes / min_part, 1, copiers_);
            const uint64_t cap = std::max<uint64_t>(granule, kBatchBytes / granule * granule);
            const uint64_t piece = std::min(cap, (op.bytes / n + granule - 1) / granule * granule);
            parts = std::max<uint64_t>((op.bytes + piece - 1) / piece, (op.runs.size() + kPartRuns - 1) / kPartRuns);
            Queued q{std::move(op.state), std::move(op.runs), piece, op.bytes};
            (parts > 1 ? link->pool_large : link->pool_small).push_back(std::move(q));
            queued_bytes_ += op.bytes;
            queued_.fetch_add(1, std::memory_order_relaxed);
            if (!link->pool_listed) {
                link->pool_listed = true;
                ready_.push_back(link);
            }
            if (queued_bytes_ >= kBacklogBytes) take(&from, batch, spent, true);
        }
        // The watcher for the queue (small transfers, a stream of them),
        // helpers for the parts of a large transfer, or a deep queue.
        const size_t queued = queued_.load(std::memory_order_relaxed);
        if (watcher_sleeping_ && ((queued > awake) || (streaming && awake == 0))) cv_.notify_one();
        const uint64_t help = parts > 1 ? parts - 1 : queued_bytes_ / kHelpBytes;
        if (helpers_sleeping_ > 0 && help > 0) {
            if (help > 1) helpers_cv_.notify_all();
            else helpers_cv_.notify_one();
        }
    }
    if (!own.empty()) copy_batch(*link, own);
    if (from) copy_batch(*from, batch);
}

void CopyPool::run(bool watcher) {
    std::shared_ptr<Link> link;
    std::vector<Part> batch;
    std::vector<Runs> spent;
    bool large = false;  // the last batch was a part of a large transfer
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            // The watcher watches for kIdleSpin, also after losing a
            // transfer to another copier; a helper only after copying a
            // part of a large transfer (the next may follow), else it
            // sleeps at once.
            const auto until = std::chrono::steady_clock::now() + kIdleSpin;
            while ((watcher || large) && ready_.empty() && !stop_.load() && std::chrono::steady_clock::now() < until) {
                spinning_++;  // submitters leave transfers to this thread meanwhile
                lk.unlock();
                spin_for_work(until);
                lk.lock();
                spinning_--;
            }
            if (ready_.empty()) {
                if (stop_.load()) return;  // nothing is left
                unsigned &sleeping = watcher ? watcher_sleeping_ : helpers_sleeping_;
                sleeping++;
                (watcher ? cv_ : helpers_cv_).wait(lk);  // woken for transfers, to watch for them (a stream), or to stop
                sleeping--;
                large = false;
                continue;
            }
            take(&link, batch, spent, false, &large);
            busy_++;
        }
        copy_batch(*link, batch);
        spent.clear();
        link.reset();  // the link may go once its peer is gone
        std::lock_guard<std::mutex> lk(mu_);
        busy_--;
    }
}

}  // namespace kvx::shm
