// The transport: vLLM's DataTransport contract on top of the backends.
// Owns the peer table, the transfer table and the completion queues; every
// public method is safe to call from several threads at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend_api/backend.h"
#include "core/id_table.h"
#include "core/options.h"
#include "core/ready.h"
#include "core/registrations.h"
#include "core/telemetry.h"
#include "kvxfer.h"
#include "util/event_loop.h"

namespace kvx {

class Transport final {
public:
    Transport(void *base, uint64_t num_blocks, uint64_t block_len, const char *config_json, const OptionBag *opts);
    ~Transport();
    Transport(const Transport &) = delete;
    Transport &operator=(const Transport &) = delete;

    // Idempotent; every call returns only once the first one finished.
    void close();
    const Region &region() const { return region_; }
    const std::string &fingerprint() const { return fingerprint_; }
    // The most preferred backend it serves on.
    const char *backend_name() const { return backends_.front()->name(); }
    // Every one it serves on, in order of preference: "shm,verbs,tcp".
    const std::string &backend_names() const { return backend_names_; }
    // Which backend (and path of it) a registered peer uses; static strings.
    void peer_backend(const std::string &id, const char **backend, const char **path) const;
    // kvx_peer_rails: the rails of a registered peer's link.
    void peer_rails(const std::string &id, std::vector<RailStats> *out) const;
    // kvx_get_peer_state. Times in steady-clock ns (Peer::now_ns()).
    struct PeerState {
        int link = KVX_PEER_UP;
        int error = 0;
        const char *backend = "", *path = "";
        uint64_t in_flight = 0;
        int64_t since_ns = 0, next_attempt_ns = 0;
        uint32_t reconnects = 0, attempts = 0;
        std::string reason;
        int64_t progress_ns = 0;  // last progress (steady ns)
    };
    PeerState peer_state(const std::string &id) const;
    // kvx_list_peers: every registered peer and registration in progress
    // (link KVX_PEER_CONNECTING), by id.
    std::vector<std::pair<std::string, PeerState>> list_peers() const;
    const std::vector<uint8_t> &metadata() const;

