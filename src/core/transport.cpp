#include "core/transport.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "registry/registry.h"
#include "core/fingerprint.h"
#include "core/hugepages.h"
#include "core/prewarm.h"
#include "util/error.h"
#include "util/log.h"
#include "wire/metadata.h"

namespace kvx {

namespace {

void random_bytes(void *p, size_t n) {
    if (RAND_bytes(static_cast<unsigned char *>(p), static_cast<int>(n)) != 1)
        fail(KVX_EINTERNAL, "OpenSSL RAND_bytes failed");
}

// The backends a transport may serve on, in order of preference: for "auto"
// every registered backend whose probe says it is usable (creation may still
// find one unusable: it is then left out); for a list, exactly those named,
// each of which must be usable.
std::vector<const BackendDesc *> choose_backends(const std::string &spec, const Options &o) {
    std::vector<const BackendDesc *> chosen;
    if (spec != "auto") {
        const std::vector<std::string> names = split_backend_list(spec);
        for (const BackendDesc *b : backend_registry())  // the registry's order is the preference
            if (std::find(names.begin(), names.end(), b->name) != names.end()) chosen.push_back(b);
        for (const std::string &n : names)
            if (!find_backend(n))
                fail(KVX_ENOTSUP, "backend '%s' is not available in this build of kvxfer %s", n.c_str(),
                     kvx_version_string());
        for (const BackendDesc *b : chosen) {
            std::string why;
            if (!b->probe(o, &why)) fail(KVX_ENOTSUP, "backend %s: %s", b->name, why.c_str());
        }
        return chosen;
    }
    for (const BackendDesc *b : backend_registry()) {
        std::string why;
        if (b->probe(o, &why)) chosen.push_back(b);
        else KVX_LOG(info, "backend auto: %s not usable here (%s)", b->name, why.c_str());
    }
    if (chosen.empty()) fail(KVX_ENOTSUP, "backend auto: no backend is usable here");
    return chosen;
}

// Fails when a remote index appears twice. Small batches compare pairwise and
// large ones mark a bitmap of the peer's blocks (sorting only when that map
// would dwarf the batch): no allocation for the common case, O(n) for large.
constexpr uint64_t kMaxBlocksPerCall = UINT32_MAX;

void check_distinct(const std::string &peer_id, const uint64_t *remote, size_t n, uint64_t num_blocks) {
    auto twice = [&](uint64_t v) {
        fail(KVX_EINVAL, "peer '%s': remote index %llu appears more than once", peer_id.c_str(),
             (unsigned long long)v);
    };
    if (n <= 32) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (remote[i] == remote[j]) twice(remote[i]);
        return;
    }
    if (num_blocks / 64 <= 4 * n) {
        std::vector<uint64_t> seen((num_blocks + 63) / 64);  // indexes were checked < num_blocks
        for (size_t i = 0; i < n; i++) {
            const uint64_t bit = uint64_t{1} << (remote[i] % 64);
            if (seen[remote[i] / 64] & bit) twice(remote[i]);
            seen[remote[i] / 64] |= bit;
        }
        return;
    }
    std::vector<uint64_t> sorted(remote, remote + n);
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) twice(*dup);
}

}  // namespace

