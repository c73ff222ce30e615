// Initiator side of the verbs backend: authenticated RC connections to one
// peer (the handshake engine's initiator, carried in rdma_cm private data),
// and their shutdown. The data path is verbs_datapath.cpp.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <random>

#include "backends/verbs/verbs.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

namespace {

// IB CM reject reason: the REQ's (QP number, CA GUID) matches a connection
// the target's CM still knows. Concurrent requests from one host that carry
// the same QP number get it; the request may be retried with another one.
constexpr int kRejStaleConn = 10;

// A QP number for a HELLO, which has no QP: random (not 0 or 1, the special
// QPs), so that concurrent HELLOs from this host do not look like one stale
// connection to the target's CM.
uint32_t hello_qp_num() {
    thread_local std::minstd_rand gen{std::random_device{}()};
    return 2 + static_cast<uint32_t>(gen() % 0xfffffdu);
}

// A reject by the target's CM itself (no kvxfer message) for a stale
// connection: worth another try with another QP number.
bool stale_reject(const CmEvent &e) {
    if (e.type != RDMA_CM_EVENT_REJECTED || e.status != kRejStaleConn) return false;
    return !handshake::is_message(e.pdata.data(), e.pdata.size());
}

}  // namespace

// ------------------------------------------------------------------ connect

VerbsPeer::VerbsPeer(EventLoop *loop, const PeerConfig &cfg, const PeerContext &pc, std::shared_ptr<PeerSet> set)
    : loop_(loop), cfg_(cfg), peer_id_(pc.peer_id), sink_(pc.sink), set_(std::move(set)) {
    wr_buf_.resize(cfg_.sq_depth);
    sge_buf_.resize(cfg_.sq_depth);
}

VerbsPeer::~VerbsPeer() { shutdown(); }

// Pairs our rails with the peer's and connects every pair's QPs. A pair
// that does not connect is left out (logged), unless the peer refused us
// (authentication, fingerprint, version: the same on every rail) or no pair
// connects: then the first failure is the peer's.
std::unique_ptr<VerbsPeer> VerbsPeer::dial(const BackendContext &ctx,
                                           const std::vector<std::shared_ptr<Device>> &rails, EventLoop *loop,
                                           const PeerConfig &cfg, const PeerContext &pc,
                                           std::shared_ptr<PeerSet> set) {
    std::unique_ptr<VerbsPeer> p(new VerbsPeer(loop, cfg, pc, std::move(set)));
    const SectionInfo v = decode_section(*pc.section, *pc.meta);
    p->where_ = strfmt("peer '%s' at %s", pc.peer_id.c_str(), v.rails.front().cm.str().c_str());
    p->remote_addr_ = v.mr_addr;
    p->remote_slice_ = v.slice_len;
    p->local_slice_ = rails.front()->slice_len;  // every rail registers alike
    p->sliced_ = p->local_slice_ < ctx.region.size() || p->remote_slice_ < v.mr_len;
    p->block_len_ = ctx.region.block_len;
    p->meta_ = *pc.meta;
    p->ours_ = ctx.identity.fingerprint;
    p->choose_rails(rails, v.rails, cfg.rail_map);
    std::string connected;
    try {
        p->setup_cm_channel();
        std::exception_ptr first;
        std::string skipped;  // rails not tried, and why
        p->dialling_.assign(p->rails_.size(), false);
        p->kicked_.assign(p->rails_.size(), false);
        for (size_t r = 0; r < p->rails_.size(); r++) {
            std::string why;
            if (!p->can_try(r, &why)) {  // dialled again once it can be (start())
                KVX_LOG(info, "verbs: %s: rail %s starts down: %s", p->where_.c_str(), p->rails_[r].name.c_str(),
                        why.c_str());
                skipped += strfmt("%s%s: %s", skipped.empty() ? "" : "; ", p->rails_[r].name.c_str(), why.c_str());
                p->set_state(p->rails_[r], Rail::State::down);
                continue;
            }
            try {
                p->connect_rail(ctx, pc, r);
                connected += (connected.empty() ? "" : ", ") + p->rails_[r].name;
            } catch (const Error &e) {
                if (e.code() == KVX_EAUTH || e.code() == KVX_EFINGERPRINT || e.code() == KVX_EVERSION) throw;
                if (!first) first = std::current_exception();
                p->fail_rail_at_dial(r, e.what());
            }
        }
        if (connected.empty()) {
            if (!first)
                fail(KVX_EHOSTUNREACH, "verbs: %s: none of its rails can be reached now (%s)", p->where_.c_str(),
                     skipped.c_str());
            std::rethrow_exception(first);
        }
    } catch (...) {
        p->shutdown();  // not started: tears down what exists, calls no sink
        throw;
    }
    KVX_LOG(info, "verbs: connected to %s with %u QP(s) per rail on %s", p->where_.c_str(), cfg.qps, connected.c_str());
    return p;
}

