// Writer side of the shm backend: connect and authenticate on the target's
// unix socket (in the caller's thread, bounded by the deadline), check who
// the target is and pin its process, take the grant, map the region, check
// that process_vm_writev reaches it, or take a staging ring; then submit
// parts to the copy threads and watch the socket for REVOKE, EOF and
// (staged) COPIED, and the pinned process for its exit.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "backends/shm/shm.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::shm {

namespace {

// How long a stopping link waits, in total, for staging slots the target is
// copying: on the stall-timeout path (the watchdog's thread, which other
// peers' timeouts wait for) and when the application removes the peer.
constexpr auto kAbortWait = std::chrono::milliseconds(100);
constexpr auto kCloseWait = std::chrono::milliseconds(1000);

// Transfers of at least 2 of these are split over copy threads (1 MiB until
// 0.4.6; 1 MiB blocks into a mapping on 2 threads: 12.1 -> 17.3 GB/s).
constexpr uint64_t kSplitMin = 512u << 10;
constexpr uint64_t kSplitGranule = 64u << 10;  // where a split may fall: anywhere for a copy, even inside a block
// process_vm_writev costs about twice a memcpy per byte (it pins the target's
// pages): a second thread pays off from much smaller transfers.
constexpr uint64_t kSplitMinKernel = 256u << 10;

// One datagram before the deadline (any passed fd into *fd).
ssize_t recv_by(int sock, void *buf, size_t cap, net::Fd *fd, const net::Deadline &deadline, const std::string &where) {
    for (bool again = true;;) {
        int passed = -1;
        ssize_t n = recv_msg(sock, buf, cap, &passed);
        if (passed >= 0) *fd = net::Fd(passed);
        if (n == -ECONNRESET && again) {  // a reset is reported before what came ahead of it: read that first
            again = false;
            continue;
        }
        if (n != -EAGAIN) {
            if (n < 0) fail(KVX_ECONNRESET, "%s: %s", where.c_str(), strerror(static_cast<int>(-n)));
            return n;
        }
        int rc = net::wait_fd(sock, POLLIN, deadline);
        if (rc != 0) fail(rc == -ETIMEDOUT ? KVX_ETIMEDOUT : KVX_ECONNRESET, "%s: %s", where.c_str(), strerror(-rc));
    }
}

void send_or_fail(int sock, const void *buf, size_t n, const std::string &where) {
    int rc = send_msg(sock, buf, n, -1);
    if (rc != 0) fail(KVX_ECONNRESET, "%s: %s", where.c_str(), strerror(-rc));
}

// Connects; a full backlog (the target busy, or flooded) is waited out in
// the kernel (a blocking connect with SO_SNDTIMEO up to the deadline), which
// wakes the waiter as soon as a slot frees, where polling would lose it to a
// peer that connects in a tight loop.
net::Fd connect_socket(const SectionInfo &si, const net::Deadline &deadline, const std::string &where) {
    net::Fd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!s) fail(KVX_EBACKEND, "%s: socket: %s", where.c_str(), strerror(errno));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, si.socket_name.data(), si.socket_name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + si.socket_name.size());
    for (;;) {
        const int ms = std::max(1, deadline.slice_ms());  // in slices when it can be called off
        timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>(ms % 1000 * 1000)};
        setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(s.get(), reinterpret_cast<sockaddr *>(&a), len) == 0) break;
        if ((errno == EINTR || errno == EAGAIN) && !deadline.passed()) continue;
        fail(errno == ECONNREFUSED ? KVX_ECONNREFUSED : errno == EAGAIN || errno == EINTR ? KVX_ETIMEDOUT : KVX_EHOSTUNREACH,
             "%s: cannot connect: %s", where.c_str(), errno == EAGAIN ? "its backlog stayed full" : strerror(errno));
    }
    const timeval none{};
    setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
    if (fcntl(s.get(), F_SETFL, fcntl(s.get(), F_GETFL) | O_NONBLOCK) != 0)
        fail(KVX_EBACKEND, "%s: fcntl: %s", where.c_str(), strerror(errno));
    return s;
}

