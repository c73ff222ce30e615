// shm backend internals. The target (ShmServer) listens on an abstract unix
// SOCK_SEQPACKET socket on the transport's event loop, runs the shared
// handshake, checks the writer's credentials (SO_PEERCRED), and only then
// grants access: the file descriptor of the region's shareable mapping
// (SCM_RIGHTS), or leave to use process_vm_writev for private memory. The
// writer (ShmPeer) copies with a small pool of copy threads (CopyPool); the
// target's threads do nothing for bytes to land. The socket stays open as
// the liveness and revocation channel: a target that closes or removes
// sends REVOKE and waits for REVOKED, so no byte lands after it returns.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend_api/backend.h"
#include "backend_api/ops.h"
#include "backends/shm/shm_wire.h"
#include "handshake/engine.h"
#include "util/event_loop.h"
#include "util/net.h"
#include "util/shared_region.h"

namespace kvx::shm {

// shm's part of the handshake: it defines no flags.
inline const handshake::DataPathOptions kDataPath{};

// This host's boot id and this process's network namespace.
std::array<uint8_t, 16> boot_id();
uint64_t netns_inode();

// Sends one datagram with an optional fd (SCM_RIGHTS); 0 or -errno.
int send_msg(int fd, const void *buf, size_t n, int pass_fd);
// Receives one datagram of at most cap bytes; *got_fd receives a passed fd
// (-1 if none; any extra ones are closed). Returns its length, or -errno
// (-ECONNRESET at EOF, -EMSGSIZE when cut).
ssize_t recv_msg(int fd, void *buf, size_t cap, int *got_fd);

// One accepted connection on the target's loop thread.
class ShmServer;
class ShmConn final : private EventLoop::Source {
public:
    ShmConn(ShmServer &s, net::Fd fd);
    bool start(Clock::time_point deadline);
    void stop();
    bool granted() const { return state_ == State::granted || state_ == State::revoking; }
    bool revoke();  // sends REVOKE; false when nothing is to wait for
    bool finished() const { return state_ == State::done; }

private:
    enum class State { hello, auth, granted, revoking, done };
    void on_event(int tag, uint32_t events) override;
    void on_timer(int tag) override;
    bool step(const uint8_t *msg, size_t n);
    bool on_handshake(const uint8_t *msg, size_t n);
    bool other_user(std::string *who);
    bool on_stage();
    bool on_copy(const CtlMsg &m);

    ShmServer &server_;
    net::Fd fd_;
    uint64_t token_ = 0, timer_ = 0;
    State state_ = State::hello;
    handshake::Responder::Session session_;
    // Staged writer: the ring we made for it (mapped here), and its geometry.
    uint8_t *ring_ = nullptr;
    uint32_t slots_ = 0, slot_len_ = 0;

public:
    ~ShmConn();
};

class ShmServer {
public:
    explicit ShmServer(const BackendContext &ctx);
    ~ShmServer();
    SectionInfo info() const { return info_; }
    // Revokes every grant (waiting for REVOKED, bounded), then closes all.
    void shutdown();

    // For ShmConn, on the loop thread.
    const BackendContext &ctx() const { return ctx_; }
    handshake::Responder &responder() { return responder_; }
    Mode mode() const { return info_.mode; }
    Mode grant_mode() const { return info_.mode == Mode::kernel && staged_ ? Mode::staged : info_.mode; }
    int backing_fd() const { return backing_.fd.get(); }
    uint64_t backing_offset() const { return backing_.offset; }
    bool allow_other_users() const { return allow_others_; }
    void close(ShmConn &c);  // frees c
    void revoked();          // a connection answered REVOKE or went away

private:
    struct Listener final : EventLoop::Source {
        explicit Listener(ShmServer &s) : server(s) {}
        void on_event(int, uint32_t) override { server.accept_all(); }
        void on_timer(int) override { server.resume_accepting(); }
        ShmServer &server;
    };
    void accept_all();
    void resume_accepting();