    void add_peer(const std::string &id, const uint8_t *meta, size_t meta_len, uint64_t base_addr,
                  uint64_t num_blocks, uint64_t block_len);
    // kvx_add_remote_peer_async: checks now, connects on a thread; the
    // registration id for registration_status().
    uint64_t add_peer_async(const std::string &id, const uint8_t *meta, size_t meta_len, uint64_t base_addr,
                            uint64_t num_blocks, uint64_t block_len, unsigned flags);
    Registrations::Status registration_status(uint64_t reg, int timeout_ms);
    // kvx_get_stats: peer_id nullptr for the transport's.
    void stats(kvx_stats *out, const char *peer_id) const;
    void remove_peer(const std::string &id);
    uint64_t write_blocks(const std::string &peer_id, const uint64_t *local, const uint64_t *remote, size_t n);
    void poll(const char *peer_id, uint64_t *done, size_t done_cap, size_t *n_done, uint64_t *failed,
              size_t failed_cap, size_t *n_failed);
    // kvx_poll_results: done and failed ids with their status into out.
    size_t poll_results(const char *peer_id, kvx_result *out, size_t cap);
    size_t cancel(const uint64_t *ids, size_t n, int mode, uint64_t *inflight);
    // kvx_wait: the number of ids ready for poll(NULL) once there are some
    // or timeout_ms (-1: no limit) passed (then 0); throws KVX_ECLOSED.
    size_t wait(int timeout_ms);
    // kvx_completion_fd.
    int completion_fd();
    // For tests: the completion queues kept, and the slots of listed_.
    struct QueueCounts {
        size_t queues, listed;
    };
    QueueCounts queue_counts() const {
        std::lock_guard<std::mutex> lk(mu_);
        return {completions_.size(), listed_.size()};
    }

private:
    // A registered peer; also the sink its link reports to.
    struct Peer final : CompletionSink {
        Transport *t = nullptr;
        std::string id;
        uint64_t num_blocks = 0;
        // Its connection. A reconnection replaces it (under mu_): read it
        // under mu_ and use the copy (link_of()).
        std::shared_ptr<BackendPeer> link;
        const char *backend = "";  // the name of link's backend; under mu_
        std::shared_ptr<const wire::AgentMetadata> meta;  // what it was added with: a reconnection dials it again
        // Reconnection (option peer_redial_ms), under mu_. up -> down when
        // the watchdog finds the link broken (or times it out); down -> up
        // when an attempt connects. broken: down for good (redial off).
        enum class Link : uint8_t { up, down, broken };
        Link state = Link::up;
        bool attempting = false;      // an attempt is queued or runs
        int64_t since_ns = 0;         // entered state (steady ns)
        int64_t due_ns = 0;           // down: the next attempt (steady ns)
        uint32_t attempts = 0, reconnects = 0;
        int error = 0;                // what took it down, then the last attempt's failure
        std::string reason;
        std::atomic<bool> redial_off{false};  // removed, replaced or closed: an attempt stops
        // Return to a preferred path (peer_redial_ms), under mu_: up on a
        // backend less preferred than one that applies but failed to
        // connect, it dials that one again in the background (attempting
        // then covers the attempt) and moves to it once it connects.
        bool fallback = false;
        int64_t return_due_ns = 0;     // fallback: the next attempt (steady ns)
        uint32_t return_attempts = 0;  // failed since it landed on the fallback
        int64_t landed_ns = 0;         // when its link connected (steady ns)
        // A return attempt stops: the peer went down, was removed or replaced,
        // or the transport closed.
        std::atomic<bool> return_off{false};
        // The transfers of link: ids from link_from_id on went to it (ids
        // grow; under mu_), link_left of them are in flight.
        uint64_t link_from_id = 0, link_left = 0;
        // Links left behind by a return, each until its transfers (ids in
        // [from_id, below_id), left of them in flight) are reported; the
        // watchdog then shuts it down (or at once when it breaks, or aborts
        // it when none of them ended for transfer_timeout_ms) and only then
        // drops it, so that remove and close, which shut down every link
        // listed here, return after it is done. Under mu_.
        struct Retired {
            std::shared_ptr<BackendPeer> link;
            uint64_t from_id = 0, below_id = 0, left = 0;
            int64_t last_end_ns = 0;  // retired, or one of its transfers last reported (steady ns)
            bool closing = false;     // the watchdog is shutting it down
        };
        std::vector<Retired> retired;
        // Set (under mu_) before a timed-out transfer is reported, so that a
        // caller who sees the failure also sees the peer broken; the link is
        // aborted right after.
        std::atomic<bool> timed_out{false};
        // Stall detection: transfers in flight, and when the peer last made
        // progress (or got work while idle). Written under mu_, read by the
        // watchdog without it.
        std::atomic<uint64_t> outstanding{0};
        std::atomic<int64_t> progress_ns{0};
        // The watchdog thread's: the progress_ns of the stall that was given
        // grace_ns (the network was silent: stall_grace_ms), 0 when none.
        int64_t grace_from_ns = 0, grace_ns = 0;
        // The watchdog thread's: the stall (its progress_ns) whose second
        // half it samples the network in, when it last did, and the largest
        // retransmission timeout it saw silent then (0: none).
        int64_t silent_since_ns = 0, silent_sampled_ns = 0;
        uint64_t silent_rto_us = 0;
        // Transfers counted in outstanding whose write_blocks has not returned
        // from link->submit() yet: a remove racing them shuts the link down
        // before they reach it, and submit() fails them (not a backend's leak).
        std::atomic<uint64_t> submitting{0};
        bool removed = false;  // taken out of peers_ (remove, replace); under mu_
        Telemetry::Slot stats;  // written under mu_

        void complete(uint64_t op_id, int status) override { t->complete(*this, op_id, status); }
        void progress() override { progress_ns.store(now_ns(), std::memory_order_relaxed); }
        static int64_t now_ns() { return Clock::now().time_since_epoch().count(); }
    };
    // An id in flight. The peer outlives it: removing a peer reports all its
    // transfers (erasing their entries) before the peer goes.
    // A peer id's finished transfers, until polled. The queue of a registered
    // peer stays (empty) between polls, so the data path neither allocates
    // nor frees one per transfer; it goes once its peer is removed and it is
    // drained.
public:
    // A failed id until polled, and its kvx_result status.
    struct Failed {
        uint64_t id;
        int status;
    };
    struct Completions {
        std::deque<uint64_t> done;
        std::deque<Failed> failed;
        bool registered = false;  // a peer is published under this id
        bool listed = false;      // in listed_ (it got ids since poll(NULL) last drained it)
        size_t slot = 0;          // its index in listed_ while listed
        bool empty() const { return done.empty() && failed.empty(); }
    };
    using CompletionsMap = std::map<std::string, Completions>;

private:

