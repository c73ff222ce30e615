// Peer registrations while they connect. Each holds its peer id's reservation
// until it publishes or fails; a replacing add supersedes it and
// kvx_remove_remote_peer() or close cancel it, and a registration that lost
// its reservation never publishes. Asynchronous ones
// (kvx_add_remote_peer_async) also have an outcome, reported once.
//
// Their connections are made by a bounded pool of connect workers owned
// here: at most kMaxWorkers threads, started on demand while jobs are queued
// and fewer than the cap run; each takes jobs from the queue (oldest first)
// until it is empty, lingers kWorkerLinger for more and exits, so an idle
// transport is back at its idle thread count (event loop, watchdog, the
// launcher). Workers are started by the launcher thread, never by the caller
// of kvx_add_remote_peer_async, whose call must not block (a thread start
// alone can take milliseconds on a busy host). All are joined at close.
//
// The cost of the cap: a connect attempt blocks its worker until it is done
// (bounded by connect_timeout_ms), so a registration queued behind slow ones
// (a peer that does not answer) waits for a worker first: with k queued
// ahead of it, up to ceil((k + 1) / kMaxWorkers) connect timeouts in all
// (kvxfer.h, kvx_add_remote_peer_async). A registration cancelled while
// queued (remove, replace, close) is never run: its outcome is already
// recorded.
//
// Everything is guarded by the transport's mutex: *_locked methods expect it
// held, wait() takes the caller's lock on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "kvxfer.h"

namespace kvx {

class Registrations {
public:
    // Connect workers at most. Connections to answering peers take about a
    // round trip and a handshake, so a few workers keep up with a burst of
    // adds (100 on loopback in tens of ms); the cap bounds what a burst costs
    // (a thread, its stack) at a small constant. It is 16, not 4, for the
    // peers that do not answer, each holding a worker for up to
    // connect_timeout_ms: vLLM's session code expects each registration to
    // end within connect_timeout_ms of its call (bindings/python/tests/
    // test_vllm_dropin.py, 10 silent peers at once), which holds for up to
    // 16 pending at once (glibc's AIO pool has 20 threads for the same
    // trade). tests/scale/test_async_adds.c names the same value.
    static constexpr size_t kMaxWorkers = 16;
    // How long an idle worker waits for another job before it exits: long
    // enough that adds in quick succession reuse it, short enough that the
    // threads of a burst are gone soon after it.
    static constexpr std::chrono::milliseconds kWorkerLinger{250};

    // mu: the transport's mutex, which guards this object.
    explicit Registrations(std::mutex &mu) : mu_(mu) {}

    struct Pending {
        uint64_t reg = 0;  // 0: a synchronous registration (no outcome kept)
        std::string id;
        bool current = true;   // still holds the reservation of id
        int cancel_code = 0;   // why not: KVX_ECANCELED or KVX_ECLOSED
        bool finished = false;
        int64_t began_ns = 0;  // steady-clock ns of the add (kvx_list_peers)
        std::atomic<bool> called_off{false};  // set with cancel_code: the attempt stops connecting
    };
    using Ref = std::shared_ptr<Pending>;

    struct Status {
        int state = KVX_REGISTRATION_PENDING;
        int error = 0;
        std::string message;
    };

    bool pending_locked(const std::string &id) const { return by_id_.count(id) != 0; }
    size_t count_locked() const { return by_id_.size(); }
    // Each registration in progress: its id and when it began.
    template <typename F> void each_locked(F f) const {
        for (const auto &[id, r] : by_id_) f(id, r->began_ns);
    }

    // Reserves id for a new registration (reg 0: synchronous). If another
    // registration holds it: KVX_EEXIST, or with replace that one is
    // superseded (reports KVX_ECANCELED, never publishes).
    Ref reserve_locked(const std::string &id, uint64_t reg, bool replace);
    // The registration ended with status (0: published). Releases its
    // reservation if it still holds it and records the outcome (once).
    void finish_locked(const Ref &r, int status, const std::string &message);
    // Cancels the registration of id in progress, if any: true if there was one.
    bool cancel_locked(const std::string &id, int code, const char *why);
    // Cancels every one (close).
    void cancel_all_locked(int code, const char *why);

    // The outcome of reg, waiting up to timeout_ms (-1: no limit) while it is
    // pending; a final one is forgotten once returned. KVX_ENOENT if unknown.
    Status wait(std::unique_lock<std::mutex> &lk, uint64_t reg, int timeout_ms);

    // Starts the launcher thread (once, at transport creation).
    void start();
    // Queues fn, the connection of registration r, for a connect worker;
    // skipped if r is cancelled before a worker takes it. r fails with
    // KVX_ENOMEM if no worker runs and none can be started.
    void submit_locked(const Ref &r, std::function<void()> fn);
    // Queues fn, a task that is no registration (a peer's reconnection), for
    // a connect worker: it shares their cap. If no worker runs and none can
    // be started, dropped() runs instead (lock held); close drops it unrun.
    void submit_task_locked(std::function<void()> fn, std::function<void()> dropped);
    // A synchronous registration (kvx_add_remote_peer() in the caller's
    // thread) began / ended: shutdown() waits for every one that began to
    // end, as it joins the connect workers.
    void sync_began_locked() { sync_++; }
    void sync_ended_locked();
    // Stops the launcher, drops the queue (cancelled by close), joins every
    // worker and waits for the synchronous registrations (close; without the
    // lock).
    void shutdown();

private:
    struct Worker {
        std::thread thread;
        bool ended = false;  // set, under the lock, as the thread's last act
    };
    struct Job {
        Ref r;  // null for a task (submit_task_locked)
        std::function<void()> fn;
        std::function<void()> dropped;  // a task's, when no worker can run it
    };
    void record_locked(uint64_t reg, int status, const std::string &message);
    void launcher();
    bool need_worker_locked() const;
    void start_worker(std::unique_lock<std::mutex> &lk);
    void reap(std::unique_lock<std::mutex> &lk);
    void work(Worker *self);
    void run_jobs(std::unique_lock<std::mutex> &lk);

    std::mutex &mu_;
    std::map<std::string, Ref> by_id_;
    std::unordered_map<uint64_t, Status> outcomes_;
    std::condition_variable cv_;  // an outcome was decided
    std::deque<Job> jobs_;        // queued for a worker, oldest first
    std::list<Worker> workers_;   // started and not joined yet (a list: workers hold their node)
    size_t live_ = 0;             // workers starting or running, at most kMaxWorkers
    size_t idle_ = 0;             // of those, the ones not running a job (starting ones count)
    size_t ended_ = 0;            // workers that ended and wait to be joined
    bool start_failed_ = false;   // no worker could be started: wait for a change before trying again
    bool stopping_ = false;
    std::condition_variable work_cv_;    // a job was queued, or stopping_
    std::condition_variable launch_cv_;  // a worker may be needed, one ended, or stopping_
    std::thread launcher_;
    size_t sync_ = 0;                  // synchronous registrations under way
    std::condition_variable sync_cv_;  // sync_ reached 0
};

}  // namespace kvx