Transport::Transport(void *base, uint64_t num_blocks, uint64_t block_len, const char *config_json,
                     const OptionBag *opts) {
    if (base == nullptr) fail(KVX_EINVAL, "region base is NULL");
    if (num_blocks == 0) fail(KVX_EINVAL, "num_blocks is 0");
    if (block_len == 0) fail(KVX_EINVAL, "block_len is 0");
    if (num_blocks > UINT64_MAX / block_len || num_blocks * block_len > static_cast<uint64_t>(PTRDIFF_MAX) ||
        reinterpret_cast<uintptr_t>(base) > UINTPTR_MAX - num_blocks * block_len)
        fail(KVX_EOVERFLOW, "num_blocks %llu x block_len %llu overflows the address space",
             (unsigned long long)num_blocks, (unsigned long long)block_len);
    region_ = Region{static_cast<uint8_t *>(base), num_blocks, block_len};
    if (opts)
        for (const auto &[k, v] : opts->kv) validate_option(k, v);
    options_ = Options(opts, all_option_tables());
    core_ = CoreOptions::from(options_);
    fingerprint_ = config_fingerprint(config_json);
    if (core_.hugepages) {  // first: prewarm then reads the new pages
        const Clock::time_point t0 = Clock::now();
        const HugepageReport h = hugepages_region(region_.base, num_blocks * block_len);
        KVX_LOG(info, "region_hugepages: %llu of the region's %llu bytes in whole %llu-byte pages on huge pages, %lld ms%s%s",
                (unsigned long long)h.huge, (unsigned long long)h.interior, (unsigned long long)h.page,
                (long long)std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(),
                h.note.empty() ? "" : ": ", h.note.c_str());
    }
    if (core_.prewarm) {
        const Clock::time_point t0 = Clock::now();
        prewarm_region(region_.base, num_blocks * block_len, block_len);
        KVX_LOG(info, "region_prewarm: %llu bytes read by the kernel in %lld ms",
                (unsigned long long)(num_blocks * block_len),
                (long long)std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
    }

    BackendContext ctx;
    ctx.region = region_;
    ctx.options = &options_;
    random_bytes(&ctx.identity.instance_id, sizeof ctx.identity.instance_id);
    random_bytes(ctx.identity.secret.data(), ctx.identity.secret.size());
    ctx.identity.fingerprint = handshake::fingerprint_bytes(fingerprint_);
    loop_ = std::make_unique<EventLoop>("kvx-loop");
    loop_->start();
    ctx.loop = loop_.get();
    start_backends(ctx);

    wire::AgentMetadata m;
    m.base_addr = reinterpret_cast<uintptr_t>(base);
    m.num_blocks = num_blocks;
    m.block_len = block_len;
    m.instance_id = ctx.identity.instance_id;
    m.secret = ctx.identity.secret;
    m.fingerprint = fingerprint_;
    for (const auto &b : backends_) m.sections.push_back(b->describe());
    metadata_ = wire::encode_metadata(m);
    watchdog_ = std::thread([this] { watchdog(); });
    registrations_.start();
}

void Transport::start_backends(const BackendContext &ctx) {
    struct StopOnThrow {
        Transport *t;
        bool armed = true;
        ~StopOnThrow() {
            if (!armed) return;
            for (auto &b : t->backends_) b->shutdown();
            t->loop_->stop();
        }
    } guard{this};
    std::string why, skipped;
    for (const BackendDesc *d : choose_backends(core_.backend, options_)) {
        if (std::unique_ptr<Backend> b = d->create(ctx, &why)) {
            backends_.push_back(std::move(b));
            continue;
        }
        if (core_.backend != "auto") fail(KVX_ENOTSUP, "backend %s: %s", d->name, why.c_str());
        KVX_LOG(info, "backend %s: not usable (%s)", d->name, why.c_str());
        skipped += strfmt("%s%s: %s", skipped.empty() ? "" : "; ", d->name, why.c_str());
    }
    if (backends_.empty()) fail(KVX_ENOTSUP, "backend %s: %s", core_.backend.c_str(), skipped.c_str());
    for (auto &b : backends_) backend_names_ += strfmt("%s%s", backend_names_.empty() ? "" : ",", b->name());
    KVX_LOG(info, "transport serves on %s", backend_names_.c_str());
    guard.armed = false;
}

Transport::~Transport() { close(); }

const std::vector<uint8_t> &Transport::metadata() const {
    std::lock_guard<std::mutex> lk(mu_);
    check_open_locked();
    return metadata_;
}

void Transport::check_open_locked() const {
    if (closed_) fail(KVX_ECLOSED, "transport is closed");
}

void Transport::close() {
    std::map<std::string, std::shared_ptr<Peer>> peers;
    {
        std::unique_lock<std::mutex> lk(mu_);
        if (closed_) {  // another close is under way or done: return once it is done
            close_cv_.wait(lk, [&] { return close_done_; });
            return;
        }
        closed_ = true;
        peers.swap(peers_);
        for (auto &[id, p] : peers) stop_redial_locked(*p);
        registrations_.cancel_all_locked(KVX_ECLOSED, "the transport was closed");
        wd_cv_.notify_all();
        ready_.close(lk);  // threads in wait() leave with KVX_ECLOSED before close goes on
    }
    // Set whatever happens below, or a later close would wait for good.
    struct Done {
        Transport *t;
        ~Done() {
            std::lock_guard<std::mutex> lk(t->mu_);
            t->close_done_ = true;
            t->close_cv_.notify_all();
        }
    } done{this};
    shut_down(peers);
    std::lock_guard<std::mutex> lk(mu_);
    inflight_.for_each([&](const OpState &op) { count_end_locked(op, Ending::failed, KVX_ECANCELED); });
    inflight_.clear();
    listed_.clear();
    completions_.clear();
}

void Transport::shut_down(std::map<std::string, std::shared_ptr<Peer>> &peers) {
    if (watchdog_.joinable()) watchdog_.join();
    registrations_.shutdown();  // connection attempts (and reconnections), called off above, end within a slice
    std::vector<std::shared_ptr<BackendPeer>> links;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto &[id, p] : peers)
            for (auto &l : links_locked(*p)) links.push_back(std::move(l));
    }
    for (auto &l : links) l->shutdown();  // no reconnection or return runs now to replace one
    for (auto &b : backends_) b->shutdown();
    loop_->stop();
}

