#include "util/event_loop.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"
#include "util/log.h"

namespace kvx {

EventLoop::EventLoop(const char *name) : name_(name) {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) fail(KVX_EBACKEND, "epoll_create1: %s", strerror(errno));
    wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakefd_ < 0) {
        int e = errno;
        ::close(epfd_);
        fail(KVX_EBACKEND, "eventfd: %s", strerror(e));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;  // token 0: the wake-up eventfd
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
}

EventLoop::~EventLoop() {
    stop();
    ::close(wakefd_);
    ::close(epfd_);
}

void EventLoop::start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (running_ || stop_) return;
    running_ = true;
    thread_ = std::thread([this] { loop(); });
    thread_id_ = thread_.get_id();
    pthread_setname_np(thread_.native_handle(), name_);
}

void EventLoop::wake() {
    uint64_t one = 1;
    (void)!::write(wakefd_, &one, sizeof one);
}

void EventLoop::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
        stop_ = true;
    }
    wake();
    if (thread_.joinable()) thread_.join();
    std::deque<Cmd *> left;
    {
        std::lock_guard<std::mutex> lk(mu_);
        running_ = false;
        left.swap(cmds_);  // queued before the loop saw stop_: finish them here
        posted_.clear();
    }
    for (Cmd *c : left) {
        if (c->op == Op::call) (*c->fn)();
        std::lock_guard<std::mutex> lk(mu_);
        if (c->op != Op::call) apply(*c);
        c->done = true;  // c belongs to its waiter from here on
        cv_.notify_all();
    }
}

void EventLoop::apply(Cmd &c) {
    epoll_event ev{};
    ev.events = c.events;
    ev.data.u64 = c.token;
    switch (c.op) {
    case Op::attach:
        if (epoll_ctl(epfd_, EPOLL_CTL_ADD, c.entry.fd, &ev) == 0) entries_[c.token] = c.entry;
        else c.token = 0;
        break;
    case Op::modify:
        if (auto it = entries_.find(c.token); it != entries_.end()) epoll_ctl(epfd_, EPOLL_CTL_MOD, it->second.fd, &ev);
        break;
    case Op::detach:
        if (auto it = entries_.find(c.token); it != entries_.end()) {
            epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
            entries_.erase(it);
        }
        break;
    default: apply_timer(c); break;
    }
}

void EventLoop::apply_timer(Cmd &c) {
    if (c.op == Op::add_timer) {
        timers_[c.token] = Timer{c.when, c.entry.src, c.entry.tag};
        due_.emplace(c.when, c.token);
        return;
    }
    timers_.erase(c.token);
    if (due_.size() > 2 * timers_.size() + 64) {  // mostly cancelled: rebuild from the live ones
        decltype(due_) live;
        for (const auto &[tok, t] : timers_) live.emplace(t.when, tok);
        due_.swap(live);
    }
}

void EventLoop::command(Cmd &c) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!running_ || on_loop_thread()) {
        // Loop joined (or we are it): nobody else touches entries_ or timers_.
        if (c.op != Op::call) return apply(c);
        lk.unlock();
        return (*c.fn)();
    }
    cmds_.push_back(&c);
    wake();
    cv_.wait(lk, [&] { return c.done; });
}

uint64_t EventLoop::new_token() {
    std::lock_guard<std::mutex> lk(mu_);
    return !running_ || stop_ ? 0 : next_token_++;
}

uint64_t EventLoop::attach(int fd, uint32_t events, Source *s, int tag) {
    Cmd c{Op::attach, new_token(), Entry{fd, s, tag}, events};
    if (c.token) command(c);
    return c.token;
}

void EventLoop::modify(uint64_t token, uint32_t events) {
    if (token == 0) return;
    Cmd c{Op::modify, token};
    c.events = events;
    command(c);
}

void EventLoop::detach(uint64_t token) {
    if (token == 0) return;
    Cmd c{Op::detach, token};
    command(c);
}

uint64_t EventLoop::add_timer(Clock::time_point when, Source *s, int tag) {
    Cmd c{Op::add_timer, new_token(), Entry{-1, s, tag}};
    c.when = when;
    if (c.token) command(c);
    return c.token;
}

void EventLoop::cancel_timer(uint64_t token) {
    if (token == 0) return;
    Cmd c{Op::cancel_timer, token};
    command(c);
}

void EventLoop::call(const std::function<void()> &fn) {
    Cmd c{Op::call};
    c.fn = &fn;
    command(c);
}

bool EventLoop::post(std::function<void()> fn) {
    bool first;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!running_ || stop_) return false;
        first = posted_.empty();
        posted_.push_back(std::move(fn));
    }
    if (first) wake();  // later ones ride on that wake-up: the loop takes them all at once
    return true;
}

void EventLoop::run_commands() {
    std::vector<Cmd *> calls;
    std::deque<std::function<void()>> posted;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (Cmd *c : cmds_) {
            if (c->op == Op::call) {
                calls.push_back(c);
                continue;
            }
            apply(*c);
            c->done = true;
        }
        cmds_.clear();
        posted.swap(posted_);
        cv_.notify_all();
    }
    // Called functions run without mu_: they may attach, detach or post.
    for (Cmd *c : calls) (*c->fn)();
    if (!calls.empty()) {
        std::lock_guard<std::mutex> lk(mu_);
        for (Cmd *c : calls) c->done = true;
        cv_.notify_all();
    }
    for (auto &fn : posted) fn();
}

int EventLoop::next_timeout_ms() {
    while (!due_.empty() && !timers_.count(due_.top().second)) due_.pop();
    if (due_.empty()) return -1;
    auto left = due_.top().first - Clock::now();
    if (left <= Clock::duration::zero()) return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return static_cast<int>(std::min<decltype(ms)>(ms, 1 << 30));
}

void EventLoop::run_timers() {
    const auto now = Clock::now();
    while (!due_.empty() && due_.top().first <= now) {
        const uint64_t tok = due_.top().second;
        due_.pop();
        auto it = timers_.find(tok);
        if (it == timers_.end()) continue;  // cancelled
        const Timer t = it->second;
        timers_.erase(it);
        t.src->on_timer(t.tag);
    }
}

void EventLoop::loop() {
    constexpr int kMaxEvents = 64;
    epoll_event evs[kMaxEvents];
    for (;;) {
        int n = epoll_wait(epfd_, evs, kMaxEvents, next_timeout_ms());
        if (n < 0) {
            if (errno == EINTR) continue;
            KVX_LOG(error, "%s: epoll_wait: %s", name_, strerror(errno));
            break;
        }
        bool woken = false;
        for (int i = 0; i < n; i++) woken |= evs[i].data.u64 == 0;
        if (woken) {
            uint64_t v;
            (void)!::read(wakefd_, &v, sizeof v);  // takes every wake-up so far
            {
                std::lock_guard<std::mutex> lk(mu_);
                if (stop_) break;
            }
            // Detaches take effect before any event of this round is dispatched.
            run_commands();
        }
        for (int i = 0; i < n; i++) {
            uint64_t tok = evs[i].data.u64;
            if (tok == 0) continue;
            auto it = entries_.find(tok);
            if (it == entries_.end()) continue;  // detached meanwhile
            Entry e = it->second;
            e.src->on_event(e.tag, evs[i].events);
        }
        run_timers();
    }
}

}  // namespace kvx