// The peer's rails pair with our ports that can carry now first, as they
// always did; one that only a port down now can reach pairs with it (down
// from the start, it joins once the port is back). Throws
// KVX_EHOSTUNREACH when no rail pairs.
void VerbsPeer::choose_rails(const std::vector<std::shared_ptr<Device>> &rails,
                             const std::vector<RemoteRail> &remote, const std::vector<RailMapEntry> &map) {
    std::vector<std::shared_ptr<Device>> up, down;
    for (const auto &d : rails) (d->port_down() || !d->has_addr_gid() ? down : up).push_back(d);
    std::string notes;
    std::vector<bool> paired(remote.size(), false);
    auto add = [&](const std::shared_ptr<Device> &dev, size_t r) {
        Rail rail;
        rail.dev = dev;
        rail.remote = remote[r];
        rail.name = dev->label + " -> " + remote[r].cm.str();
        max_msg_ = max_msg_ ? std::min(max_msg_, dev->max_msg) : dev->max_msg;
        rails_.push_back(std::move(rail));
        paired[r] = true;
    };
    std::string unused;
    for (const auto &[l, r] : pair_rails(up, remote, &unused, map)) add(up[l], r);
    std::vector<size_t> rest;
    std::vector<RemoteRail> rest_rails;
    for (size_t r = 0; r < remote.size(); r++)
        if (!paired[r]) {
            rest.push_back(r);
            rest_rails.push_back(remote[r]);
        }
    for (const auto &[l, r] : pair_rails(down, rest_rails, &notes, map, /*route=*/false)) add(down[l], rest[r]);
    if (!notes.empty()) KVX_LOG(info, "verbs: %s: rails left out: %s", where_.c_str(), notes.c_str());
    if (rails_.empty())
        fail(KVX_EHOSTUNREACH, "verbs: %s: %s none of its rails (%s)", where_.c_str(),
             map.empty() ? "no port of ours pairs with" : "verbs.rail_map pairs", notes.c_str());
}

void VerbsPeer::setup_cm_channel() {
    cm_ch_ = rdma_create_event_channel();
    if (!cm_ch_) fail(KVX_EBACKEND, "verbs: rdma_create_event_channel: %s", strerror(errno));
    net::set_nonblocking(cm_ch_->fd, "rdma_cm event channel");
}

// A rail pair's completion channel and CQ. One CQ per peer and rail: its
// lifetime is the peer's, so removing a peer never leaves stale completions
// in a shared CQ, and a broken peer's flushes cannot crowd out another
// peer's completions. Every WR may complete (flushes complete unsignalled
// WRs too), plus one drain marker and the probe receives per QP.
void VerbsPeer::setup_rail(Rail &r) { make_cq(*r.dev, &r.comp_ch, &r.cq); }