void Transport::add_peer(const std::string &id, const uint8_t *meta, size_t meta_len, uint64_t base_addr,
                         uint64_t num_blocks, uint64_t block_len) {
    wire::AgentMetadata m = check_peer(id, meta, meta_len, base_addr, num_blocks, block_len);
    Registrations::Ref r;
    {
        std::lock_guard<std::mutex> lk(mu_);
        r = reserve_locked(id, 0, false, nullptr);
        registrations_.sync_began_locked();
    }
    // Ends the attempt for close, which waits for it: the last this thread
    // does with the transport (a link it made but did not publish is shut
    // down by then).
    struct Ended {
        Transport *t;
        ~Ended() {
            std::lock_guard<std::mutex> lk(t->mu_);
            t->registrations_.sync_ended_locked();
        }
    } ended{this};
    connect_and_publish(r, m);
}

// Everything about a new peer that can be checked without connecting.
wire::AgentMetadata Transport::check_peer(const std::string &id, const uint8_t *meta, size_t meta_len,
                                          uint64_t base_addr, uint64_t num_blocks, uint64_t block_len) {
    if (id.empty()) fail(KVX_EINVAL, "peer id is empty");
    if (id.size() > KVX_PEER_ID_MAX)
        fail(KVX_EINVAL, "peer id of %zu bytes is longer than %d", id.size(), KVX_PEER_ID_MAX);
    {
        std::lock_guard<std::mutex> lk(mu_);
        check_open_locked();
    }
    wire::AgentMetadata m;
    try {
        m = wire::decode_metadata(meta, meta_len);
    } catch (const Error &e) {
        fail(e.code(), "peer '%s': %s", id.c_str(), e.what());
    }
    if (block_len != region_.block_len)
        fail(KVX_EGEOMETRY, "peer '%s': block_len %llu differs from the local block_len %llu", id.c_str(),
             (unsigned long long)block_len, (unsigned long long)region_.block_len);
    if (m.base_addr != base_addr || m.num_blocks != num_blocks || m.block_len != block_len)
        fail(KVX_EGEOMETRY,
             "peer '%s': geometry (base_addr 0x%llx, num_blocks %llu, block_len %llu) differs from its metadata "
             "(0x%llx, %llu, %llu)",
             id.c_str(), (unsigned long long)base_addr, (unsigned long long)num_blocks, (unsigned long long)block_len,
             (unsigned long long)m.base_addr, (unsigned long long)m.num_blocks, (unsigned long long)m.block_len);
    if (!fingerprint_.empty() && !m.fingerprint.empty() && fingerprint_ != m.fingerprint) {
        KVX_LOG_PEER(warn, id.c_str(), "peer '%s': refused: its config fingerprint %s differs from the local %s",
                     id.c_str(), m.fingerprint.c_str(), fingerprint_.c_str());
        fail(KVX_EFINGERPRINT, "peer '%s': config fingerprint %s differs from the local %s", id.c_str(),
             m.fingerprint.c_str(), fingerprint_.c_str());
    }
    candidates(id, m, nullptr);  // no backend in common: refused before connecting
    return m;
}

