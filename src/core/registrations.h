// Peer registrations while they connect. Each holds its peer id's reservation
// until it publishes or fails; a replacing add supersedes it and
// kvx_remove_remote_peer() or close cancel it, and a registration that lost
// its reservation never publishes. Asynchronous ones
// (kvx_add_remote_peer_async) also have an outcome, reported once, and a
// thread that connects, owned here and joined at close.
//
// Everything is guarded by the transport's mutex: *_locked methods expect it
// held, wait() takes the caller's lock on it.
#pragma once

#include <condition_variable>
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
    // Forgets reg's outcome unreported (its start failed after all).
    void discard_locked(uint64_t reg) { outcomes_.erase(reg); }
    // Cancels every one (close).
    void cancel_all_locked(int code, const char *why);

    // The outcome of reg, waiting up to timeout_ms (-1: no limit) while it is
    // pending; a final one is forgotten once returned. KVX_ENOENT if unknown.
    Status wait(std::unique_lock<std::mutex> &lk, uint64_t reg, int timeout_ms);

    // Runs fn on a thread of its own. Threads that ended are handed back
    // through *ended, to be joined by the caller without the lock.
    void spawn_locked(std::function<void()> fn, std::vector<std::thread> *ended);
    // Every thread, to be joined without the lock (close).
    std::vector<std::thread> take_threads_locked();

private:
    struct Worker {
        std::thread thread;
        std::shared_ptr<bool> ended;  // set, under the lock, as the thread's last act
    };
    void record_locked(uint64_t reg, int status, const std::string &message);

    std::mutex &mu_;
    std::map<std::string, Ref> by_id_;
    std::unordered_map<uint64_t, Status> outcomes_;
    std::vector<Worker> workers_;
    std::condition_variable cv_;
};

}  // namespace kvx
