// The one interface between the core and the backends (tcp, verbs, shm).
// The core never includes a backend's headers; a backend never sees the
// core's peer or transfer tables. Dependency direction:
//   capi -> core -> backend/ (this interface, ops, registry) <- backends/{tcp,verbs,...}
// A backend describes itself in a registry entry (registry.h); the core walks
// the registry and never names a backend.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "handshake/handshake.h"
#include "util/event_loop.h"
#include "util/net.h"
#include "util/options.h"
#include "wire/metadata.h"

namespace kvx {

using Clock = std::chrono::steady_clock;

// The caller-owned local region.
struct Region {
    uint8_t *base = nullptr;
    uint64_t num_blocks = 0;
    uint64_t block_len = 0;
    uint64_t size() const { return num_blocks * block_len; }
};

// One run of consecutive blocks: local byte offset -> remote byte offset.
struct Run {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
};

// A transfer's state, shared by the core (which may cancel it) and the
// backend (which moves it): reported exactly once, when its last part is done
// or at its first failure, or never if it was claimed before it started.
// Every transition is one atomic step, so cancel needs no backend lock and
// no search: O(1) per id. 40 bytes: with a million transfers in flight every
// byte here is a megabyte.
struct OpState {
    uint64_t id = 0;
    // The core's, fixed at submit: its peer, the bytes, when it was submitted.
    void *owner = nullptr;
    uint64_t bytes = 0;
    int64_t t0_ns = 0;
    std::atomic<uint32_t> refs{1};  // OpRef's
    std::atomic<uint16_t> parts_left{0};
    std::atomic<uint8_t> state{kQueued};
    enum : uint8_t { kQueued, kStarted, kReported };
    static constexpr size_t kMaxParts = UINT16_MAX;

