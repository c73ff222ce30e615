// Rails that come back: a rail pair that is down (taken out and drained, or
// not connected at the add) is dialled again in the background, with fresh
// QPs on a CQ and an rdma_cm channel of the attempt's own, authenticated as
// at the add; once every QP of it connected, the loop thread swaps them in
// for the rail's dead ones and the rail carries parts again (README.md,
// "Rails").
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/verbs/verbs.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

VerbsPeer::Fresh::~Fresh() {
    const bool port_up = dev && !dev->port_down();  // no DREQ through a port that is down (close_conn)
    for (Qp &q : qps)
        if (q.id && port_up) rdma_disconnect(q.id.get());  // the target's half goes too
    qps.clear();                                // the QPs before their CQ
    if (cq) ibv_destroy_cq(cq);
    if (comp_ch) ibv_destroy_comp_channel(comp_ch);
    if (ch) rdma_destroy_event_channel(ch);
}

// Rail r, down, joins the dialler's queue: first try peer_redial_ms from
// now. mu_ held.
void VerbsPeer::redial(size_t r) {
    if (cfg_.redial_ms == 0 || stopping_ || broken_) return;
    std::lock_guard<std::mutex> lk(dial_mu_);
    if (dial_stop_ || dialling_[r]) return;
    dialling_[r] = true;
    dial_queue_.push_back(Redial{r, Clock::now() + std::chrono::milliseconds(cfg_.redial_ms), 0});
    if (!dialler_.joinable()) dialler_ = std::thread([this] { dial_loop(); });
    dial_cv_.notify_all();
}

void VerbsPeer::port_up(const Device *dev) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || broken_) return;
    std::lock_guard<std::mutex> g(dial_mu_);
    for (size_t r = 0; r < rails_.size(); r++)  // one being dialled now goes again at once if this one fails
        if (rails_[r].dev.get() == dev && rails_[r].state == Rail::State::down && dialling_[r]) kicked_[r] = true;
    for (Redial &d : dial_queue_)
        if (rails_[d.rail].dev.get() == dev) d.due = Clock::now();
    dial_cv_.notify_all();
}

void VerbsPeer::call_off_attempt(const Device *dev) {
    std::lock_guard<std::mutex> lk(dial_mu_);
    if (attempt_rail_ < rails_.size() && rails_[attempt_rail_].dev.get() == dev) {
        kicked_[attempt_rail_] = false;
        dial_cancel_.store(true);
    }
}

// Whether rail r may be dialled now: our port ACTIVE and our address still
// one of its GIDs (on rxe, a connection through a port that is down wedges
// the port). *why when not.
bool VerbsPeer::can_try(size_t r, std::string *why) const {
    const Device &dev = *rails_[r].dev;
    if (dev.port_down()) *why = strfmt("port %s is not ACTIVE", dev.label.c_str());
    else if (!dev.has_addr_gid()) *why = strfmt("its address is not a GID of port %s", dev.label.c_str());
    else return true;
    return false;
}

// Every QP of rail r, connected and authenticated into f; throws Error.
void VerbsPeer::connect_fresh(size_t r, Fresh *f) {
    f->dev = rails_[r].dev.get();
    make_cq(*rails_[r].dev, &f->comp_ch, &f->cq);
    f->ch = rdma_create_event_channel();
    if (!f->ch) fail(KVX_EBACKEND, "verbs: rdma_create_event_channel: %s", strerror(errno));
    net::set_nonblocking(f->ch->fd, "rdma_cm event channel");
    const net::Deadline dl(Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms), &dial_cancel_);
    for (uint32_t i = 0; i < cfg_.qps; i++) connect_qp(Dial{meta_, ours_, dl, r, i, f->ch, f->cq, &f->qps});
}

