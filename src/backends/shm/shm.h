// shm backend internals. The target (ShmServer) listens on an abstract unix
// SOCK_SEQPACKET socket on the transport's event loop, checks the writer's
// credentials (SO_PEERCRED) when it accepts, runs the shared handshake, and
// only then grants access: to a writer of its own user the file descriptor
// of the region's shareable mapping (SCM_RIGHTS), or leave to use
// process_vm_writev for private memory; to another user (only with
// shm.allow_other_users=1) a staging ring. The writer (ShmPeer) copies with a
// small pool of copy threads (CopyPool); the target's threads do nothing for
// bytes to land but on the staged path. The socket stays open as the
// revocation channel, and a pidfd pins the target process: a target that
// closes or removes sends REVOKE and waits for REVOKED, so no byte lands
// after it returns, and one that exits fails the writer's transfers even
// while a forked child holds its sockets.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <csetjmp>
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

// The process at the other end of a unix socket, as the kernel reports it
// (SO_PEERCRED: the process that connected, or that listened).
struct PeerCred {
    uid_t uid = 0;
    pid_t pid = 0;           // 0: not visible in our pid namespace
    bool same_user = false;  // our user, as the kernel sees it across user namespaces
    std::string who;         // "uid U pid P", for messages
};
// False when the socket has no credentials (never for a connected one).
// same_user: the uid SO_PEERCRED reports (the peer's, mapped into our user
// namespace) is our effective uid; when that is the overflow uid (a uid the
// namespace does not map, as every outside user looks in an unmapped
// namespace), the peer must also be in our user namespace.
bool peer_cred(int sock, PeerCred *out);
// A pidfd of the socket's peer process: SO_PEERPIDFD (Linux 6.5) names that
// exact process (*exact = true); before it, pidfd_open(pid) names whatever
// process has that pid now (check it: pinned_start_time). An invalid Fd
// when neither works.
net::Fd pin_process(int sock, pid_t pid, bool *exact = nullptr);
// When process pid started (/proc/PID/stat starttime, clock ticks since
// boot); 0 when it cannot be read.
uint64_t process_start_time(pid_t pid);
// The process pidfd pins (pid in our namespace) started at start_time: read
// while it lives, so pid named it.
bool pinned_started_at(int pidfd, pid_t pid, uint64_t start_time);
// The pinned process has exited (its pid may name another process now).
bool process_exited(int pidfd);

// Turns a SIGBUS fault of the calling thread inside either range into a
// failed copy instead of a dead process: f() runs guarded, and the call
// returns -1 when it faulted, else f()'s result (>= 0). For copies into and
// out of memory another process can shrink or empty (a peer's file, a
// staging ring, a huge-page region whose pages can be punched out).
struct FaultRange {
    const void *base = nullptr;
    size_t len = 0;
};
void install_sigbus_guard();
void arm_fault_guard(sigjmp_buf *jb, FaultRange a, FaultRange b);
void disarm_fault_guard();
void fault_taken();  // after the jump: SIGBUS is blocked again in this thread otherwise
template <class F> int guarded(FaultRange a, FaultRange b, F &&f) {
    install_sigbus_guard();
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0) != 0) {
        fault_taken();
        return -1;
    }
    arm_fault_guard(&jb, a, b);
    const int rc = f();
    disarm_fault_guard();
    return rc;
}

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
    ShmConn(ShmServer &s, net::Fd fd, const PeerCred &cred);
    bool start(Clock::time_point deadline);
    // Whose connection it is, for admission: our user, or another uid.
    static uint64_t user_of(const PeerCred &c) { return c.same_user ? kOurUser : c.uid; }
    static constexpr uint64_t kOurUser = UINT64_MAX;
    uint64_t user() const { return user_of(cred_); }
    // Where this connection is in the server's list of pending ones.
    std::list<ShmConn *>::iterator pending_at;
    bool listed = false;
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
    bool on_stage();
    bool on_copy(const CtlMsg &m);

    ShmServer &server_;
    net::Fd fd_;
    const PeerCred cred_;
    uint64_t token_ = 0, timer_ = 0;
    State state_ = State::hello;
    Mode granted_ = Mode::none;
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
    void authenticated(ShmConn &c);  // c no longer counts as pending
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
    // Admission of a connection from cred: false refuses it (another user
    // not allowed, or no slot). May close another pending connection to
    // make room (see shm_listener.cpp).
    bool admit(net::Fd &fd, const PeerCred &cred);
    void unlist(ShmConn &c);

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
    // Connections not yet authenticated, oldest first, and their number per
    // peer uid (the loop thread's); at most max_pending_ at once.
    std::list<ShmConn *> pending_;
    std::unordered_map<uint64_t, size_t> pending_per_user_;  // by ShmConn::user()
    size_t max_pending_ = 0, max_conns_ = 0;
    std::mutex mu_;
    std::condition_variable cv_;
    size_t revoking_ = 0;  // under mu_
    bool stopped_ = false;
};

