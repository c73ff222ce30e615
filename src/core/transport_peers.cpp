// Transport: peer registration (synchronous and asynchronous, replace,
// cancel) and telemetry. The data path's hooks into both stay in
// transport.cpp; what they call lives here.
#include <algorithm>
#include <cstring>
#include <new>

#include "core/transport.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx {

namespace {

// What a failed registration reports: the code and message of the exception.
int failure_of(std::exception_ptr e, std::string *message) {
    try {
        std::rethrow_exception(e);
    } catch (const Error &x) {
        *message = x.what();
        return x.code();
    } catch (const std::bad_alloc &) {
        *message = "out of memory";
        return KVX_ENOMEM;
    } catch (const std::exception &x) {
        *message = x.what();
        return KVX_EINTERNAL;
    } catch (...) {
        *message = "unknown internal error";
        return KVX_EINTERNAL;
    }
}

}  // namespace

// Why registration r, cancelled while it connected, failed.
Error Transport::called_off_locked(const Registrations::Pending &r) const {
    if (closed_) return Error(KVX_ECLOSED, strfmt("transport was closed while peer '%s' connected", r.id.c_str()));
    return Error(r.cancel_code, strfmt("peer '%s': registration cancelled while it connected (the peer was removed "
                                       "or added again)", r.id.c_str()));
}

// Reserves id for registration reg (0: synchronous). With replace, a peer
// registered under id is taken out (*replaced: the caller shuts its link down
// without the lock, as remove does) and a registration in progress superseded.
Registrations::Ref Transport::reserve_locked(const std::string &id, uint64_t reg, bool replace,
                                             std::shared_ptr<Peer> *replaced) {
    check_open_locked();
    auto it = peers_.find(id);
    if (it != peers_.end()) {
        if (!replace) fail(KVX_EEXIST, "peer '%s' is already registered", id.c_str());
        *replaced = std::move(it->second);
        (*replaced)->removed = true;  // write_blocks adds nothing to it any more
        stop_redial_locked(**replaced);
        peers_.erase(it);
        completions_[id].registered = false;  // until the new registration publishes
    }
    return registrations_.reserve_locked(id, reg, replace);
}

// Connects, then publishes the peer if r still holds its id's reservation.
// Throws the failure (also recorded as r's outcome).
void Transport::connect_and_publish(const Registrations::Ref &r, const wire::AgentMetadata &m) {
    const int64_t t0 = Peer::now_ns();
    std::shared_ptr<Peer> peer;
    bool fell_back = false;
    try {
        peer = connect_peer(r->id, m, &r->called_off, &fell_back);
    } catch (...) {
        std::string msg;
        int code = failure_of(std::current_exception(), &msg);
        std::lock_guard<std::mutex> lk(mu_);
        if (r->current) telemetry_.connect_failed(r->id);
        if (!r->current && r->cancel_code != 0) {  // called off: that is the outcome, whatever the attempt saw
            const Error e = called_off_locked(*r);
            registrations_.finish_locked(r, e.code(), e.what());
            throw e;
        }
        registrations_.finish_locked(r, code, msg);
        const std::string own = "peer '" + r->id + "': ";
        KVX_LOG_PEER(warn, r->id.c_str(), "peer '%s': not added: %s", r->id.c_str(),
                     msg.c_str() + (msg.compare(0, own.size(), own) == 0 ? own.size() : 0));
        throw;
    }
    Error called_off{0, ""};
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!closed_ && r->current) {
            peer->stats = telemetry_.slot(r->id);
            telemetry_.connected(peer->stats.get(), Peer::now_ns() - t0);
            peers_[r->id] = peer;
            landed_locked(*peer, fell_back);
            completions_[r->id].registered = true;
            registrations_.finish_locked(r, 0, "");
            return;
        }
        called_off = called_off_locked(*r);
        registrations_.finish_locked(r, called_off.code(), called_off.what());
    }
    peer->link->shutdown();  // never published: nothing of it was used (no reconnection: it is not in peers_)
    throw called_off;
}

