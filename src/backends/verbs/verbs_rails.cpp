// The initiator's rails: pairing local rails with the peer's, striping parts
// over them by measured rate, and taking out a rail that fails: its QPs to
// ERR, drained, and the parts it owed posted again on the others
// (README.md, "Rails").
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backends/verbs/verbs.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/log.h"
#include "util/net.h"

namespace kvx::verbs {

namespace {

// A rail's rate is sampled over at least this much busy time.
constexpr int64_t kRateWindowNs = 20'000'000;
// How long a failed rail's drain markers may take to flush before its parts
// go elsewhere anyway (its QPs are in ERR: the NIC starts nothing more).
constexpr auto kDrainWait = std::chrono::seconds(2);

int64_t mono_ns() { return Clock::now().time_since_epoch().count(); }

// Whether a lies in the prefix-bit subnet of b (IPv4 or IPv6).
bool same_subnet(const sockaddr_storage &a, const sockaddr_storage &b, unsigned prefix) {
    return net::same_subnet(net::to_endpoint(a), net::to_endpoint(b), prefix);
}

}  // namespace

std::vector<std::pair<size_t, size_t>> pair_rails(const std::vector<std::shared_ptr<Device>> &local,
                                                  const std::vector<RemoteRail> &remote, std::string *notes,
                                                  const std::vector<RailMapEntry> &map, bool route) {
    std::vector<std::pair<size_t, size_t>> pairs;
    std::vector<size_t> used(local.size(), 0);
    if (!map.empty()) {  // verbs.rail_map: the first entry that holds the address decides; no fallback
        for (size_t j = 0; j < remote.size(); j++) {
            const RailMapEntry *e = nullptr;
            for (const RailMapEntry &m : map)
                if (net::same_subnet(remote[j].cm, m.addr, m.prefix)) {
                    e = &m;
                    break;
                }
            size_t best = local.size();
            for (size_t i = 0; e && i < local.size(); i++)
                if (local[i]->name == e->device && (e->port == 0 || local[i]->port == e->port) &&
                    (best == local.size() || used[i] < used[best]))
                    best = i;
            if (best == local.size()) {
                *notes += strfmt("%s%s: %s", notes->empty() ? "" : "; ", remote[j].cm.str().c_str(),
                                 e ? "its verbs.rail_map entry names no rail of ours" : "in no verbs.rail_map entry");
                continue;
            }
            used[best]++;
            pairs.emplace_back(best, j);
        }
        return pairs;
    }
    for (size_t j = 0; j < remote.size(); j++) {
        socklen_t len = 0;
        const sockaddr_storage ra = net::from_endpoint(remote[j].cm, &len);
        size_t best = local.size();
        for (size_t i = 0; i < local.size(); i++)
            if (same_subnet(ra, local[i]->addr, local[i]->prefix) && (best == local.size() || used[i] < used[best]))
                best = i;
        if (best == local.size()) {
            *notes += strfmt("%s%s: no rail of ours on its subnet", notes->empty() ? "" : "; ",
                             remote[j].cm.str().c_str());
            continue;
        }
        used[best]++;
        pairs.emplace_back(best, j);
    }
    if (route && pairs.empty() && !local.empty() && !remote.empty()) pairs.emplace_back(0, 0);
    return pairs;
}

// ------------------------------------------------------------------ striping (mu_ held)

bool VerbsPeer::usable(const Qp &q) const { return !q.dead && rails_[q.rail].state == Rail::State::up; }

// Rail r's weight: its measured rate once every rail that is up has one,
// before that the same for all (1).
double VerbsPeer::rate_of(size_t r) const {
    for (const Rail &x : rails_)
        if (x.state == Rail::State::up && !(x.rate > 0)) return 1.0;
    return rails_[r].rate > 0 ? rails_[r].rate : 1.0;
}

// When q would be done with bytes more: its load over its rail's rate.
double VerbsPeer::finish_ns(const Qp &q, uint64_t bytes) const {
    return static_cast<double>(q.inflight_bytes + q.waiting_bytes + bytes) / rate_of(q.rail);
}

// The k usable QPs that would finish bytes more first (QP 0 of each rail
// before QP 1 of any on a tie).
std::vector<size_t> VerbsPeer::fastest(size_t k, uint64_t bytes) const {
    std::vector<size_t> order;
    for (size_t i = 0; i < qps_.size(); i++)
        if (usable(qps_[i])) order.push_back(i);
    std::vector<double> t(qps_.size());
    for (size_t i : order) t[i] = finish_ns(qps_[i], bytes);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return t[a] != t[b] ? t[a] < t[b] : qps_[a].turn < qps_[b].turn;
    });
    if (order.size() > k) order.resize(k);
    return order;
}

