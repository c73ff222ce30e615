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

CopyPool::CopyPool(unsigned threads) : copiers_(threads) {
    for (unsigned i = 1; i < threads; i++) threads_.emplace_back([this] { run(); });
}

CopyPool::~CopyPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_.store(true);
    }
    cv_.notify_all();
    for (auto &t : threads_) t.join();
}

namespace {

constexpr uint64_t kBatchBytes = 1u << 20;  // a batch's bound: a halt is seen within about 100 us of copying
constexpr uint64_t kBacklogBytes = 2u << 20;  // queued while pool threads are awake: the submitter copies a share too
constexpr auto kIdleSpin = std::chrono::microseconds(50);

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

uint64_t CopyPool::take(std::shared_ptr<Link> *link, std::vector<Part> &out, bool bounded) {
    out.clear();
    link->reset();
    if (ready_.empty()) return 0;
    if (bounded && ready_.front()->pool_parts.front().bytes() > kBatchBytes) return 0;  // a pool thread's
    *link = std::move(ready_.front());
    ready_.pop_front();
    Link &l = **link;
    const size_t share = (queued_parts_.load(std::memory_order_relaxed) + copiers_ - 1) / copiers_;
    uint64_t bytes = 0;
    size_t runs = 0;
    while (!l.pool_parts.empty() && out.size() < share) {
        const uint64_t b = l.pool_parts.front().bytes();
        const size_t r = l.pool_parts.front().runs.size();
        if (!out.empty() && (bytes + b > kBatchBytes || runs + r > IOV_MAX)) break;
        bytes += b;
        runs += r;
        out.push_back(std::move(l.pool_parts.front()));
        l.pool_parts.pop_front();
    }
    if (l.pool_parts.empty()) l.pool_listed = false;
    else ready_.push_back(*link);  // its turn comes again after the others'
    queued_parts_.fetch_sub(out.size(), std::memory_order_relaxed);
    queued_bytes_ -= bytes;
    return bytes;
}

void CopyPool::spin_for_work(std::chrono::steady_clock::time_point until) const {
    for (unsigned i = 1;; i++) {
        if (queued_parts_.load(std::memory_order_relaxed) != 0 || stop_.load(std::memory_order_relaxed)) return;
        cpu_relax();
        if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return;
    }
}

void CopyPool::submit(const std::shared_ptr<Link> &link, std::vector<Part> parts) {
    if (threads_.empty()) {  // shm.threads=1: the caller copies its transfer (one part: one per copier)
        copy_batch(*link, parts);
        return;
    }
    if (parts.empty()) return;
    std::vector<Part> own, batch;
    std::shared_ptr<Link> from;
    {
        std::lock_guard<std::mutex> lk(mu_);
        // This thread copies the first part of a transfer that was split
        // (its share, as with one part per thread), and a transfer of one
        // part when every pool thread sleeps: waking one costs more than
        // copying a small part. Otherwise the part queues for the pool
        // threads that are awake (copying, or watching the queue), which
        // take the queue in batches; then this thread copies a batch of it
        // too once kBacklogBytes wait, but never a part above kBatchBytes
        // of another transfer. A stream of calls (the last within
        // kIdleSpin) wakes a sleeping pool thread to watch for the next.
        const auto now = std::chrono::steady_clock::now();
        const bool streaming = now - last_submit_ < kIdleSpin;
        last_submit_ = now;
        // Awake: watching, or copying a batch of at most kBatchBytes (one
        // copying a larger part is not: a small transfer would wait for it).
        const unsigned awake = spinning_ + busy_small_;
        size_t first = 0;
        if (parts.size() > 1 || awake == 0) {
            own.push_back(std::move(parts.front()));
            first = 1;
        }
        for (size_t i = first; i < parts.size(); i++) {
            queued_bytes_ += parts[i].bytes();
            link->pool_parts.push_back(std::move(parts[i]));
        }
        queued_parts_.fetch_add(parts.size() - first, std::memory_order_relaxed);
        if (!link->pool_listed && !link->pool_parts.empty()) {
            link->pool_listed = true;
            ready_.push_back(link);
        }
        if (own.empty() && queued_bytes_ >= kBacklogBytes) take(&from, batch, true);
        const size_t left = queued_parts_.load(std::memory_order_relaxed);
        if (sleeping_ > 0 && (left > awake || (streaming && awake == 0))) {
            if (left > awake + 1) cv_.notify_all();
            else cv_.notify_one();
        }
    }
    if (!own.empty()) copy_batch(*link, own);
    if (from) copy_batch(*from, batch);
}

void CopyPool::run() {
    std::shared_ptr<Link> link;
    std::vector<Part> batch;
    bool small = false;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            // Watch for kIdleSpin, also after losing a part to another copier.
            const auto until = std::chrono::steady_clock::now() + kIdleSpin;
            while (ready_.empty() && !stop_.load() && std::chrono::steady_clock::now() < until) {
                spinning_++;  // submitters leave parts to this thread meanwhile
                lk.unlock();
                spin_for_work(until);
                lk.lock();
                spinning_--;
            }
            if (ready_.empty()) {
                if (stop_.load()) return;  // nothing is left
                sleeping_++;
                cv_.wait(lk);  // woken for parts, to watch for them (a stream), or to stop
                sleeping_--;
                continue;
            }
            small = take(&link, batch, false) <= kBatchBytes;
            if (small) busy_small_++;
        }
        copy_batch(*link, batch);
        link.reset();  // the link may go once its peer is gone
        std::lock_guard<std::mutex> lk(mu_);
        if (small) busy_small_--;
    }
}

}  // namespace kvx::shm