// The handshake's carrier: one message per datagram. A target that refuses
// a writer when it accepts it sends its REFUSE and closes before our HELLO
// arrives: a failed send is reported only if no answer is waiting.
class SeqpacketCarrier final : public handshake::Carrier {
public:
    SeqpacketCarrier(int sock, const PeerContext &pc, const std::string &where) : sock_(sock), pc_(pc), where_(where) {}
    int send(const uint8_t *p, size_t n) override {
        send_failed_ = send_msg(sock_, p, n, -1);
        return 0;
    }
    int receive(handshake::Bytes &buf, size_t *n) override {
        net::Fd none;  // a target passes no descriptor before it grants
        try {
            *n = static_cast<size_t>(recv_by(sock_, buf.data(), buf.size(), &none, pc_.deadline, where_));
        } catch (const Error &) {
            if (send_failed_ != 0) fail(KVX_ECONNRESET, "%s: %s", where_.c_str(), strerror(-send_failed_));
            throw;
        }
        return 0;
    }

private:
    int sock_;
    const PeerContext &pc_;
    const std::string &where_;
    int send_failed_ = 0;
};

// The handshake over the socket; throws the refusal or failure.
void authenticate(int sock, const BackendContext &ctx, const PeerContext &pc, const std::string &where) {
    handshake::Initiator in(*pc.meta, ctx.identity.fingerprint, kDataPath, where);
    SeqpacketCarrier carrier(sock, pc, where);
    handshake::initiate(in, carrier);
}

// Maps exactly the peer's region out of the file it granted.
void map_region(Link &l, int fd, const CtlMsg &g, const std::string &where) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(KVX_EAUTH, "%s: the granted descriptor is not a file", where.c_str());
    // A copy faulting on a file elsewhere (a FUSE mount the target serves)
    // could block without bound, and with it removal and close.
    if (!shared::in_memory_fs(fd))
        fail(KVX_EAUTH, "%s: the granted file is not on tmpfs or hugetlbfs", where.c_str());
    if (g.offset > UINT64_MAX - g.size || static_cast<uint64_t>(st.st_size) < g.offset + g.size)
        fail(KVX_EAUTH, "%s: the granted file has %lld bytes, the region needs %" PRIu64 " at offset %" PRIu64,
             where.c_str(), static_cast<long long>(st.st_size), g.size, g.offset);
    const uint64_t page = static_cast<uint64_t>(st.st_blksize > 0 ? st.st_blksize : sysconf(_SC_PAGESIZE));
    const uint64_t align = std::max<uint64_t>(page, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
    const uint64_t start = g.offset / align * align, delta = g.offset - start;
    void *p = mmap(nullptr, g.size + delta, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
    if (p == MAP_FAILED) fail(KVX_EBACKEND, "%s: cannot map the granted region: %s", where.c_str(), strerror(errno));
    l.map_base = p;
    l.map_len = g.size + delta;
    l.dst = static_cast<uint8_t *>(p) + delta;
    install_sigbus_guard();  // a sealed file cannot shrink, but a huge-page file can lose pages to a punched hole
}

// process_vm_writev reaches the target: a one-byte read of its region proves
// the same permission (PTRACE_MODE_ATTACH) without writing anything.
bool kernel_path_works(const Link &l, const std::string &where) {
    uint8_t b;
    iovec lv{&b, 1}, rv{reinterpret_cast<void *>(l.remote_base), 1};
    if (process_vm_readv(l.pid, &lv, 1, &rv, 1, 0) == 1) return true;
    KVX_LOG(info, "%s: process_vm_writev cannot reach pid %d (%s): copying through a staging ring", where.c_str(),
            static_cast<int>(l.pid), strerror(errno));
    return false;
}

// The target's next control message before the deadline (a passed
// descriptor into *fd); one that does not decode fails with KVX_EAUTH.
CtlMsg recv_ctl(int sock, net::Fd *fd, const PeerContext &pc, const std::string &where) {
    uint8_t buf[kCtlMaxLen + 8];
    ssize_t n = recv_by(sock, buf, sizeof buf, fd, pc.deadline, where);
    try {
        return decode_ctl(buf, static_cast<size_t>(n));
    } catch (const Error &e) {
        fail(KVX_EAUTH, "%s: %s", where.c_str(), e.what());
    }
}

// Asks for a staging ring and maps it: the target's sealed memfd, exactly as
// large as STAGED says.
void take_ring(Link &l, int sock, const PeerContext &pc, const std::string &where) {
    uint8_t buf[kCtlMaxLen];
    send_or_fail(sock, buf, encode_ctl(CtlMsg{Ctl::stage}, buf), where);
    net::Fd fd;
    const CtlMsg m = recv_ctl(sock, &fd, pc, where);
    if (m.kind != Ctl::staged || !fd) fail(KVX_EAUTH, "%s: no staging ring in answer to STAGE", where.c_str());
    struct stat st;
    const int seals = fcntl(fd.get(), F_GET_SEALS);
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != m.size ||
        seals < 0 || !(seals & F_SEAL_SHRINK) || !shared::in_memory_fs(fd.get()))
        fail(KVX_EAUTH, "%s: the staging ring is not a sealed in-memory file of %" PRIu64 " bytes", where.c_str(), m.size);
    void *p = mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) fail(KVX_EBACKEND, "%s: cannot map the staging ring: %s", where.c_str(), strerror(errno));
    l.ring = static_cast<uint8_t *>(p);
    l.ring_len = m.size;
    l.slots = m.slots;
    l.slot_len = m.slot_len;
    l.in_flight.assign(m.slots, 0);
    l.owner.assign(m.slots, nullptr);
    l.free_slots = m.slots;
    l.sock = sock;
    l.mode = Mode::staged;
}