// Queues parts[i] on QP qps[i] and posts what may go now.
void VerbsPeer::place(std::vector<Part> &&parts, const std::vector<size_t> &qps, CompletionBatch &out) {
    for (size_t i = 0; i < parts.size(); i++) {
        Qp &q = qps_[qps[i]];
        QueuedPart queued;
        queued.wrs_left = wrs_for(parts[i].runs);
        q.waiting_bytes += parts[i].bytes();
        queued.part = std::move(parts[i]);
        q.waiting_wrs += queued.wrs_left;
        q.waiting.push_back(std::move(queued));
    }
    for (size_t i = 0; i < qps.size(); i++)
        if (std::find(qps.begin(), qps.begin() + static_cast<std::ptrdiff_t>(i), qps[i]) == qps.begin() + i &&
            !should_wait(qps_[qps[i]]))
            post_ready(qps_[qps[i]], out);
}

// A signalled WR of r completed bytes: the rail's rate is what it completed
// over the time it had bytes in flight, in windows of kRateWindowNs, each
// sample weighing 30 %.
void VerbsPeer::measure(Rail &r, uint64_t bytes) {
    const int64_t now = mono_ns();
    if (r.last_ns) r.win_busy_ns += now - r.last_ns;
    r.last_ns = now;
    r.win_bytes += bytes;
    // Idle from here unless more is in flight: the next post starts the clock.
    uint64_t inflight = 0;
    for (const Qp &q : qps_)
        if (q.rail == static_cast<size_t>(&r - rails_.data())) inflight += q.inflight_bytes;
    if (!inflight) r.last_ns = 0;
    if (r.win_busy_ns < kRateWindowNs) return;
    const double sample = static_cast<double>(r.win_bytes) / static_cast<double>(r.win_busy_ns);
    r.rate = r.rate > 0 ? 0.7 * r.rate + 0.3 * sample : sample;
    r.win_bytes = 0;
    r.win_busy_ns = 0;
}

// The rail goes from idle to busy: its busy time counts from now.
void VerbsPeer::start_clock(Rail &r) { r.last_ns = mono_ns(); }

// ------------------------------------------------------------------ failover (mu_ held)

size_t VerbsPeer::rails_up() const {
    size_t n = 0;
    for (const Rail &r : rails_) n += r.state == Rail::State::up;
    return n;
}

void VerbsPeer::set_state(Rail &r, Rail::State s) {
    r.state = s;
    r.changed_ns = realtime_ns();
}

// Takes rail r out: its QPs to ERR and a drain marker behind each; once the
// markers flushed (or at once when its device is gone), the parts it owed go
// to the other rails (rail_drained). The last rail breaks the peer instead.
void VerbsPeer::fail_rail(size_t r, const std::string &why, bool gone, CompletionBatch &out) {
    Rail &rail = rails_[r];
    if (rail.state != Rail::State::up || broken_) return;
    rail.failures++;
    if (rails_up() == 1) {
        set_state(rail, Rail::State::down);
        KVX_LOG(warn, "verbs: %s: rail %s: %s; no rail left: the peer is broken (the core reconnects it)", where_.c_str(),
                rail.name.c_str(), why.c_str());
        break_peer(KVX_ECONNRESET, out);
        return;
    }
    set_state(rail, Rail::State::draining);
    // A port that is down sends nothing, and its QPs go to ERR before it
    // could come back: nothing to wait for (and on rxe a WR posted to a
    // QP of a port that is down wedges the port for good).
    gone = gone || rail.dev->port_down();
    KVX_LOG(warn, "verbs: %s: rail %s taken out: %s; its parts go to the %zu other rail(s) once it is drained",
            where_.c_str(), rail.name.c_str(), why.c_str(), rails_up());
    for (Qp &q : qps_) {
        if (q.rail != r) continue;
        if (!q.dead) {
            q.dead = true;
            to_error(q);
        }
        take_parts(q, &rail.orphans);
        if (!gone && post_marker(q)) rail.drains_left++;
    }
    if (rail.drains_left == 0 && gone) return rail_drained(r, out);
    // No marker (none could be posted): the QPs are in ERR; 2 s stand in
    // for the flush that would have said so. Off the loop thread (a failed post in submit) a timer would wait for
    // the loop, which may wait for mu_: the flushes alone end that drain.
    if (loop_->on_loop_thread())
        rail.drain_timer = loop_->add_timer(Clock::now() + kDrainWait, this, static_cast<int>(r));
    else if (rail.drains_left == 0)
        rail_drained(r, out);
}