// A completion channel and an armed CQ on dev for one rail pair's QPs; what
// was made is in *ch and *cq (the caller's to destroy) when it throws.
void VerbsPeer::make_cq(const Device &dev, ibv_comp_channel **ch, ibv_cq **cq) const {
    *ch = ibv_create_comp_channel(dev.ctx);
    if (!*ch) fail(KVX_EBACKEND, "verbs: ibv_create_comp_channel on %s: %s", dev.label.c_str(), strerror(errno));
    net::set_nonblocking((*ch)->fd, "completion channel");
    int cqe = static_cast<int>(cfg_.qps * (cfg_.sq_depth + 1 + kProbeRecvs));
    *cq = ibv_create_cq(dev.ctx, cqe, const_cast<VerbsPeer *>(this), *ch, 0);
    if (!*cq) fail(KVX_EBACKEND, "verbs: ibv_create_cq(%d) on %s: %s", cqe, dev.label.c_str(), strerror(errno));
    if (ibv_req_notify_cq(*cq, 0) != 0) fail(KVX_EBACKEND, "verbs: ibv_req_notify_cq failed");
}

// Each rail gets an equal share of the time left (the last one all of it),
// so that one the network swallows does not use up the others' time.
void VerbsPeer::connect_rail(const BackendContext &ctx, const PeerContext &pc, size_t r) {
    setup_rail(rails_[r]);
    const auto left = pc.deadline.at() - Clock::now();
    const net::Deadline mine = pc.deadline.sooner(Clock::now() + left / static_cast<long>(rails_.size() - r));
    for (uint32_t i = 0; i < cfg_.qps; i++)
        connect_qp(Dial{*pc.meta, ctx.identity.fingerprint, mine, r, i, cm_ch_, rails_[r].cq, nullptr});
    set_state(rails_[r], Rail::State::up);
}

// A rail pair that did not connect: down from the start, its QPs gone.
void VerbsPeer::fail_rail_at_dial(size_t r, const char *why) {
    KVX_LOG(warn, "verbs: %s: rail %s not connected: %s", where_.c_str(), rails_[r].name.c_str(), why);
    for (Qp &q : qps_)
        if (q.rail == r) {
            q.dead = true;
            to_error(q);
        }
    rails_[r].failures++;
    set_state(rails_[r], Rail::State::down);
}

// HELLO gets a challenge; AUTH with the QP answers it. The target verifies
// before it creates its own QP, and may challenge again (the challenge
// expired, or was used): we answer until the connect deadline, which ends
// each wait (KVX_ETIMEDOUT), not after a fixed number of rounds.
void VerbsPeer::connect_qp(const Dial &d) {
    handshake::Initiator in(d.meta, d.ours, kDataPath, where_, /*rechallenge=*/true);
    hello(d, in);
    for (int round = 1;; round++) {
        if (authenticate(d, in)) return;
        if (d.deadline.passed())
            fail(KVX_ETIMEDOUT, "%s kept challenging until the connect timeout (%d rounds)", where_.c_str(), round);
        KVX_LOG(debug, "verbs: %s challenged again (round %d)", where_.c_str(), round);
    }
}

// Next event of id; events of the peer's earlier QPs are handled in passing.
CmEvent VerbsPeer::wait_cm(rdma_cm_id *id, const Dial &d, const char *what) {
    CmEvent ev;
    for (;;) {
        if (next_cm_event(d.ch, &ev)) {
            if (ev.id == id) return ev;
            if (ends_connection(ev.type) && d.into) {  // a rejoin: its own QPs alone are on its channel
                for (const Qp &q : *d.into)
                    if (q.id.get() == ev.id)
                        fail(KVX_ECONNRESET, "%s: an earlier connection closed while connecting QP %zu (%s)",
                             where_.c_str(), d.index, rdma_event_str(ev.type));
            } else if (ends_connection(ev.type)) {
                for (const Qp &q : qps_)
                    if (q.id.get() == ev.id && q.rail == d.rail)
                        fail(KVX_ECONNRESET, "%s: an earlier connection closed while connecting QP %zu (%s)",
                             where_.c_str(), d.index, rdma_event_str(ev.type));
                for (const Qp &q : qps_)  // another rail's: it is down from the start
                    if (q.id.get() == ev.id && rails_[q.rail].state == Rail::State::up)
                        fail_rail_at_dial(q.rail, rdma_event_str(ev.type));
            }
            continue;
        }
        if (errno != EAGAIN && errno != EINTR) fail(KVX_EBACKEND, "verbs: rdma_get_cm_event: %s", strerror(errno));
        int rc = net::wait_fd(d.ch->fd, POLLIN, d.deadline);
        if (rc == -ETIMEDOUT) fail(KVX_ETIMEDOUT, "%s: no answer within the connect timeout (%s)", where_.c_str(), what);
        if (rc == -ECANCELED) fail(KVX_ECANCELED, "%s: connecting called off (%s)", where_.c_str(), what);
        if (rc < 0) fail(KVX_EBACKEND, "verbs: poll on the rdma_cm channel: %s", strerror(-rc));
    }
}