uint64_t Transport::add_peer_async(const std::string &id, const uint8_t *meta, size_t meta_len, uint64_t base_addr,
                                   uint64_t num_blocks, uint64_t block_len, unsigned flags) {
    if (flags & ~static_cast<unsigned>(KVX_PEER_REPLACE)) fail(KVX_EINVAL, "flags 0x%x has unknown bits", flags);
    auto m = std::make_shared<wire::AgentMetadata>(check_peer(id, meta, meta_len, base_addr, num_blocks, block_len));
    std::shared_ptr<Peer> replaced;
    std::vector<std::shared_ptr<BackendPeer>> links;
    uint64_t reg;
    {
        std::lock_guard<std::mutex> lk(mu_);
        Registrations::Ref r = reserve_locked(id, next_reg_, flags & KVX_PEER_REPLACE, &replaced);
        if (replaced) links = links_locked(*replaced);
        reg = next_reg_++;
        registrations_.submit_locked(r, [this, r, m] {
            try {
                connect_and_publish(r, *m);
            } catch (...) {  // recorded as the outcome
            }
        });
    }
    for (auto &l : links) l->shutdown();  // the replaced peer's transfers fail, as on remove
    return reg;
}

Registrations::Status Transport::registration_status(uint64_t reg, int timeout_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    return registrations_.wait(lk, reg, timeout_ms);
}

// ------------------------------------------------------------ reconnection
//
// A peer whose link broke stays registered. The watchdog (which looks at
// every peer each slice anyway) marks it down and, peer_redial_ms later,
// queues an attempt for a connect worker: the failed link is shut down
// (nothing of it reports or lands any more), then the peer's metadata is
// dialled again through the same path choice as an add, authenticating
// anew. Success swaps the link in under mu_; failure waits twice as long
// (up to 8 x peer_redial_ms) for the next attempt. Writes meanwhile fail at
// once (refuse_broken_locked). Remove, replace and close stop it.
//
// A peer up on a fallback (a path it prefers applied but failed to connect:
// verbs with every rail down, so tcp) is up, but not where it should be.
// On the same timer and workers (after the reconnections) it dials the
// paths it prefers to its link's again; once one connects, that becomes its
// link under mu_ (writes go there from then on) and the old link is retired:
// it carries its transfers in flight to their end, reported through the
// same sink, and is shut down once the last is reported (by the watchdog),
// or at once if it has none. Writes never fail for it.

namespace {

// Log a failed attempt at warn on attempts 1, 2, 4, 8, ...; at debug otherwise.
bool worth_a_warning(uint32_t attempt) { return (attempt & (attempt - 1)) == 0; }

int64_t ms_ns(uint64_t ms) { return static_cast<int64_t>(ms) * 1000000; }

}  // namespace

void Transport::landed_locked(Peer &p, bool fell_back) {
    p.link_from_id = next_id_;
    p.link_left = 0;
    p.landed_ns = Peer::now_ns();
    // peer_redial_ms=0: no return either (the peer keeps its fallback).
    const bool on = fell_back && core_.redial_ms != 0;
    if (on && !p.fallback) fallback_peers_++;
    if (!on && p.fallback) fallback_peers_--;
    p.fallback = on;
    p.return_attempts = 0;
    if (!on) return;
    p.return_due_ns = Peer::now_ns() + ms_ns(core_.redial_ms);
    wd_cv_.notify_all();
}

void Transport::no_return_locked(Peer &p) {
    p.return_off.store(true);  // an attempt under way stops
    if (p.fallback) fallback_peers_--;
    p.fallback = false;
}

std::vector<std::shared_ptr<BackendPeer>> Transport::links_locked(const Peer &p) {
    std::vector<std::shared_ptr<BackendPeer>> out{p.link};
    for (const Peer::Retired &r : p.retired) out.push_back(r.link);
    return out;
}

std::vector<Transport::Reaped> Transport::reap_retired_locked() {
    std::vector<Reaped> out;
    const int64_t now = Peer::now_ns(), timeout_ns = ms_ns(core_.transfer_timeout_ms);
    for (auto &[id, p] : peers_)
        for (Peer::Retired &r : p->retired) {
            if (r.closing) continue;
            if (r.left == 0 || r.link->broken()) {
                if (r.left != 0)
                    KVX_LOG_PEER(warn, id.c_str(), "peer '%s': the link it left for a preferred path failed with %llu "
                                 "transfers in flight: failing them", id.c_str(), (unsigned long long)r.left);
                r.closing = true;  // listed until it is shut down: remove and close wait for that
                out.push_back(Reaped{p, r.link, true, 0});
            } else if (now - r.last_end_ns >= timeout_ns) {
                out.push_back(Reaped{p, r.link, false, now - r.last_end_ns});
            }
        }
    return out;
}

