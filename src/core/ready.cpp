#include "core/ready.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "util/error.h"

namespace kvx {

void ReadySignal::taken(size_t n) {
    ready_ -= n;
    if (ready_ == 0 && !closed_) signal_fd(false);
}

void ReadySignal::became_ready() {
    if (waiters_ > 0) ready_cv_.notify_all();
    signal_fd(true);
}

// The eventfd mirrors "something is ready": one write when that starts, one
// read when it ends; nothing while it stays so (level-triggered for epoll).
void ReadySignal::signal_fd(bool on) {
    if (!fd_ || fd_on_ == on) return;
    eventfd_t v = 0;
    const int rc = on ? eventfd_write(fd_.get(), 1) : eventfd_read(fd_.get(), &v);
    if (rc == 0 || errno == EAGAIN) fd_on_ = on;  // EAGAIN on read: it was 0 already
}

int ReadySignal::fd() {
    if (!fd_) {
        const int f = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (f < 0) fail(KVX_EBACKEND, "kvx_completion_fd: eventfd failed: %s", strerror(errno));
        fd_ = net::Fd(f);
        if (ready_ > 0 || closed_) signal_fd(true);
    }
    return fd_.get();
}

bool ReadySignal::wait(std::unique_lock<std::mutex> &lk, int timeout_ms) {
    auto done = [&] { return ready_ > 0 || closed_; };
    waiters_++;
    if (timeout_ms < 0)
        ready_cv_.wait(lk, done);
    else
        ready_cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), done);
    if (--waiters_ == 0 && closed_) left_cv_.notify_all();
    return !closed_;
}

void ReadySignal::close(std::unique_lock<std::mutex> &lk) {
    closed_ = true;
    ready_ = 0;
    ready_cv_.notify_all();
    signal_fd(true);
    left_cv_.wait(lk, [&] { return waiters_ == 0; });
}

}  // namespace kvx
