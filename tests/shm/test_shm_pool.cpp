// The shm copy pool on its own, made deterministic: a sink whose progress()
// holds the copy threads while the test thread submits, so the transfers
// queue exactly as the test says. Checks that queued single-part transfers
// are taken as batches of several, that every part of a batch lands (on the
// mapped path: memcpy; on the kernel path: one process_vm_writev into this
// very process), that each transfer is reported once, that the submitting
// thread copies no more than a small transfer's worth itself (a large
// scattered transfer is carved by the copy threads, a backlog of 2 MiB
// costs the submitter at most kSubmitBytes in kSubmitRuns runs), and that a
// small transfer waits behind at most one part of a large one.
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend_api/ops.h"
#include "backends/shm/shm.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

namespace shm = kvx::shm;

constexpr uint64_t kBL = 64 << 10, kNB = 128;  // 8 MiB each side

// Counts what each thread reports; holds the first thread other than the
// test's in progress() while armed.
class Sink final : public kvx::CompletionSink {
public:
    explicit Sink(std::thread::id tester) : tester_(tester) {}
    void complete(uint64_t id, int status) override {
        std::lock_guard<std::mutex> lk(mu_);
        if (std::this_thread::get_id() == tester_) tester_reports_++;
        reports_[id].push_back(status);
        order_.push_back(id);
        cv_.notify_all();
    }
    void progress() override {
        std::unique_lock<std::mutex> lk(mu_);
        if (std::this_thread::get_id() == tester_) {
            tester_batches_++;
            return;
        }
        pool_batches_++;
        if (armed_) {
            held_++;
            cv_.notify_all();
            cv_.wait(lk, [&] { return !armed_; });
            held_--;
        }
    }
    void arm() {
        std::lock_guard<std::mutex> lk(mu_);
        armed_ = true;
    }
    void wait_held(unsigned n = 1) {
        std::unique_lock<std::mutex> lk(mu_);
        assert_true(cv_.wait_for(lk, std::chrono::seconds(20), [&] { return held_ == n; }));
    }
    void release() {
        std::lock_guard<std::mutex> lk(mu_);
        armed_ = false;
        cv_.notify_all();
    }
    // Waits until ids [from, to) were reported; each exactly once, done
    // (or, with failed, failed).
    void wait_done(uint64_t from, uint64_t to, bool failed = false) {
        std::unique_lock<std::mutex> lk(mu_);
        assert_true(cv_.wait_for(lk, std::chrono::seconds(20), [&] {
            for (uint64_t id = from; id < to; id++)
                if (reports_.count(id) == 0) return false;
            return true;
        }));
        for (uint64_t id = from; id < to; id++) {
            assert_int_equal(reports_[id].size(), 1);
            assert_int_equal(reports_[id][0] != 0, failed);
        }
    }
    unsigned pool_batches() {
        std::lock_guard<std::mutex> lk(mu_);
        return pool_batches_;
    }
    unsigned tester_batches() {
        std::lock_guard<std::mutex> lk(mu_);
        return tester_batches_;
    }
    unsigned tester_reports() {
        std::lock_guard<std::mutex> lk(mu_);
        return tester_reports_;
    }
    size_t reported() {
        std::lock_guard<std::mutex> lk(mu_);
        return reports_.size();
    }
    // Where id was in the order of reports.
    size_t rank(uint64_t id) {
        std::lock_guard<std::mutex> lk(mu_);
        for (size_t i = 0; i < order_.size(); i++)
            if (order_[i] == id) return i;
        return SIZE_MAX;
    }
private:
    std::thread::id tester_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<uint64_t, std::vector<int>> reports_;
    std::vector<uint64_t> order_;
    bool armed_ = false;
    unsigned held_ = 0;
    unsigned pool_batches_ = 0, tester_batches_ = 0, tester_reports_ = 0;
};

struct Fixture {
    const uint64_t nb, bl;
    region src, dst;
    std::shared_ptr<shm::Link> link = std::make_shared<shm::Link>();
    Sink sink{std::this_thread::get_id()};
    std::vector<uint8_t> want;  // what dst must hold
    uint64_t next_id = 1;

