// The transport's event loop (src/util/event_loop): timers fire once, in
// deadline order and not early; a cancelled timer or a detached source is
// never called once cancel_timer()/detach() returned, also when called from
// another thread while the loop is busy; call() runs on the loop thread
// between rounds (inline once the loop is stopped). Project headers first:
// cmocka.h defines a fail() macro that would clash with kvx::fail().
#include "util/error.h"
#include "util/event_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "unit_util.h"

using namespace kvx;
using namespace std::chrono_literals;

namespace {

using Clock = EventLoop::Clock;

// Records what the loop calls, and on which thread.
struct Recorder final : EventLoop::Source {
    std::mutex mu;
    std::vector<int> fired;  // timer tags, in firing order
    std::vector<Clock::time_point> at;
    std::atomic<int> events{0};
    std::atomic<bool> off_loop{false};
    EventLoop *loop = nullptr;

    void on_event(int, uint32_t) override {
        off_loop = off_loop || !loop->on_loop_thread();
        events++;
    }
    void on_timer(int tag) override {
        off_loop = off_loop || !loop->on_loop_thread();
        std::lock_guard<std::mutex> lk(mu);
        fired.push_back(tag);
        at.push_back(Clock::now());
    }
    size_t n_fired() {
        std::lock_guard<std::mutex> lk(mu);
        return fired.size();
    }
};

bool wait_for(const std::function<bool()> &cond, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!cond()) {
        if (Clock::now() > end) return false;
        std::this_thread::sleep_for(1ms);
    }
    return true;
}

void test_timers_in_order(void **) {
    EventLoop loop("test-loop");
    loop.start();
    Recorder r;
    r.loop = &loop;
    const auto t0 = Clock::now();
    const int delays_ms[] = {600, 200, 400, 0};  // wide apart: adding them may be preempted under load
    for (int i = 0; i < 4; i++) assert_true(loop.add_timer(t0 + std::chrono::milliseconds(delays_ms[i]), &r, i) != 0);
    assert_true(wait_for([&] { return r.n_fired() == 4; }, 5000ms));
    std::this_thread::sleep_for(50ms);  // and each only once
    std::lock_guard<std::mutex> lk(r.mu);
    assert_int_equal(r.fired.size(), 4);
    const int order[] = {3, 1, 2, 0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r.fired[i], order[i]);
        assert_true(r.at[i] >= t0 + std::chrono::milliseconds(delays_ms[order[i]]));
    }
    assert_false(r.off_loop.load());
}

void test_cancel(void **) {
    EventLoop loop("test-loop");
    loop.start();
    Recorder r;
    r.loop = &loop;
    // Many cancelled timers, some due right away: none fires; the live one does.
    std::vector<uint64_t> toks;
    for (int i = 0; i < 1000; i++) toks.push_back(loop.add_timer(Clock::now() + std::chrono::milliseconds(i % 3), &r, 1));
    for (uint64_t t : toks) loop.cancel_timer(t);
    const size_t after_cancel = r.n_fired();
    assert_true(loop.add_timer(Clock::now() + 30ms, &r, 2) != 0);
    assert_true(wait_for([&] { return r.n_fired() == after_cancel + 1; }, 5000ms));
    std::this_thread::sleep_for(20ms);
    std::lock_guard<std::mutex> lk(r.mu);
    assert_int_equal(r.fired.size(), after_cancel + 1);
    assert_int_equal(r.fired.back(), 2);
    loop.cancel_timer(0);  // no-op, as is a token that fired
}

void test_detach_while_busy(void **) {
    EventLoop loop("test-loop");
    loop.start();
    Recorder r;
    r.loop = &loop;
    int efd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);  // always readable: called every round
    uint64_t tok = loop.attach(efd, EPOLLIN, &r, 0);
    assert_true(tok != 0);
    assert_true(wait_for([&] { return r.events.load() > 100; }, 5000ms));
    loop.detach(tok);
    const int seen = r.events.load();
    std::this_thread::sleep_for(20ms);
    assert_int_equal(r.events.load(), seen);
    close(efd);
    assert_false(r.off_loop.load());
}

void test_call(void **) {
    EventLoop loop("test-loop");
    loop.start();
    bool on_loop = false;
    loop.call([&] { on_loop = loop.on_loop_thread(); });
    assert_true(on_loop);
    // From the loop thread itself (a call inside a posted function): inline.
    std::atomic<int> step{0};
    assert_true(loop.post([&] { loop.call([&] { step = 1; }); }));
    assert_true(wait_for([&] { return step.load() == 1; }, 5000ms));
    loop.stop();
    bool ran = false;
    loop.call([&] { ran = true; });
    assert_true(ran);
    Recorder r;
    assert_int_equal(loop.add_timer(Clock::now(), &r, 0), 0);
    assert_false(loop.post([] {}));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timers_in_order),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_detach_while_busy),
        cmocka_unit_test(test_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
