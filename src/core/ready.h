// How many finished transfer ids wait for kvx_poll(), and who is told when
// there are some: threads in kvx_wait() and the descriptor of
// kvx_completion_fd(). Every method runs under the transport's lock (the
// mutex of the unique_lock the waiting methods take).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>

#include "util/net.h"

namespace kvx {

class ReadySignal {
public:
    // n ids were queued for poll / n were taken by poll or dropped by cancel.
    void added(size_t n) {
        if (n > 0 && ready_ == 0) became_ready();
        ready_ += n;
    }
    void taken(size_t n);
    size_t count() const { return ready_; }
    // The eventfd, made on the first call (throws KVX_EBACKEND); readable
    // while count() > 0 and for good once closed.
    int fd();
    // Releases lk until count() > 0, close() or timeout_ms (-1: no limit)
    // has passed; returns false once closed.
    bool wait(std::unique_lock<std::mutex> &lk, int timeout_ms);
    // Wakes every waiter, leaves the descriptor readable, and returns once no
    // thread is inside wait() any more (lk is released meanwhile). The ids
    // are forgotten: count() is 0 afterwards.
    void close(std::unique_lock<std::mutex> &lk);

private:
    void became_ready();
    void signal_fd(bool on);

    size_t ready_ = 0;
    unsigned waiters_ = 0;
    bool closed_ = false;
    std::condition_variable ready_cv_, left_cv_;
    net::Fd fd_;
    bool fd_on_ = false;  // the eventfd's counter is not 0
};

}  // namespace kvx
