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
    std::lock_guard<std::mutex> lk(mu_);
    running_ = false;
    while (!cmds_.empty()) {  // queued before the loop saw stop_: finish them here
        Cmd *c = cmds_.front();
        cmds_.pop_front();
        apply(*c);
    }
    posted_.clear();
    cv_.notify_all();
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
    }
    c.done = true;
}

void EventLoop::command(Cmd &c) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!running_ || on_loop_thread()) {
        apply(c);  // loop joined (or we are it): nobody else touches entries_
        return;
    }
    cmds_.push_back(&c);
    wake();
    cv_.wait(lk, [&] { return c.done; });
}

uint64_t EventLoop::attach(int fd, uint32_t events, Source *s, int tag) {
    Cmd c{Op::attach, 0, Entry{fd, s, tag}, events};
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!running_ || stop_) return 0;
        c.token = next_token_++;
    }
    command(c);
    return c.token;
}

void EventLoop::modify(uint64_t token, uint32_t events) {
    if (token == 0) return;
    Cmd c{Op::modify, token, Entry{-1, nullptr, 0}, events};
    command(c);
}

void EventLoop::detach(uint64_t token) {
    if (token == 0) return;
    Cmd c{Op::detach, token, Entry{-1, nullptr, 0}, 0};
    command(c);
}

bool EventLoop::post(std::function<void()> fn) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!running_ || stop_) return false;
        posted_.push_back(std::move(fn));
    }
    wake();
    return true;
}

void EventLoop::run_commands() {
    std::deque<std::function<void()>> posted;
    {
        std::lock_guard<std::mutex> lk(mu_);
        while (!cmds_.empty()) {
            Cmd *c = cmds_.front();
            cmds_.pop_front();
            apply(*c);
        }
        posted.swap(posted_);
        cv_.notify_all();
    }
    for (auto &fn : posted) fn();
}

void EventLoop::loop() {
    constexpr int kMaxEvents = 64;
    epoll_event evs[kMaxEvents];
    for (;;) {
        int n = epoll_wait(epfd_, evs, kMaxEvents, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            KVX_LOG(error, "%s: epoll_wait: %s", name_, strerror(errno));
            break;
        }
        bool woken = false;
        for (int i = 0; i < n; i++) woken |= evs[i].data.u64 == 0;
        if (woken) {
            uint64_t v;
            while (::read(wakefd_, &v, sizeof v) > 0) {
            }
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
    }
}

}  // namespace kvx