std::shared_ptr<Transport::Peer> Transport::connect_peer(const std::string &id, const wire::AgentMetadata &m,
                                                         const std::atomic<bool> *called_off, bool *fell_back) {
    auto peer = std::make_shared<Peer>();
    peer->t = this;
    peer->id = id;
    peer->num_blocks = m.num_blocks;
    peer->meta = std::make_shared<const wire::AgentMetadata>(m);
    peer->link = connect_link(id, m, called_off, peer.get(), &peer->backend, nullptr, fell_back);
    peer->since_ns = Peer::now_ns();
    return peer;
}

std::shared_ptr<BackendPeer> Transport::connect_link(const std::string &id, const wire::AgentMetadata &m,
                                                     const std::atomic<bool> *called_off, CompletionSink *sink,
                                                     const char **backend, const char *better_than,
                                                     bool *fell_back) {
    PeerContext pc;
    pc.peer_id = id;
    pc.meta = &m;
    pc.deadline = net::Deadline(Clock::now() + std::chrono::milliseconds(core_.connect_timeout_ms), called_off);
    pc.sink = sink;
    std::string skipped;
    std::vector<Candidate> cands = candidates(id, m, &skipped);
    if (better_than) {  // a return attempt: the link's own path and those after it are not tried
        auto own = std::find_if(cands.begin(), cands.end(),
                                [&](const Candidate &c) { return strcmp(c.backend->name(), better_than) == 0; });
        // (not listed at all: nothing is known to be better; no attempt)
        cands.erase(own == cands.end() ? cands.begin() : own, cands.end());
    }
    if (fell_back) *fell_back = false;
    for (size_t i = 0; i < cands.size(); i++) {
        Backend &b = *cands[i].backend;
        pc.section = cands[i].section;
        std::string why;
        if (!b.applicable(pc, &why)) {
            skipped += strfmt("%s%s: %s", skipped.empty() ? "" : "; ", b.name(), why.c_str());
            continue;
        }
        std::shared_ptr<BackendPeer> link;
        try {
            link = b.connect(pc);
        } catch (const Error &e) {
            // Called off (close, remove): no next path; the caller reports why.
            if (i + 1 == cands.size() || pc.deadline.cancelled()) throw;
            if (!core_.fallback)
                fail(e.code(), "%s (backend %s; peer_backend_fallback=0, so no other path was tried)", e.what(),
                     b.name());
            // A return attempt that fails is routine while the path is away: not worth a warning.
            if (better_than)
                KVX_LOG_PEER(debug, id.c_str(), "peer '%s': backend %s failed to connect (%s): trying the next path",
                             id.c_str(), b.name(), e.what());
            else
                KVX_LOG_PEER(warn, id.c_str(), "peer '%s': backend %s failed to connect (%s): trying the next path",
                             id.c_str(), b.name(), e.what());
            skipped += strfmt("%s%s: failed (%s)", skipped.empty() ? "" : "; ", b.name(), e.what());
            if (fell_back) *fell_back = true;
            continue;
        }
        *backend = b.name();
        const char *path = link->path();
        KVX_LOG_PEER(info, id.c_str(), "peer '%s': uses backend %s%s%s%s%s%s", id.c_str(), b.name(), *path ? " (" : "", path,
                *path ? ")" : "", skipped.empty() ? "" : "; not ", skipped.c_str());
        return link;
    }
    fail(KVX_ENOTSUP, "peer '%s': no path both sides offer applies (%s)", id.c_str(), skipped.c_str());
}

// Our backends (in order of preference) that the peer offers too, with its
// section of each, checked. *not_offered names ours the peer lacks.
std::vector<Transport::Candidate> Transport::candidates(const std::string &id, const wire::AgentMetadata &m,
                                                        std::string *not_offered) {
    std::vector<Candidate> out;
    std::string ours;
    for (auto &b : backends_) {
        const BackendDesc *d = find_backend(b->name());
        const wire::Section *s = d ? m.find(d->id) : nullptr;
        ours += strfmt("%s%s", ours.empty() ? "" : ", ", b->name());
        if (!s) {
            if (not_offered)
                *not_offered += strfmt("%s%s: not offered by the peer", not_offered->empty() ? "" : "; ", b->name());
            continue;
        }
        try {
            d->check_section(*s, m);
        } catch (const Error &e) {
            fail(e.code(), "peer '%s': %s", id.c_str(), e.what());
        }
        out.push_back(Candidate{b.get(), s});
    }
    if (!out.empty()) return out;
    std::string theirs;
    for (const wire::Section &s : m.sections) {
        const BackendDesc *d = nullptr;
        for (const BackendDesc *c : backend_registry()) d = c->id == s.type ? c : d;
        theirs += strfmt("%s%s", theirs.empty() ? "" : ", ", d ? d->name : strfmt("#%u", s.type).c_str());
    }
    fail(KVX_ENOTSUP, "peer '%s' offers no backend this transport serves on (ours: %s; theirs: %s)", id.c_str(),
         ours.c_str(), theirs.empty() ? "none" : theirs.c_str());
}