[[noreturn]] void VerbsPeer::connect_failed(const CmEvent &e, const char *what) const {
    fail(connect_failure_code(e.type, e.status), "%s: %s failed: %s (status %d)", where_.c_str(), what,
         rdma_event_str(e.type), e.status);
}

// A fresh cm_id, address and route resolved; from our RDMA address, so the
// connection uses the device that holds our MR.
CmId VerbsPeer::resolve(const Dial &d) {
    rdma_cm_id *raw = nullptr;
    if (rdma_create_id(d.ch, &raw, this, RDMA_PS_TCP) != 0)
        fail(KVX_EBACKEND, "verbs: rdma_create_id: %s", strerror(errno));
    CmId id(raw);
    const Rail &rail = rails_[d.rail];
    socklen_t dlen = 0;
    sockaddr_storage dst = net::from_endpoint(rail.remote.cm, &dlen);
    sockaddr_storage src = rail.dev->addr;
    if (rdma_resolve_addr(id.get(), src.ss_family == dst.ss_family ? reinterpret_cast<sockaddr *>(&src) : nullptr,
                          reinterpret_cast<sockaddr *>(&dst), std::max(1, net::ms_left(d.deadline.at()))) != 0)
        fail(KVX_EHOSTUNREACH, "%s: rdma_resolve_addr: %s", where_.c_str(), strerror(errno));
    CmEvent e = wait_cm(id.get(), d, "address resolution");
    if (e.type != RDMA_CM_EVENT_ADDR_RESOLVED) connect_failed(e, "address resolution");
    if (id->verbs != rail.dev->ctx || id->port_num != rail.dev->port)
        fail(KVX_EHOSTUNREACH, "%s: rail %s is reached through %s port %u, not %s", where_.c_str(),
             rail.name.c_str(), id->verbs ? ibv_get_device_name(id->verbs->device) : "?", id->port_num,
             rail.dev->label.c_str());
    if (rdma_resolve_route(id.get(), std::max(1, net::ms_left(d.deadline.at()))) != 0)
        fail(KVX_EHOSTUNREACH, "%s: rdma_resolve_route: %s", where_.c_str(), strerror(errno));
    e = wait_cm(id.get(), d, "route resolution");
    if (e.type != RDMA_CM_EVENT_ROUTE_RESOLVED) connect_failed(e, "route resolution");
    return id;
}

// The target's answer in a REJECT or CONNECT_RESPONSE, to the engine: true
// for an ACCEPT. Private data of a REJECT that is no kvxfer message is a
// reject by something that is no kvxfer target (nobody listening: IB CM pads
// its private data with zeros).
bool VerbsPeer::answer(const CmEvent &e, handshake::Initiator &in, const char *what) {
    if (e.type == RDMA_CM_EVENT_REJECTED && !handshake::is_message(e.pdata.data(), e.pdata.size()))
        fail(KVX_ECONNREFUSED, "%s refused the connection (%s, reject reason %d)", where_.c_str(), what, e.status);
    handshake::Bytes unused;
    size_t n = 0;
    return in.on_answer(e.pdata.data(), e.pdata.size(), unused.data(), &n);
}