    // The backend is about to put bytes of it on the wire. false: it was
    // claimed (cancelled) or already failed: drop the part, report nothing.
    bool try_start() {
        uint8_t s = kQueued;
        return state.compare_exchange_strong(s, kStarted) || s == kStarted;
    }
    // The core cancels it: true if nothing of it was sent and it will never
    // be reported; false once it started (it will be reported).
    bool claim_unstarted() {
        uint8_t s = kQueued;
        return state.compare_exchange_strong(s, kReported);
    }
    // The core forgot it after it started (KVX_CANCEL_IMMEDIATE): it is never
    // reported, and a part of it not on the wire yet (queued, or one to send
    // again on another rail or stream after a failure) is dropped, never read
    // again from memory the application may reuse by now.
    void forget() { state.store(kReported); }
    // True for the one caller that reports it.
    bool report() { return state.exchange(kReported) != kReported; }
    // One part ended with status. True when the transfer is to be reported
    // now, with that status (a success only for the last part).
    bool finish_part(int status) {
        if (status != 0) return report();
        return parts_left.fetch_sub(1) == 1 && report();
    }
};

// A counted reference to an OpState (8 bytes; the count lives in it).
class OpRef {
public:
    OpRef() = default;
    static OpRef make() { return OpRef(new OpState); }
    OpRef(const OpRef &o) noexcept : p_(o.p_) {
        if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
    }
    OpRef(OpRef &&o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    OpRef &operator=(OpRef o) noexcept {
        std::swap(p_, o.p_);
        return *this;
    }
    ~OpRef() {
        if (p_ && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete p_;
    }
    OpState *get() const { return p_; }
    OpState *operator->() const { return p_; }
    OpState &operator*() const { return *p_; }
    explicit operator bool() const { return p_ != nullptr; }

private:
    explicit OpRef(OpState *p) : p_(p) {}
    OpState *p_ = nullptr;
};

// A transfer's runs: most transfers are one run, held inline (no
// allocation); more spill to the heap. 32 bytes. Large arrays (kRecycleRuns
// runs or more) are recycled: a few freed ones are kept, their pages
// resident, for the next transfers of as many runs (issue 30 item 7: a
// fresh 1.5 MiB array for 65,536 runs cost its submitter 30-120 page faults
// a call).
class Runs {
public:
    Runs() : one_{} {}
    Runs(std::initializer_list<Run> l) : Runs() {
        for (const Run &r : l) push_back(r);
    }
    Runs(const Runs &o) : Runs() {
        for (const Run &r : o) push_back(r);
    }
    Runs(Runs &&o) noexcept : Runs() { swap(o); }
    Runs &operator=(Runs o) noexcept {
        swap(o);
        return *this;
    }
    ~Runs() {
        if (cap_) release(heap_, cap_);
    }
    static constexpr size_t kRecycleRuns = 4096;  // 96 KiB: below, malloc's heap serves without faults
    static constexpr size_t kCacheSlots = 8;      // at most this many kept,
    static constexpr uint64_t kCacheBytes = uint64_t{16} << 20;  // in at most these bytes, process-wide
    static size_t cached_bytes();                 // the freed arrays kept now (for tests)
    void swap(Runs &o) noexcept {
        unsigned char t[sizeof(Run)];  // the union's bytes: a Run or a pointer, both trivially copyable
        memcpy(t, raw_, sizeof t);
        memcpy(raw_, o.raw_, sizeof t);
        memcpy(o.raw_, t, sizeof t);
        std::swap(n_, o.n_);
        std::swap(cap_, o.cap_);
    }
    void push_back(const Run &r) {
        if (cap_ > n_) {
            heap_[n_++] = r;
        } else if (cap_ == 0 && n_ == 0) {
            one_ = r;
            n_ = 1;
        } else {
            reserve(cap_ ? size_t{cap_} * 2 : 4);
            heap_[n_++] = r;
        }
    }
    // Room for n runs (more than one: on the heap).
    void reserve(size_t n);
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    Run *begin() { return cap_ ? heap_ : &one_; }
    Run *end() { return begin() + n_; }
    const Run *begin() const { return cap_ ? heap_ : &one_; }
    const Run *end() const { return begin() + n_; }
    Run &operator[](size_t i) { return begin()[i]; }
    const Run &operator[](size_t i) const { return begin()[i]; }
    Run &front() { return *begin(); }
    const Run &front() const { return *begin(); }
    Run &back() { return begin()[n_ - 1]; }

private:
    static Run *acquire(size_t n, uint32_t *cap);
    static void release(Run *p, uint32_t cap) noexcept;
    union {
        Run one_;       // cap_ == 0: at most one run, here
        Run *heap_;     // cap_ > 0
        unsigned char raw_[sizeof(Run)];
    };
    uint32_t n_ = 0, cap_ = 0;
};

// A transfer as a backend sees it: validated, coalesced runs.
struct Op {
    OpRef state;  // id, and what the core shares with the backend
    Runs runs;
    uint64_t bytes = 0;
};

// One per peer. Backends report each submitted op exactly once through it,
// from any thread, holding none of their own locks. status is 0 or a KVX_E*
// code. progress() says the peer acknowledged something that completed no
// transfer (part of a large one): the transfer timeout measures a stall, so
// a backend that can see partial progress reports it.
class CompletionSink {
public:
    virtual void complete(uint64_t id, int status) = 0;
    virtual void progress() = 0;

protected:
    ~CompletionSink() = default;
};

// Everything a backend needs from the transport, fixed at creation.
struct BackendContext {
    Region region;
    const Options *options = nullptr;  // the transport's options (every table)
    handshake::Identity identity;      // what our metadata says about us
    EventLoop *loop = nullptr;         // the transport's event loop, running
};

// What the core knows about a peer when it asks a backend to connect.
struct PeerContext {
    std::string peer_id;
    const wire::AgentMetadata *meta = nullptr;  // decoded and checked by the core
    const wire::Section *section = nullptr;     // this backend's section of it (checked)
    net::Deadline deadline;  // connect + authenticate before this; called off by close or remove
    CompletionSink *sink = nullptr;
};

// The stall timeout's timers, all derived from transfer_timeout_ms (t, in
// ms) and stated in docs/semantics.md ("Timers"). A peer with transfers
// outstanding and no progress for t is failed, unless at that moment one of
// its connections is silent because of the network (BackendPeer::
// network_silent_rto_us()): the kernel resends at doubling intervals from
// its retransmission timeout rto (200 ms at least; more on a loaded or long
// path), so the resend that follows an outage of d comes up to 2d + rto
// after the outage began, in each direction. Such a peer is failed only once
// it made no progress for stall_grace_ms(t, rto): 2t plus rto and 250 ms to
// take the answer, at least max(t/4, 500 ms), at most max(t, 500 ms). The kernel gives up
// on a connection (TCP_USER_TIMEOUT, keepalive) only after the longest
// grace, so that an outage shorter than t fails nothing and the watchdog,
// not the kernel, ends a longer one.
constexpr uint64_t stall_grace_ms(uint64_t t, uint64_t rto_ms) {
    const uint64_t least = std::max<uint64_t>(t / 4, 500);
    return 2 * t + std::clamp<uint64_t>(rto_ms + 250, least, std::max(least, t));
}
constexpr uint64_t kernel_give_up_ms(uint64_t t) { return 3 * t + 1000; }

// Reconnection's timer (peer_redial_ms, docs/semantics.md "Timers"), for a
// peer and for a peer's lost rail alike: after n failed attempts the next
// waits peer_redial_ms times this, doubling up to 8.
constexpr uint32_t kRedialMaxFactor = 8;
constexpr uint32_t redial_factor(uint32_t failed) {
    return std::min<uint32_t>(1u << std::min<uint32_t>(failed, 3), kRedialMaxFactor);
}

// The rail dialler's wait (tcp and verbs): until an entry of q (each has a
// `due` time point) is due, then takes the earliest into *out: true; false
// once stop is set. lk holds the mutex guarding q and stop; cv is notified
// when either changes.
template <class T>
bool take_due(std::vector<T> &q, std::unique_lock<std::mutex> &lk, std::condition_variable &cv, const bool &stop,
              T *out) {
    while (!stop) {
        if (q.empty()) {
            cv.wait(lk);
            continue;
        }
        auto next = std::min_element(q.begin(), q.end(), [](const T &a, const T &b) { return a.due < b.due; });
        if (Clock::now() < next->due) {
            cv.wait_until(lk, next->due);
            continue;
        }
        *out = *next;
        q.erase(next);
        return true;
    }
    return false;
}

// One rail of a peer (a local port or interface paired with one of the
// peer's), as telemetry shows it.
struct RailStats {
    std::string name;         // "rxe0:1 -> 198.18.0.1:20049"
    bool up = true;           // carries parts now
    uint64_t bytes = 0;       // of the parts it completed
    uint64_t parts = 0;       // parts it completed
    uint64_t failures = 0;    // times it was taken out
    int64_t changed_ns = 0;   // CLOCK_REALTIME of its last change of state (up or connected)
};

class BackendPeer {
public:
    virtual ~BackendPeer() = default;
    // Queue an op. Never blocks on the network. If the peer is broken or shut
    // down, the op is failed through the sink. Before the first byte of a
    // part leaves, the backend calls op.state->try_start() and drops the part
    // silently when it says false (the core cancelled the transfer).
    virtual void submit(Op op) = 0;
    // True once the connection failed; later submits fail fast.
    virtual bool broken() const = 0;
    // Break the connection without waiting (timeout path); pending ops fail.
    virtual void abort(int status) = 0;
    // Fail what is pending, close connections, release resources. After
    // return the sink is never called again for this peer. Idempotent; a
    // caller that comes while another shuts the peer down returns only
    // once that is done (std::call_once): the core's remove relies on it.
    virtual void shutdown() = 0;
    // How this peer's bytes move when the backend has several ways ("mapped",
    // "process_vm_writev"); "" when it has one. Static storage.
    virtual const char *path() const { return ""; }
    // Whether the silence of a peer that made no progress for the stall
    // timeout is the network's: the kernel is resending after a
    // retransmission timeout, or its keepalive probes go unanswered, on one
    // of the peer's connections (a frozen peer's kernel still answers).
    // 0 when not; else the largest base retransmission timeout (before
    // backoff) of those connections, in microseconds, at least 1. Called by
    // the watchdog thread, at most once per stall.
    virtual uint64_t network_silent_rto_us() { return 0; }
    // This peer's rails, for telemetry; none when the backend has no rails.
    // Any thread.
    virtual void rails(std::vector<RailStats> *) const {}
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char *name() const = 0;
    // This backend's section of the transport's metadata.
    virtual wire::Section describe() const = 0;
    // Can this peer be reached this way at all (shm: on this host)? Cheap,
    // no connection; false with *why. A path that is not applicable is
    // skipped; one that is applicable and fails to connect is a failure.
    virtual bool applicable(const PeerContext &, std::string *) const { return true; }
    // Connect and authenticate within pc.deadline; throws Error on failure.
    virtual std::unique_ptr<BackendPeer> connect(const PeerContext &pc) = 0;
    // Stop serving: after return no byte lands in the region.
    virtual void shutdown() = 0;
};

}  // namespace kvx