void Transport::remove_peer(const std::string &id) {
    std::shared_ptr<Peer> peer;
    std::vector<std::shared_ptr<BackendPeer>> links;
    {
        std::lock_guard<std::mutex> lk(mu_);
        check_open_locked();
        auto it = peers_.find(id);
        // A registration of id in progress never publishes now.
        const bool cancelled = registrations_.cancel_locked(id, KVX_ECANCELED, "the peer was removed");
        telemetry_.forget(id);
        if (auto q = completions_.find(id); q != completions_.end()) q->second.registered = false;
        if (it == peers_.end()) {
            if (cancelled) return;
            fail(KVX_ENOENT, "peer '%s' is not registered", id.c_str());
        }
        peer = std::move(it->second);
        peer->removed = true;
        stop_redial_locked(*peer);
        links = links_locked(*peer);  // a reconnection or return no longer replaces one
        peers_.erase(it);
    }
    // Its pending ops come back failed through complete(): after this
    // returns none of its transfers is in flight any more (nor on a link a
    // return left behind).
    for (auto &l : links) l->shutdown();
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (auto q = completions_.find(id); q != completions_.end()) forget_drained_locked(q);
    }
    // Transfers still being submitted are not the backend's: submit() fails
    // them on the shut-down link. (submitting first: each of those counts in
    // it until after it left outstanding, and none is added after the erase.)
    const uint64_t racing = peer->submitting.load();
    if (uint64_t left = peer->outstanding.load(); left > racing)
        KVX_LOG_PEER(error, id.c_str(), "peer '%s': backend %s left %llu transfers unreported at remove", id.c_str(),
                peer->backend, (unsigned long long)(left - racing));
}

// The registered peer id (mu_ held); KVX_ECLOSED, or KVX_ENOENT naming a
// registration still connecting.
const std::shared_ptr<Transport::Peer> &Transport::registered_locked(const std::string &id) const {
    check_open_locked();
    auto it = peers_.find(id);
    if (it == peers_.end())
        fail(KVX_ENOENT, "peer '%s' is not registered%s", id.c_str(),
             registrations_.pending_locked(id) ? " (its registration is still connecting)" : "");
    return it->second;
}

void Transport::peer_backend(const std::string &id, const char **backend, const char **path) const {
    std::lock_guard<std::mutex> lk(mu_);
    const std::shared_ptr<Peer> &peer = registered_locked(id);
    *backend = peer->backend;
    *path = peer->link->path();  // (the link's path is fixed; a reconnection replaces the link under mu_)
}

void Transport::peer_rails(const std::string &id, std::vector<RailStats> *out) const {
    std::shared_ptr<BackendPeer> link;
    {
        std::lock_guard<std::mutex> lk(mu_);
        link = registered_locked(id)->link;
    }
    link->rails(out);  // the link's own lock
}