// Outside mu_. A retired link that made no progress for the stall timeout
// is aborted (as the peer's own link would be), unless the network is
// silent under it, which gets the same grace as the peer's (Timers); the
// next look shuts it down. One whose transfers are all reported, or that
// broke, is shut down and then dropped from its peer (unless a removal,
// a replacement or a reconnection took the peer's list meanwhile).
void Transport::reap_retired(std::vector<Reaped> &reaped) {
    for (Reaped &r : reaped) {
        if (r.shut) {
            r.link->shutdown();
            std::lock_guard<std::mutex> lk(mu_);
            auto &v = r.peer->retired;
            auto it = std::find_if(v.begin(), v.end(), [&](const Peer::Retired &x) { return x.link == r.link; });
            if (it == v.end()) continue;
            v.erase(it);
            if (!r.peer->redial_off.load()) retired_links_--;  // else stop_redial_locked() counted it out
            continue;
        }
        const uint64_t rto_us = r.link->network_silent_rto_us();
        if (rto_us != 0 && r.idle_ns < ms_ns(stall_grace_ms(core_.transfer_timeout_ms, rto_us / 1000))) continue;
        KVX_LOG_PEER(warn, r.peer->id.c_str(), "peer '%s': the link it left for a preferred path made no progress for "
                     "%lld ms: failing what it carries", r.peer->id.c_str(), (long long)(r.idle_ns / 1000000));
        r.link->abort(KVX_ETIMEDOUT);
    }
    reaped.clear();  // the last reference to a link or a removed peer goes without mu_
}

void Transport::went_down_locked(Peer &p, std::string why) {
    no_return_locked(p);
    const int64_t now = Peer::now_ns();
    p.since_ns = now;
    p.attempts = 0;
    p.error = p.timed_out.load() ? KVX_ETIMEDOUT : KVX_ECONNRESET;
    p.reason = std::move(why);
    if (core_.redial_ms == 0) {
        p.state = Peer::Link::broken;
        KVX_LOG_PEER(warn, p.id.c_str(), "peer '%s' (%s): %s; it stays broken until removed (peer_redial_ms=0)", p.id.c_str(),
                p.backend, p.reason.c_str());
        return;
    }
    p.state = Peer::Link::down;
    p.due_ns = now + ms_ns(core_.redial_ms);
    down_peers_++;
    KVX_LOG_PEER(warn, p.id.c_str(), "peer '%s' (%s): %s; reconnecting in the background, first attempt in %u ms", p.id.c_str(),
            p.backend, p.reason.c_str(), core_.redial_ms);
}

void Transport::stop_redial_locked(Peer &p) {
    p.redial_off.store(true);
    no_return_locked(p);
    retired_links_ -= p.retired.size();  // the caller shuts them down (links_locked) with its link
    if (p.state == Peer::Link::down) down_peers_--;
    p.state = Peer::Link::broken;
}

void Transport::start_redials_locked(Clock::time_point *next) {
    if (down_peers_ == 0) return start_returns_locked(next);
    const int64_t now = Peer::now_ns();
    for (auto &[id, p] : peers_) {
        if (p->state != Peer::Link::down || p->attempting) continue;
        // Half the connect workers at most: an attempt holds one for up to
        // connect_timeout_ms, and adds must find one behind a partition too.
        if (redials_running_ + returns_running_ >= Registrations::kMaxWorkers / 2) {
            *next = std::min(*next, Clock::now() + std::chrono::milliseconds(core_.redial_ms));
            break;
        }
        if (p->due_ns > now) {
            *next = std::min(*next, Clock::now() + std::chrono::nanoseconds(p->due_ns - now));
            continue;
        }
        p->attempting = true;
        redials_running_++;
        std::shared_ptr<Peer> peer = p;
        registrations_.submit_task_locked(
            [this, peer] {
                try {
                    redial(peer);
                } catch (...) {  // out of memory on the way: the peer stays down and is tried again
                    std::lock_guard<std::mutex> lk(mu_);
                    if (peer->attempting) {
                        peer->attempting = false;
                        peer->due_ns = Peer::now_ns() + ms_ns(core_.redial_ms);
                    }
                }
                std::lock_guard<std::mutex> lk(mu_);
                redials_running_--;
            },
            [this, peer] {  // no thread for it (lock held): the next slice tries again
                peer->attempting = false;
                peer->due_ns = Peer::now_ns() + ms_ns(core_.redial_ms);
                redials_running_--;
            });
    }
    start_returns_locked(next);
}