// HELLO on a cm_id without a QP: the target rejects it with a fresh
// challenge, which the engine answers. Tried again (until the deadline) when
// the target's CM took it for a stale connection.
void VerbsPeer::hello(const Dial &d, handshake::Initiator &in) {
    for (;;) {
        CmId id = resolve(d);
        handshake::Bytes b;
        rdma_conn_param cp = conn_param(b.data(), in.hello(b.data()));
        cp.qp_num = hello_qp_num();  // no QP exists: the target never accepts a HELLO
        if (rdma_connect(id.get(), &cp) != 0)
            fail(KVX_EBACKEND, "%s: rdma_connect: %s", where_.c_str(), strerror(errno));
        CmEvent e = wait_cm(id.get(), d, "HELLO");
        if (e.type == RDMA_CM_EVENT_CONNECT_RESPONSE || e.type == RDMA_CM_EVENT_ESTABLISHED)
            fail(KVX_EAUTH, "%s accepted an unauthenticated HELLO: not a kvxfer verbs target", where_.c_str());
        if (stale_reject(e)) {
            KVX_LOG(debug, "verbs: %s: HELLO taken for a stale connection, again", where_.c_str());
            continue;
        }
        if (e.type != RDMA_CM_EVENT_REJECTED) connect_failed(e, "connect");
        if (answer(e, in, "HELLO")) fail(KVX_EAUTH, "%s accepted a HELLO", where_.c_str());  // not reached: the engine refuses
        return;
    }
}

// The engine's AUTH on a cm_id with its QP. true: accepted, the QP is ours;
// false: the target challenged again (the engine answered: the next AUTH is
// ready), or its CM took the request for a stale connection (the same AUTH
// again).
//
// The QP is ours, not rdma_create_qp's: rdma_cm would move that one to RTR
// with remote write access when the REP arrives, before we verified who sent
// it, and whoever accepted could write into our region until we took the
// access away. Ours goes through INIT, RTR and RTS with rdma_cm's attributes
// but no remote access, and reaches RTR only after the accept's proof
// verified (CONNECT_RESPONSE, then rdma_establish sends the RTU).
bool VerbsPeer::authenticate(const Dial &d, handshake::Initiator &in) {
    CmId id = resolve(d);
    const Rail &rail = rails_[d.rail];
    ibv_qp_init_attr qa = rc_qp_attr(d.cq, cfg_.sq_depth + 1, kProbeRecvs);  // +1: a drain marker
    OwnedQp qp(ibv_create_qp(rail.dev->pd, &qa));
    if (!qp)
        fail(KVX_EBACKEND, "%s: ibv_create_qp (send queue %u): %s", where_.c_str(), cfg_.sq_depth + 1, strerror(errno));
    move_qp(id.get(), qp.get(), IBV_QPS_INIT);
    for (uint32_t i = 0; i < kProbeRecvs; i++)
        if (int rc = post_probe_recv(qp.get()))
            fail(KVX_EBACKEND, "%s: ibv_post_recv: %s", where_.c_str(), strerror(rc));
    handshake::Bytes b;
    rdma_conn_param cp = conn_param(b.data(), in.auth(b.data()));
    cp.qp_num = qp->qp_num;
    if (rdma_connect(id.get(), &cp) != 0) fail(KVX_EBACKEND, "%s: rdma_connect: %s", where_.c_str(), strerror(errno));
    CmEvent e = wait_cm(id.get(), d, "AUTH");
    if (stale_reject(e)) return false;  // the same AUTH again, with a new QP
    if (e.type == RDMA_CM_EVENT_REJECTED) {
        if (answer(e, in, "AUTH")) fail(KVX_EAUTH, "%s accepted in a reject", where_.c_str());  // not reached
        return false;  // challenged again: the engine's next AUTH
    }
    if (e.type != RDMA_CM_EVENT_CONNECT_RESPONSE) connect_failed(e, "connect");
    // Throws on a bad proof; destroying the id then rejects the REP.
    if (!answer(e, in, "AUTH")) fail(KVX_EAUTH, "%s answered AUTH with a challenge in its accept", where_.c_str());
    move_qp(id.get(), qp.get(), IBV_QPS_RTR);
    move_qp(id.get(), qp.get(), IBV_QPS_RTS);
    ibv_qp_attr at{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qp.get(), &at, IBV_QP_ACCESS_FLAGS, &ia) != 0)
        fail(KVX_EBACKEND, "%s: ibv_query_qp: %s", where_.c_str(), strerror(errno));
    constexpr unsigned kRemote = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    if (at.qp_access_flags & kRemote)
        fail(KVX_EBACKEND, "%s: the outbound QP has remote access (0x%x) after RTS; not taken", where_.c_str(),
             at.qp_access_flags);
    if (rdma_establish(id.get()) != 0)
        fail(KVX_EBACKEND, "%s: rdma_establish: %s", where_.c_str(), strerror(errno));
    id->qp = qp.release();  // the cm_id owns it from here (CmIdDeleter: rdma_destroy_qp)
    adopt(std::move(id), d);
    return true;
}