uint64_t Transport::write_blocks(const std::string &peer_id, const uint64_t *local, const uint64_t *remote,
                                 size_t n) {
    if (n > 0 && (local == nullptr || remote == nullptr)) fail(KVX_EINVAL, "index array is NULL with n = %zu", n);
    if (n > kMaxBlocksPerCall)  // a transfer's runs count in 32 bits
        fail(KVX_EINVAL, "n = %zu blocks in one call: at most %llu", n, (unsigned long long)kMaxBlocksPerCall);
    std::shared_ptr<Peer> peer;
    std::shared_ptr<BackendPeer> link;
    bool up;
    {
        std::lock_guard<std::mutex> lk(mu_);
        peer = registered_locked(peer_id);
        link = peer->link;
        up = peer->state == Peer::Link::up;
    }
    if (!up || peer->timed_out.load() || link->broken()) {
        std::lock_guard<std::mutex> lk(mu_);
        check_open_locked();  // a close racing us breaks links: report the close
        refuse_broken_locked(*peer);
    }

    const uint64_t bl = region_.block_len;
    Op op;
    op.runs.reserve(n);
    for (size_t i = 0; i < n; i++) {
        if (local[i] >= region_.num_blocks)
            fail(KVX_ERANGE, "peer '%s': local index %llu (position %zu) >= %llu blocks", peer_id.c_str(),
                 (unsigned long long)local[i], i, (unsigned long long)region_.num_blocks);
        if (remote[i] >= peer->num_blocks)
            fail(KVX_ERANGE, "peer '%s': remote index %llu (position %zu) >= %llu blocks", peer_id.c_str(),
                 (unsigned long long)remote[i], i, (unsigned long long)peer->num_blocks);
        if (i > 0 && local[i] == local[i - 1] + 1 && remote[i] == remote[i - 1] + 1) {
            op.runs.back().len += bl;
        } else {
            op.runs.push_back(Run{local[i] * bl, remote[i] * bl, bl});
        }
    }
    if (n > 1) check_distinct(peer_id, remote, n, peer->num_blocks);
    op.bytes = n * bl;

    op.state = OpRef::make();
    op.state->owner = peer.get();
    op.state->bytes = op.bytes;
    op.state->t0_ns = kTelemetry ? Peer::now_ns() : 0;
    uint64_t id;
    {
        std::lock_guard<std::mutex> lk(mu_);
        // Still registered: nothing is added to a peer whose remove (or
        // replace) began: its link may be shut down and its count checked.
        check_open_locked();
        if (peer->removed) fail(KVX_ENOENT, "peer '%s' was removed during the call", peer_id.c_str());
        // Went down meanwhile: refused, registering nothing. Reconnected
        // meanwhile: the new link takes it.
        if (peer->state != Peer::Link::up || peer->timed_out.load()) refuse_broken_locked(*peer);
        link = peer->link;
        id = op.state->id = next_id_++;
        if (n == 0) {
            queue_locked(peer_id, id, 0);  // done at once
            telemetry_.ended(peer->stats.get(), 0, Ending::done, -1, 0, false);
            return id;
        }
        inflight_.insert(op.state);
        telemetry_.submitted(peer->stats.get(), op.bytes);
        // Idle until now: the stall clock starts with this work. Restarted
        // before the work counts: the watchdog reads both without mu_, and
        // one that saw the count first could take the old clock for a stall
        // (it did: a peer never given work before has a clock of 0).
        if (peer->outstanding.load() == 0) peer->progress();
        peer->outstanding.fetch_add(1);
        peer->link_left++;
        peer->submitting.fetch_add(1);
    }
    struct Submitted {
        Peer &p;
        ~Submitted() { p.submitting.fetch_sub(1); }
    } submitted{*peer};
    link->submit(std::move(op));
    return id;
}

void Transport::complete(Peer &peer, uint64_t id, int status) {
    if (status == 0) peer.progress();
    std::lock_guard<std::mutex> lk(mu_);
    if (!inflight_.find(id)) return;  // cancelled (immediate)
    finish_locked(id, peer, status);
}

void Transport::finish_locked(uint64_t id, Peer &peer, int status) {
    status = failure_cause_locked(peer, status);
    count_end_locked(*inflight_.find(id), status == 0 ? Ending::done : Ending::failed, status);
    inflight_.erase(id);
    peer.outstanding.fetch_sub(1);
    left_link_locked(peer, id);
    queue_locked(peer.id, id, status);
    if (status != 0) KVX_LOG_PEER(debug, peer.id.c_str(), "transfer %llu to peer '%s' failed: %s", (unsigned long long)id, peer.id.c_str(),
                             error_name(status));
}

void Transport::left_link_locked(Peer &p, uint64_t id) {
    if (id >= p.link_from_id) {
        p.link_left--;
        return;
    }
    // A link a return left behind (or one a reconnection shut down: in none).
    for (Peer::Retired &r : p.retired)
        if (id >= r.from_id && id < r.below_id) {
            r.last_end_ns = Peer::now_ns();
            if (--r.left == 0) wd_cv_.notify_all();  // its last: the watchdog shuts it down
            return;
        }
}