// The target's user, checked before the handshake says anything to it.
// Its process is pinned as soon as it can be: the pid in the credentials
// names the process that listened, but once that process exited (a child
// it forked may hold its socket) another one may have the pid. SO_PEERPIDFD
// pins the listener itself; pidfd_open pins whoever has the pid, which is
// the target only if it started when the metadata says the target did.
PeerCred check_target(Link &l, int sock, const SectionInfo &si, const std::string &where, bool allow_others) {
    PeerCred cred;
    if (!peer_cred(sock, &cred)) fail(KVX_EBACKEND, "%s: SO_PEERCRED: %s", where.c_str(), strerror(errno));
    if (!cred.same_user && !allow_others)
        fail(KVX_EAUTH, "%s: the target is another user (%s), we are uid %u (shm.allow_other_users=0)", where.c_str(),
             cred.who.c_str(), static_cast<unsigned>(geteuid()));
    l.pid = cred.pid;
    bool exact = false;
    l.pidfd = pin_process(sock, cred.pid, &exact);
    if (l.pidfd && !exact && si.start_time != 0 && !pinned_started_at(l.pidfd.get(), cred.pid, si.start_time)) {
        KVX_LOG(info, "%s: pid %d is not the target process (it started at %llu, the target at %llu ticks)",
                where.c_str(), static_cast<int>(cred.pid), (unsigned long long)process_start_time(cred.pid),
                (unsigned long long)si.start_time);
        l.pidfd = net::Fd();  // not pinned: no process_vm_writev
    }
    return cred;
}