// qp to state st with the attributes rdma_cm has for id, and no remote access:
// only our writes go out through it, nothing comes in.
void VerbsPeer::move_qp(rdma_cm_id *id, ibv_qp *qp, ibv_qp_state st) const {
    ibv_qp_attr at{};
    int mask = 0;
    at.qp_state = st;
    if (rdma_init_qp_attr(id, &at, &mask) != 0)
        fail(KVX_EBACKEND, "%s: rdma_init_qp_attr (QP state %d): %s", where_.c_str(), static_cast<int>(st),
             strerror(errno));
    at.qp_access_flags = 0;
    if (ibv_modify_qp(qp, &at, mask) != 0)
        fail(KVX_EBACKEND, "%s: QP %u to state %d: %s", where_.c_str(), qp->qp_num, static_cast<int>(st),
             strerror(errno));
}

void VerbsPeer::adopt(CmId id, const Dial &d) {
    Qp q;
    q.qp = id->qp;
    q.id = std::move(id);
    q.rail = d.rail;
    q.turn = d.index * kMaxRails + d.rail;
    KVX_LOG(debug, "verbs: %s: rail %s QP %zu (qp %u) authenticated", where_.c_str(), rails_[d.rail].name.c_str(),
            d.index, q.qp->qp_num);
    (d.into ? *d.into : qps_).push_back(std::move(q));
}

// On the loop thread, as the tokens are only touched there.
bool VerbsPeer::start() {
    bool ok = false;
    loop_->call([&] {
        tok_cm_ = loop_->attach(cm_ch_->fd, EPOLLIN, this, kTagCm);
        ok = tok_cm_ != 0;
        for (size_t r = 0; r < rails_.size(); r++) {
            if (!rails_[r].comp_ch) continue;
            rails_[r].tok = loop_->attach(rails_[r].comp_ch->fd, EPOLLIN, this, kTagCq0 + static_cast<int>(r));
            ok &= rails_[r].tok != 0;
        }
        if (ok) {
            set_->peers.push_back(this);
            std::lock_guard<std::mutex> lk(mu_);
            for (size_t r = 0; r < rails_.size(); r++)  // not connected at the add: to be dialled again
                if (rails_[r].state == Rail::State::down) redial(r);
            return;
        }
        loop_->detach(tok_cm_);
        tok_cm_ = 0;
        for (Rail &r : rails_) {
            loop_->detach(r.tok);
            r.tok = 0;
        }
    });
    return ok;
}


// ------------------------------------------------------------------ shutdown

