// Liveness of the verbs target's accepted connections: a zero-length SEND
// every half transfer_timeout_ms; one that fails closes the connection. And
// the ports' own liveness: their async events take a rail out of every peer
// using it.
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
    if (c.probing || !rails_[c.rail].probe_tok) return;  // no channel: nothing would hear the answer
    if (rails_[c.rail].dev->port_down()) {  // nothing leaves a port that is down (on_async_events closes these)
        c.timer = loop_->add_timer(Clock::now() + probe_every_, &c, 0);
        return;
    }
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
void VerbsBackend::on_probe_events(size_t r) {
    ibv_cq *cq = nullptr;
    void *ctx = nullptr;
    std::vector<rdma_cm_id *> dead;
    while (ibv_get_cq_event(rails_[r].probe_ch, &cq, &ctx) == 0) {
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
    // No DREQ through a port that is down: it cannot leave, and on rxe a
    // MAD sent then wedges the port's CM for good.
    if (c->established && !rails_[c->rail].dev->port_down()) rdma_disconnect(id);
    destroy_cm_id(id);  // the QP before its CQ
    if (c->cq) ibv_destroy_cq(c->cq);
}

// A context of our own per device of a rail, for its async events: port
// state changes reach every open context of the device, so another
// transport of this process (sharing librdmacm's contexts) misses none.
void VerbsBackend::watch_ports() {
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    for (const RailListener &r : rails_) {
        bool seen = false;
        for (const Watch &w : watches_) seen |= w.device == r.dev->name;
        if (seen) continue;
        Watch w;
        w.device = r.dev->name;
        for (int i = 0; list && i < n && !w.ctx; i++)
            if (w.device == ibv_get_device_name(list[i])) w.ctx = ibv_open_device(list[i]);
        if (!w.ctx) {
            KVX_LOG(warn, "verbs: cannot open %s for its port events: %s; a port going down is noticed by its "
                    "connections failing", w.device.c_str(), strerror(errno));
            continue;
        }
        net::set_nonblocking(w.ctx->async_fd, "async event fd");
        w.tok = loop_->attach(w.ctx->async_fd, EPOLLIN, this, kTagAsync0 + static_cast<int>(watches_.size()));
        watches_.push_back(w);
    }
    if (list) ibv_free_device_list(list);
}

// Port events of device watch w: a rail's port that leaves ACTIVE, or whose
// GID table no longer holds the rail's address (a GID change: the address
// was removed or moved), is taken out of every peer (their parts go to
// other rails). One that is ACTIVE again, or has its address back, has
// every peer dial its rails on it at once (VerbsPeer::port_up).
void VerbsBackend::on_async_events(size_t w) {
    Watch &watch = watches_[w];
    ibv_async_event ev{};
    while (ibv_get_async_event(watch.ctx, &ev) == 0) {
        const ibv_event_type type = ev.event_type;
        const uint8_t port = static_cast<uint8_t>(ev.element.port_num);
        ibv_ack_async_event(&ev);
        const bool down = type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_DEVICE_FATAL;
        const bool up = type == IBV_EVENT_PORT_ACTIVE;
        if (!down && !up && type != IBV_EVENT_GID_CHANGE) continue;
        for (RailListener &r : rails_) {
            if (r.dev->name != watch.device || (type != IBV_EVENT_DEVICE_FATAL && r.dev->port != port)) continue;
            const bool gid_gone = type == IBV_EVENT_GID_CHANGE && !r.dev->has_addr_gid();
            if (down || gid_gone) KVX_LOG(warn, "verbs: rail %s: %s%s", r.dev->label.c_str(), ibv_event_type_str(type),
                                          gid_gone ? ": its address is no longer a GID of the port" : "");
            else KVX_LOG(info, "verbs: rail %s: %s", r.dev->label.c_str(), ibv_event_type_str(type));
            if (!down && !gid_gone) {  // ACTIVE, or its address (back) among the GIDs: its rails rejoin now
                if (!r.dev->port_down() && r.dev->has_addr_gid())
                    for (VerbsPeer *p : peers_->peers) p->port_up(r.dev.get());
                continue;
            }
            const std::string why = gid_gone ? "port event GID change: the rail's address left the port"
                                             : strfmt("port event %s", ibv_event_type_str(type));
            for (VerbsPeer *p : peers_->peers) p->port_down(r.dev.get(), why.c_str());
            // Inbound connections through it are over too: their initiators
            // see their QPs fail and take the rail out (no DREQ: nothing
            // leaves a port that is down).
            std::vector<rdma_cm_id *> gone;
            for (const auto &[id, c] : conns_)
                if (c->rail == static_cast<size_t>(&r - rails_.data())) gone.push_back(id);
            for (rdma_cm_id *id : gone) close_conn(id);
        }
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        KVX_LOG(warn, "verbs: reading %s's async events: %s; they are no longer watched", watch.device.c_str(),
                strerror(errno));
        loop_->detach(watch.tok);
        watch.tok = 0;
    }
}

}  // namespace kvx::verbs
