// One epoll loop on its own thread, shared by every backend of a transport:
// the tcp listener and connections, the verbs CQ channels and rdma_cm events.
// Sources are attached by fd; a detached source is never called again once
// detach() returns, which is what lets an owner free its state right after.
#pragma once

#include <sys/epoll.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace kvx {

class EventLoop {
public:
    class Source {
    public:
        // events: the EPOLL* bits that are ready (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP).
        virtual void on_event(int tag, uint32_t events) = 0;

    protected:
        ~Source() = default;
    };

    // name: the thread's name (at most 15 characters). Throws Error(KVX_EBACKEND).
    explicit EventLoop(const char *name);
    ~EventLoop();
    EventLoop(const EventLoop &) = delete;
    EventLoop &operator=(const EventLoop &) = delete;

    void start();
    // Joins the thread. Later attach() fails, later detach() runs inline.
    void stop();
    // fd must be non-blocking; events (EPOLLIN and/or EPOLLOUT) are
    // level-triggered. Returns a token, 0 when the loop is stopped.
    uint64_t attach(int fd, uint32_t events, Source *s, int tag);
    // Changes the events a source waits for; no-op for an unknown token.
    void modify(uint64_t token, uint32_t events);
    void detach(uint64_t token);
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
    enum class Op { attach, modify, detach };
    struct Cmd {
        Op op;
        uint64_t token;
        Entry entry;
        uint32_t events;
        bool done = false;
    };
    void loop();
    void apply(Cmd &c);  // loop thread, or any thread once stopped
    void run_commands();
    void command(Cmd &c);  // apply on the loop thread and wait, or inline
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
    std::unordered_map<uint64_t, Entry> entries_;  // owned by the loop
};

}  // namespace kvx
