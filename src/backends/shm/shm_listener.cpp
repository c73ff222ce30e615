// Target side of the shm backend: the listener and its connections, on the
// transport's event loop. A connection's credentials are read when it is
// accepted: another user is refused at once unless shm.allow_other_users=1,
// and unauthenticated connections are capped per uid and overall, so that
// no other user can take the slots this user's writers need. Writers copy
// into the region themselves, once the handshake proved they hold the
// metadata's secret; only for a staged writer (private memory the kernel
// does not let it reach, or a writer of another user) does this loop copy,
// from the writer's staging ring.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "backends/shm/shm.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::shm {

namespace {

constexpr auto kHandshakeTimeout = std::chrono::milliseconds(1000);
// Unauthenticated connections: at most this many (or a quarter of the
// descriptor limit) at once, and of each other user at most kPendingPerUser.
constexpr size_t kMaxPending = 1024, kPendingPerUser = 16;
// All connections, granted ones included: at most this many (or half the
// descriptor limit).
constexpr size_t kMaxConnections = 4096;
constexpr auto kRevokeWait = std::chrono::milliseconds(2000);
constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // after running out of descriptors
// Accepted per wake-up: a peer that connects without end keeps the backlog
// full, and the loop's other sources (handshakes, timers, other backends)
// must still run between rounds (the listener is level-triggered).
constexpr int kAcceptBatch = 64;
constexpr uint32_t kRingSlots = 8, kRingSlotLen = 1u << 20;  // a staged writer's ring: 8 MiB

// The one place a staged writer's bytes reach the region (named in
// tests/tsan.supp like tcp's readv_into_region: the application orders its
// reads of the region through its own control plane).
__attribute__((noinline)) void copy_into_region(uint8_t *dst, const uint8_t *src, size_t n) { memcpy(dst, src, n); }

socklen_t abstract_addr(const std::string &name, sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path + 1, name.data(), name.size());
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace

ShmConn::ShmConn(ShmServer &s, net::Fd fd, const PeerCred &cred) : server_(s), fd_(std::move(fd)), cred_(cred) {}

ShmConn::~ShmConn() {
    if (ring_) munmap(ring_, ring_len(slots_, slot_len_));
}

bool ShmConn::start(Clock::time_point deadline) {
    EventLoop *loop = server_.ctx().loop;
    token_ = loop->attach(fd_.get(), EPOLLIN, this, 0);
    if (token_ == 0) return false;
    timer_ = loop->add_timer(deadline, this, 0);
    return true;
}

void ShmConn::stop() {
    EventLoop *loop = server_.ctx().loop;
    loop->cancel_timer(timer_);
    loop->detach(token_);
    token_ = timer_ = 0;
}

void ShmConn::on_timer(int) {
    timer_ = 0;
    if (state_ == State::hello || state_ == State::auth) {
        KVX_LOG(info, "shm: a connection did not authenticate within %lld ms: closed",
                static_cast<long long>(kHandshakeTimeout.count()));
        server_.close(*this);
    }
}

void ShmConn::on_event(int, uint32_t events) {
    uint8_t buf[std::max(handshake::kMaxMessageLen, kCtlMaxLen) + 8];  // handshake, then control messages
    int passed = -1;
    ssize_t n = (events & EPOLLIN) ? recv_msg(fd_.get(), buf, sizeof buf, &passed) : -ECONNRESET;
    if (passed >= 0) ::close(passed);  // a writer never passes descriptors
    if (n == -EAGAIN) return;
    if (n < 0 || !step(buf, static_cast<size_t>(n))) {
        if (state_ == State::revoking) server_.revoked();
        state_ = State::done;
        server_.close(*this);
    }
}

// One message in the current state; false: close the connection.
bool ShmConn::step(const uint8_t *msg, size_t n) {
    if (state_ == State::hello || state_ == State::auth) return on_handshake(msg, n);
    if (state_ == State::revoking) {
        try {
            if (decode_ctl(msg, n).kind == Ctl::revoked) {
                server_.revoked();
                state_ = State::done;
            }
        } catch (const Error &) {
        }
        return false;  // revoked, or nonsense: either way this connection is over
    }
    CtlMsg m;
    try {
        m = decode_ctl(msg, n);
    } catch (const Error &e) {
        KVX_LOG(warn, "shm: closing a writer's connection: %s", e.what());
        return false;
    }
    if (m.kind == Ctl::stage) return on_stage();
    if (m.kind == Ctl::copy) return on_copy(m);
    return false;  // nothing else comes from a granted writer
}

// A writer of private memory that the kernel does not let it reach (or told
// to stage): a ring of its own, a sealed memfd, passed with STAGED.
bool ShmConn::on_stage() {
    if (ring_ || (server_.mode() != Mode::kernel && granted_ != Mode::staged)) {
        KVX_LOG(warn, "shm: closing a writer's connection: STAGE %s", ring_ ? "twice" : "for a mapped region");
        return false;
    }
    const uint64_t len = ring_len(kRingSlots, kRingSlotLen);
    net::Fd fd(memfd_create("kvxfer-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    void *p = MAP_FAILED;
    if (fd && ftruncate(fd.get(), static_cast<off_t>(len)) == 0 &&
        fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
        KVX_LOG(warn, "shm: cannot make a staging ring of %" PRIu64 " bytes: %s", len, strerror(errno));
        return false;
    }
    ring_ = static_cast<uint8_t *>(p);
    slots_ = kRingSlots;
    slot_len_ = kRingSlotLen;
    CtlMsg r{Ctl::staged};
    r.slots = slots_;
    r.slot_len = slot_len_;
    r.size = len;
    uint8_t out[kCtlMaxLen];
    return send_msg(fd_.get(), out, encode_ctl(r, out), fd.get()) == 0;
}

// COPY: the slot's segments into the region, if the writer has not withdrawn
// them (a ticket taken here is copied whole; one withdrawn is skipped).
// Anything outside the ring or the region closes the connection.
bool ShmConn::on_copy(const CtlMsg &m) {
    const Region &rg = server_.ctx().region;
    if (!ring_ || m.slot >= slots_) {
        KVX_LOG(warn, "shm: closing a writer's connection: COPY from slot %u, the ring has %u", m.slot, slots_);
        return false;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < m.nseg; i++) {
        const CtlMsg::Seg &s = m.segs[i];
        total += s.len;
        if (total > slot_len_ || s.dst_off > rg.size() || s.len > rg.size() - s.dst_off) {
            KVX_LOG(warn, "shm: closing a writer's connection: COPY segment %u (%u bytes to offset %" PRIu64
                          ") is outside the slot (%u bytes) or the region (%" PRIu64 " bytes)",
                    i, s.len, s.dst_off, slot_len_, rg.size());
            return false;
        }
    }
    CtlMsg r{Ctl::copied};
    r.slot = m.slot;
    r.ticket = m.ticket;
    // The ring is shared with the writer and the region may be a huge-page
    // file whose pages a holder of its descriptor can punch out: a fault in
    // either fails this connection, not the process.
    const int rc = guarded({ring_, ring_len(slots_, slot_len_)}, {rg.base, rg.size()}, [&] {
        std::atomic_ref<uint64_t> state(*reinterpret_cast<uint64_t *>(ring_ + uint64_t{m.slot} * 64));
        uint64_t expect = m.ticket;
        if (!state.compare_exchange_strong(expect, m.ticket | kTaken, std::memory_order_acquire)) return 1;  // withdrawn
        const uint8_t *src = ring_ + ring_data_off(slots_) + uint64_t{m.slot} * slot_len_;
        for (uint32_t i = 0; i < m.nseg; src += m.segs[i].len, i++)
            copy_into_region(rg.base + m.segs[i].dst_off, src, m.segs[i].len);
        state.store(m.ticket | kCopied, std::memory_order_release);
        return 0;
    });
    if (rc < 0) {
        KVX_LOG(warn, "shm: closing a writer's connection: a copy from its staging ring faulted (SIGBUS: pages of the "
                      "ring or the region are gone)");
        return false;
    }
    r.status = static_cast<uint32_t>(rc);
    uint8_t out[kCtlMaxLen];
    return send_msg(fd_.get(), out, encode_ctl(r, out), -1) == 0;
}

// HELLO -> CHALLENGE, AUTH -> ACCEPT and the grant, or a REFUSE at either
// step. A writer of another user (admitted with shm.allow_other_users=1)
// gets a staging ring: never the region's file, never leave to ptrace us.
bool ShmConn::on_handshake(const uint8_t *msg, size_t n) {
    const std::string who = "shm " + cred_.who;
    handshake::Step st = server_.responder().on_message(session_, msg, n, who.c_str());
    if (send_msg(fd_.get(), st.reply.data(), st.reply_len, -1) != 0) return false;
    if (st.outcome == handshake::Step::Outcome::refused) return false;
    if (st.outcome == handshake::Step::Outcome::challenged) {
        state_ = State::auth;
        return true;
    }
    server_.authenticated(*this);
    CtlMsg g;
    g.kind = Ctl::grant;
    g.mode = cred_.same_user || server_.mode() == Mode::none ? server_.grant_mode() : Mode::staged;
    granted_ = g.mode;
    g.offset = g.mode == Mode::mapped ? server_.backing_offset() : 0;
    g.size = server_.ctx().region.size();
    const int pass = g.mode == Mode::mapped ? server_.backing_fd() : -1;
    uint8_t out[kCtlMaxLen];
    if (send_msg(fd_.get(), out, encode_ctl(g, out), pass) != 0) return false;
    state_ = State::granted;
    server_.ctx().loop->cancel_timer(timer_);
    timer_ = 0;
    return true;
}

bool ShmConn::revoke() {
    if (!granted()) return false;
    uint8_t out[kCtlMaxLen];
    if (send_msg(fd_.get(), out, encode_ctl(CtlMsg{Ctl::revoke}, out), -1) != 0) return false;
    state_ = State::revoking;
    return true;
}

ShmServer::ShmServer(const BackendContext &ctx) : ctx_(ctx), responder_(ctx.identity, kDataPath, "shm") {
    allow_others_ = ctx.options->uint("shm.allow_other_users") != 0;
    rlimit nofile{};
    const size_t fds = getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY
                           ? static_cast<size_t>(nofile.rlim_cur) : SIZE_MAX;
    max_pending_ = std::clamp<size_t>(fds / 4, kPendingPerUser, kMaxPending);
    max_conns_ = std::clamp<size_t>(fds / 2, max_pending_, kMaxConnections);
    staged_ = ctx.options->str("shm.private") == "staged";
    info_.boot_id = boot_id();
    info_.netns = netns_inode();
    info_.pid = static_cast<uint32_t>(getpid());
    info_.start_time = process_start_time(getpid());
    info_.socket_name = strfmt("kvxfer-shm-%d-%016" PRIx64, static_cast<int>(getpid()), ctx.identity.instance_id);
    std::string why;
    if (shared::find_backing(ctx.region.base, ctx.region.size(), &backing_, &why)) {
        info_.mode = Mode::mapped;
        KVX_LOG(info, "shm: the region lies in %s at offset %" PRIu64 ": same-host peers map it", backing_.what.c_str(),
                backing_.offset);
    } else {
        info_.mode = ctx.options->str("shm.private") == "off" ? Mode::none : Mode::kernel;
        const bool small_pages = info_.mode == Mode::kernel && !staged_ && ctx.options->uint("region_hugepages") == 0;
        KVX_LOG(info, "shm: %s: same-host peers %s%s", why.c_str(),
                info_.mode == Mode::none ? "cannot use shm (shm.private=off)"
                : staged_                ? "copy through a staging ring (shm.private=staged)"
                                         : "write with process_vm_writev (or a staging ring when the kernel refuses)",
                small_pages ? " (faster on huge pages: region_hugepages=1; mapped directly: kvx_region_alloc() memory)" : "");
    }
    listen_fd_ = net::Fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un a;
    const socklen_t alen = abstract_addr(info_.socket_name, &a);
    if (!listen_fd_ || bind(listen_fd_.get(), reinterpret_cast<sockaddr *>(&a), alen) != 0 ||
        listen(listen_fd_.get(), SOMAXCONN) != 0)
        fail(KVX_EBACKEND, "shm: cannot listen on @%s: %s", info_.socket_name.c_str(), strerror(errno));
    listen_tok_ = ctx.loop->attach(listen_fd_.get(), EPOLLIN, &listener_, 0);
    if (listen_tok_ == 0) fail(KVX_ECLOSED, "shm: the event loop is stopped");
}

ShmServer::~ShmServer() { shutdown(); }

void ShmServer::accept_all() {
    for (int i = 0; i < kAcceptBatch; i++) {
        net::Fd fd(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (net::accept_exhausted(errno)) {
                // The level-triggered listener would wake the loop without end
                // while no descriptor is free: stop listening for a while.
                KVX_LOG(warn, "shm: cannot accept: %s; pausing for %lld ms", strerror(errno),
                        static_cast<long long>(kAcceptPause.count()));
                ctx_.loop->modify(listen_tok_, 0);
                resume_timer_ = ctx_.loop->add_timer(Clock::now() + kAcceptPause, &listener_, 0);
            }
            return;  // EAGAIN: none left
        }
        PeerCred cred;
        if (!peer_cred(fd.get(), &cred) || !admit(fd, cred)) continue;  // closed: the writer's handshake fails
        auto c = std::make_unique<ShmConn>(*this, std::move(fd), cred);
        ShmConn *p = c.get();
        conns_.emplace(p, std::move(c));
        p->pending_at = pending_.insert(pending_.end(), p);
        p->listed = true;
        pending_per_user_[p->user()]++;
        if (!p->start(Clock::now() + kHandshakeTimeout)) close(*p);
    }
}

// A writer of another user is refused before it says anything, unless
// allowed: the REFUSE waits in its socket for its HELLO, and the connection
// costs us nothing after this call. Otherwise it needs a pending slot: at
// most kPendingPerUser per other user (a new one replaces that user's
// oldest), and when all max_pending_ are taken, the oldest connection of the
// other user holding the most makes room; if this user holds them all, the
// new connection is closed. So another user can delay this user's writers
// by at most its quota, whatever it opens.
bool ShmServer::admit(net::Fd &fd, const PeerCred &cred) {
    auto oldest_of = [&](uint64_t user) -> ShmConn * {
        for (ShmConn *c : pending_)
            if (c->user() == user) return c;
        return nullptr;
    };
    auto pending_of = [&](uint64_t user) -> size_t {
        auto it = pending_per_user_.find(user);
        return it == pending_per_user_.end() ? 0 : it->second;
    };
    if (!cred.same_user && !allow_others_) {
        const handshake::Step st =
            responder_.decline(KVX_EAUTH, "a writer of another user (shm.allow_other_users=0)", ("shm " + cred.who).c_str());
        send_msg(fd.get(), st.reply.data(), st.reply_len, -1);
        // Closed with its HELLO unread, the socket would reset the writer's
        // end, and the reset is reported before the REFUSE waiting there:
        // stop taking data, drop what came, then close.
        ::shutdown(fd.get(), SHUT_RD);
        uint8_t sink[64];
        for (int i = 0; i < 64 && recv(fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
        }
        return false;
    }
    if (conns_.size() >= max_conns_ && pending_.empty()) return false;
    const uint64_t user = ShmConn::user_of(cred);
    if (user != ShmConn::kOurUser && pending_of(user) >= kPendingPerUser) {
        close(*oldest_of(user));
    } else if (pending_.size() >= max_pending_ || conns_.size() >= max_conns_) {
        uint64_t most = ShmConn::kOurUser;
        size_t n = 0;
        for (const auto &[u, count] : pending_per_user_)
            if (count > n && u != ShmConn::kOurUser) {
                most = u;
                n = count;
            }
        if (n == 0) return false;  // all ours (or none pending): no room
        close(*oldest_of(most));
    }
    return true;
}

void ShmServer::unlist(ShmConn &c) {
    if (!c.listed) return;
    auto it = pending_per_user_.find(c.user());
    if (it != pending_per_user_.end() && --it->second == 0) pending_per_user_.erase(it);
    pending_.erase(c.pending_at);
    c.listed = false;
}

void ShmServer::authenticated(ShmConn &c) { unlist(c); }

void ShmServer::resume_accepting() {
    resume_timer_ = 0;
    ctx_.loop->modify(listen_tok_, EPOLLIN);
}

void ShmServer::close(ShmConn &c) {
    unlist(c);
    c.stop();
    conns_.erase(&c);
}

void ShmServer::revoked() {
    std::lock_guard<std::mutex> lk(mu_);
    if (revoking_ > 0) revoking_--;
    cv_.notify_all();
}

// Every writer that holds a grant is told to let go, and answers once none
// of its copies runs and its mapping is gone; we wait for those answers
// (bounded: a writer that hangs is logged, see docs/security.md).
void ShmServer::shutdown() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stopped_) return;
        stopped_ = true;
    }
    size_t asked = 0;
    ctx_.loop->call([&] {
        ctx_.loop->detach(listen_tok_);
        ctx_.loop->cancel_timer(resume_timer_);
        resume_timer_ = 0;
        std::vector<ShmConn *> idle;
        for (auto &[p, c] : conns_) {
            if (p->revoke()) asked++;
            else idle.push_back(p);
        }
        for (ShmConn *p : idle) close(*p);
        std::lock_guard<std::mutex> lk(mu_);
        revoking_ = asked;
    });
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, kRevokeWait, [&] { return revoking_ == 0; }))
        KVX_LOG(warn, "shm: %zu of %zu writers did not confirm revocation within %lld ms", revoking_, asked,
                static_cast<long long>(kRevokeWait.count()));
    lk.unlock();
    ctx_.loop->call([&] {
        for (auto &[p, c] : conns_) c->stop();
        conns_.clear();
        pending_.clear();
        pending_per_user_.clear();
    });
    listen_fd_ = net::Fd();
}

}  // namespace kvx::shm