// Loop thread: f's QPs become rail r's, which is up again; its dead QPs and
// their CQ go (in ERR, and drained or given 2 s: nothing of them can land).
// false when the peer no longer wants them (broken, stopping), the port
// went down or lost the address meanwhile (the loop thread hears of that
// in order with this), or they cannot be handed to the loop; f keeps them
// then.
bool VerbsPeer::install(size_t r, Fresh *f) {
    std::lock_guard<std::mutex> lk(mu_);
    Rail &rail = rails_[r];
    if (stopping_ || broken_ || rail.state != Rail::State::down) return false;
    if (rail.dev->port_down() || !rail.dev->has_addr_gid()) return false;
    const uint64_t tok = loop_->attach(f->comp_ch->fd, EPOLLIN, this, kTagCq0 + static_cast<int>(r));
    if (!tok) return false;
    // Their disconnects from here on reach on_cm_event (the kernel moves
    // what is queued for them along).
    for (Qp &q : f->qps)
        if (rdma_migrate_id(q.id.get(), cm_ch_) != 0) {
            KVX_LOG(warn, "verbs: %s: rail %s: rdma_migrate_id: %s", where_.c_str(), rail.name.c_str(), strerror(errno));
            loop_->detach(tok);
            return false;
        }
    loop_->detach(rail.tok);
    const bool port_up = !rail.dev->port_down();
    for (Qp &q : qps_)
        if (q.rail == r && q.id && port_up) rdma_disconnect(q.id.get());
    qps_.erase(std::remove_if(qps_.begin(), qps_.end(), [&](const Qp &q) { return q.rail == r; }), qps_.end());
    if (rail.cq) {
        if (rail.cq_unacked) ibv_ack_cq_events(rail.cq, rail.cq_unacked);
        if (int rc = ibv_destroy_cq(rail.cq)) KVX_LOG(error, "verbs: ibv_destroy_cq: %s", strerror(rc));
    }
    if (rail.comp_ch) ibv_destroy_comp_channel(rail.comp_ch);
    rail.cq_unacked = 0;
    rail.cq = std::exchange(f->cq, nullptr);
    rail.comp_ch = std::exchange(f->comp_ch, nullptr);
    rail.tok = tok;
    for (Qp &q : f->qps) qps_.push_back(std::move(q));
    f->qps.clear();
    rail.drains_left = 0;
    rail.rate = 0;  // measured again: the port may be back at another speed
    rail.win_bytes = 0;
    rail.win_busy_ns = rail.last_ns = 0;
    {
        // Before it is up: a failure from here on queues it again (redial()
        // skips a rail being dialled).
        std::lock_guard<std::mutex> g(dial_mu_);
        dialling_[r] = false;
        kicked_[r] = false;
    }
    set_state(rail, Rail::State::up);
    return true;
}

// The dialler: one thread per peer, started with the first rail that goes
// down, dials the queued rails when they are due, one at a time.
void VerbsPeer::dial_loop() {
    const std::chrono::milliseconds base(cfg_.redial_ms);
    std::unique_lock<std::mutex> lk(dial_mu_);
    Redial d{};
    while (take_due(dial_queue_, lk, dial_cv_, dial_stop_, &d)) {
        if (broken()) continue;  // set_broken() emptied the queue; the core dials the whole peer again
        attempt_rail_ = d.rail;
        kicked_[d.rail] = false;
        dial_cancel_.store(false);
        lk.unlock();
        const Rail &rail = rails_[d.rail];
        std::string why;
        bool back = false;
        if (can_try(d.rail, &why)) {
            Fresh f;
            try {
                connect_fresh(d.rail, &f);
                loop_->call([&] { back = install(d.rail, &f); });
                if (!back) why = "its port went down, or the peer no longer takes it";
            } catch (const Error &e) {
                why = e.what();
                if (e.code() == KVX_EAUTH || e.code() == KVX_EFINGERPRINT || e.code() == KVX_EVERSION)
                    KVX_LOG(warn, "verbs: %s: rail %s refused: %s", where_.c_str(), rail.name.c_str(), e.what());
            }
        }
        lk.lock();
        attempt_rail_ = SIZE_MAX;
        if (back) {
            KVX_LOG(warn, "verbs: %s: rail %s is back (%d attempt(s)): it carries parts again", where_.c_str(),
                    rail.name.c_str(), d.attempt + 1);
            continue;
        }
        if (dial_stop_) break;
        if (broken() || !dialling_[d.rail]) continue;  // the peer broke meanwhile (set_broken())
        if (d.attempt == 0)
            KVX_LOG(info, "verbs: %s: rail %s not back yet: %s (dialled again every %lld ms at most)", where_.c_str(),
                    rail.name.c_str(), why.c_str(), (long long)(kRedialMaxFactor * base).count());
        else
            KVX_LOG(debug, "verbs: %s: rail %s: attempt %d failed: %s", where_.c_str(), rail.name.c_str(),
                    d.attempt + 1, why.c_str());
        d.attempt++;
        d.due = kicked_[d.rail] ? Clock::now() : Clock::now() + base * redial_factor(static_cast<uint32_t>(d.attempt));
        kicked_[d.rail] = false;
        dial_queue_.push_back(d);
    }
}

// No attempt starts from here on, and one under way is called off (within
// a slice of its waits) and joined.
void VerbsPeer::stop_dialler() {
    std::thread t;
    {
        std::lock_guard<std::mutex> lk(dial_mu_);
        dial_stop_ = true;
        t = std::move(dialler_);
    }
    dial_cancel_.store(true);
    dial_cv_.notify_all();
    if (t.joinable()) t.join();
}

}  // namespace kvx::verbs
