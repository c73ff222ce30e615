// Transport: peer registration (synchronous and asynchronous, replace,
// cancel) and telemetry. The data path's hooks into both stay in
// transport.cpp; what they call lives here.
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
    try {
        peer = connect_peer(r->id, m, &r->called_off);
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
        throw;
    }
    Error called_off{0, ""};
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!closed_ && r->current) {
            peer->stats = telemetry_.slot(r->id);
            telemetry_.connected(peer->stats.get(), Peer::now_ns() - t0);
            peers_[r->id] = peer;
            completions_[r->id].registered = true;
            registrations_.finish_locked(r, 0, "");
            return;
        }
        called_off = called_off_locked(*r);
        registrations_.finish_locked(r, called_off.code(), called_off.what());
    }
    peer->link->shutdown();  // never published: nothing of it was used
    throw called_off;
}

uint64_t Transport::add_peer_async(const std::string &id, const uint8_t *meta, size_t meta_len, uint64_t base_addr,
                                   uint64_t num_blocks, uint64_t block_len, unsigned flags) {
    if (flags & ~static_cast<unsigned>(KVX_PEER_REPLACE)) fail(KVX_EINVAL, "flags 0x%x has unknown bits", flags);
    auto m = std::make_shared<wire::AgentMetadata>(check_peer(id, meta, meta_len, base_addr, num_blocks, block_len));
    std::shared_ptr<Peer> replaced;
    uint64_t reg;
    {
        std::lock_guard<std::mutex> lk(mu_);
        Registrations::Ref r = reserve_locked(id, next_reg_, flags & KVX_PEER_REPLACE, &replaced);
        reg = next_reg_++;
        registrations_.submit_locked(r, [this, r, m] {
            try {
                connect_and_publish(r, *m);
            } catch (...) {  // recorded as the outcome
            }
        });
    }
    if (replaced) replaced->link->shutdown();  // its transfers fail, as on remove
    return reg;
}

Registrations::Status Transport::registration_status(uint64_t reg, int timeout_ms) {
    std::unique_lock<std::mutex> lk(mu_);
    return registrations_.wait(lk, reg, timeout_ms);
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

void Transport::count_end_locked(const OpState &op, Ending how) {
    if constexpr (kTelemetry)
        telemetry_.ended(static_cast<Peer *>(op.owner)->stats.get(), op.bytes, how,
                         how == Ending::done ? Peer::now_ns() - op.t0_ns : -1);
}

}  // namespace kvx