// Returns of peers on a fallback come after the reconnections (those peers
// work meanwhile, the ones down do not), and a quarter of the connect
// workers stays free for reconnections.
void Transport::start_returns_locked(Clock::time_point *next) {
    if (fallback_peers_ == 0) return;
    const int64_t now = Peer::now_ns();
    for (auto &[id, p] : peers_) {
        if (p->state != Peer::Link::up || !p->fallback || p->attempting) continue;
        if (redials_running_ + returns_running_ >= Registrations::kMaxWorkers / 2 ||
            returns_running_ >= Registrations::kMaxWorkers / 4) {
            *next = std::min(*next, Clock::now() + std::chrono::milliseconds(core_.redial_ms));
            break;
        }
        if (p->return_due_ns > now) {
            *next = std::min(*next, Clock::now() + std::chrono::nanoseconds(p->return_due_ns - now));
            continue;
        }
        p->attempting = true;
        p->return_off.store(false);
        returns_running_++;
        std::shared_ptr<Peer> peer = p;
        registrations_.submit_task_locked(
            [this, peer] {
                try {
                    return_to_preferred(peer);
                } catch (...) {  // out of memory on the way: tried again later
                    std::lock_guard<std::mutex> lk(mu_);
                    if (peer->attempting) {
                        peer->attempting = false;
                        peer->return_due_ns = Peer::now_ns() + ms_ns(core_.redial_ms);
                    }
                }
                std::lock_guard<std::mutex> lk(mu_);
                returns_running_--;
                wd_cv_.notify_all();  // a redial may have waited for the worker or for this peer
            },
            [this, peer] {
                peer->attempting = false;
                peer->return_due_ns = Peer::now_ns() + ms_ns(core_.redial_ms);
                returns_running_--;
            });
    }
}

void Transport::return_to_preferred(const std::shared_ptr<Peer> &p) {
    const char *was;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (p->removed || closed_ || p->state != Peer::Link::up || !p->fallback) {
            p->attempting = false;
            return;
        }
        was = p->backend;
    }
    std::shared_ptr<BackendPeer> link, unused;
    const char *backend = "";
    bool fell_back = false;
    int code = 0;
    std::string why;
    try {
        link = connect_link(p->id, *p->meta, &p->return_off, p.get(), &backend, was, &fell_back);
    } catch (...) {
        code = failure_of(std::current_exception(), &why);
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        p->attempting = false;
        const int64_t now = Peer::now_ns();
        if (p->removed || closed_ || p->state != Peer::Link::up || !p->fallback || p->timed_out.load() ||
            p->backend != was || p->link->broken()) {
            // Gone, or down (a reconnection now chooses the path): the link
            // was never used.
            unused = std::move(link);
        } else if (!link) {
            p->return_attempts++;
            const uint32_t factor = redial_factor(p->return_attempts);
            p->return_due_ns = now + ms_ns(uint64_t{core_.redial_ms} * factor);
            if (worth_a_warning(p->return_attempts))
                KVX_LOG_PEER(info, p->id.c_str(), "peer '%s': still on %s: return attempt %u to a preferred path "
                             "failed (%s; %s); next in %llu ms", p->id.c_str(), was, p->return_attempts,
                             error_name(code), why.c_str(), (unsigned long long)core_.redial_ms * factor);
        } else {
            // From here on writes go to the new link; the old one finishes
            // what it carries and is shut down once that is all reported.
            Peer::Retired old{std::move(p->link), p->link_from_id, next_id_, p->link_left, now};
            KVX_LOG_PEER(warn, p->id.c_str(), "peer '%s': back on %s (was %s) after %lld ms on %s (%u failed return "
                         "attempts); %llu transfers in flight on %s finish there", p->id.c_str(), backend, was,
                         (long long)((now - p->landed_ns) / 1000000), was, p->return_attempts,
                         (unsigned long long)old.left, was);
            p->link = std::move(link);
            p->backend = backend;
            landed_locked(*p, fell_back);
            if (old.left == 0) {
                unused = std::move(old.link);
            } else {
                p->retired.push_back(std::move(old));
                retired_links_++;
            }
        }
    }
    if (unused) unused->shutdown();
}

