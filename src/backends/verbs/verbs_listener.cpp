// The verbs target's listener: where it listens, the connect requests it
// hands to the handshake engine, the connections it accepts, and shutdown.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/verbs/verbs_listener.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

namespace {

bool is_wildcard(const sockaddr_storage &ss) {
    if (ss.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in &>(ss).sin_addr.s_addr == htonl(INADDR_ANY);
    const auto &a = reinterpret_cast<const sockaddr_in6 &>(ss).sin6_addr;
    return IN6_IS_ADDR_UNSPECIFIED(&a);
}

void set_port(sockaddr_storage &ss, uint16_t port) {
    if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in &>(ss).sin_port = htons(port);
    else reinterpret_cast<sockaddr_in6 &>(ss).sin6_port = htons(port);
}

uint16_t get_port(const sockaddr_storage &ss) {
    if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in &>(ss).sin_port);
    return ntohs(reinterpret_cast<const sockaddr_in6 &>(ss).sin6_port);
}


// verbs.listen when it names a host (one rail); otherwise every ACTIVE port
// verbs.devices (or verbs.device/verbs.port) selects, each a rail, with
// verbs.listen's port, if any. The host without an RDMA stack ends here,
// false with *why.
bool plan_listen(const Options &o, const Selection &sel, ListenPlan *lp, std::string *why) {
    lp->option = o.str("verbs.listen");
    if (!lp->option.empty()) {
        lp->bind = net::parse_hostport(lp->option, "option verbs.listen", true);
        lp->explicit_host = !is_wildcard(lp->bind);
        lp->port = get_port(lp->bind);
    }
    if (lp->explicit_host) return true;
    lp->pls = find_placements(sel, why);
    if (lp->pls.empty()) return false;
    if (lp->pls.size() > kMaxRails) {
        KVX_LOG(warn, "verbs: %zu usable ports; the first %zu serve", lp->pls.size(), kMaxRails);
        lp->pls.resize(kMaxRails);
    }
    for (const Placement &pl : lp->pls) KVX_LOG(info, "verbs: rail %s", pl.how.c_str());
    return true;
}

// The registration's slice length: verbs.mr_slice_bytes in whole blocks
// (at least one), or more where that would make more than kMaxSlices (so
// that a setting never stops a larger region from serving); the region's
// size when not sliced.
uint64_t slice_of(const Options &o, const Region &r) {
    const uint64_t want = o.uint("verbs.mr_slice_bytes");
    uint64_t blocks = std::max<uint64_t>(1, want / r.block_len);
    if (want == 0 || blocks >= r.num_blocks) return r.size();
    const uint64_t least = r.num_blocks / kMaxSlices + (r.num_blocks % kMaxSlices != 0);
    if (blocks < least) {
        KVX_LOG(info, "verbs: verbs.mr_slice_bytes=%llu would cut the region into more than %zu slices: slices of %llu "
                "blocks (%llu bytes)", (unsigned long long)want, kMaxSlices, (unsigned long long)least,
                (unsigned long long)(least * r.block_len));
        blocks = least;
    }
    return blocks >= r.num_blocks ? r.size() : blocks * r.block_len;
}

// librdmacm's context of the named device (the one its cm_ids use), or nullptr.
ibv_context *cm_context(const std::string &device) {
    int n = 0;
    ibv_context *found = nullptr;
    ibv_context **list = rdma_get_devices(&n);
    for (int i = 0; list && i < n; i++)
        if (device == ibv_get_device_name(list[i]->device)) found = list[i];
    if (list) rdma_free_devices(list);
    return found;
}

}  // namespace

// Every rail that can serve does; one that cannot (its address taken, its
// registration refused) is left out with a warning, unless none is left.
bool VerbsBackend::init(std::string *why) {
    const Options &o = *ctx_.options;
    ListenPlan lp;
    lp.slice = slice_of(o, ctx_.region);
    if (!plan_listen(o, selection(o), &lp, why)) return false;
    listen_ch_ = rdma_create_event_channel();
    if (!listen_ch_) {
        *why = strfmt("rdma_cm unavailable (/dev/infiniband/rdma_cm): %s", strerror(errno));
        return false;
    }
    std::string first_why;
    if (lp.explicit_host) {
        if (!add_rail(lp, nullptr, why)) return false;
    } else {
        for (const Placement &pl : lp.pls) {
            std::string w;
            if (add_rail(lp, &pl, &w)) continue;
            KVX_LOG(warn, "verbs: rail %s:%u not served: %s", pl.device.c_str(), pl.port, w.c_str());
            if (first_why.empty()) first_why = w;
        }
        if (rails_.empty()) {
            *why = first_why;
            return false;
        }
    }
    std::vector<std::shared_ptr<Device>> devs;
    for (const RailListener &r : rails_) devs.push_back(r.dev);
    peer_cfg_ = peer_config(devs, o);
    start_listening();
    return true;
}

