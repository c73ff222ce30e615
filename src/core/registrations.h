// Peer registrations while they connect. Each holds its peer id's reservation
// until it publishes or fails; a replacing add supersedes it and
// kvx_remove_remote_peer() or close cancel it, and a registration that lost
// its reservation never publishes. Asynchronous ones
// (kvx_add_remote_peer_async) also have an outcome, reported once, and a
// thread that connects, owned here and joined at close. Those threads are
// started by a launcher thread of the transport, never by the caller, whose
// call must not block (a thread start alone can take milliseconds on a busy
// host).
//
// Everything is guarded by the transport's mutex: *_locked methods expect it
// held, wait() takes the caller's lock on it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvxfer.h"

namespace kvx {

class Registrations {
public:
    // mu: the transport's mutex, which guards this object.
    explicit Registrations(std::mutex &mu) : mu_(mu) {}

    struct Pending {
        uint64_t reg = 0;  // 0: a synchronous registration (no outcome kept)
        std::string id;
        bool current = true;   // still holds the reservation of id
        int cancel_code = 0;   // why not: KVX_ECANCELED or KVX_ECLOSED
        bool finished = false;
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
    // Has fn run on a thread of its own, for registration r (which fails
    // with KVX_ENOMEM if no thread can be started).
    void submit_locked(const Ref &r, std::function<void()> fn);
    // A synchronous registration (kvx_add_remote_peer() in the caller's
    // thread) began / ended: shutdown() waits for every one that began to
    // end, as it joins the threads of the asynchronous ones.
    void sync_began_locked() { sync_++; }
    void sync_ended_locked();
    // Stops the launcher, joins every thread and waits for the synchronous
    // registrations (close; without the lock).
    void shutdown();

private:
    struct Worker {
        std::thread thread;
        std::shared_ptr<bool> ended;  // set, under the lock, as the thread's last act
    };
    struct Job {
        Ref r;
        std::function<void()> fn;
    };
    void record_locked(uint64_t reg, int status, const std::string &message);
    void launcher();
    std::thread start_worker(std::function<void()> fn, std::shared_ptr<bool> ended);

    std::mutex &mu_;
    std::map<std::string, Ref> by_id_;
    std::unordered_map<uint64_t, Status> outcomes_;
    std::vector<Worker> workers_;
    std::condition_variable cv_;  // an outcome was decided
    std::deque<Job> jobs_;
    bool stopping_ = false;
    std::condition_variable launch_cv_;
    std::thread launcher_;
    size_t sync_ = 0;                  // synchronous registrations under way
    std::condition_variable sync_cv_;  // sync_ reached 0
};

}  // namespace kvx
