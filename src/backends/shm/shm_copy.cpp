// The writer's data path: copy threads, the copy of one part (into the
// mapping, through process_vm_writev, or through the target's staging ring),
// and the SIGBUS guard that turns a fault in the peer's mapping (the target
// truncated its file) into a failed transfer instead of a dead process.
#include <sys/mman.h>
#include <sys/uio.h>

#include <climits>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#include "backends/shm/shm.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::shm {

namespace {

constexpr uint64_t kChunk = 8u << 20;  // a halt is seen at least this often while copying

// Set only while a copy thread copies into a peer's mapping, with the range
// of that mapping. initial-exec: the signal handler must not allocate
// thread storage.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf *t_guard = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local uintptr_t t_guard_lo = 0, t_guard_hi = 0;
struct sigaction g_prev_sigbus;

// Ours: a fault (not a signal someone sent) at an address of the mapping
// this thread is copying into. Anything else (a fault in the source region,
// kill -BUS) goes where it went before us.
void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const bool sent = !si || si->si_code <= 0;  // SI_USER, SI_QUEUE, SI_TKILL...
    if (sigjmp_buf *jb = t_guard; jb && !sent) {
        const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
        if (a >= t_guard_lo && a < t_guard_hi) {
            t_guard = nullptr;
            siglongjmp(*jb, 1);
        }
    }
    // sa_handler and sa_sigaction share storage: SIG_DFL/SIG_IGN are seen
    // the same with or without SA_SIGINFO.
    const struct sigaction &p = g_prev_sigbus;
    if (p.sa_handler == SIG_IGN && sent) return;  // ignored, as before us
    if (p.sa_handler == SIG_DFL || p.sa_handler == SIG_IGN) {
        signal(SIGBUS, SIG_DFL);
        if (sent) raise(SIGBUS);  // the default action now (SA_NODEFER: not blocked here)
        return;                   // a fault repeats on return and kills, as without us
    }
    if (p.sa_flags & SA_SIGINFO) p.sa_sigaction(sig, si, uc);
    else p.sa_handler(sig);
}

// The runs of p into the mapping: 0, 1 when halted, -1 on a fault.
int copy_mapped(Link &l, const Part &p) {
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0) != 0) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &s, nullptr);  // the handler left it blocked
        return -1;
    }
    t_guard_lo = reinterpret_cast<uintptr_t>(l.map_base);
    t_guard_hi = t_guard_lo + l.map_len;
    t_guard = &jb;
    for (const Run &r : p.runs) {
        for (uint64_t done = 0; done < r.len; done += kChunk) {
            if (l.halt.load(std::memory_order_relaxed)) {
                t_guard = nullptr;
                return 1;
            }
            const uint64_t n = std::min(kChunk, r.len - done);
            memcpy(l.dst + r.remote_off + done, l.local.base + r.local_off + done, n);
        }
    }
    t_guard = nullptr;
    return 0;
}

int copy_kernel(Link &l, const Part &p) {
    std::vector<iovec> lv, rv;
    for (const Run &r : p.runs) {
        for (uint64_t done = 0; done < r.len; done += kChunk) {
            const uint64_t n = std::min(kChunk, r.len - done);
            lv.push_back(iovec{l.local.base + r.local_off + done, n});
            rv.push_back(iovec{reinterpret_cast<void *>(l.remote_base + r.remote_off + done), n});
        }
    }
    for (size_t at = 0; at < lv.size();) {
        if (l.halt.load(std::memory_order_relaxed)) return KVX_ECANCELED;
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
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    struct sigaction prev {};
    sigaction(SIGBUS, &sa, &prev);
    if (!((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == on_sigbus)) g_prev_sigbus = prev;
}

int copy_part(Link &l, const Part &p) {
    if (l.mode == Mode::kernel) return copy_kernel(l, p);
    if (!l.sealed) install_sigbus_guard();  // a file that may shrink under us
    const int rc = copy_mapped(l, p);
    if (rc < 0) {
        KVX_LOG(warn, "shm: peer '%s': its mapping faulted (SIGBUS: the file was truncated?)", l.peer_id.c_str());
        return KVX_ECONNRESET;
    }
    return rc == 0 ? 0 : KVX_ECANCELED;
}

Link::~Link() { unmap(); }

void Link::fail_all(int st) {
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
    withdraw(posted);  // staged: nothing the target has not taken lands any more
    CompletionBatch b;
    for (auto &[id, op] : victims) b.fail(*op, status);
    b.deliver(*sink);
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
        stop_ = true;
    }
    cv_.notify_all();
    for (auto &t : threads_) t.join();
}

void CopyPool::push(std::vector<Job> jobs) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto &j : jobs) queue_.push_back(std::move(j));
    }
    if (jobs.size() == 1) cv_.notify_one();
    else cv_.notify_all();
}

namespace {

// Starts a job's part if its link and transfer still want it; true when the
// caller then copies it (counted in link.active).
bool begin(Job &j) {
    Link &l = *j.link;
    std::lock_guard<std::mutex> lk(l.mu);
    if (l.stop) return false;
    if (!j.part.op->try_start()) {  // cancelled before a byte moved
        l.ops.erase(j.part.op->id);
        return false;
    }
    l.active++;
    return true;
}

// Reports a copied part (or stops the link at its first failure).
void end(Job &j, int rc) {
    Link &l = *j.link;
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
            b.part_done(*j.part.op, 0);
            if (!b.empty()) l.ops.erase(j.part.op->id);
        }
    }
    if (rc == 0) l.sink->progress();
    b.deliver(*l.sink);
    {
        std::lock_guard<std::mutex> lk(l.mu);
        l.active--;
        l.cv.notify_all();
    }
    if (first_failure) l.fail_all(rc);  // once every copy of the link let go
}

}  // namespace

void CopyPool::copy_now(Job j) {
    if (begin(j)) end(j, copy_part(*j.link, j.part));
}

void CopyPool::run() {
    for (;;) {
        Job j;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            j = std::move(queue_.front());
            queue_.pop_front();
        }
        if (!begin(j)) continue;
        end(j, copy_part(*j.link, j.part));
    }
}

}  // namespace kvx::shm