void take_grant(Link &l, int sock, const PeerContext &pc, const std::string &where, const PeerCred &cred) {
    net::Fd fd;
    const CtlMsg g = recv_ctl(sock, &fd, pc, where);
    const uint64_t size = pc.meta->num_blocks * pc.meta->block_len;
    if (g.kind != Ctl::grant || g.size != size)
        fail(KVX_EAUTH, "%s: the grant does not match the region of %" PRIu64 " bytes", where.c_str(), size);
    l.mode = g.mode;
    l.remote_size = size;
    l.remote_base = pc.meta->base_addr;
    if (g.mode == Mode::mapped) {
        if (!fd) fail(KVX_EAUTH, "%s: a mapped grant without its descriptor", where.c_str());
        map_region(l, fd.get(), g, where);
        return;
    }
    // process_vm_writev only into a process of our own user that is pinned:
    // a pid is a number, and after the target's exit another process may get it.
    if (g.mode == Mode::kernel && !cred.same_user)
        KVX_LOG(info, "%s: the target is another user (%s): copying through a staging ring", where.c_str(), cred.who.c_str());
    else if (g.mode == Mode::kernel && !l.pidfd)
        KVX_LOG(info, "%s: cannot pin the target process (pid %d): copying through a staging ring", where.c_str(),
                static_cast<int>(cred.pid));
    else if (g.mode == Mode::kernel && kernel_path_works(l, where))
        return;
    take_ring(l, sock, pc, where);
}

}  // namespace

std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc, CopyPool &pool) {
    const SectionInfo si = decode_section(*pc.section);
    const std::string where = strfmt("peer '%s' at shm @%s", pc.peer_id.c_str(), si.socket_name.c_str());
    net::Fd sock = connect_socket(si, pc.deadline, where);
    auto link = std::make_shared<Link>();
    link->local = ctx.region;
    link->sink = pc.sink;
    link->peer_id = pc.peer_id;
    const PeerCred cred = check_target(*link, sock.get(), si, where, ctx.options->uint("shm.allow_other_users") != 0);
    try {
        authenticate(sock.get(), ctx, pc, where);
    } catch (const Error &e) {
        // A REFUSE carries a code only: name the likely reason we can see.
        if (e.code() != KVX_EAUTH || cred.same_user) throw;
        fail(KVX_EAUTH, "%s (the target is another user, %s: it admits writers of another user only with "
                        "shm.allow_other_users=1 on its side, besides the metadata's secret)", e.what(), cred.who.c_str());
    }
    take_grant(*link, sock.get(), pc, where, cred);
    auto peer = std::make_unique<ShmPeer>(std::move(link), std::move(sock), pool, ctx.loop);
    peer->start();
    KVX_LOG(info, "shm: connected to %s (pid %u): %s", where.c_str(), si.pid, peer->path());
    return peer;
}

ShmPeer::ShmPeer(std::shared_ptr<Link> link, net::Fd sock, CopyPool &pool, EventLoop *loop)
    : link_(std::move(link)), sock_(std::move(sock)), pool_(pool), loop_(loop) {}

ShmPeer::~ShmPeer() { shutdown(); }

void ShmPeer::start() {
    // On the loop thread: no event of either can run gone() before both tokens are set.
    loop_->call([&] {
        token_ = loop_->attach(sock_.get(), EPOLLIN, &watch_, 0);
        if (token_ != 0 && link_->pidfd) pid_token_ = loop_->attach(link_->pidfd.get(), EPOLLIN, &watch_, 1);
    });
    if (token_ == 0) fail(KVX_ECLOSED, "shm: the event loop is stopped");
    if (link_->mode == Mode::staged) stager_ = std::thread([l = link_] { stage_loop(*l); });
}

const char *ShmPeer::path() const {
    return link_->mode == Mode::mapped ? "mapped" : link_->mode == Mode::staged ? "staged" : "process_vm_writev";
}