// One rail: its listener bound (the first rail's port again where it is
// free, so that every rail of a transport listens on one port), its device
// opened and the region registered there.
bool VerbsBackend::add_rail(const ListenPlan &lp, const Placement *pl, std::string *why) {
    RailListener r;
    if (rdma_create_id(listen_ch_, &r.id, this, RDMA_PS_TCP) != 0) {
        *why = strfmt("rdma_create_id: %s", strerror(errno));
        return false;
    }
    CmId guard(r.id);
    sockaddr_storage at = pl ? pl->addr : lp.bind;
    uint16_t port = lp.port;
    if (pl && !rails_.empty() && !port) port = rails_.front().advertised.port;
    set_port(at, port);
    if (!bind_listener(r.id, at, why)) {
        if (lp.port || !pl || rails_.empty() || errno != EADDRINUSE) return false;
        set_port(at, 0);  // the first rail's port is taken here: any port
        if (!bind_listener(r.id, at, why)) return false;
    }
    r.dev = open_device(lp, pl, r.id, why);
    if (!r.dev) return false;
    choose_addresses(pl, r.id, *r.dev, &r.advertised);
    r.dev->index = rails_.size();
    r.dev->label = strfmt("%s:%u", r.dev->name.c_str(), r.dev->port);
    if (!r.dev->register_region(ctx_.region, lp.slice, why)) return false;
    guard.release();
    rails_.push_back(std::move(r));
    return true;
}

bool VerbsBackend::bind_listener(rdma_cm_id *id, const sockaddr_storage &at, std::string *why) {
    sockaddr_storage ss = at;
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&ss)) == 0) return true;
    int e = errno;
    std::string s = net::to_endpoint(at).str();
    if (e == EADDRINUSE && rails_.empty() && get_port(at) != 0)
        fail(KVX_EBACKEND, "verbs: cannot listen on %s: %s", s.c_str(), strerror(e));
    *why = strfmt("rdma_cm cannot bind %s: %s", s.c_str(), strerror(e));
    errno = e;
    return false;
}

// The device the listener is bound to; for a wildcard, the discovered one,
// so that outgoing connections and the MR share one PD.
std::shared_ptr<Device> VerbsBackend::open_device(const ListenPlan &lp, const Placement *pl, rdma_cm_id *id,
                                                  std::string *why) {
    ibv_context *c = id->verbs;
    uint8_t port = id->port_num;
    if (!c && lp.explicit_host) {
        *why = strfmt("verbs.listen %s is not an address of an RDMA device", lp.option.c_str());
        return nullptr;
    }
    if (!c || pl) {
        c = cm_context(pl->device);
        port = pl->port;
        if (!c) {
            *why = strfmt("rdma_cm does not know device %s", pl->device.c_str());
            return nullptr;
        }
    }
    const char *name = ibv_get_device_name(c->device);
    const Selection sel = selection(*ctx_.options);
    if (lp.explicit_host && sel.one) {
        const std::string dev = sel.devices.empty() ? "" : sel.devices.front().first;
        const int p = sel.devices.empty() ? sel.port : sel.devices.front().second;
        if (!dev.empty() && dev != name) {
            *why = strfmt("verbs.listen %s is on device %s, not verbs.device %s", lp.option.c_str(), name, dev.c_str());
            return nullptr;
        }
        if (p && p != port) {
            *why = strfmt("verbs.listen %s is on port %u of %s, not verbs.port %d", lp.option.c_str(), port, name, p);
            return nullptr;
        }
    }
    auto dev = std::make_shared<Device>();
    if (!dev->open(c, port, why)) return nullptr;
    return dev;
}