    Fixture(shm::Mode mode, uint64_t nblocks, uint64_t block_len) : nb(nblocks), bl(block_len) {
        src = region_new(nb, bl, 0);
        dst = region_new(nb, bl, 0x5A);
        for (uint64_t i = 0; i < nb; i++) fill_block(src.base + i * bl, bl, i, 3);
        want.assign(dst.base, dst.base + nb * bl);
        link->local = kvx::Region{src.base, nb, bl};
        link->mode = mode;
        link->sink = &sink;
        link->peer_id = "self";
        if (mode == shm::Mode::kernel) {
            link->pid = getpid();
            link->remote_base = reinterpret_cast<uint64_t>(dst.base);
        } else {
            link->dst = dst.base;
        }
        link->remote_size = nb * bl;
    }
    ~Fixture() {
        link->sink = nullptr;
        region_free(&src);
        region_free(&dst);
    }
    // A transfer of blocks l[i] -> r[i] (consecutive ones as one run, as the
    // core builds them), split from 2 x min_part (the peer's is 512 KiB
    // mapped, 256 KiB private; the tests pick their own); returns its id.
    uint64_t submit(shm::CopyPool &pool, const std::vector<std::pair<uint64_t, uint64_t>> &blocks,
                    uint64_t min_part = 1u << 20) {
        kvx::Op op;
        op.state = kvx::OpRef::make();
        op.state->id = next_id++;
        for (size_t i = 0; i < blocks.size(); i++) {
            const auto [l, r] = blocks[i];
            if (i > 0 && l == blocks[i - 1].first + 1 && r == blocks[i - 1].second + 1) op.runs.back().len += bl;
            else op.runs.push_back(kvx::Run{l * bl, r * bl, bl});
            op.bytes += bl;
            memcpy(want.data() + r * bl, src.base + l * bl, bl);
        }
        const uint64_t id = op.state->id;
        {
            std::lock_guard<std::mutex> lk(link->mu);
            link->ops.emplace(id, op.state);
        }
        pool.submit(link, std::move(op), min_part, std::min<uint64_t>(bl, 64 << 10));
        return id;
    }
    // Blocks of dst that hold something else than they did (landed).
    uint64_t landed() const {
        uint64_t n = 0;
        for (uint64_t i = 0; i < nb; i++) n += !block_is(dst.base + i * bl, bl, 0x5A);
        return n;
    }
    void check_bytes() const {
        for (uint64_t i = 0; i < nb; i++) assert_memory_equal(dst.base + i * bl, want.data() + i * bl, bl);
        assert_true(region_guards_ok(&dst));
    }
};

// A fixture and a pool of copy threads (declared after it: its threads are
// gone before the fixture). Rigs live on the heap: a failed assertion leaves
// the test by longjmp, past every destructor, and a copy thread held in a
// sink must not find its memory reused by the next test.
struct Rig {
    Fixture f;
    shm::CopyPool pool;
    Rig(shm::Mode mode, unsigned threads, uint64_t nb, uint64_t bl) : f(mode, nb, bl), pool(threads) {}
};

Rig &rig(std::unique_ptr<Rig> &p, shm::Mode mode, unsigned threads = 1, uint64_t nb = kNB, uint64_t bl = kBL) {
    p = std::make_unique<Rig>(mode, threads, nb, bl);
    return *p;
}

// Holds the copy threads: a transfer of 960 KiB per thread (blocks
// first_block.. to the same indexes; less than the 2 MiB of a backlog), in
// one part per thread; each thread copies one and stops in progress().
uint64_t hold_pool(Rig &r, uint64_t first_block, unsigned threads = 1) {
    r.f.sink.arm();
    std::vector<std::pair<uint64_t, uint64_t>> blocks;
    for (uint64_t i = 0; i < (960 << 10) / r.f.bl * threads; i++) blocks.emplace_back(first_block + i, first_block + i);
    const uint64_t id = r.f.submit(r.pool, blocks, 512 << 10);
    r.f.sink.wait_held(threads);
    return id;
}

