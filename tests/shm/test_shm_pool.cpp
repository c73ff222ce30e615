// The shm copy pool on its own, made deterministic: a sink whose progress()
// holds the pool thread while the test thread submits, so the parts queue
// exactly as the test says. Checks that queued single-part transfers are
// taken as batches of several parts, that every part of a batch lands (on
// the mapped path: memcpy; on the kernel path: one process_vm_writev into
// this very process), that each transfer is reported once, that a backlog
// of 2 MiB makes the submitting thread copy a batch itself (at most 1 MiB),
// that it never takes a queued part above 1 MiB of another transfer, and
// that a small transfer never waits for a pool thread copying such a part.
#include <unistd.h>

#include <atomic>
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
            held_ = true;
            cv_.notify_all();
            cv_.wait(lk, [&] { return !armed_; });
            held_ = false;
        }
    }
    void arm() {
        std::lock_guard<std::mutex> lk(mu_);
        armed_ = true;
    }
    void wait_held() {
        std::unique_lock<std::mutex> lk(mu_);
        assert_true(cv_.wait_for(lk, std::chrono::seconds(20), [&] { return held_; }));
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
private:
    std::thread::id tester_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<uint64_t, std::vector<int>> reports_;
    bool armed_ = false, held_ = false;
    unsigned pool_batches_ = 0, tester_batches_ = 0, tester_reports_ = 0;
};

struct Fixture {
    region src, dst;
    std::shared_ptr<shm::Link> link = std::make_shared<shm::Link>();
    Sink sink{std::this_thread::get_id()};
    std::vector<uint8_t> want;  // what dst must hold
    uint64_t next_id = 1;

    explicit Fixture(shm::Mode mode) {
        src = region_new(kNB, kBL, 0);
        dst = region_new(kNB, kBL, 0x5A);
        for (uint64_t i = 0; i < kNB; i++) fill_block(src.base + i * kBL, kBL, i, 3);
        want.assign(dst.base, dst.base + kNB * kBL);
        link->local = kvx::Region{src.base, kNB, kBL};
        link->mode = mode;
        link->sink = &sink;
        link->peer_id = "self";
        if (mode == shm::Mode::kernel) {
            link->pid = getpid();
            link->remote_base = reinterpret_cast<uint64_t>(dst.base);
        } else {
            link->dst = dst.base;
        }
        link->remote_size = kNB * kBL;
    }
    ~Fixture() {
        link->sink = nullptr;
        region_free(&src);
        region_free(&dst);
    }
    // A transfer of blocks l[i] -> r[i] (consecutive ones as one run), split
    // for two copiers into parts of at least min_part (the peer's is 512 KiB
    // mapped, 256 KiB private; the tests pick their own); returns its id.
    uint64_t submit(shm::CopyPool &pool, const std::vector<std::pair<uint64_t, uint64_t>> &blocks,
                    uint64_t min_part = 1u << 20) {
        kvx::Op op;
        op.state = kvx::OpRef::make();
        op.state->id = next_id++;
        for (auto [l, r] : blocks) {
            op.runs.push_back(kvx::Run{l * kBL, r * kBL, kBL});
            op.bytes += kBL;
            memcpy(want.data() + r * kBL, src.base + l * kBL, kBL);
        }
        const uint64_t id = op.state->id;
        {
            std::lock_guard<std::mutex> lk(link->mu);
            link->ops.emplace(id, op.state);
        }
        pool.submit(link, kvx::split_op(std::move(op), pool.copiers(), min_part, kBL));
        return id;
    }
    void check_bytes() const {
        for (uint64_t i = 0; i < kNB; i++)
            assert_memory_equal(dst.base + i * kBL, want.data() + i * kBL, kBL);
        assert_true(region_guards_ok(&dst));
    }
};

// A fixture and a pool of two copiers (declared after it: its threads are
// gone before the fixture). Rigs live on the heap: a failed assertion leaves
// the test by longjmp, past every destructor, and a pool thread held in a
// sink must not find its memory reused by the next test.
struct Rig {
    Fixture f;
    shm::CopyPool pool{2};
    explicit Rig(shm::Mode mode) : f(mode) {}
};

Rig &rig(std::unique_ptr<Rig> &p, shm::Mode mode) {
    p = std::make_unique<Rig>(mode);
    return *p;
}

// Holds the pool thread: a transfer of nblocks (blocks first_block.. to the
// same indexes) is split in two, the test thread copies the first part and
// the pool thread the second, which then stops in progress(). By default a
// batch of 1 MiB (a pool thread copying more than that does not count as
// awake: small transfers would wait for it).
uint64_t hold_pool(Rig &r, uint64_t first_block, uint64_t nblocks = 32, uint64_t min_part = 512 << 10) {
    r.f.sink.arm();
    std::vector<std::pair<uint64_t, uint64_t>> blocks;
    for (uint64_t i = 0; i < nblocks; i++) blocks.emplace_back(first_block + i, first_block + i);
    const uint64_t id = r.f.submit(r.pool, blocks, min_part);
    r.f.sink.wait_held();
    return id;
}

