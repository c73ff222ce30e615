// Transport: the stall watchdog, one thread per transport. It fails the
// transfers of a peer that stalls, marks a broken peer down, shuts down or
// times out the links a return to a preferred path left behind, and starts
// reconnections and returns (transport_peers.cpp) on the connect workers.
#include <algorithm>
#include <map>

#include "core/transport.h"
#include "util/log.h"

namespace kvx {

// A transfer times out only when its peer stalls: work outstanding and no
// progress (no acknowledgement, nothing completed) for transfer_timeout_ms,
// or for stall_grace_ms of it when the network was silent at that point
// (backend.h). Time spent queued behind a healthy peer's other transfers
// does not count, and nothing here scans the transfers in flight: the work
// is O(peers). Time this process did not run (stopped, a paused VM) does
// not count either: its event loop could not take acknowledgements then.
void Transport::watchdog() {
    const auto timeout = std::chrono::milliseconds(core_.transfer_timeout_ms);
    // A peer that gets work while the watchdog sleeps is checked at most this late.
    const auto slack = std::clamp<std::chrono::milliseconds>(timeout / 20, std::chrono::milliseconds(1),
                                                             std::chrono::milliseconds(100));
    // Waking later than this past its time, the watchdog was not running.
    const auto paused = std::max<Clock::duration>(4 * slack, std::chrono::milliseconds(200));
    std::unique_lock<std::mutex> lk(mu_);
    while (!closed_) {
        Clock::time_point next = Clock::now() + slack;
        std::vector<Reaped> reaped;
        if (retired_links_ != 0) reaped = reap_retired_locked();
        lk.unlock();
        reap_retired(reaped);
        std::vector<std::shared_ptr<Peer>> broke;
        std::vector<Stalled> stalled = stalled_peers(&next, &broke);
        lk.lock();
        for (auto &p : broke)
            if (!p->removed && p->state == Peer::Link::up) went_down_locked(*p, "its connection failed");
        size_t n = 0;
        for (auto &s : stalled) {
            // Progress or completion since the look: not stalled after all.
            if (s.peer->progress_ns.load() != s.since || s.peer->outstanding.load() == 0) continue;
            KVX_LOG_PEER(warn, s.peer->id.c_str(), "peer '%s' made no progress for %llu ms with %llu transfers in flight: failing them",
                    s.peer->id.c_str(), (unsigned long long)(Peer::now_ns() - s.since) / 1000000,
                    (unsigned long long)s.peer->outstanding.load());
            s.peer->timed_out.store(true);
            for (const Peer::Retired &r : s.peer->retired) s.retired.push_back(r.link);
            if (s.peer->state == Peer::Link::up)
                went_down_locked(*s.peer, strfmt("no progress for %u ms with transfers in flight (transfer_timeout_ms)",
                                                 core_.transfer_timeout_ms));
            if (&s != &stalled[n]) stalled[n] = std::move(s);  // (a vector moved onto itself empties)
            n++;
        }
        stalled.resize(n);
        // How much longer than expected the next step took: the process was
        // not running for most of it. An abort waits up to 200 ms for its
        // resets to arrive (tcp's settle), a sleep ends at `next`.
        Clock::duration late{};
        if (!stalled.empty()) {
            lk.unlock();
            const Clock::time_point t0 = Clock::now();
            for (auto &s : stalled) {  // each link reports its transfers, failed
                s.link->abort(KVX_ETIMEDOUT);
                for (auto &l : s.retired) l->abort(KVX_ETIMEDOUT);
            }
            late = Clock::now() - t0 - std::chrono::milliseconds(250 * static_cast<int64_t>(stalled.size()));
            stalled.clear();  // the last reference to a retired link or a removed peer goes without mu_
            lk.lock();
        } else {
            start_redials_locked(&next);
            const Clock::time_point from = Clock::now();
            wd_cv_.wait_until(lk, next);
            late = Clock::now() - std::max(next, from);
        }
        if (late > paused) {
            lk.unlock();
            credit_pause(std::chrono::duration_cast<std::chrono::nanoseconds>(late).count());
            lk.lock();
        }
    }
}

// The process did not run for late_ns: every peer's last progress moves
// that much later (never past now), so a stall counts only time in which
// its acknowledgements could have been taken.
void Transport::credit_pause(int64_t late_ns) {
    std::vector<std::shared_ptr<Peer>> peers;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto &[id, p] : peers_) peers.push_back(p);
    }
    KVX_LOG(info, "the stall watchdog woke %lld ms late (the process was stopped or starved): peers' stall time "
                  "restarts", (long long)(late_ns / 1000000));
    const int64_t now = Peer::now_ns();
    for (auto &p : peers) {
        int64_t old = p->progress_ns.load();
        while (!p->progress_ns.compare_exchange_weak(old, std::min(old + late_ns, now))) {
        }
    }
}