void VerbsPeer::shutdown() {
    std::call_once(shutdown_once_, [this] {
        stop_dialler();  // a rejoin under way is called off, none starts
        loop_->call([this] {  // from here on the event loop never calls us
            loop_->detach(tok_cm_);
            tok_cm_ = 0;
            for (Rail &r : rails_) {
                loop_->detach(r.tok);
                loop_->cancel_timer(r.drain_timer);
                r.tok = r.drain_timer = 0;
            }
            auto &v = set_->peers;
            v.erase(std::remove(v.begin(), v.end(), this), v.end());
        });
        {
            CompletionBatch out;
            std::unique_lock<std::mutex> lk(mu_);
            stopping_ = true;
            set_broken(KVX_ECONNRESET);
            // QPs to ERR before anything is reported: the NIC stops (and
            // retransmits nothing), so only what already left it may land.
            for (Qp &q : qps_) kill_qp(q, KVX_ECONNRESET, out);
            fail_all_waiting(KVX_ECONNRESET, out);
            fail_orphans(KVX_ECONNRESET, out);
            deliver(lk, out);
            cv_.wait(lk, [&] { return delivering_ == 0; });  // e.g. an abort() delivering right now
        }
        teardown();
    });
}

// A signalled marker behind everything on each QP: once it completes
// (flushed), the device no longer touches the region for this peer.
void VerbsPeer::drain() {
    std::vector<int> want(rails_.size(), 0);
    std::vector<bool> port_up(rails_.size());
    for (size_t r = 0; r < rails_.size(); r++) port_up[r] = !rails_[r].dev->port_down();
    for (Qp &q : qps_) {
        // A port that is down sends nothing more (and on rxe a WR posted
        // then wedges the port): its QPs, in ERR, need no marker.
        if (!port_up[q.rail]) continue;
        if (rails_[q.rail].state == Rail::State::draining) continue;  // its markers are posted (counted below)
        if (post_marker(q)) want[q.rail]++;
    }
    for (size_t r = 0; r < rails_.size(); r++)
        if (rails_[r].state == Rail::State::draining) want[r] += rails_[r].drains_left;
    const auto until = Clock::now() + std::chrono::seconds(2);
    ibv_wc wc[kCqPollBatch];
    for (size_t r = 0; r < rails_.size(); r++) {
        while (want[r] > 0 && rails_[r].cq && Clock::now() < until) {
            int n = ibv_poll_cq(rails_[r].cq, kCqPollBatch, wc);
            if (n < 0) break;
            for (int i = 0; i < n; i++) want[r] -= wc[i].wr_id == kDrainWrId;
            if (n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if (want[r] > 0)
            KVX_LOG(warn, "verbs: %s: rail %s: %d QP(s) did not drain within 2 s", where_.c_str(),
                    rails_[r].name.c_str(), want[r]);
    }
}

// Disconnect, drain, destroy. Runs with the peer detached and idle.
void VerbsPeer::teardown() {
    for (Qp &q : qps_) {
        // DREQ (moves the QP to ERR on IB/RoCE), but not through a port
        // that is down (see VerbsBackend::close_conn)
        if (q.id && !rails_[q.rail].dev->port_down()) rdma_disconnect(q.id.get());
        to_error(q);  // iWARP only goes to SQD at a DREQ; without one, every QP here
    }
    drain();
    for (Qp &q : qps_) {
        q.id.reset();
        q.qp = nullptr;
    }
    for (Rail &r : rails_) {
        if (r.cq) {
            if (r.cq_unacked) ibv_ack_cq_events(r.cq, r.cq_unacked);
            r.cq_unacked = 0;
            if (int rc = ibv_destroy_cq(r.cq)) KVX_LOG(error, "verbs: ibv_destroy_cq: %s", strerror(rc));
            r.cq = nullptr;
        }
        if (r.comp_ch) ibv_destroy_comp_channel(r.comp_ch);
        r.comp_ch = nullptr;
    }
    if (cm_ch_) rdma_destroy_event_channel(cm_ch_);
    cm_ch_ = nullptr;
}

}  // namespace kvx::verbs