// What a thread calling kvx_write_blocks() may copy itself in one call: one
// small transfer, of at most kSubmitBytes in at most kSubmitRuns runs. Into
// private memory every run costs a page walk and pin of its own (about 1 us
// on this VM even for 64 B), so the runs are bounded as well as the bytes:
// such a copy takes some 10-20 us here.
inline constexpr uint64_t kSubmitBytes = 64u << 10;
inline constexpr size_t kSubmitRuns = 16;

// A transfer queued for the copy threads. They carve it into parts as they
// take it (at most `piece` bytes and kPartRuns runs each), so submitting one
// costs no pass over its runs, however many it has.
struct Queued {
    OpRef op;
    Runs runs;
    uint64_t piece = 0;  // the most bytes one part carries
    uint64_t left = 0;   // bytes not taken yet
    size_t next = 0;     // the next part starts at runs[next], byte off of it
    uint64_t off = 0;
};

// The writer's state of one peer, shared with the copy threads (which hold it
// by shared_ptr, so a part still queued when the peer goes finds it stopped).
struct Link {
    Region local;                // our region (the source)
    uint8_t *dst = nullptr;      // mapped: the peer's region in our address space
    void *map_base = nullptr;    // mapped: what to munmap
    size_t map_len = 0;
    pid_t pid = 0;               // the target process (0: not visible here)
    net::Fd pidfd;               // that process, pinned (kernel: required; checked before each write)
    uint64_t remote_base = 0;    // kernel: the peer's base address there
    uint64_t remote_size = 0;
    Mode mode = Mode::none;
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
        bool small = false;     // kSubmitBytes in kSubmitRuns: the submitting thread may post it
    };
    std::deque<std::shared_ptr<Staged>> stage_queue;
    std::vector<std::shared_ptr<Staged>> owner;
    // Transfers waiting for a copier (the CopyPool's, under its mu_): those
    // of one part, in order, and those of several, in order (the front one
    // is being carved). While both wait, the link's batches alternate
    // between them, so a small transfer waits behind at most one part of a
    // large one. And whether the link is in the pool's ready list.
    std::deque<Queued> pool_small, pool_large;
    bool pool_large_turn = false;
    bool pool_listed = false;
    std::vector<uint64_t> in_flight;
    uint32_t free_slots = 0;
    uint64_t next_ticket = 1;

    ~Link();
    void unmap();  // the peer's region or ring, once nothing copies
    // staged: COPIED for slot/ticket (status 1: the target skipped it).
    void answered(uint32_t slot, uint64_t ticket, uint32_t status);
    // staged: takes back the posted slots the target has not begun to copy,
    // and waits until `until`, in total, for those it is copying.
    void withdraw(const std::vector<std::pair<uint32_t, uint64_t>> &posted, Clock::time_point until);
    // Stops the link with status (the first one wins), waits for the copy
    // threads to let go, then fails what it had: a failure is reported only
    // once nothing of the link is copying, and (staged) after waiting up to
    // `wait` in total for slots the target is copying (zero when its socket
    // closed or it exited: it copies on the thread that owned the socket).
    // Idempotent.
    void fail_all(int status, Clock::duration wait);
};