// Advertise the bound port at the device's address (a wildcard bind says
// nothing peers could use); connect out from the device's address.
void VerbsBackend::choose_addresses(const Placement *pl, rdma_cm_id *id, Device &dev, net::Endpoint *advertised) {
    sockaddr *local = rdma_get_local_addr(id);
    sockaddr_storage bound{};
    memcpy(&bound, local, local->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    *advertised = net::to_endpoint(bound);
    dev.addr = pl ? pl->addr : bound;
    dev.prefix = pl ? pl->prefix : prefix_of(bound);
    if (pl) {
        net::Endpoint e = net::to_endpoint(pl->addr);
        e.port = advertised->port;
        *advertised = e;
    }
    set_port(dev.addr, 0);
}

void VerbsBackend::start_listening() {
    set_probe_timing();
    for (RailListener &r : rails_) {
        r.probe_ch = ibv_create_comp_channel(r.dev->ctx);
        if (!r.probe_ch) fail(KVX_EBACKEND, "verbs: ibv_create_comp_channel: %s", strerror(errno));
        net::set_nonblocking(r.probe_ch->fd, "probe completion channel");
        if (rdma_listen(r.id, kListenBacklog) != 0)
            fail(KVX_EBACKEND, "verbs: rdma_listen on %s: %s", r.advertised.str().c_str(), strerror(errno));
    }
    net::set_nonblocking(listen_ch_->fd, "rdma_cm listener channel");
    // The initiator needs two CM round trips within its connect timeout; ours bounds the wait.
    connect_timeout_ = std::chrono::milliseconds(ctx_.options->uint("connect_timeout_ms"));
    responder_ = std::make_unique<handshake::Responder>(ctx_.identity, kDataPath, "verbs", connect_timeout_,
                                                        kMaxAuthPerEpoch);
    loop_ = ctx_.loop;
    listen_tok_ = loop_->attach(listen_ch_->fd, EPOLLIN, this, kTagListener);
    bool ok = listen_tok_ != 0;
    for (size_t i = 0; i < rails_.size(); i++) {
        rails_[i].probe_tok = loop_->attach(rails_[i].probe_ch->fd, EPOLLIN, this, kTagProbes0 + static_cast<int>(i));
        ok &= rails_[i].probe_tok != 0;
    }
    if (!ok) fail(KVX_EBACKEND, "verbs: cannot watch the rdma_cm listener");
    watch_ports();
    for (const RailListener &r : rails_)
        KVX_LOG(info,
                "verbs: listening on %s (rail %s, region %llu bytes in %zu MR(s), rkey 0x%x, %u QP(s)/peer, SQ %u, "
                "signal every %u)",
                r.advertised.str().c_str(), r.dev->label.c_str(), (unsigned long long)ctx_.region.size(),
                r.dev->mrs.size(), r.dev->mrs.front()->rkey, peer_cfg_.qps, peer_cfg_.sq_depth, peer_cfg_.signal_every);
}

std::unique_ptr<BackendPeer> VerbsBackend::connect(const PeerContext &pc) {
    std::vector<std::shared_ptr<Device>> all;
    bool any_up = false;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (closed_) fail(KVX_ECLOSED, "peer '%s': the verbs backend is shut down", pc.peer_id.c_str());
        for (const RailListener &r : rails_) {
            // Every rail is paired; one whose port is not ACTIVE now starts
            // down and joins once it can (verbs_rejoin.cpp).
            all.push_back(r.dev);
            any_up |= !r.dev->port_down();
        }
    }
    if (!any_up)
        fail(KVX_EHOSTUNREACH, "peer '%s': every RDMA port of ours is down", pc.peer_id.c_str());
    std::unique_ptr<VerbsPeer> p = VerbsPeer::dial(ctx_, all, loop_, peer_cfg_, pc, peers_);
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_ || !p->start()) {
        p->shutdown();
        fail(KVX_ECLOSED, "peer '%s': the verbs backend was shut down while connecting", pc.peer_id.c_str());
    }
    return p;
}