void Transport::redial(const std::shared_ptr<Peer> &p) {
    std::vector<std::shared_ptr<BackendPeer>> old;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (p->removed || closed_) return;
        // Links a return left behind go too: every transfer in flight when
        // the peer went down fails (docs/semantics.md), and no stall timer
        // watches a peer that is down.
        old = links_locked(*p);  // still listed while they shut down: a removal waits for them
    }
    // The failed link's transfers are reported (failed) and nothing of it
    // lands once this returns: the new link starts from a clean slate.
    for (auto &l : old) l->shutdown();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!p->redial_off.load()) retired_links_ -= p->retired.size();  // else stop_redial_locked() did
        p->retired.clear();
    }
    std::shared_ptr<BackendPeer> link;
    const char *backend = "";
    int code = 0;
    std::string why;
    const int64_t t0 = Peer::now_ns();
    bool fell_back = false;
    try {
        link = connect_link(p->id, *p->meta, &p->redial_off, p.get(), &backend, nullptr, &fell_back);
    } catch (...) {
        code = failure_of(std::current_exception(), &why);
    }
    std::unique_lock<std::mutex> lk(mu_);
    p->attempting = false;
    if (p->removed || closed_ || p->state != Peer::Link::down) {
        lk.unlock();
        if (link) link->shutdown();  // never used
        return;
    }
    const int64_t now = Peer::now_ns();
    if (!link) {
        p->attempts++;
        p->error = code;
        p->reason = why;
        const uint32_t factor = redial_factor(p->attempts);
        p->due_ns = now + ms_ns(uint64_t{core_.redial_ms} * factor);
        if (worth_a_warning(p->attempts))
            KVX_LOG_PEER(warn, p->id.c_str(), "peer '%s': reconnection attempt %u failed after %lld ms (%s); next in %llu ms",
                    p->id.c_str(), p->attempts, (long long)((now - t0) / 1000000), why.c_str(),
                    (unsigned long long)core_.redial_ms * factor);
        else
            KVX_LOG_PEER(debug, p->id.c_str(), "peer '%s': reconnection attempt %u failed (%s)", p->id.c_str(), p->attempts, why.c_str());
        wd_cv_.notify_all();
        return;
    }
    const char *was = p->backend;
    KVX_LOG_PEER(warn, p->id.c_str(), "peer '%s': reconnected on %s%s%s after %lld ms down (%u failed attempts)", p->id.c_str(), backend,
            strcmp(was, backend) != 0 ? ", was " : "", strcmp(was, backend) != 0 ? was : "",
            (long long)((now - p->since_ns) / 1000000), p->attempts);
    p->link = std::move(link);
    p->backend = backend;
    landed_locked(*p, fell_back);
    p->state = Peer::Link::up;
    p->since_ns = now;
    p->attempts = 0;
    p->error = 0;
    p->reason.clear();
    p->reconnects++;
    down_peers_--;
    p->progress();
    p->timed_out.store(false);  // last: write_blocks reads it without mu_
}

void Transport::refuse_broken_locked(Peer &p) {
    const int64_t now = Peer::now_ns();
    const long long ago = (now - p.since_ns) / 1000000;
    // An application that keeps writing wants the peer back soon: its next
    // attempt is at most peer_redial_ms away (backoff is for idle peers).
    if (p.state == Peer::Link::down && !p.attempting && p.due_ns > now + ms_ns(core_.redial_ms)) {
        p.due_ns = now + ms_ns(core_.redial_ms);
        wd_cv_.notify_all();
    }
    if (p.state == Peer::Link::down)
        fail(KVX_EPEERBROKEN,
             "peer '%s': its connection failed %lld ms ago (%s); it is reconnecting in the background (%u attempts so "
             "far%s; kvx_get_peer_state), or remove and re-add it",
             p.id.c_str(), ago, p.reason.c_str(), p.attempts, p.attempting ? ", one under way" : "");
    if (p.state == Peer::Link::broken)
        fail(KVX_EPEERBROKEN, "peer '%s': its connection failed %lld ms ago (%s); remove and re-add the peer "
                              "(peer_redial_ms=0: no reconnection)", p.id.c_str(), ago, p.reason.c_str());
    fail(KVX_EPEERBROKEN, "peer '%s': %s just now; it reconnects in the background%s", p.id.c_str(),
         p.timed_out.load() ? "a transfer timed out" : "its connection failed",
         core_.redial_ms ? "" : " only with peer_redial_ms > 0: remove and re-add it");
}