// What a failed transfer reports (kvx_result): the core knows better than
// the backend why it stopped it. A backend fails what a removal or a stall
// abort stopped with its own code (a reset, a halt); those say KVX_ECANCELED
// and KVX_ETIMEDOUT. A backend's KVX_ECANCELED (a copy it halted) is a
// failed connection unless the peer was removed.
int Transport::failure_cause_locked(const Peer &peer, int status) const {
    if (status == 0) return 0;
    if (peer.removed) return KVX_ECANCELED;
    if (peer.timed_out.load()) return KVX_ETIMEDOUT;
    if (status == KVX_ECANCELED || status == KVX_EPEERBROKEN) return KVX_ECONNRESET;
    return status;
}

void Transport::queue_locked(const std::string &peer_id, uint64_t id, int status) {
    auto it = completions_.try_emplace(peer_id).first;
    if (status == 0) it->second.done.push_back(id);
    else it->second.failed.push_back(Failed{id, status});
    ready_.added(1);
    if (!it->second.listed) {
        it->second.listed = true;
        it->second.slot = listed_.size();
        listed_.push_back(it);
    }
}

void Transport::forget_drained_locked(CompletionsMap::iterator it) {
    if (!it->second.empty() || it->second.registered) return;
    if (it->second.listed) {
        listed_[it->second.slot] = completions_.end();
        if (++unlisted_ * 2 > listed_.size()) compact_listed_locked();
    }
    completions_.erase(it);
}

void Transport::compact_listed_locked() {
    size_t keep = 0;
    for (CompletionsMap::iterator it : listed_) {
        if (it == completions_.end()) continue;
        it->second.slot = keep;
        listed_[keep++] = it;
    }
    listed_.resize(keep);
    unlisted_ = 0;
}

namespace {

// Moves ids from the front of q to out[*n..cap).
void drain(std::deque<uint64_t> &q, uint64_t *out, size_t cap, size_t *n) {
    for (; *n < cap && !q.empty(); q.pop_front()) out[(*n)++] = q.front();
}

void drain(std::deque<Transport::Failed> &q, uint64_t *out, size_t cap, size_t *n) {
    for (; *n < cap && !q.empty(); q.pop_front()) out[(*n)++] = q.front().id;
}

// Results: done ids, then failed ones, into out[*n..cap).
void drain_results(Transport::Completions &c, kvx_result *out, size_t cap, size_t *n) {
    for (; *n < cap && !c.done.empty(); c.done.pop_front()) out[(*n)++] = kvx_result{c.done.front(), 0, 0};
    for (; *n < cap && !c.failed.empty(); c.failed.pop_front())
        out[(*n)++] = kvx_result{c.failed.front().id, c.failed.front().status, 0};
}

}  // namespace

void Transport::poll(const char *peer_id, uint64_t *done, size_t done_cap, size_t *n_done, uint64_t *failed,
                     size_t failed_cap, size_t *n_failed) {
    if ((done == nullptr && done_cap) || (failed == nullptr && failed_cap))
        fail(KVX_EINVAL, "poll: NULL array with non-zero capacity");
    size_t nd = 0, nf = 0;
    std::lock_guard<std::mutex> lk(mu_);
    check_open_locked();
    if (peer_id) {
        auto it = completions_.find(peer_id);
        if (it != completions_.end()) {
            drain(it->second.done, done, done_cap, &nd);
            drain(it->second.failed, failed, failed_cap, &nf);
            forget_drained_locked(it);
        }
    } else {
        drain_listed_locked([&](Completions &c) {
            drain(c.done, done, done_cap, &nd);
            drain(c.failed, failed, failed_cap, &nf);
        });
    }
    ready_.taken(nd + nf);
    *n_done = nd;
    *n_failed = nf;
}

