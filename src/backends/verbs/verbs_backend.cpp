// Target side of the verbs backend: the rdma_cm listener, the target's half
// of the handshake (handshake/) carried in connect/reject private data, and
// the passive QPs through which peers write into our region. All of it runs
// on the transport's event loop; the application never calls anything for
// data to land. At the end: the registry entry (options, probe, factory,
// metadata section).
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "registry/registry.h"
#include "backends/verbs/verbs.h"
#include "handshake/handshake.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx {

namespace verbs {

namespace {

// Authentications per challenge epoch (connect_timeout_ms); past this, peers
// are challenged again until the next epoch.
constexpr size_t kMaxAuthPerEpoch = 1 << 16;
// Connect requests rdma_cm queues for us before it turns new ones away
// (ucma clamps it to net.rdma_ucm.max_backlog, 1024 by default).
constexpr int kListenBacklog = 1024;
constexpr size_t kDestroyBatch = 64;  // refused ids destroyed together (see on_event)
enum { kTagListener = 0, kTagSweep = 1, kTagProbes = 2 };
constexpr uint64_t kProbeWrId = 1;
constexpr int kProbeTries = 7;  // transmissions of a probe: retry_count 6 (conn_param) + 1

constexpr uint16_t kSectionId = 3;
constexpr uint8_t kSectionVersion = 0;
constexpr size_t kSectionLen = wire::kEndpointLen + 24;

constexpr OptionSpec kOptions[] = {
    {"verbs.device", OptType::string, 0, 64, "", "RDMA device name (e.g. mlx5_0); default: the first with an ACTIVE port"},
    {"verbs.port", OptType::uint, 1, 255, "", "port number on that device; default: the first ACTIVE port"},
    {"verbs.gid_index", OptType::uint, 0, 65535, "",
     "take the listen address from this GID (RoCE); default: rdma_cm's choice, logged"},
    {"verbs.listen", OptType::hostport, 0, 0, "",
     "IP:PORT for rdma_cm to listen on (an address of the RDMA device; PORT 0 = any); default: the chosen port's IPv4 address"},
    {"verbs.qps_per_peer", OptType::uint, 1, 16, "1", "RC queue pairs per peer; transfers of 512 KiB or more are split over them"},
    {"verbs.post_batch_bytes", OptType::uint, 0, 1ull << 30, "0",
     "when not 0: while this many bytes stay in flight on a QP behind its next completion, new transfers wait for it and "
     "are posted together, one doorbell and one signalled WR for all (0: post each at once)"},
};

Selection selection(const Options &o) {
    Selection sel;
    sel.device = o.str("verbs.device");
    sel.port = o.is_set("verbs.port") ? static_cast<int>(o.uint("verbs.port")) : 0;
    sel.gid_index = o.is_set("verbs.gid_index") ? static_cast<int>(o.uint("verbs.gid_index")) : -1;
    return sel;
}

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

// Where to listen and what to advertise.
struct ListenPlan {
    std::string option;           // verbs.listen as given, "" when unset
    sockaddr_storage bind{};      // what rdma_bind_addr gets
    bool explicit_host = false;   // verbs.listen names one address
    Placement pl;                 // the discovered port, unless explicit_host
};

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

class VerbsBackend final : public Backend, private EventLoop::Source {
public:
    VerbsBackend(const BackendContext &ctx) : ctx_(ctx) {}
    ~VerbsBackend() override { shutdown(); }

    // false with *why when no usable device; throws for configuration errors.
    bool init(std::string *why);