void ShmPeer::submit(Op op) {
    const uint64_t bl = link_->local.block_len;
    int status = 0;
    {
        std::unique_lock<std::mutex> lk(link_->mu);
        if (link_->stop) {
            status = link_->status ? link_->status : KVX_EPEERBROKEN;
        } else {
            link_->ops.emplace(op.state->id, op.state);
            if (link_->mode == Mode::staged) {  // a small transfer into a free slot now, the rest by the stager
                auto st = std::make_shared<Link::Staged>();
                st->small = op.bytes <= kSubmitBytes && op.runs.size() <= kSubmitRuns;
                st->part = std::move(split_op(std::move(op), 1, kSplitMin, bl).front());
                link_->stage_queue.push_back(std::move(st));
                if (link_->stage_queue.front()->small) post_now(*link_, lk);  // this one, or the next small one
                else link_->cv.notify_all();
                return;
            }
        }
    }
    if (status != 0) {
        CompletionBatch b;
        b.fail(*op.state, status);
        b.deliver(*link_->sink);
        return;
    }
    const uint64_t granule = std::min(bl, kSplitGranule);  // one large block is split too
    const uint64_t min_part = link_->mode == Mode::kernel ? kSplitMinKernel : kSplitMin;
    pool_.submit(link_, std::move(op), min_part, granule);  // queued for the copy threads, or copied here if small
}

bool ShmPeer::broken() const {
    std::lock_guard<std::mutex> lk(link_->mu);
    return link_->stop;
}

void ShmPeer::abort(int status) { link_->fail_all(status, kAbortWait); }

// On the loop thread: REVOKE (the target closes) or EOF (it went away). Either
// way nothing of ours copies once fail_all returns; then the mapping goes and
// the target hears that it may return.
void ShmPeer::on_socket(uint32_t events) {
    uint8_t buf[kCtlMaxLen + 8];
    int passed = -1;
    ssize_t n = (events & EPOLLIN) ? recv_msg(sock_.get(), buf, sizeof buf, &passed) : -ECONNRESET;
    if (passed >= 0) ::close(passed);
    if (n == -EAGAIN) return;
    bool revoke = false;
    if (n > 0) {
        try {
            const CtlMsg m = decode_ctl(buf, static_cast<size_t>(n));
            if (m.kind == Ctl::copied && link_->mode == Mode::staged) {
                link_->answered(m.slot, m.ticket, m.status);
                return;
            }
            revoke = m.kind == Ctl::revoke;
        } catch (const Error &) {
        }
    }
    KVX_LOG(info, "shm: peer '%s' %s", link_->peer_id.c_str(),
            revoke ? "revoked its grant (it closes)" : "closed its socket (it went away)");
    link_->fail_all(KVX_ECONNRESET, Clock::duration::zero());  // it copied on the thread that closed: nothing left to wait for
    link_->unmap();
    if (revoke) {
        uint8_t out[kCtlMaxLen];
        send_msg(sock_.get(), out, encode_ctl(CtlMsg{Ctl::revoked}, out), -1);
    }
    gone();
}

// On the loop thread: the target process exited. Its sockets may live on in
// a child it forked, and its pid in another process: nothing goes out any
// more, whatever the socket says.
void ShmPeer::on_exit() {
    KVX_LOG(info, "shm: peer '%s': its process (pid %d) exited", link_->peer_id.c_str(), static_cast<int>(link_->pid));
    link_->fail_all(KVX_ECONNRESET, Clock::duration::zero());
    link_->unmap();
    gone();
}

void ShmPeer::gone() {
    loop_->detach(token_);
    loop_->detach(pid_token_);
    token_ = pid_token_ = 0;
}

void ShmPeer::shutdown() {
    std::call_once(shutdown_once_, [this] {
        loop_->call([&] { gone(); });
        link_->fail_all(KVX_ECONNRESET, kCloseWait);
        if (stager_.joinable()) stager_.join();  // it saw the stop; nothing of it runs
        link_->unmap();
        sock_ = net::Fd();  // the target sees EOF: nothing of ours touches its region any more
    });
}

}  // namespace kvx::shm