std::vector<Transport::Stalled> Transport::stalled_peers(Clock::time_point *next,
                                                         std::vector<std::shared_ptr<Peer>> *broke) {
    std::vector<std::pair<std::shared_ptr<Peer>, std::shared_ptr<BackendPeer>>> peers;
    std::vector<Stalled> stalled;
    // Links a return left behind, by peer: a stall may be theirs (silent network) too.
    std::map<const Peer *, std::vector<std::shared_ptr<BackendPeer>>> retired;
    {
        std::lock_guard<std::mutex> lk(mu_);
        peers.reserve(peers_.size());
        for (auto &[id, p] : peers_) {
            if (p->state != Peer::Link::up) continue;
            peers.emplace_back(p, p->link);
            for (const Peer::Retired &r : p->retired) retired[p.get()].push_back(r.link);
        }
    }
    auto ns = [](uint64_t ms) { return std::chrono::nanoseconds(std::chrono::milliseconds(ms)).count(); };
    const int64_t timeout_ns = ns(core_.transfer_timeout_ms);
    const int64_t now = Peer::now_ns();
    for (auto &[p, link] : peers) {
        if (link->broken()) {
            broke->push_back(p);
            continue;
        }
        if (p->outstanding.load() == 0 || p->timed_out.load()) continue;
        const int64_t since = p->progress_ns.load(std::memory_order_relaxed);
        int64_t due = since + (p->grace_from_ns == since ? p->grace_ns : timeout_ns);
        if (p->silent_since_ns != since) {  // a new stall (or progress since the last look)
            p->silent_since_ns = since;
            p->silent_sampled_ns = 0;
            p->silent_rto_us = 0;
        }
        // The network may be silent in the middle of the stall and answer
        // again by its end while data the peer sent us still waits for its
        // kernel's next resend (a keepalive probe answered just before the
        // timeout says nothing of that): look from half the timeout on, at
        // most every 50 ms, and count what was seen.
        if (p->grace_from_ns != since && now >= since + timeout_ns / 2 &&
            (due <= now || now >= p->silent_sampled_ns + ns(50))) {
            p->silent_sampled_ns = now;
            p->silent_rto_us = std::max(p->silent_rto_us, link->network_silent_rto_us());
            if (auto r = retired.find(p.get()); r != retired.end())
                for (auto &l : r->second) p->silent_rto_us = std::max(p->silent_rto_us, l->network_silent_rto_us());
        }
        const uint64_t rto_us = due <= now && p->grace_from_ns != since ? p->silent_rto_us : 0;
        if (rto_us != 0) {
            const uint64_t grace_ms = stall_grace_ms(core_.transfer_timeout_ms, (rto_us + 999) / 1000);
            p->grace_from_ns = since;
            p->grace_ns = ns(grace_ms);
            due = since + p->grace_ns;
            KVX_LOG_PEER(warn, p->id.c_str(), "peer '%s' made no progress for %u ms while the network loses its packets (the kernel is "
                          "resending, timeout %llu ms): waiting for a resend, up to %llu ms in all",
                    p->id.c_str(), core_.transfer_timeout_ms, (unsigned long long)(rto_us + 999) / 1000,
                    (unsigned long long)grace_ms);
        }
        if (due <= now) stalled.push_back(Stalled{p, link, since, {}});
        else *next = std::min(*next, Clock::now() + std::chrono::nanoseconds(due - now));
    }
    return stalled;
}

}  // namespace kvx