// Refused ids go in batches, after their rejects are on their way: the
// kernel's destroy waits for the reject to be sent, so destroying each one
// at once would make every request wait for the sends of all before it.
void VerbsBackend::on_event(int tag, uint32_t events) {
    if (tag >= kTagAsync0) return on_async_events(static_cast<size_t>(tag - kTagAsync0));
    if (tag >= kTagProbes0) {
        RailListener &r = rails_[static_cast<size_t>(tag - kTagProbes0)];
        if (events & (EPOLLERR | EPOLLHUP)) {
            // The device went away (disassociated): the channel stays in
            // error and would wake the loop for ever. The probes stop.
            KVX_LOG(warn, "verbs: the probe completion channel of rail %s failed (device removed?): probes stop",
                    r.dev->label.c_str());
            loop_->detach(r.probe_tok);
            r.probe_tok = 0;
            return;
        }
        return on_probe_events(static_cast<size_t>(tag - kTagProbes0));
    }
    CmEvent ev;
    std::vector<rdma_cm_id *> done;
    bool more = true;
    int err = 0;
    while (more) {
        more = next_cm_event(listen_ch_, &ev);
        if (!more) err = errno;
        if (more && on_cm_event(ev)) done.push_back(ev.id);
        if (!more || done.size() >= kDestroyBatch) {
            for (rdma_cm_id *id : done) destroy_cm_id(id);
            done.clear();
        }
    }
    if (err != EAGAIN && err != EINTR) KVX_LOG(error, "verbs: rdma_get_cm_event: %s", strerror(err));
}

bool VerbsBackend::on_cm_event(const CmEvent &ev) {
    switch (ev.type) {
    case RDMA_CM_EVENT_CONNECT_REQUEST: return on_request(ev);
    case RDMA_CM_EVENT_ESTABLISHED:
        if (auto it = conns_.find(ev.id); it != conns_.end() && !it->second->established) {
            Conn &c = *it->second;
            c.established = true;
            c.timer = loop_->add_timer(Clock::now() + probe_every_, &c, 0);
        }
        KVX_LOG(debug, "verbs: inbound connection established (qp %u)", ev.id->qp ? ev.id->qp->qp_num : 0);
        return false;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
        if (!conns_.count(ev.id)) return false;
        KVX_LOG(debug, "verbs: inbound connection closed (%s)", rdma_event_str(ev.type));
        close_conn(ev.id);
        return false;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        KVX_LOG(error, "verbs: device %s removed: peers can no longer write here through it",
                ev.id->verbs ? ibv_get_device_name(ev.id->verbs->device) : "?");
        if (conns_.count(ev.id)) close_conn(ev.id);
        return false;
    default:  // TIMEWAIT_EXIT, ADDR_CHANGE: nothing to do
        KVX_LOG(debug, "verbs: listener event %s", rdma_event_str(ev.type));
        return false;
    }
}

// A CHALLENGE or a REFUSE travels in a reject.
void VerbsBackend::reject(rdma_cm_id *id, const handshake::Step &st) {
    if (rdma_reject(id, st.reply.data(), static_cast<uint8_t>(st.reply_len)) != 0)
        KVX_LOG(debug, "verbs: rdma_reject: %s", strerror(errno));
}

// "rdma_cm 192.0.2.7:41234": where a connect request comes from, for the log.
static std::string source_of(rdma_cm_id *id) {
    const sockaddr *sa = rdma_get_peer_addr(id);
    if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) return "rdma_cm ?";
    sockaddr_storage ss{};
    memcpy(&ss, sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    return "rdma_cm " + net::to_endpoint(ss).str();
}

// A connect request: the engine answers a HELLO with a challenge (in a
// reject) and an AUTH against a live challenge with an ACCEPT, which gets a
// QP here. Nothing is allocated for a request before its AUTH verifies:
// every other one is rejected at once. Returns true when the request's id
// must be destroyed (refused).
bool VerbsBackend::on_request(const CmEvent &ev) {
    const std::string from = source_of(ev.id);
    const handshake::Step st = responder_->on_request(ev.pdata.data(), ev.pdata.size(), from.c_str());
    if (st.outcome == handshake::Step::Outcome::accepted) return !accept(ev.id, st, from.c_str());
    reject(ev.id, st);
    return true;
}

