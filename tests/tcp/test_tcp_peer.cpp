// tcp initiator under concurrency, driven through the backend interface: ops
// submitted from several threads while another drops queued ones and the
// link is aborted or shut down mid-flight (a drop is the core's cancel: a
// claim on the op's shared state). Every op that was not dropped is
// reported exactly once, a dropped one never, and after shutdown() returns
// the sink is never called again. Run under TSan (label threads).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "backend_api/backend.h"
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
        bag.kv.insert_or_assign("tcp.streams", std::string("3"));  // not = "3": gcc 12 -O3 -Wrestrict false positive (GCC bug 105329)
        options = kvx::Options(&bag, kvx::all_option_tables());
        loop.start();
        kvx::BackendContext ctx;
        ctx.region = kvx::Region{ir.base, kNB, kBL};
        ctx.options = &options;
        ctx.loop = &loop;
        kvx::PeerContext pc;
        pc.peer_id = std::string("b");  // not = "b": gcc 12 -Wrestrict false positive here with ASan
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

// The frames FrameWriter writes for a batch of parts, read back and checked
// as the target checks them.
struct Frame {
    kvx::tcp::FrameHeader h;
    std::vector<kvx::tcp::Segment> segs;
    std::vector<uint8_t> payload;
};

std::vector<Frame> frames_of(kvx::tcp::FrameWriter &w, const kvx::Region &rg) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    std::vector<uint8_t> wire;
    std::thread reader([&] {
        uint8_t buf[1 << 16];
        for (ssize_t r; (r = ::read(sv[1], buf, sizeof buf)) > 0;) wire.insert(wire.end(), buf, buf + r);
    });
    for (int rc; (rc = w.write(sv[0])) != 1;) {
        assert_int_equal(rc, 0);
        pollfd p{sv[0], POLLOUT, 0};
        ::poll(&p, 1, 1000);
    }
    ::shutdown(sv[0], SHUT_WR);
    reader.join();
    ::close(sv[0]);
    ::close(sv[1]);
    std::vector<Frame> out;
    for (size_t at = 0; at < wire.size();) {
        Frame f;
        assert_true(wire.size() - at >= kvx::tcp::kFrameHeaderLen);
        f.h = kvx::tcp::decode_frame_header(wire.data() + at, rg.block_len);
        at += kvx::tcp::kFrameHeaderLen;
        f.segs = kvx::tcp::decode_segments(wire.data() + at, f.h, rg.block_len, rg.size());
        at += f.h.nseg * kvx::tcp::kSegLen;
        assert_true(wire.size() - at >= f.h.total_len);
        f.payload.assign(wire.begin() + static_cast<long>(at), wire.begin() + static_cast<long>(at + f.h.total_len));
        at += f.h.total_len;
        out.push_back(std::move(f));
    }
    return out;
}

kvx::Part part_of(std::initializer_list<kvx::Run> runs) {
    kvx::Part p;
    p.op = kvx::OpRef::make();
    p.runs = kvx::Runs(runs);
    return p;
}

// Small parts queued together share frames: whole parts only, at most
// kMergeSegs segments and kMergeBytes per frame, never two segments over the
// same remote bytes (a sealed payload is decrypted where it lands); each
// frame asks for an ack under its last part's sequence number, and the
// payload is the local bytes of its segments. A large part travels alone.
void test_writer_merges(void **) {
    constexpr uint64_t bl = 4096, nb = 4096;
    region src = region_new(nb, bl, 3);
    for (uint64_t i = 0; i < nb; i++) fill_block(src.base + i * bl, bl, i, 5);
    const kvx::Region rg{src.base, nb, bl};
    kvx::tcp::FrameWriter w(rg);
    std::vector<kvx::Part> parts;
    // 16 parts of 16 scattered blocks (4 per frame), then one that overlaps
    // the last part's remote blocks, then a 1 MiB part, then 3 single blocks.
    for (uint64_t p = 0; p < 16; p++) {
        kvx::Part q = part_of({});
        for (uint64_t i = 0; i < 16; i++) q.runs.push_back(kvx::Run{(p * 16 + i) * bl, (i * 97 + p * 16 * 3) % nb * bl, bl});
        parts.push_back(std::move(q));
    }
    parts.push_back(part_of({kvx::Run{0, parts.back().runs[3].remote_off, bl}}));
    parts.push_back(part_of({kvx::Run{1024 * bl, 2048 * bl, 256 * bl}}));
    for (uint64_t i = 0; i < 3; i++) parts.push_back(part_of({kvx::Run{(300 + i) * bl, (3000 + 2 * i) * bl, bl}}));
    for (size_t i = 0; i < parts.size(); i++) w.add(parts[i], 100 + i);
    const std::vector<Frame> fr = frames_of(w, rg);
    // Expected: 4 frames of 4 parts, the overlapping part alone, 1 MiB alone, 3 together.
    const std::vector<std::pair<uint64_t, uint32_t>> want = {{103, 64}, {107, 64}, {111, 64}, {115, 64},
                                                             {116, 1},  {117, 1},  {120, 3}};
    assert_int_equal(fr.size(), want.size());
    size_t part = 0, run = 0;
    for (size_t k = 0; k < fr.size(); k++) {
        const Frame &f = fr[k];
        assert_int_equal(f.h.seq, want[k].first);
        assert_int_equal(f.h.nseg, want[k].second);
        assert_true(f.h.flags & kvx::tcp::kFlagAck);
        assert_true(f.h.total_len <= kvx::tcp::kMergeBytes || f.h.nseg == 1);
        size_t at = 0;
        for (size_t i = 0; i < f.segs.size(); i++) {
            for (size_t j = 0; j < i; j++)
                assert_true(f.segs[i].offset + f.segs[i].len <= f.segs[j].offset ||
                            f.segs[j].offset + f.segs[j].len <= f.segs[i].offset);
            const kvx::Run &r = parts[part].runs[run];
            assert_int_equal(f.segs[i].offset, r.remote_off);
            assert_int_equal(f.segs[i].len, r.len);
            assert_memory_equal(f.payload.data() + at, src.base + r.local_off, r.len);
            at += r.len;
            if (++run == parts[part].runs.size()) run = 0, part++;
        }
        assert_int_equal(run, 0);  // a frame ends with a whole part
    }
    assert_int_equal(part, parts.size());
    region_free(&src);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_mid_flight),
        cmocka_unit_test(test_shutdown_mid_flight),
        cmocka_unit_test(test_healthy),
        cmocka_unit_test(test_writer_merges),
    };
    return cmocka_run_group_tests_name("tcp_peer", tests, nullptr, nullptr);
}
