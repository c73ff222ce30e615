#include "instant_backend.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "registry/registry.h"
#include "kvxfer.h"

namespace kvx::instant {

namespace {

constexpr uint16_t kSectionId = 0x7e57;  // outside the range of shipped backends
std::atomic<bool> g_hold{false};
std::atomic<int> g_delay_ms{0};

class InstantPeer;
std::mutex g_peers_mu;
std::vector<InstantPeer *> g_peers;  // live ones, for release()

class InstantPeer final : public BackendPeer {
public:
    explicit InstantPeer(CompletionSink *sink) : sink_(sink) {
        std::lock_guard<std::mutex> lk(g_peers_mu);
        g_peers.push_back(this);
    }
    ~InstantPeer() override {
        std::lock_guard<std::mutex> lk(g_peers_mu);
        std::erase(g_peers, this);
    }
    // Its held transfers, to complete (release()).
    CompletionSink *take_held(std::vector<OpRef> *out) {
        std::lock_guard<std::mutex> lk(mu_);
        out->swap(held_);
        return sink_;
    }
    void submit(Op op) override {
        if (int ms = g_delay_ms.load(std::memory_order_relaxed)) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        if (!op.state->try_start()) return;  // cancelled before it started
        // Shut down: failed at once, as the real backends do.
        int status = stopped_.load() ? KVX_ECLOSED : 0;
        if (status == 0 && g_hold.load(std::memory_order_relaxed)) {
            std::lock_guard<std::mutex> lk(mu_);
            if (!stopped_.load()) {
                held_.push_back(std::move(op.state));
                return;
            }
            status = KVX_ECLOSED;
        }
        if (op.state->report()) sink_->complete(op.state->id, status);
    }
    bool broken() const override { return false; }
    void abort(int status) override { fail_held(status, false); }
    void shutdown() override {  // a second caller returns once the first is done (backend.h)
        std::call_once(shut_, [this] { fail_held(KVX_ECLOSED, true); });
    }

private:
    void fail_held(int status, bool stop) {
        std::vector<OpRef> held;
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stop) stopped_.store(true);
            held.swap(held_);
        }
        for (OpRef &op : held)
            if (op->report()) sink_->complete(op->id, status);
    }

    CompletionSink *sink_;
    std::mutex mu_;
    std::vector<OpRef> held_;
    std::atomic<bool> stopped_{false};
    std::once_flag shut_;
};

class InstantBackend final : public Backend {
public:
    const char *name() const override { return "instant"; }
    wire::Section describe() const override { return wire::Section{kSectionId, 1, {}}; }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override {
        return std::make_unique<InstantPeer>(pc.sink);
    }
    void shutdown() override {}
};

bool probe(const Options &, std::string *) { return true; }
std::unique_ptr<Backend> create(const BackendContext &, std::string *) { return std::make_unique<InstantBackend>(); }
void check_section(const wire::Section &, const wire::AgentMetadata &) {}

}  // namespace

void hold(bool on) { g_hold.store(on); }
void release() {
    // Reported without a lock, as a backend does (the test releases only
    // while nothing shuts the peers down).
    std::vector<std::pair<CompletionSink *, std::vector<OpRef>>> held;
    {
        std::lock_guard<std::mutex> lk(g_peers_mu);
        for (InstantPeer *p : g_peers) {
            held.emplace_back();
            held.back().first = p->take_held(&held.back().second);
        }
    }
    for (auto &[sink, ops] : held)
        for (OpRef &op : ops)
            if (op->report()) sink->complete(op->id, 0);
}
int live_peers() {
    std::lock_guard<std::mutex> lk(g_peers_mu);
    return static_cast<int>(g_peers.size());
}
void submit_delay_ms(int ms) { g_delay_ms.store(ms); }

}  // namespace kvx::instant

extern "C" const kvx::BackendDesc kvx_backend_test = {
    "instant", kvx::instant::kSectionId, {}, kvx::instant::probe, kvx::instant::create, kvx::instant::check_section,
};