Transport::PeerState Transport::peer_state_locked(const Peer &p) const {
    PeerState out;
    out.backend = p.backend;
    out.in_flight = p.outstanding.load();
    out.since_ns = p.since_ns;
    out.reconnects = p.reconnects;
    out.attempts = p.attempts;
    out.error = p.error;
    out.reason = p.reason;
    out.progress_ns = p.progress_ns.load();
    switch (p.state) {
    case Peer::Link::up:
        out.link = KVX_PEER_UP;
        // Broken, and the watchdog has not looked yet (it does within a slice).
        if (p.timed_out.load() || p.link->broken()) {
            out.link = core_.redial_ms ? KVX_PEER_RECONNECTING : KVX_PEER_BROKEN;
            out.error = p.timed_out.load() ? KVX_ETIMEDOUT : KVX_ECONNRESET;
            out.reason = p.timed_out.load() ? "a transfer timed out" : "its connection failed";
            out.since_ns = Peer::now_ns();
        }
        break;
    case Peer::Link::down:
        out.link = KVX_PEER_RECONNECTING;
        out.next_attempt_ns = p.attempting ? 0 : p.due_ns;
        break;
    case Peer::Link::broken:
        out.link = KVX_PEER_BROKEN;
        break;
    }
    return out;
}

Transport::PeerState Transport::peer_state(const std::string &id) const {
    std::shared_ptr<BackendPeer> link;
    PeerState out;
    {
        std::lock_guard<std::mutex> lk(mu_);
        const std::shared_ptr<Peer> &p = registered_locked(id);
        link = p->link;
        out = peer_state_locked(*p);
    }
    out.path = link->path();
    return out;
}

std::vector<std::pair<std::string, Transport::PeerState>> Transport::list_peers() const {
    std::vector<std::pair<std::string, PeerState>> out;
    std::vector<std::shared_ptr<BackendPeer>> links;
    {
        std::lock_guard<std::mutex> lk(mu_);
        check_open_locked();
        out.reserve(peers_.size() + registrations_.count_locked());
        for (const auto &[id, p] : peers_) {
            out.emplace_back(id, peer_state_locked(*p));
            links.push_back(p->link);
        }
        registrations_.each_locked([&](const std::string &id, int64_t began_ns) {
            PeerState st;
            st.link = KVX_PEER_CONNECTING;
            st.since_ns = began_ns;
            out.emplace_back(id, st);
        });
    }
    for (size_t i = 0; i < links.size(); i++) out[i].second.path = links[i]->path();
    std::sort(out.begin(), out.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
    return out;
}

void Transport::stats(kvx_stats *out, const char *peer_id) const {
    if constexpr (!kTelemetry) fail(KVX_ENOTSUP, "this libkvxfer was built without telemetry (KVX_TELEMETRY=OFF)");
    std::lock_guard<std::mutex> lk(mu_);
    if (peer_id == nullptr) {
        Telemetry::fill(out, telemetry_.total(), peers_.size(), registrations_.count_locked());
        return;
    }
    const Counters *c = telemetry_.find(peer_id);
    if (c == nullptr) fail(KVX_ENOENT, "peer '%s' is not registered: no statistics", peer_id);
    Telemetry::fill(out, *c, peers_.count(peer_id), registrations_.pending_locked(peer_id));
}

void Transport::count_end_locked(const OpState &op, Ending how, int status) {
    if constexpr (kTelemetry)
        telemetry_.ended(static_cast<Peer *>(op.owner)->stats.get(), op.bytes, how,
                         how == Ending::done ? Peer::now_ns() - op.t0_ns : -1, status);
}

}  // namespace kvx