// The copy threads of one transport's shm backend: shm.threads threads of
// its own, beside the threads that submit, which copy at most one small
// transfer (kSubmitBytes in kSubmitRuns runs) per call: their own when no
// copy thread is awake, or, with kBacklogBytes or more queued, the next of
// the queue if it is one. Everything else is the copy threads', so a submit
// returns in microseconds whatever the transfer's size and shape. A
// transfer is queued whole on its link and carved into parts as the copy
// threads take it: from 1 MiB (512 KiB into private memory) in one part per
// copy thread, each at most kBatchBytes (a halt is seen within about 100 us
// of copying) and kPartRuns runs. The links with transfers queued are
// served in turn, so a peer's transfers wait behind at most one batch of
// each other peer, never behind another peer's whole backlog (a wait in a
// queue is no stall); within a link, batches of transfers of one part
// alternate with parts of larger ones. A copy thread takes a batch from the
// next link: transfers of one part in order, at most a fair share of the
// queued transfers (their number / threads) and kBatchBytes, or one part of
// the front larger transfer. A batch into private memory is one
// process_vm_writev, so the kernel's fixed cost per call (about 2.5 us
// here) is paid once per batch. The first copy thread is the watcher: when
// it finds nothing queued it watches the queue for kIdleSpin before it
// sleeps, and a stream of calls wakes it to watch. A wake-up costs more
// than a 64 KiB copy on a VM, so a small transfer is queued only while a
// copy thread is awake (watching, or copying a batch), and copied by the
// submitting thread otherwise (on a transport idle for kIdleSpin it is done
// when the call returns). The other copy threads are helpers: woken for the
// parts of a large transfer, or when kHelpBytes of small ones wait; one
// that finds nothing queued sleeps at once, unless it just copied a part
// of a large transfer (then it watches for kIdleSpin: the next may follow). So a stream of small
// transfers keeps one copy thread and the submitting thread busy, as many
// as it can use on a small host, and a large transfer has every copy thread.
class CopyPool {
public:
    explicit CopyPool(unsigned threads);
    ~CopyPool();
    unsigned threads() const { return copiers_; }
    // Queues op's transfer for link, or copies it in the calling thread
    // (see above), never waiting for the peer. From 2 x min_part it is
    // split for the copy threads; parts end on multiples of granule.
    void submit(const std::shared_ptr<Link> &link, Op op, uint64_t min_part, uint64_t granule);

private:
    void run(bool watcher);
    // Moves the next batch into out and its link into *link (mu_ held);
    // nothing when nothing is queued, or, for the submitting thread, when
    // the next link's front transfer of one part is not a small one (the
    // only kind it takes). The runs of transfers it finished carving go to
    // spent, to be freed without the lock. Returns the batch's bytes.
    // *large_out: the batch is a part of a larger transfer.
    uint64_t take(std::shared_ptr<Link> *link, std::vector<Part> &out, std::vector<Runs> &spent, bool submitter,
                  bool *large_out = nullptr);
    // Watches queued_ without the lock until a transfer comes, a stop, or until.
    void spin_for_work(std::chrono::steady_clock::time_point until) const;

    std::mutex mu_;
    std::condition_variable cv_, helpers_cv_;  // the watcher's, the helpers'
    std::deque<std::shared_ptr<Link>> ready_;  // links with transfers queued, each once, in turn (under mu_)
    std::atomic<size_t> queued_{0};  // transfers queued over all links (changed under mu_; spinning threads read it without)
    uint64_t queued_bytes_ = 0;      // their bytes not taken yet (under mu_)
    std::atomic<bool> stop_{false};
    unsigned watcher_sleeping_ = 0;  // the watcher waits on cv_ (under mu_)
    unsigned helpers_sleeping_ = 0;  // helpers waiting on helpers_cv_ (under mu_)
    unsigned spinning_ = 0;          // the watcher watches queued_ (under mu_)
    unsigned busy_ = 0;              // copy threads copying a batch (under mu_)
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
// staged, in the submitting thread: posts the front queued part, a small
// one, into a free slot (one slot at most), leaves the rest queued for the
// stager. Never waits for the peer.
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
        void on_event(int tag, uint32_t events) override {
            if (tag == 1) peer.on_exit();
            else peer.on_socket(events);
        }
        ShmPeer &peer;
    };
    void on_socket(uint32_t events);
    void on_exit();  // the target process exited
    void gone();     // on the loop thread: stop watching

    std::shared_ptr<Link> link_;
    net::Fd sock_;
    CopyPool &pool_;
    EventLoop *loop_;
    std::thread stager_;  // staged only
    Watch watch_{*this};
    uint64_t token_ = 0, pid_token_ = 0;
    std::once_flag shutdown_once_;
};

// Connects, authenticates and takes the grant; throws Error.
std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc, CopyPool &pool);

}  // namespace kvx::shm