// Authenticated: only now does a QP exist that can reach the region.
bool VerbsBackend::accept(rdma_cm_id *id, const handshake::Step &accepted, const char *from) {
    size_t r = 0;
    // Both ports of a device share its context: the port tells them apart.
    while (r < rails_.size() && (rails_[r].dev->ctx != id->verbs || rails_[r].dev->port != id->port_num)) r++;
    if (r == rails_.size()) {  // a request on a device we registered nothing on
        reject(id, responder_->decline(KVX_ECONNREFUSED,
                                       strfmt("a connection arriving on device %s (not one of our rails)",
                                              id->verbs ? ibv_get_device_name(id->verbs->device) : "?"),
                                       from));
        return false;
    }
    const RailListener &rail = rails_[r];
    auto c = std::make_unique<Conn>(*this, id);
    c->rail = r;
    // Room for the one probe in flight and a flush of the receive queue.
    c->cq = ibv_create_cq(rail.dev->ctx, 2, id, rail.probe_ch, 0);
    ibv_qp_init_attr qa = rc_qp_attr(c->cq, 1, 1);
    if (!c->cq || ibv_req_notify_cq(c->cq, 0) != 0 || rdma_create_qp(id, rail.dev->pd, &qa) != 0) {
        const std::string why = strfmt("no CQ or QP for it: %s", strerror(errno));
        KVX_LOG(error, "verbs: an authenticated connection from %s: %s", from, why.c_str());
        if (c->cq) ibv_destroy_cq(c->cq);
        reject(id, responder_->decline(KVX_ECONNREFUSED, why, from));
        return false;
    }
    // Probes retry within about half transfer_timeout_ms (set_probe_timing).
    uint8_t t = ack_timeout_;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t) != 0)
        KVX_LOG(debug, "verbs: rdma_set_option(ACK_TIMEOUT): %s; rdma_cm's timeout stays", strerror(errno));
    rdma_conn_param cp = conn_param(accepted.reply.data(), accepted.reply_len);
    if (rdma_accept(id, &cp) != 0) {
        KVX_LOG(warn, "verbs: rdma_accept: %s", strerror(errno));
        rdma_destroy_qp(id);  // before its CQ; the caller destroys the id
        id->qp = nullptr;
        ibv_destroy_cq(c->cq);
        return false;
    }
    // Established within twice the connect timeout (the initiator's whole
    // budget, and then some), or the sweep tears it down.
    c->deadline = Clock::now() + 2 * connect_timeout_;
    conns_[id] = std::move(c);
    arm_sweep();
    KVX_LOG(info, "verbs: accepted an authenticated connection from %s on rail %s (qp %u)", from,
            rail.dev->label.c_str(), id->qp->qp_num);
    return true;
}

void VerbsBackend::arm_sweep() {
    if (!sweep_tok_) sweep_tok_ = loop_->add_timer(Clock::now() + connect_timeout_, this, kTagSweep);
}

// Accepted, never established (no RTU, no first packet): a half-open
// connection holding a QP. It goes; the initiator gave up long ago.
void VerbsBackend::on_timer(int) {
    sweep_tok_ = 0;
    on_event(0, 0);  // an ESTABLISHED already queued counts
    const auto now = Clock::now();
    bool pending = false;
    std::vector<rdma_cm_id *> stale;
    for (auto &[id, c] : conns_) {
        if (c->established || c->deadline > now) {
            pending |= !c->established;
            continue;
        }
        KVX_LOG(warn, "verbs: an accepted connection (qp %u) never became established: closed",
                id->qp ? id->qp->qp_num : 0);
        stale.push_back(id);
    }
    for (rdma_cm_id *id : stale) close_conn(id);
    if (pending) arm_sweep();
}


void VerbsBackend::shutdown() {
    std::call_once(shutdown_once_, [this] {
        {
            std::lock_guard<std::mutex> lk(mu_);
            closed_ = true;
        }
        // On the loop thread (inline once it is stopped), between two rounds
        // of events and timers: no probe or sweep is running, and once this
        // returns the loop never calls us again; the passive ids are ours alone.
        if (loop_) loop_->call([this] {
            loop_->detach(listen_tok_);
            loop_->cancel_timer(sweep_tok_);
            listen_tok_ = sweep_tok_ = 0;
            for (RailListener &r : rails_) {
                loop_->detach(r.probe_tok);
                r.probe_tok = 0;
            }
            for (Watch &w : watches_) {
                loop_->detach(w.tok);
                w.tok = 0;
            }
            while (!conns_.empty()) close_conn(conns_.begin()->first);
        });
        for (Watch &w : watches_)
            if (w.ctx) ibv_close_device(w.ctx);
        watches_.clear();
        for (RailListener &r : rails_) {
            destroy_cm_id(r.id);
            r.id = nullptr;
            // Any events still queued for destroyed ids were dropped with them.
            if (r.dev) r.dev->deregister();  // from here on no byte can land in the region through it
            if (r.probe_ch) ibv_destroy_comp_channel(r.probe_ch);
            r.probe_ch = nullptr;
        }
        if (listen_ch_) rdma_destroy_event_channel(listen_ch_);
        listen_ch_ = nullptr;
        KVX_LOG(info, "verbs: backend shut down");
    });
}

}  // namespace kvx::verbs