// Ten small transfers queued while both copy threads are busy: taken in
// batches of a fair share each, ceil(10/2) = 5, then 3, 1, 1, whichever
// thread takes them.
void batches(shm::Mode mode) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, mode, 2);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t big = hold_pool(r, 0, 2);
    // One or two blocks each (distinct targets 64..): all queue, since the
    // copy threads are awake (copying), and less than 2 MiB waits.
    const unsigned before = f.sink.tester_batches();
    const uint64_t first = f.next_id;
    for (uint64_t i = 0; i < 10; i++) {
        if (i % 3 == 2) f.submit(pool, {{i, 64 + 2 * i}, {i + 40, 64 + 2 * i + 1}});
        else f.submit(pool, {{100 + i, 64 + 2 * i}});
    }
    assert_int_equal(f.sink.tester_batches(), before);  // the test thread copied none of them
    assert_int_equal(f.landed(), 30);                    // the held transfer only
    const unsigned pool_before = f.sink.pool_batches();
    f.sink.release();
    f.sink.wait_done(big, f.next_id);
    const unsigned taken = f.sink.pool_batches() - pool_before;
    print_message("10 queued transfers copied in %u batches\n", taken);
    assert_int_equal(taken, 4);
    assert_int_equal(f.sink.reported(), f.next_id - 1);
    assert_true(first > big);
    f.check_bytes();
}

void test_batches_mapped(void **) { batches(shm::Mode::mapped); }
void test_batches_kernel(void **) { batches(shm::Mode::kernel); }

// A transfer of 65,536 scattered blocks of 64 B (4 MiB, one run each) with
// one copy thread: the submitting thread copies nothing of it, though 4 MiB
// wait (a backlog: it would copy a small transfer of the queue); the copy
// thread takes parts of 1024 runs (one process_vm_writev each). Seen in
// the target's memory while the copy thread is held after its first part.
void scattered(shm::Mode mode) {
    constexpr uint64_t nb = 65536, bl = 64;
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, mode, 1, nb, bl);
    Fixture &f = r.f;
    std::vector<std::pair<uint64_t, uint64_t>> blocks(nb);
    for (uint64_t i = 0; i < nb; i++) blocks[i] = {i, i * 7919 % nb};  // no two adjacent on both sides
    f.sink.arm();
    const uint64_t id = f.submit(r.pool, blocks);
    assert_int_equal(f.sink.tester_batches(), 0);
    f.sink.wait_held();
    assert_int_equal(f.landed(), IOV_MAX);  // the copy thread's first part
    f.sink.release();
    f.sink.wait_done(id, id + 1);
    assert_int_equal(f.sink.tester_reports(), 0);
    f.check_bytes();
}

void test_scattered_mapped(void **) { scattered(shm::Mode::mapped); }
void test_scattered_kernel(void **) { scattered(shm::Mode::kernel); }

// A backlog (2 MiB or more queued): the submitting thread copies the next
// transfer of the queue if it is a small one (at most kSubmitBytes in at
// most kSubmitRuns runs), whole; never a part of a larger one, and nothing
// above either bound. Blocks of 1 KiB, one copy thread held meanwhile.
void backlog(uint64_t extra_runs, uint64_t extra_bytes_per_run, bool copied) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, shm::Mode::mapped, 1, 8192, 1024);
    Fixture &f = r.f;
    const uint64_t first = hold_pool(r, 0);  // blocks 0-959
    // 2200 scattered blocks (2200 KiB in 2200 runs): queued, in parts for
    // the copy thread; none of it is copied here.
    std::vector<std::pair<uint64_t, uint64_t>> spread;
    for (uint64_t i = 0; i < 2200; i++) spread.emplace_back(960 + 3 * i, 960 + 3 * i);
    f.submit(r.pool, spread);
    assert_int_equal(f.sink.tester_batches(), 0);
    assert_int_equal(f.landed(), 960);
    // The next transfer (blocks above 7600): runs of extra_bytes_per_run KiB.
    std::vector<std::pair<uint64_t, uint64_t>> next;
    for (uint64_t i = 0; i < extra_runs; i++)
        for (uint64_t k = 0, b = 7600 + i * (extra_bytes_per_run + 1); k < extra_bytes_per_run; k++)
            next.emplace_back(b + k, b + k);
    const uint64_t id = f.submit(r.pool, next);
    assert_int_equal(f.sink.tester_batches(), copied ? 1 : 0);
    assert_int_equal(f.sink.tester_reports(), copied ? 1 : 0);  // done in the call, or queued
    assert_int_equal(f.landed(), 960 + (copied ? next.size() : 0));
    f.sink.release();
    f.sink.wait_done(first, id + 1);
    f.check_bytes();
}