void batches(shm::Mode mode) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, mode);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t big = hold_pool(r, 0);
    // Ten transfers of one or two blocks (distinct targets 64..): all queue,
    // since the pool thread is awake (copying 1 MiB) and less than 2 MiB waits.
    const unsigned before = f.sink.tester_batches();
    const uint64_t first = f.next_id;
    for (uint64_t i = 0; i < 10; i++) {
        if (i % 3 == 2) f.submit(pool, {{i, 64 + 2 * i}, {i + 40, 64 + 2 * i + 1}});
        else f.submit(pool, {{100 + i, 64 + 2 * i}});
    }
    assert_int_equal(f.sink.tester_batches(), before);  // the test thread copied none of them
    const unsigned pool_before = f.sink.pool_batches();
    f.sink.release();
    f.sink.wait_done(big, f.next_id);
    // The pool thread took them in batches: ceil(10/2) = 5, then 3, 1, 1.
    const unsigned taken = f.sink.pool_batches() - pool_before;
    print_message("10 queued transfers copied in %u batches\n", taken);
    assert_int_equal(taken, 4);
    assert_int_equal(f.sink.reported(), f.next_id - 1);
    assert_true(first > big);
    f.check_bytes();
}

void test_batches_mapped(void **) { batches(shm::Mode::mapped); }
void test_batches_kernel(void **) { batches(shm::Mode::kernel); }

// A backlog of 2 MiB: the submitting thread copies a batch of it (at most
// 1 MiB); a queued part above 1 MiB of another transfer it leaves alone.
void test_backlog_bounded(void **) {
    std::unique_ptr<Rig> rp, rq;
    Rig &r = rig(rp, shm::Mode::kernel);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t first = hold_pool(r, 0);
    // 4 MiB more, split: the test thread copies its first half now, the
    // second (2 MiB) queues at the front.
    std::vector<std::pair<uint64_t, uint64_t>> big;
    for (uint64_t i = 0; i < 64; i++) big.emplace_back(i, 64 + i);
    unsigned before = f.sink.tester_batches();
    f.submit(pool, big);
    assert_int_equal(f.sink.tester_batches(), before + 1);  // its own first part only
    // 2 MiB + 64 KiB wait now, but the front part is 2 MiB: not this thread's.
    before = f.sink.tester_batches();
    f.submit(pool, {{5, 0}});
    assert_int_equal(f.sink.tester_batches(), before);
    f.sink.release();
    f.sink.wait_done(first, f.next_id);
    f.check_bytes();

    // With parts of 192 KiB only: once 2 MiB wait (the 11th), the test
    // thread copies a batch itself while the pool thread is held: its fair
    // share is 6 parts, its bound 1 MiB, so 5 (960 KiB).
    Rig &q = rig(rq, shm::Mode::mapped);
    Fixture &g = q.f;
    const uint64_t gfirst = hold_pool(q, 0);
    const unsigned reports = g.sink.tester_reports();
    for (uint64_t i = 0; i < 10; i++) g.submit(q.pool, {{40 + 3 * i, 32 + 3 * i}, {41 + 3 * i, 33 + 3 * i}, {42 + 3 * i, 34 + 3 * i}});
    assert_int_equal(g.sink.tester_reports(), reports);  // 1920 KiB wait: nothing copied here yet
    g.submit(q.pool, {{70, 62}, {71, 63}, {72, 64}});
    assert_int_equal(g.sink.tester_reports(), reports + 5);
    g.sink.release();
    g.sink.wait_done(gfirst, g.next_id);
    g.check_bytes();
}

// A pool thread copying a part above 1 MiB is not awake for small
// transfers: one submitted meanwhile is copied by the calling thread, done
// when the call returns, instead of waiting for that part.
void test_big_part_not_awake(void **) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, shm::Mode::kernel);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t first = hold_pool(r, 0, 64, 1 << 20);  // 4 MiB: two parts of 2 MiB
    const unsigned reports = f.sink.tester_reports();
    const uint64_t small = f.submit(pool, {{70, 100}});
    assert_int_equal(f.sink.tester_reports(), reports + 1);  // done in the call
    f.sink.release();
    f.sink.wait_done(first, small + 1);
    f.check_bytes();
}

// A stopped link: its queued parts are dropped, reported by fail_all once.
void test_stopped_link_drops_queued(void **) {
    std::unique_ptr<Rig> rp;
    Rig &r = rig(rp, shm::Mode::mapped);
    Fixture &f = r.f;
    shm::CopyPool &pool = r.pool;
    const uint64_t big = hold_pool(r, 0);
    const std::vector<uint8_t> before(f.dst.base + 64 * kBL, f.dst.base + 80 * kBL);
    const uint64_t first = f.next_id;
    for (uint64_t i = 0; i < 16; i++) f.submit(pool, {{i, 64 + i}});
    std::thread failer([&] { f.link->fail_all(KVX_ECONNRESET, kvx::Clock::duration::zero()); });  // waits for the held batch
    for (bool stopped = false; !stopped; usleep(100)) {  // the stop is set before the pool thread goes on
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
        cmocka_unit_test(test_backlog_bounded),
        cmocka_unit_test(test_big_part_not_awake),
        cmocka_unit_test(test_stopped_link_drops_queued),
    };
    return cmocka_run_group_tests_name("shm_pool", tests, NULL, NULL);
}
