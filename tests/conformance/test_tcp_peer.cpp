// tcp initiator under concurrency, driven through the backend interface: ops
// submitted from several threads while another drops queued ones and the
// link is aborted or shut down mid-flight (a drop is the core's cancel: a
// claim on the op's shared state). Every op that was not dropped is
// reported exactly once, a dropped one never, and after shutdown() returns
// the sink is never called again. Run under TSan (label threads).
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backends/tcp/tcp.h"
#include "core/options.h"
#include "util/event_loop.h"
#include "wire/metadata.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

constexpr uint64_t kNB = 64, kBL = 64 * 1024;
constexpr int kSubmitters = 4, kPerSubmitter = 200;

struct Sink final : kvx::CompletionSink {
    std::mutex mu;
    std::map<uint64_t, int> reports;
    int dup = 0, late = 0;
    bool closed = false;
    void complete(uint64_t id, int status) override {
        std::lock_guard<std::mutex> lk(mu);
        late += closed;
        dup += !reports.emplace(id, status).second;
    }
    void progress() override {}
    size_t count() {
        std::lock_guard<std::mutex> lk(mu);
        return reports.size();
    }
};

// An initiator with its own loop, connected to a target transport.
struct Rig {
    region tr, ir;
    kvx_transport *target = nullptr;
    metablob mb;
    kvx::wire::AgentMetadata meta;
    kvx::OptionBag bag;
    kvx::Options options;
    kvx::EventLoop loop{"test-loop"};
    Sink sink;
    std::unique_ptr<kvx::BackendPeer> peer;

    Rig() {
        tr = region_new(kNB, kBL, 1);
        ir = region_new(kNB, kBL, 2);
        target = transport_new(&tr, NULL, test_options("backend=tcp", NULL));
        get_meta(target, &mb);
        meta = kvx::wire::decode_metadata(mb.bytes, mb.len);
        bag.kv["tcp.streams"] = "3";
        options = kvx::Options(&bag, kvx::all_option_tables());
        loop.start();
        kvx::BackendContext ctx;
        ctx.region = kvx::Region{ir.base, kNB, kBL};
        ctx.options = &options;
        ctx.loop = &loop;
        kvx::PeerContext pc;
        pc.peer_id = "b";
        pc.meta = &meta;
        pc.section = meta.find(2);
        pc.deadline = kvx::Clock::now() + std::chrono::seconds(10);
        pc.sink = &sink;
        peer = kvx::tcp::connect_peer(ctx, pc);
    }
    ~Rig() {
        peer.reset();
        loop.stop();
        kvx_transport_destroy(target);
        region_free(&tr);
        region_free(&ir);
    }
};

// 1..kNB consecutive blocks at a random place: large ones are split over the streams.
kvx::Op random_op(uint64_t id, std::mt19937 &rng) {
    const uint64_t n = 1 + rng() % kNB, at = rng() % (kNB - n + 1);
    kvx::Op op;
    op.state = kvx::OpRef::make();
    op.state->id = id;
    op.runs.push_back(kvx::Run{at * kBL, (kNB - n - at) * kBL, n * kBL});
    op.bytes = n * kBL;
    return op;
}

struct Load {
    std::atomic<uint64_t> next_id{1};
    std::mutex mu;
    std::map<uint64_t, kvx::OpRef> states;  // as the core keeps them, to cancel
    std::set<uint64_t> dropped;
    std::atomic<bool> stop{false};
};

void submitter(kvx::BackendPeer &p, Load &ld, int seed) {
    std::mt19937 rng(seed);
    for (int i = 0; i < kPerSubmitter; i++) {
        kvx::Op op = random_op(ld.next_id++, rng);
        {
            std::lock_guard<std::mutex> lk(ld.mu);
            ld.states.emplace(op.state->id, op.state);
        }
        p.submit(std::move(op));
    }
}

// Cancels recent ops as the core does: a claim that wins means the backend
// must never send nor report the op.
void dropper(Load &ld) {
    std::mt19937 rng(99);
    while (!ld.stop.load()) {
        std::lock_guard<std::mutex> lk(ld.mu);
        if (ld.states.empty()) continue;
        auto it = std::prev(ld.states.end(), 1 + static_cast<long>(rng() % std::min<size_t>(8, ld.states.size())));
        if (it->second->claim_unstarted()) assert_true(ld.dropped.insert(it->first).second);
    }
}

// Runs the load; `breaker` breaks the link while it runs, or nothing does
// (drain: wait for every report, all successes, before the shutdown). Every
// id surfaces once except the dropped ones, which never do; nothing after
// shutdown() returned.
void run(Rig &rig, const std::function<void()> &breaker, bool drain) {
    Load ld;
    std::vector<std::thread> th;
    for (int i = 0; i < kSubmitters; i++) th.emplace_back(submitter, std::ref(*rig.peer), std::ref(ld), i);
    std::thread drop(dropper, std::ref(ld));
    breaker();
    for (auto &t : th) t.join();
    ld.stop = true;
    drop.join();
    const uint64_t n = ld.next_id.load() - 1;
    const auto end = kvx::Clock::now() + std::chrono::seconds(60);
    while (drain && rig.sink.count() + ld.dropped.size() < n && kvx::Clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    rig.peer->shutdown();
    {
        std::lock_guard<std::mutex> lk(rig.sink.mu);
        rig.sink.closed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lk(rig.sink.mu);
    assert_int_equal(rig.sink.dup, 0);
    assert_int_equal(rig.sink.late, 0);
    size_t failed = 0;
    for (uint64_t id = 1; id <= n; id++) {
        if (ld.dropped.count(id) == rig.sink.reports.count(id))
            fail_msg("id %llu: dropped and reported, or neither", (unsigned long long)id);
        failed += rig.sink.reports.count(id) && rig.sink.reports[id] != 0;
    }
    print_message("%llu ops: %zu reported (%zu failed), %zu dropped\n", (unsigned long long)n,
                  rig.sink.reports.size(), failed, ld.dropped.size());
    if (drain) assert_int_equal(failed, 0);
}

void wait_reports(Rig &rig, size_t n) {
    while (rig.sink.count() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void test_abort_mid_flight(void **) {
    Rig rig;
    run(rig, [&] {
        wait_reports(rig, 50);
        rig.peer->abort(KVX_ETIMEDOUT);
        assert_true(rig.peer->broken());
    }, false);
}

void test_shutdown_mid_flight(void **) {
    Rig rig;
    run(rig, [&] {
        wait_reports(rig, 20);
        rig.peer->shutdown();
    }, false);
}

void test_healthy(void **) {
    Rig rig;
    run(rig, [] {}, true);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_mid_flight),
        cmocka_unit_test(test_shutdown_mid_flight),
        cmocka_unit_test(test_healthy),
    };
    return cmocka_run_group_tests_name("tcp_peer", tests, nullptr, nullptr);
}
