// The verbs target's listener: where it listens, the connect requests it
// hands to the handshake engine, the connections it accepts, and shutdown.
#include <arpa/inet.h>
#include <netinet/in.h>

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


// verbs.listen when it names a host; otherwise the first ACTIVE port's
// address (with verbs.listen's port, if any). The host without an RDMA stack
// ends here, false with *why.
bool plan_listen(const Options &o, const Selection &sel, ListenPlan *lp, std::string *why) {
    lp->option = o.str("verbs.listen");
    if (!lp->option.empty()) {
        lp->bind = net::parse_hostport(lp->option, "option verbs.listen", true);
        lp->explicit_host = !is_wildcard(lp->bind);
    }
    if (lp->explicit_host) return true;
    if (!find_placement(sel, &lp->pl, why)) return false;
    uint16_t port = lp->option.empty() ? 0 : get_port(lp->bind);
    if (lp->option.empty()) lp->bind = lp->pl.addr;
    set_port(lp->bind, port);
    KVX_LOG(info, "verbs: using %s", lp->pl.how.c_str());
    return true;
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

bool VerbsBackend::init(std::string *why) {
    const Options &o = *ctx_.options;
    const Selection sel = selection(o);
    ListenPlan lp;
    if (!plan_listen(o, sel, &lp, why) || !bind_listener(lp, why) || !open_device(lp, sel, why)) return false;
    choose_addresses(lp);
    if (!dev_->register_region(ctx_.region, why)) return false;
    rkey_ = dev_->mr->rkey;
    peer_cfg_ = peer_config(*dev_, o);
    start_listening();
    return true;
}

bool VerbsBackend::bind_listener(const ListenPlan &lp, std::string *why) {
    listen_ch_ = rdma_create_event_channel();
    if (!listen_ch_) {
        *why = strfmt("rdma_cm unavailable (/dev/infiniband/rdma_cm): %s", strerror(errno));
        return false;
    }
    if (rdma_create_id(listen_ch_, &listen_id_, this, RDMA_PS_TCP) != 0) {
        *why = strfmt("rdma_create_id: %s", strerror(errno));
        return false;
    }
    sockaddr_storage ss = lp.bind;
    if (rdma_bind_addr(listen_id_, reinterpret_cast<sockaddr *>(&ss)) != 0) {
        int e = errno;
        std::string s = net::to_endpoint(lp.bind).str();
        if (e == EADDRINUSE) fail(KVX_EBACKEND, "verbs: cannot listen on %s: %s", s.c_str(), strerror(e));
        *why = strfmt("rdma_cm cannot bind %s: %s", s.c_str(), strerror(e));
        return false;
    }
    return true;
}

// The device the listener is bound to; for a wildcard, the discovered one,
// so that outgoing connections and the MR share one PD.
bool VerbsBackend::open_device(const ListenPlan &lp, const Selection &sel, std::string *why) {
    ibv_context *c = listen_id_->verbs;
    uint8_t port = listen_id_->port_num;
    if (!c && lp.explicit_host) {
        *why = strfmt("verbs.listen %s is not an address of an RDMA device", lp.option.c_str());
        return false;
    }
    if (!c) {
        c = cm_context(lp.pl.device);
        port = lp.pl.port;
        if (!c) {
            *why = strfmt("rdma_cm does not know device %s", lp.pl.device.c_str());
            return false;
        }
    }
    const char *name = ibv_get_device_name(c->device);
    if (!sel.device.empty() && sel.device != name) {
        *why = strfmt("verbs.listen %s is on device %s, not verbs.device %s", lp.option.c_str(), name,
                      sel.device.c_str());
        return false;
    }
    if (sel.port && sel.port != port) {
        *why = strfmt("verbs.listen %s is on port %u of %s, not verbs.port %d", lp.option.c_str(), port, name,
                      sel.port);
        return false;
    }
    dev_ = std::make_shared<Device>();
    return dev_->open(c, port, why);
}

// Advertise the bound port at the device's address (a wildcard bind says
// nothing peers could use); connect out from the device's address.
void VerbsBackend::choose_addresses(const ListenPlan &lp) {
    sockaddr *local = rdma_get_local_addr(listen_id_);
    sockaddr_storage bound{};
    memcpy(&bound, local, local->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    advertised_ = net::to_endpoint(bound);
    dev_->addr = lp.explicit_host ? bound : lp.pl.addr;
    if (!lp.explicit_host) {
        net::Endpoint e = net::to_endpoint(lp.pl.addr);
        e.port = advertised_.port;
        advertised_ = e;
    }
    set_port(dev_->addr, 0);
}

void VerbsBackend::start_listening() {
    probe_ch_ = ibv_create_comp_channel(dev_->ctx);
    if (!probe_ch_) fail(KVX_EBACKEND, "verbs: ibv_create_comp_channel: %s", strerror(errno));
    net::set_nonblocking(probe_ch_->fd, "probe completion channel");
    set_probe_timing();
    if (rdma_listen(listen_id_, kListenBacklog) != 0)
        fail(KVX_EBACKEND, "verbs: rdma_listen on %s: %s", advertised_.str().c_str(), strerror(errno));
    net::set_nonblocking(listen_ch_->fd, "rdma_cm listener channel");
    // The initiator needs two CM round trips within its connect timeout; ours bounds the wait.
    connect_timeout_ = std::chrono::milliseconds(ctx_.options->uint("connect_timeout_ms"));
    responder_ = std::make_unique<handshake::Responder>(ctx_.identity, kDataPath, "verbs", connect_timeout_,
                                                        kMaxAuthPerEpoch);
    loop_ = ctx_.loop;
    listen_tok_ = loop_->attach(listen_ch_->fd, EPOLLIN, this, kTagListener);
    probe_tok_ = loop_->attach(probe_ch_->fd, EPOLLIN, this, kTagProbes);
    if (!listen_tok_ || !probe_tok_) fail(KVX_EBACKEND, "verbs: cannot watch the rdma_cm listener");
    KVX_LOG(info, "verbs: listening on %s (device %s port %u, MR %llu bytes rkey 0x%x, %u QP(s)/peer, SQ %u, signal every %u)",
            advertised_.str().c_str(), dev_->name.c_str(), dev_->port, (unsigned long long)ctx_.region.size(), rkey_,
            peer_cfg_.qps, peer_cfg_.sq_depth, peer_cfg_.signal_every);
}

std::unique_ptr<BackendPeer> VerbsBackend::connect(const PeerContext &pc) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (closed_) fail(KVX_ECLOSED, "peer '%s': the verbs backend is shut down", pc.peer_id.c_str());
    }
    std::unique_ptr<VerbsPeer> p = VerbsPeer::dial(ctx_, dev_, loop_, peer_cfg_, pc);
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
    if (tag == kTagProbes) {
        if (events & (EPOLLERR | EPOLLHUP)) {
            // The device went away (disassociated): the channel stays in
            // error and would wake the loop for ever. The probes stop.
            KVX_LOG(warn, "verbs: the probe completion channel failed (device %s removed?): probes stop",
                    dev_->name.c_str());
            loop_->detach(probe_tok_);
            probe_tok_ = 0;
            return;
        }
        return on_probe_events();
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
        KVX_LOG(error, "verbs: device %s removed: peers can no longer write here", dev_->name.c_str());
        if (ev.id != listen_id_ && conns_.count(ev.id)) close_conn(ev.id);
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
    if (id->verbs != dev_->ctx) {  // wildcard listener, request on another device: no MR there
        reject(id, responder_->decline(KVX_ECONNREFUSED,
                                       strfmt("a connection arriving on device %s (the region is registered on %s)",
                                              id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
                                              dev_->name.c_str()),
                                       from));
        return false;
    }
    auto c = std::make_unique<Conn>(*this, id);
    // Room for the one probe in flight and a flush of the receive queue.
    c->cq = ibv_create_cq(dev_->ctx, 2, id, probe_ch_, 0);
    ibv_qp_init_attr qa = rc_qp_attr(c->cq, 1, 1);
    if (!c->cq || ibv_req_notify_cq(c->cq, 0) != 0 || rdma_create_qp(id, dev_->pd, &qa) != 0) {
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
    KVX_LOG(info, "verbs: accepted an authenticated connection (qp %u)", id->qp->qp_num);
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
            loop_->detach(probe_tok_);
            loop_->cancel_timer(sweep_tok_);
            listen_tok_ = probe_tok_ = sweep_tok_ = 0;
            while (!conns_.empty()) close_conn(conns_.begin()->first);
        });
        destroy_cm_id(listen_id_);
        listen_id_ = nullptr;
        // Any events still queued for destroyed ids were dropped with them.
        if (dev_) dev_->deregister();  // from here on no byte can land in the region
        if (probe_ch_) ibv_destroy_comp_channel(probe_ch_);
        probe_ch_ = nullptr;
        if (listen_ch_) rdma_destroy_event_channel(listen_ch_);
        listen_ch_ = nullptr;
        KVX_LOG(info, "verbs: backend shut down");
    });
}

}  // namespace kvx::verbs