    BackendContext ctx_;
    handshake::Responder responder_;
    SectionInfo info_;
    shared::Backing backing_;
    bool allow_others_ = false;
    bool staged_ = false;  // shm.private=staged: private memory is written through a staging ring
    net::Fd listen_fd_;
    Listener listener_{*this};
    uint64_t listen_tok_ = 0;
    uint64_t resume_timer_ = 0;  // accepting paused: out of descriptors (the loop thread's)
    std::unordered_map<ShmConn *, std::unique_ptr<ShmConn>> conns_;  // the loop thread's
    std::mutex mu_;
    std::condition_variable cv_;
    size_t revoking_ = 0;  // under mu_
    bool stopped_ = false;
};

// The writer's state of one peer, shared with the copy threads (which hold it
// by shared_ptr, so a part still queued when the peer goes finds it stopped).
struct Link {
    Region local;                // our region (the source)
    uint8_t *dst = nullptr;      // mapped: the peer's region in our address space
    void *map_base = nullptr;    // mapped: what to munmap
    size_t map_len = 0;
    pid_t pid = 0;               // kernel: the target process
    uint64_t remote_base = 0;    // kernel: the peer's base address there
    uint64_t remote_size = 0;
    Mode mode = Mode::none;
    bool sealed = false;         // mapped: the file cannot shrink (F_SEAL_SHRINK): no SIGBUS to fear
    // staged: the target's ring, mapped here; COPY goes out on sock (the
    // ShmPeer's socket, open while anything copies).
    uint8_t *ring = nullptr;
    size_t ring_len = 0;
    uint32_t slots = 0, slot_len = 0;
    int sock = -1;
    CompletionSink *sink = nullptr;
    std::string peer_id;

    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;           // no part starts any more
    std::atomic<bool> halt{false};  // copies in progress stop at the next chunk
    int status = 0;              // why it stopped
    size_t active = 0;           // copy threads inside this link (copying or reporting)
    std::unordered_map<uint64_t, OpRef> ops;  // submitted, not reported
    // staged: parts waiting for slots (the stager posts them in order), and
    // per slot the ticket posted and not yet answered (0 = free) and its part.
    struct Staged {
        Part part;
        size_t run = 0;         // where posting goes on: runs[run], byte off
        uint64_t off = 0;
        uint32_t outstanding = 0;  // pieces posted and not answered
        bool started = false, all_posted = false;
    };
    std::deque<std::shared_ptr<Staged>> stage_queue;
    std::vector<std::shared_ptr<Staged>> owner;
    // Parts waiting for a copier, in order (the CopyPool's, under its mu_),
    // and whether the link is in the pool's ready list.
    std::deque<Part> pool_parts;
    bool pool_listed = false;
    std::vector<uint64_t> in_flight;
    uint32_t free_slots = 0;
    uint64_t next_ticket = 1;