size_t Transport::poll_results(const char *peer_id, kvx_result *out, size_t cap) {
    if (out == nullptr && cap) fail(KVX_EINVAL, "poll_results: NULL array with capacity %zu", cap);
    size_t n = 0;
    std::lock_guard<std::mutex> lk(mu_);
    check_open_locked();
    if (peer_id) {
        auto it = completions_.find(peer_id);
        if (it != completions_.end()) {
            drain_results(it->second, out, cap, &n);
            forget_drained_locked(it);
        }
    } else {
        drain_listed_locked([&](Completions &c) { drain_results(c, out, cap, &n); });
    }
    ready_.taken(n);
    return n;
}

size_t Transport::wait(int timeout_ms) {
    if (timeout_ms < -1) fail(KVX_EINVAL, "wait: timeout_ms %d is neither -1 nor >= 0", timeout_ms);
    std::unique_lock<std::mutex> lk(mu_);
    check_open_locked();
    if (ready_.count() == 0 && timeout_ms != 0 && !ready_.wait(lk, timeout_ms))
        fail(KVX_ECLOSED, "transport was closed while waiting");
    return ready_.count();
}

int Transport::completion_fd() {
    std::lock_guard<std::mutex> lk(mu_);
    check_open_locked();
    return ready_.fd();
}

// poll(NULL): the listed queues in the order they got ids; those drained
// leave the list (and the map, if their peer is gone), and so do the slots of
// queues erased meanwhile.
template <class F>
void Transport::drain_listed_locked(F &&drain_one) {
    size_t keep = 0;
    for (CompletionsMap::iterator it : listed_) {
        if (it == completions_.end()) continue;  // erased by poll(peer) or remove
        drain_one(it->second);
        if (!it->second.empty()) {
            it->second.slot = keep;
            listed_[keep++] = it;
            continue;
        }
        it->second.listed = false;
        forget_drained_locked(it);
    }
    listed_.resize(keep);
    unlisted_ = 0;
}

size_t Transport::cancel(const uint64_t *ids, size_t n, int mode, uint64_t *inflight) {
    if (mode != KVX_CANCEL_IMMEDIATE && mode != KVX_CANCEL_WAIT) fail(KVX_EINVAL, "cancel: mode %d is unknown", mode);
    if (n > 0 && ids == nullptr) fail(KVX_EINVAL, "cancel: ids is NULL with n = %zu", n);
    if (mode == KVX_CANCEL_WAIT && n > 0 && inflight == nullptr) fail(KVX_EINVAL, "cancel: wait mode needs an output array");
    // Ids that finished but were not polled yet: released, never reported
    // (vLLM's handle release succeeds for a finished transfer).
    std::unordered_set<uint64_t> finished;
    size_t still = 0;
    {
        std::lock_guard<std::mutex> lk(mu_);
        check_open_locked();
        std::unordered_set<uint64_t> seen;
        seen.reserve(n);
        for (size_t i = 0; i < n; i++) {
            if (!seen.insert(ids[i]).second) continue;  // an id given twice counts once
            OpState *op = inflight_.find(ids[i]);
            if (op == nullptr) {
                finished.insert(ids[i]);  // or unknown, or reported: then nothing matches
                continue;
            }
            // Not started: the backend drops it unseen. Started: it is on the
            // wire and surfaces in poll (wait), or is forgotten (immediate).
            bool dropped = op->claim_unstarted();
            if (mode == KVX_CANCEL_IMMEDIATE && !dropped) op->forget();
            if (mode == KVX_CANCEL_IMMEDIATE || dropped) {
                Peer &owner = *static_cast<Peer *>(op->owner);
                owner.outstanding.fetch_sub(1);
                left_link_locked(owner, ids[i]);
                count_end_locked(*op, Ending::cancelled);
                inflight_.erase(ids[i]);
            } else {
                inflight[still++] = ids[i];
            }
        }
        if (!finished.empty()) drop_unpolled_locked(finished);
    }
    return still;
}

void Transport::drop_unpolled_locked(const std::unordered_set<uint64_t> &ids) {
    auto gone = [&](uint64_t id) { return ids.count(id) != 0; };
    // Every queue holding ids is listed; those emptied here go at the next poll.
    size_t dropped = 0;
    for (CompletionsMap::iterator it : listed_) {
        if (it == completions_.end()) continue;
        dropped += std::erase_if(it->second.done, gone);
        dropped += std::erase_if(it->second.failed, [&](const Failed &f) { return gone(f.id); });
    }
    ready_.taken(dropped);
}

}  // namespace kvx
