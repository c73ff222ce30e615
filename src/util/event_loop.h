// One epoll loop on its own thread, shared by every backend of a transport:
// the tcp listener and connections, the verbs CQ channels and rdma_cm events.
// Sources are attached by fd; a detached source is never called again once
// detach() returns, which is what lets an owner free its state right after.
// Timers are one-shot, kept in a min-heap that sets epoll_wait's timeout; a
// cancelled timer never fires once cancel_timer() returns.
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvx {

class EventLoop {
public:
    using Clock = std::chrono::steady_clock;

    class Source {
    public:
        // events: the EPOLL* bits that are ready (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP).
        virtual void on_event(int tag, uint32_t events) = 0;
        // A timer set with add_timer() for this source is due.
        virtual void on_timer(int tag) { (void)tag; }

    protected:
        ~Source() = default;
    };

    // name: the thread's name (at most 15 characters). Throws Error(KVX_EBACKEND).
    explicit EventLoop(const char *name);
    ~EventLoop();
    EventLoop(const EventLoop &) = delete;
    EventLoop &operator=(const EventLoop &) = delete;

    void start();
    // Joins the thread. Later attach() and add_timer() fail, later detach(),
    // cancel_timer() and call() run inline.
    void stop();
    // fd must be non-blocking; events (EPOLLIN and/or EPOLLOUT) are
    // level-triggered. Returns a token, 0 when the loop is stopped.
    uint64_t attach(int fd, uint32_t events, Source *s, int tag);
    // Changes the events a source waits for; no-op for an unknown token.
    void modify(uint64_t token, uint32_t events);
    void detach(uint64_t token);
    // Calls s->on_timer(tag) once on the loop thread, at `when` or soon after
    // (millisecond resolution). Returns a token, 0 when the loop is stopped.
    uint64_t add_timer(Clock::time_point when, Source *s, int tag);
    // No-op for a token that fired, was cancelled, or is 0.
    void cancel_timer(uint64_t token);
    // Runs fn on the loop thread between two rounds of events and waits for
    // it; inline when called on the loop thread or once the loop is stopped.
    // While fn runs no source is being called. fn must not wait for the loop.
    void call(const std::function<void()> &fn);
    // Runs fn on the loop thread (soon, in order); false if the loop is
    // stopped. A fn still queued when stop() runs is dropped, never called.
    bool post(std::function<void()> fn);
    bool on_loop_thread() const { return std::this_thread::get_id() == thread_id_; }

private:
    struct Entry {
        int fd;
        Source *src;
        int tag;
    };
    struct Timer {
        Clock::time_point when;
        Source *src;
        int tag;
    };
    enum class Op { attach, modify, detach, add_timer, cancel_timer, call };
    struct Cmd {
        Op op;
        uint64_t token = 0;
        Entry entry{-1, nullptr, 0};
        uint32_t events = 0;
        Clock::time_point when{};
        const std::function<void()> *fn = nullptr;
        bool done = false;
    };
    using Due = std::pair<Clock::time_point, uint64_t>;

    void loop();
    void apply(Cmd &c);  // under mu_: on the loop thread, or any thread once stopped
    void apply_timer(Cmd &c);
    void run_commands();
    void command(Cmd &c);  // apply on the loop thread and wait, or inline
    uint64_t new_token();  // 0 when stopped
    int next_timeout_ms();
    void run_timers();
    void wake();

    const char *name_;
    int epfd_ = -1;
    int wakefd_ = -1;
    std::thread thread_;
    std::thread::id thread_id_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Cmd *> cmds_;
    std::deque<std::function<void()>> posted_;
    bool running_ = false;
    bool stop_ = false;
    uint64_t next_token_ = 1;
    // The loop thread's; other threads change them (under mu_) only once it is joined.
    std::unordered_map<uint64_t, Entry> entries_;
    std::unordered_map<uint64_t, Timer> timers_;
    std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;  // may hold cancelled tokens
};

}  // namespace kvx
