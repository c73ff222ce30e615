#include "instant_backend.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "backend/registry.h"
#include "kvxfer.h"

namespace kvx::instant {

namespace {

constexpr uint16_t kSectionId = 0x7e57;  // outside the range of shipped backends
std::atomic<bool> g_hold{false};

class InstantPeer final : public BackendPeer {
public:
    explicit InstantPeer(CompletionSink *sink) : sink_(sink) {}
    void submit(Op op) override {
        if (!op.state->try_start()) return;  // cancelled before it started
        if (g_hold.load(std::memory_order_relaxed)) {
            std::lock_guard<std::mutex> lk(mu_);
            held_.push_back(std::move(op.state));
            return;
        }
        if (op.state->report()) sink_->complete(op.state->id, 0);
    }
    bool broken() const override { return false; }
    void abort(int status) override { fail_held(status); }
    void shutdown() override { fail_held(KVX_ECLOSED); }

private:
    void fail_held(int status) {
        std::vector<OpRef> held;
        {
            std::lock_guard<std::mutex> lk(mu_);
            held.swap(held_);
        }
        for (OpRef &op : held)
            if (op->report()) sink_->complete(op->id, status);
    }

    CompletionSink *sink_;
    std::mutex mu_;
    std::vector<OpRef> held_;
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

}  // namespace kvx::instant

extern "C" const kvx::BackendDesc kvx_backend_test = {
    "instant", kvx::instant::kSectionId, {}, kvx::instant::probe, kvx::instant::create, kvx::instant::check_section,
};