void test_backlog_bounded(void **) {
    backlog(16, 1, true);    // 16 runs of 1 KiB: copied here
    backlog(1, 64, true);    // one run of 64 KiB: copied here
    backlog(17, 1, false);   // 17 runs: the copy thread's
    backlog(1, 65, false);   // 65 KiB: the copy thread's
}

// A small transfer waits behind at most one part of a large one: queued
// behind a transfer of 1.5 MiB whose first part (1 MiB) the copy thread
// copies, it is reported before the large one.
void test_small_not_behind_large(void **) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, shm::Mode::kernel);
    Fixture &f = r.f;
    f.sink.arm();
    std::vector<std::pair<uint64_t, uint64_t>> big;
    for (uint64_t i = 0; i < 24; i++) big.emplace_back(i, i);
    const uint64_t large = f.submit(r.pool, big, 512 << 10);  // parts of 1 MiB and 512 KiB
    f.sink.wait_held();
    const uint64_t small = f.submit(r.pool, {{70, 100}});
    const uint64_t small2 = f.submit(r.pool, {{71, 101}});
    assert_int_equal(f.sink.tester_batches(), 0);  // queued: the copy thread is awake
    f.sink.release();
    f.sink.wait_done(large, small2 + 1);
    assert_true(f.sink.rank(small) < f.sink.rank(large));
    assert_true(f.sink.rank(small2) < f.sink.rank(large));
    f.check_bytes();
}

// A stopped link: its queued transfers are dropped, reported by fail_all once.
void test_stopped_link_drops_queued(void **) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, shm::Mode::mapped);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t big = hold_pool(r, 0);
    const std::vector<uint8_t> before(f.dst.base + 64 * kBL, f.dst.base + 128 * kBL);
    const uint64_t first = f.next_id;
    // Less than the 2 MiB of a backlog, so that this thread copies none:
    // six of one part, and one of two parts (1 MiB and 512 KiB).
    for (uint64_t i = 0; i < 6; i++) f.submit(pool, {{i, 64 + i}});
    std::vector<std::pair<uint64_t, uint64_t>> large;
    for (uint64_t i = 0; i < 24; i++) large.emplace_back(16 + i, 96 + i);
    f.submit(pool, large, 512 << 10);
    std::thread failer([&] { f.link->fail_all(KVX_ECONNRESET, kvx::Clock::duration::zero()); });  // waits for the held batch
    for (bool stopped = false; !stopped; usleep(100)) {  // the stop is set before the copy thread goes on
        std::lock_guard<std::mutex> lk(f.link->mu);
        stopped = f.link->stop;
    }
    f.sink.release();
    failer.join();
    f.sink.wait_done(big, first);  // the held transfer finished before the stop
    f.sink.wait_done(first, f.next_id, true);  // the queued ones: each reported once, failed
    assert_int_equal(f.sink.reported(), f.next_id - 1);
    assert_memory_equal(f.dst.base + 64 * kBL, before.data(), before.size());  // none of their bytes landed
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_mapped),
        cmocka_unit_test(test_batches_kernel),
        cmocka_unit_test(test_scattered_mapped),
        cmocka_unit_test(test_scattered_kernel),
        cmocka_unit_test(test_backlog_bounded),
        cmocka_unit_test(test_small_not_behind_large),
        cmocka_unit_test(test_stopped_link_drops_queued),
    };
    return cmocka_run_group_tests_name("shm_pool", tests, NULL, NULL);
}