// Everything q owed, whole parts, in order: what is posted (it may have
// landed in part: posted again, the same bytes go to the same place) and
// what waits. Its counters start over.
void VerbsPeer::take_parts(Qp &q, std::vector<Part> *into) {
    for (Part &p : q.posted) into->push_back(std::move(p));
    for (QueuedPart &w : q.waiting) into->push_back(std::move(w.part));
    q.posted.clear();
    q.waiting.clear();
    q.waiting_wrs = q.waiting_bytes = 0;
    q.marks.clear();
    q.used = q.since_signal = q.since_mark = 0;
    q.seg_bytes.clear();
    q.tail_bytes = q.inflight_bytes = 0;
}

// Rail r can land nothing more: what it owed goes, each part whole, to the
// QPs that would finish it first.
void VerbsPeer::rail_drained(size_t r, CompletionBatch &out) {
    Rail &rail = rails_[r];
    set_state(rail, Rail::State::down);
    if (rail.drain_timer) loop_->cancel_timer(rail.drain_timer);
    rail.drain_timer = 0;
    std::vector<Part> parts = std::move(rail.orphans);
    rail.orphans.clear();
    size_t moved = 0;
    for (Part &p : parts) {
        const std::vector<size_t> to = fastest(1, p.bytes());
        if (broken_ || to.empty()) {
            out.fail(*p.op, broken_ ? break_status_ : KVX_ECONNRESET);
            continue;
        }
        std::vector<Part> one;
        one.push_back(std::move(p));
        place(std::move(one), to, out);
        moved++;
    }
    KVX_LOG(info, "verbs: %s: rail %s drained; %zu part(s) it owed posted again", where_.c_str(), rail.name.c_str(),
            moved);
    redial(r);  // back in the background once it connects again
}

// A signalled zero-length marker behind everything on q (in ERR: it
// flushes once all before it did); false when it cannot be posted.
bool VerbsPeer::post_marker(Qp &q) {
    if (!q.qp) return false;
    ibv_send_wr w{};
    w.wr_id = kDrainWrId;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = remote_addr_;
    w.wr.rdma.rkey = rails_[q.rail].remote.rkeys.front();
    ibv_send_wr *bad = nullptr;
    return ibv_post_send(q.qp, &w, &bad) == 0;
}

void VerbsPeer::fail_orphans(int status, CompletionBatch &out) {
    for (Rail &r : rails_) {
        for (Part &p : r.orphans) out.fail(*p.op, status);
        r.orphans.clear();
    }
}

// A drain that did not finish in time: the rail's QPs are in ERR, so the
// NIC starts nothing more of them; its parts go on.
void VerbsPeer::on_timer(int tag) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    const size_t r = static_cast<size_t>(tag);
    if (r >= rails_.size()) return;
    rails_[r].drain_timer = 0;
    if (rails_[r].state != Rail::State::draining) return;
    KVX_LOG(warn, "verbs: %s: rail %s: %d drain marker(s) not flushed within %lld s; its QPs are in ERR, its parts go on",
            where_.c_str(), rails_[r].name.c_str(), rails_[r].drains_left, (long long)kDrainWait.count());
    rail_drained(r, out);
    deliver(lk, out);
}

// ------------------------------------------------------------------ events and telemetry

void VerbsPeer::port_down(const Device *dev, const char *why) {
    CompletionBatch out;
    std::unique_lock<std::mutex> lk(mu_);
    if (stopping_) return;
    call_off_attempt(dev);  // a rejoin through it: nothing more goes out there
    for (size_t r = 0; r < rails_.size(); r++) {
        if (rails_[r].dev.get() != dev) continue;
        if (rails_[r].state == Rail::State::draining) {  // nothing leaves the port now: drained
            rail_drained(r, out);
            continue;
        }
        if (rails_[r].state != Rail::State::up) continue;
        // what completed there first, posting nothing more to it
        for (bool more = true; more && rails_[r].state == Rail::State::up;) more = poll_cq(r, out, false);
        fail_rail(r, why, false, out);
    }
    deliver(lk, out);
}

void VerbsPeer::rails(std::vector<RailStats> *out) const {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Rail &r : rails_) {
        RailStats s;
        s.name = r.name;
        s.up = r.state == Rail::State::up;
        s.bytes = r.bytes;
        s.parts = r.parts;
        s.failures = r.failures;
        s.changed_ns = r.changed_ns;
        out->push_back(std::move(s));
    }
}

}  // namespace kvx::verbs