    const std::shared_ptr<Peer> &registered_locked(const std::string &id) const;
    // p's state but its path (the link's: read without mu_).
    PeerState peer_state_locked(const Peer &p) const;
    // Reconnection (transport_peers.cpp). The watchdog (transport_watchdog.cpp)
    // marks peers whose link broke (mu_ held) and starts due attempts on the
    // connect workers.
    void went_down_locked(Peer &p, std::string why);
    void start_redials_locked(Clock::time_point *next);  // and start_returns_locked()
    void start_returns_locked(Clock::time_point *next);
    void redial(const std::shared_ptr<Peer> &p);
    // A return attempt of a peer on a fallback (connect worker): dials the
    // backends it prefers to its link's and, once one connects, makes that
    // its link and retires the old one.
    void return_to_preferred(const std::shared_ptr<Peer> &p);
    // A peer (re)connected on link (mu_ held): fell_back says a preferred
    // path failed on the way, so it tries that one again from time to time.
    void landed_locked(Peer &p, bool fell_back);
    // No return (any more): the peer went down, was removed or replaced, or
    // the transport closed; an attempt under way is called off (mu_ held).
    void no_return_locked(Peer &p);
    // Id (erased from inflight_) no longer counts against the link it went to.
    void left_link_locked(Peer &p, uint64_t id);
    // p's links: the current one and those retired (mu_ held).
    static std::vector<std::shared_ptr<BackendPeer>> links_locked(const Peer &p);
    // What the watchdog does to a retired link outside mu_: shut it down
    // (its transfers are all reported, or it broke), or, when none of them
    // ended for the stall timeout, abort it.
    struct Reaped {
        std::shared_ptr<Peer> peer;
        std::shared_ptr<BackendPeer> link;
        bool shut = false;
        int64_t idle_ns = 0;
    };
    // The retired links to shut down (marked closing) or to abort (mu_
    // held), for the caller to act on without it: reap_retired().
    std::vector<Reaped> reap_retired_locked();
    void reap_retired(std::vector<Reaped> &reaped);
    // Ends reconnection of a peer taken out of peers_ (remove, replace, close).
    void stop_redial_locked(Peer &p);
    // Throws KVX_EPEERBROKEN for a peer whose link is not up, saying why;
    // brings its next reconnection attempt forward to peer_redial_ms.
    [[noreturn]] void refuse_broken_locked(Peer &p);
    // Connects a link for peer id to the first path that takes it, before
    // connect_timeout_ms or until *called_off is set (may be null); its
    // transfers report to sink. *backend: the backend's name. better_than (a
    // backend's name, or null): only the paths preferred to it are tried.
    // *fell_back (may be null): a path preferred to the one taken applied
    // but failed to connect.
    std::shared_ptr<BackendPeer> connect_link(const std::string &id, const wire::AgentMetadata &m,
                                              const std::atomic<bool> *called_off, CompletionSink *sink,
                                              const char **backend, const char *better_than = nullptr,
                                              bool *fell_back = nullptr);
    void complete(Peer &peer, uint64_t id, int status);
    void finish_locked(uint64_t id, Peer &peer, int status);
    // Removes ids from the completion queues (cancel of finished, unpolled ids):
    // one pass over the queues, so cancel stays off poll's path.
    void drop_unpolled_locked(const std::unordered_set<uint64_t> &ids);
    void queue_locked(const std::string &peer_id, uint64_t id, int status);
    int failure_cause_locked(const Peer &peer, int status) const;
    // Erases the queue of a removed peer once it is drained (taking it off
    // listed_ if it is listed: poll(peer) and remove drain queues too).
    void forget_drained_locked(CompletionsMap::iterator it);
    // Squeezes the slots of erased queues out of listed_.
    void compact_listed_locked();
    // poll(NULL) and poll_results(NULL): drain_one(queue) for each listed
    // queue in turn (see transport.cpp).
    template <class F>
    void drain_listed_locked(F &&drain_one);
    void check_open_locked() const;
    // close(): stops the threads, links and backends (closed_ set, no lock).
    void shut_down(std::map<std::string, std::shared_ptr<Peer>> &peers);
    void watchdog();
    // A stalled peer and its last progress when it was found so.
    struct Stalled {
        std::shared_ptr<Peer> peer;
        std::shared_ptr<BackendPeer> link;  // its link then
        int64_t since = 0;
        std::vector<std::shared_ptr<BackendPeer>> retired;  // its retired links, aborted with it
    };
    // Peers stalled now (work outstanding, no progress for the timeout); sets
    // *next to when the next one could stall.
    // *broke: peers whose link broke (found without mu_; checked again under it).
    std::vector<Stalled> stalled_peers(Clock::time_point *next, std::vector<std::shared_ptr<Peer>> *broke);
    void credit_pause(int64_t late_ns);
    // Connects to the first path that takes it, before connect_timeout_ms or
    // until *called_off is set (may be null).
    // *fell_back: as connect_link() says.
    std::shared_ptr<Peer> connect_peer(const std::string &id, const wire::AgentMetadata &m,
                                       const std::atomic<bool> *called_off, bool *fell_back);
    // Registration steps (transport_peers.cpp): the checks that need no
    // connection, the reservation of the id, and connect + publish.
    wire::AgentMetadata check_peer(const std::string &id, const uint8_t *meta, size_t meta_len,
                                   uint64_t base_addr, uint64_t num_blocks, uint64_t block_len);
    Registrations::Ref reserve_locked(const std::string &id, uint64_t reg, bool replace,
                                      std::shared_ptr<Peer> *replaced);
    void connect_and_publish(const Registrations::Ref &r, const wire::AgentMetadata &m);
    // Why r, cancelled (removed, superseded or closed) while it connected, failed.
    Error called_off_locked(const Registrations::Pending &r) const;
    // Telemetry of a transfer that ends here (mu_ held).
    void count_end_locked(const OpState &op, Ending how, int status = 0);  // op.owner is its Peer
    void start_backends(const BackendContext &ctx);
    struct Candidate {
        Backend *backend;
        const wire::Section *section;
    };
    std::vector<Candidate> candidates(const std::string &id, const wire::AgentMetadata &m, std::string *not_offered);