    const char *name() const override { return "verbs"; }
    wire::Section describe() const override {
        SectionInfo v;
        v.cm = advertised_;
        v.mr_addr = reinterpret_cast<uintptr_t>(dev_->region.base);
        v.mr_len = dev_->region.size();
        v.rkey = rkey_;
        return encode_section(v);
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override;
    void shutdown() override;

private:
    // init, step by step
    bool bind_listener(const ListenPlan &lp, std::string *why);
    bool open_device(const ListenPlan &lp, const Selection &sel, std::string *why);
    void choose_addresses(const ListenPlan &lp);
    void start_listening();
    // the listener's events (loop thread)
    void on_event(int tag, uint32_t events) override;
    // Returns true when the event's id must be destroyed.
    bool on_cm_event(const CmEvent &ev);
    bool on_request(const CmEvent &ev);
    bool on_auth(rdma_cm_id *id, const handshake::Auth &a);
    bool accept(rdma_cm_id *id, const handshake::Accept &acc);
    void refuse(rdma_cm_id *id, int status);
    void challenge(rdma_cm_id *id);
    void note_refusal(const char *why);
    // accepted connections that never became established
    void on_timer(int tag) override;
    void arm_sweep();
    // liveness of established connections (verbs.h, kProbeRecvs)
    struct Conn;
    void probe(Conn &c);
    void on_probe_events();
    void set_probe_timing();
    void close_conn(rdma_cm_id *id);

    BackendContext ctx_;
    std::shared_ptr<Device> dev_;
    EventLoop *loop_ = nullptr;
    PeerConfig peer_cfg_;
    rdma_event_channel *listen_ch_ = nullptr;
    rdma_cm_id *listen_id_ = nullptr;
    // The completion channel of every passive QP's CQ: only probes complete
    // there (RDMA WRITEs complete nothing at the target).
    ibv_comp_channel *probe_ch_ = nullptr;
    uint64_t listen_tok_ = 0, probe_tok_ = 0;
    net::Endpoint advertised_;
    uint32_t rkey_ = 0;

    // An accepted connection: its QP's own CQ (one probe in flight at most)
    // and its probe timer. Loop thread only (or after the listener is detached).
    struct Conn final : EventLoop::Source {
        Conn(VerbsBackend &b, rdma_cm_id *i) : backend(b), id(i) {}
        void on_event(int, uint32_t) override {}
        void on_timer(int) override {
            timer = 0;
            backend.probe(*this);
        }
        VerbsBackend &backend;
        rdma_cm_id *id;
        ibv_cq *cq = nullptr;
        bool established = false;
        Clock::time_point deadline;  // to be established by then, or it goes
        uint64_t timer = 0;          // the next probe
        bool probing = false;        // a probe is in flight
    };
    std::unordered_map<rdma_cm_id *, std::unique_ptr<Conn>> conns_;  // accepted ids
    std::chrono::milliseconds probe_every_{0};
    uint8_t ack_timeout_ = 0;  // of the passive QPs: 4.096 us << this per try
    uint64_t probes_failed_ = 0;  // probes that could not be posted
    std::unique_ptr<handshake::ChallengeCookies> challenges_;
    std::chrono::milliseconds connect_timeout_{0};
    uint64_t sweep_tok_ = 0;
    uint64_t refused_ = 0;  // unauthenticated requests refused since the last log line
    Clock::time_point next_refusal_log_{};

    std::mutex mu_;  // guards closed_
    bool closed_ = false;
    std::once_flag shutdown_once_;
};

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
    challenges_ = std::make_unique<handshake::ChallengeCookies>(connect_timeout_, kMaxAuthPerEpoch);
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

void VerbsBackend::refuse(rdma_cm_id *id, int status) {
    handshake::Bytes b;
    size_t n = handshake::encode(handshake::Refuse{status}, b.data());
    if (rdma_reject(id, b.data(), static_cast<uint8_t>(n)) != 0) KVX_LOG(debug, "verbs: rdma_reject: %s", strerror(errno));
}

void VerbsBackend::challenge(rdma_cm_id *id) {
    handshake::Bytes b;
    size_t n = handshake::encode(challenges_->issue(), b.data());
    if (rdma_reject(id, b.data(), static_cast<uint8_t>(n)) != 0)
        KVX_LOG(debug, "verbs: rdma_reject (challenge): %s", strerror(errno));
}

// Refusals of unauthenticated requests cost no log line each: one a second
// at most, with the count (a flood must not become a flood of the log).
void VerbsBackend::note_refusal(const char *why) {
    refused_++;
    const auto now = Clock::now();
    if (now < next_refusal_log_) return;
    KVX_LOG(warn, "verbs: refused %llu unauthenticated connect request(s); latest: %s",
            (unsigned long long)refused_, why);
    refused_ = 0;
    next_refusal_log_ = now + std::chrono::seconds(1);
}

// A connect request: HELLO gets a challenge (in a reject); AUTH against a
// live challenge gets a QP and an ACCEPT. Nothing is allocated for a request
// before its AUTH verifies: every other one is rejected at once. Returns true
// when the request's id must be destroyed (refused).
bool VerbsBackend::on_request(const CmEvent &ev) {
    rdma_cm_id *id = ev.id;
    handshake::Message m;
    try {
        m = handshake::decode(ev.pdata.data(), ev.pdata.size());
    } catch (const Error &e) {
        note_refusal(e.what());
        refuse(id, handshake::failure_code(e.code()));
        return true;
    }
    if (m.kind == handshake::Kind::hello) {
        if (m.hello.instance_id == ctx_.identity.instance_id) {
            challenge(id);
        } else {
            note_refusal("a HELLO meant for another transport");
            refuse(id, KVX_ECONNREFUSED);
        }
        return true;
    }
    if (m.kind != handshake::Kind::auth) {
        note_refusal("a handshake message that is neither HELLO nor AUTH");
        refuse(id, KVX_EAUTH);
        return true;
    }
    return on_auth(id, m.auth);
}

bool VerbsBackend::on_auth(rdma_cm_id *id, const handshake::Auth &a) {
    if (a.instance_id != ctx_.identity.instance_id) {
        note_refusal("an AUTH meant for another transport");
        refuse(id, KVX_EAUTH);
        return true;
    }
    handshake::Challenge ch;
    if (!challenges_->find(a.challenge_id, &ch)) {
        // Expired, used or never ours: a fresh challenge lets an honest initiator retry.
        KVX_LOG(debug, "verbs: AUTH with an unknown, expired or used challenge, challenging again");
        challenge(id);
        return true;
    }
    handshake::Accept acc;
    if (int st = handshake::verify(ctx_.identity, ch, a, &acc, "an rdma_cm connect request")) {
        refuse(id, st);
        return true;
    }
    if (!challenges_->use(a.challenge_id)) {
        challenge(id);
        return true;
    }
    return !accept(id, acc);
}

// Authenticated: only now does a QP exist that can reach the region.
bool VerbsBackend::accept(rdma_cm_id *id, const handshake::Accept &acc) {
    if (id->verbs != dev_->ctx) {  // wildcard listener, request on another device: no MR there
        KVX_LOG(warn, "verbs: refused a connection arriving on device %s (the region is registered on %s)",
                id->verbs ? ibv_get_device_name(id->verbs->device) : "?", dev_->name.c_str());
        refuse(id, KVX_ECONNREFUSED);
        return false;
    }
    auto c = std::make_unique<Conn>(*this, id);
    // Room for the one probe in flight and a flush of the receive queue.
    c->cq = ibv_create_cq(dev_->ctx, 2, id, probe_ch_, 0);
    ibv_qp_init_attr qa = rc_qp_attr(c->cq, 1, 1);
    if (!c->cq || ibv_req_notify_cq(c->cq, 0) != 0 || rdma_create_qp(id, dev_->pd, &qa) != 0) {
        KVX_LOG(error, "verbs: CQ or QP for an inbound connection: %s", strerror(errno));
        if (c->cq) ibv_destroy_cq(c->cq);
        refuse(id, KVX_ECONNREFUSED);
        return false;
    }
    // Probes retry within about half transfer_timeout_ms (set_probe_timing).
    uint8_t t = ack_timeout_;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t) != 0)
        KVX_LOG(debug, "verbs: rdma_set_option(ACK_TIMEOUT): %s; rdma_cm's timeout stays", strerror(errno));
    handshake::Bytes b;
    rdma_conn_param cp = conn_param(b.data(), handshake::encode(acc, b.data()));
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

// Each probe retries for about half transfer_timeout_ms (7 tries of the ACK
// timeout: retry_count 6), one is sent every half transfer_timeout_ms: an
// initiator whose NIC stops answering (its host vanished, no DREQ) loses its
// connection within about transfer_timeout_ms, and never in less than 7
// tries of 67 ms (a live initiator's NIC may miss an ACK for a while).
void VerbsBackend::set_probe_timing() {
    const uint64_t t_ms = ctx_.options->uint("transfer_timeout_ms");
    probe_every_ = std::chrono::milliseconds(std::max<uint64_t>(t_ms / 2, 50));
    const double per_try_us = static_cast<double>(probe_every_.count()) * 1000.0 / kProbeTries;
    uint8_t t = 14;  // 67 ms
    while (t < 20 && 4.096 * static_cast<double>(uint64_t{1} << (t + 1)) <= per_try_us) t++;
    ack_timeout_ = t;
}

// A zero-length SEND on an established connection, unless one is in flight.
void VerbsBackend::probe(Conn &c) {
    if (c.probing || !probe_tok_) return;  // no channel: nothing would hear the answer
    ibv_send_wr w{};
    w.wr_id = kProbeWrId;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr *bad = nullptr;
    if (int rc = ibv_post_send(c.id->qp, &w, &bad)) {
        // Not a sign of a dead peer. EACCES/EPERM: this process may not ring
        // the doorbell (rxe in a child forked after its parent opened the
        // device: the uverbs file carries the parent's credentials); its
        // connections are served without probes. Anything else: again at
        // the next period.
        if (rc != EACCES && rc != EPERM) {
            KVX_LOG(debug, "verbs: cannot probe an inbound connection (qp %u, ibv_post_send: %s); again later",
                    c.id->qp->qp_num, strerror(rc));
            c.timer = loop_->add_timer(Clock::now() + probe_every_, &c, 0);
        } else if (!probes_failed_++) {
            KVX_LOG(warn, "verbs: cannot send liveness probes (ibv_post_send: %s): connections of initiators that "
                    "vanish without a DREQ stay until the transport closes", strerror(rc));
        }
        return;
    }
    c.probing = true;
}

// Probe completions: a success re-arms the connection's timer; a failure
// (retries or RNR retries exhausted, the QP in error) closes it.
void VerbsBackend::on_probe_events() {
    ibv_cq *cq = nullptr;
    void *ctx = nullptr;
    std::vector<rdma_cm_id *> dead;
    while (ibv_get_cq_event(probe_ch_, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);  // at once: closing the connection destroys its CQ
        auto it = conns_.find(static_cast<rdma_cm_id *>(ctx));
        if (it == conns_.end() || it->second->cq != cq) continue;
        Conn &c = *it->second;
        if (ibv_req_notify_cq(cq, 0) != 0) {
            // Its next probe would complete unheard: the connection could
            // never be judged again. Closed, as a connection we cannot watch.
            KVX_LOG(warn, "verbs: ibv_req_notify_cq on an inbound connection (qp %u) failed: closed",
                    c.id->qp->qp_num);
            dead.push_back(c.id);
            continue;
        }
        ibv_wc wc[2];
        int n;
        while ((n = ibv_poll_cq(cq, 2, wc)) > 0) {
            for (int i = 0; i < n; i++) {
                if (wc[i].wr_id != kProbeWrId) continue;  // a flushed receive
                c.probing = false;
                if (wc[i].status == IBV_WC_SUCCESS) {
                    KVX_LOG(debug, "verbs: the initiator of qp %u answered a probe", wc[i].qp_num);
                    if (!c.timer) c.timer = loop_->add_timer(Clock::now() + probe_every_, &c, 0);
                    continue;
                }
                KVX_LOG(info, "verbs: an initiator stopped answering (qp %u: %s): its connection is closed",
                        wc[i].qp_num, ibv_wc_status_str(wc[i].status));
                dead.push_back(c.id);
            }
        }
    }
    for (rdma_cm_id *id : dead)
        if (conns_.count(id)) close_conn(id);
}

// The QP, its CQ, the id and the timer of an accepted connection (the
// initiator sees a DREQ, or nothing when it is gone).
void VerbsBackend::close_conn(rdma_cm_id *id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    std::unique_ptr<Conn> c = std::move(it->second);
    conns_.erase(it);
    loop_->cancel_timer(c->timer);
    if (c->established) rdma_disconnect(id);
    destroy_cm_id(id);  // the QP before its CQ
    if (c->cq) ibv_destroy_cq(c->cq);
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

}  // namespace

}  // namespace verbs

wire::Section verbs::encode_section(const SectionInfo &v) {
    Writer w;
    wire::put_endpoint(w, v.cm);
    w.u64(v.mr_addr);
    w.u64(v.mr_len);
    w.u32(v.rkey);
    w.u32(0);
    return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
}

verbs::SectionInfo verbs::decode_section(const wire::Section &s, const wire::AgentMetadata &m) {
    if (s.body.size() != kSectionLen && !(s.version > kSectionVersion && s.body.size() > kSectionLen))
        fail(KVX_EBADMETA, "metadata: verbs section is %zu bytes, expected %zu", s.body.size(), kSectionLen);
    Reader r(s.body.data(), s.body.size(), KVX_EBADMETA, "metadata verbs section");
    SectionInfo v;
    v.cm = wire::get_endpoint(r);
    v.mr_addr = r.u64("verbs.mr_addr");
    v.mr_len = r.u64("verbs.mr_len");
    v.rkey = r.u32("verbs.rkey");
    r.u32("verbs.reserved");
    if (v.mr_len != m.num_blocks * m.block_len)
        fail(KVX_EBADMETA, "metadata: verbs MR length %llu differs from the region size", (unsigned long long)v.mr_len);
    if (v.mr_addr > UINT64_MAX - v.mr_len)
        fail(KVX_EBADMETA, "metadata: verbs MR at 0x%llx + %llu bytes wraps around", (unsigned long long)v.mr_addr,
             (unsigned long long)v.mr_len);
    return v;
}

namespace verbs {

namespace {

bool probe(const Options &o, std::string *why) {
    if (!o.str("verbs.listen").empty()) return true;  // an explicit address: create() finds out
    Placement pl;
    return find_placement(selection(o), &pl, why);
}

std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *why) {
    auto b = std::make_unique<VerbsBackend>(ctx);
    if (!b->init(why)) return nullptr;  // the core logs why
    return b;
}

void check_section(const wire::Section &s, const wire::AgentMetadata &m) { decode_section(s, m); }

}  // namespace

}  // namespace verbs

}  // namespace kvx

extern "C" const kvx::BackendDesc kvx_backend_verbs = {
    "verbs", kvx::verbs::kSectionId, kvx::verbs::kOptions, kvx::verbs::probe, kvx::verbs::create,
    kvx::verbs::check_section,
};