    ~Link();
    void unmap();  // the peer's region or ring, once nothing copies
    // staged: COPIED for slot/ticket (status 1: the target skipped it).
    void answered(uint32_t slot, uint64_t ticket, uint32_t status);
    // staged: takes back the posted slots the target has not begun to copy,
    // and waits (bounded) for one it is copying.
    void withdraw(const std::vector<std::pair<uint32_t, uint64_t>> &posted);
    // Stops the link with status (the first one wins), waits for the copy
    // threads to let go, then fails what it had: a failure is reported only
    // once nothing of the link is copying. Idempotent.
    void fail_all(int status);
};

// The copy threads of one transport's shm backend: shm.threads copiers, the
// threads that submit and shm.threads - 1 pool threads. A transfer of 1 MiB
// or more (512 KiB into private memory) is split in parts, one per copier,
// and the submitting thread copies the first. Each link queues the parts for
// the pool; the links with parts queued are served in turn, so a peer's
// parts wait behind at most one batch of each other peer, never behind
// another peer's whole backlog (a wait in a queue is no stall). A copier
// takes a batch from the next link: parts in order, at most a fair share of
// all queued parts (their number / copiers) and kBatchBytes (or one larger
// part). A batch into private memory is one process_vm_writev, so the
// kernel's fixed cost per call (about 2.5 us here) is paid once per batch.
// A pool thread that finds nothing queued watches the queue for kIdleSpin
// before it sleeps: a wake-up costs more than a 64 KiB copy on a VM, so a
// transfer of one part is queued only while a pool thread is awake
// (watching, or copying a batch of at most kBatchBytes: not one larger part,
// which a small transfer would wait for), and copied by the submitting
// thread otherwise (on a transport idle for kIdleSpin it is done when the
// call returns, as with one thread). When it queued its part and
// kBacklogBytes or more wait, the submitting thread copies a batch of the
// queue as well (never one part above kBatchBytes: that is a pool thread's).
class CopyPool {
public:
    explicit CopyPool(unsigned threads);
    ~CopyPool();
    unsigned copiers() const { return copiers_; }
    // A transfer's parts for link: copies some in the calling thread and
    // queues the others (see above; with shm.threads=1 it copies them all),
    // never waiting for the peer.
    void submit(const std::shared_ptr<Link> &link, std::vector<Part> parts);

private:
    void run();
    // Moves the next batch into out and its link into *link (mu_ held);
    // nothing when no part is queued, or, bounded, when the next is a part
    // above kBatchBytes.
    // Returns the batch's bytes.
    uint64_t take(std::shared_ptr<Link> *link, std::vector<Part> &out, bool bounded);
    // Watches queued_parts_ without the lock until a part comes, a stop, or until.
    void spin_for_work(std::chrono::steady_clock::time_point until) const;

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Link>> ready_;  // links with parts queued, each once, in turn (under mu_)
    std::atomic<size_t> queued_parts_{0};  // parts queued over all links (changed under mu_; spinning threads read it without)
    uint64_t queued_bytes_ = 0;      // their bytes (under mu_)
    std::atomic<bool> stop_{false};
    unsigned sleeping_ = 0;          // pool threads waiting on cv_ (under mu_)
    unsigned spinning_ = 0;          // pool threads watching queued_parts_ (under mu_)
    unsigned busy_small_ = 0;        // pool threads copying a batch of at most kBatchBytes (under mu_)
    std::chrono::steady_clock::time_point last_submit_{};  // under mu_
    unsigned copiers_;
    std::vector<std::thread> threads_;
};

// Copies a batch of parts of one link (one process_vm_writev for all of them
// into private memory, or memcpy into the mapping); 0 or a KVX_E* code (the
// target faulted or went away, or the link halted).
int copy_parts(Link &l, const Part *parts, size_t n);

// staged: posts one free slot's worth of the front queued part (copy into
// the slot, ticket, COPY); answers complete parts (Link::answered, on the
// loop thread). l.mu held via lk (released while copying); 0, or the
// failure that must stop the link. Needs a queued part and a free slot.
int post_slot(Link &l, std::unique_lock<std::mutex> &lk);
// staged, in the submitting thread: posts while slots are free, leaves the
// rest queued for the stager. Never waits for the peer.
void post_now(Link &l, std::unique_lock<std::mutex> &lk);
// staged: the link's stager thread, posting queued parts as slots free up,
// until the link stops.
void stage_loop(Link &l);

class ShmPeer final : public BackendPeer {
public:
    ShmPeer(std::shared_ptr<Link> link, net::Fd sock, CopyPool &pool, EventLoop *loop);
    ~ShmPeer() override;
    void start();
    void submit(Op op) override;
    bool broken() const override;
    void abort(int status) override;
    void shutdown() override;
    const char *path() const override;

private:
    struct Watch final : EventLoop::Source {
        explicit Watch(ShmPeer &p) : peer(p) {}
        void on_event(int, uint32_t events) override { peer.on_socket(events); }
        ShmPeer &peer;
    };
    void on_socket(uint32_t events);

    std::shared_ptr<Link> link_;
    net::Fd sock_;
    CopyPool &pool_;
    EventLoop *loop_;
    std::thread stager_;  // staged only
    Watch watch_{*this};
    uint64_t token_ = 0;
    std::once_flag shutdown_once_;
};

// Connects, authenticates and takes the grant; throws Error.
std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc, CopyPool &pool);

}  // namespace kvx::shm