    Region region_;
    Options options_;
    CoreOptions core_;
    std::string fingerprint_;
    std::unique_ptr<EventLoop> loop_;
    std::vector<std::unique_ptr<Backend>> backends_;  // in order of preference
    std::string backend_names_;                       // their names, comma-separated
    std::vector<uint8_t> metadata_;

    mutable std::mutex mu_;
    std::condition_variable wd_cv_;
    bool closed_ = false;
    // The close that set closed_ has finished its shutdown: a later close
    // (another thread's, or the destructor's) waits for it on close_cv_, so
    // that it too returns only once nothing lands in the region any more.
    bool close_done_ = false;
    std::condition_variable close_cv_;
    uint64_t next_id_ = 1;
    std::map<std::string, std::shared_ptr<Peer>> peers_;
    Registrations registrations_{mu_};
    uint64_t next_reg_ = 1;
    Telemetry telemetry_;
    IdTable inflight_;  // by id; each OpState's owner is its Peer
    CompletionsMap completions_;
    ReadySignal ready_;  // how many ids completions_ holds, for wait() and completion_fd()
    // The queues that got ids, in that order: poll(NULL) visits these, not
    // every peer's. A queue erased while listed leaves completions_.end() in
    // its slot (unlisted_ counts those); they are squeezed out once they are
    // half of listed_, or by the next poll(NULL), so that an application
    // that polls only by peer id does not keep removed peers' queues.
    std::vector<CompletionsMap::iterator> listed_;
    size_t unlisted_ = 0;
    std::thread watchdog_;
    size_t down_peers_ = 0;  // peers in Link::down (the watchdog starts their attempts)
    size_t redials_running_ = 0;  // reconnection attempts queued or running (at most half the connect workers)
    size_t fallback_peers_ = 0;   // up peers with fallback set (the watchdog starts their return attempts)
    size_t returns_running_ = 0;  // return attempts queued or running (within that half, at most a quarter)
    size_t retired_links_ = 0;    // Peer::retired entries, of every peer
};

}  // namespace kvx
