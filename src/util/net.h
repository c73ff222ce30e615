// Socket helpers shared by the backends: address parsing, deadline-bounded
// connect/read/write, interface enumeration. Linux only.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace kvx::net {

using Clock = std::chrono::steady_clock;

// An IPv4 or IPv6 address and port (agent metadata carries these).
struct Endpoint {
    uint8_t family = 4;  // 4 or 6
    std::array<uint8_t, 16> addr{};
    uint16_t port = 0;
    std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
    bool operator==(const Endpoint &) const = default;
};

// Syntax only, no name lookup: "HOST:PORT" or "[V6]:PORT" with PORT 0..65535
// and a non-empty HOST unless allow_empty_host. Throws Error(KVX_EINVAL) naming what.
void check_hostport_syntax(const std::string &s, const char *what, bool allow_empty_host);
// "HOST:PORT" or "[V6]:PORT" (HOST numeric or a name); throws Error(KVX_EINVAL) naming what.
sockaddr_storage parse_hostport(const std::string &s, const char *what, bool passive);
Endpoint to_endpoint(const sockaddr_storage &ss);
sockaddr_storage from_endpoint(const Endpoint &e, socklen_t *len);
socklen_t sa_len(const sockaddr_storage &ss);

// Non-loopback IPv4 addresses of interfaces that are up, in interface order.
std::vector<Endpoint> local_ipv4_endpoints(uint16_t port);

// An address of a network interface and the prefix length of its subnet.
struct IfAddr {
    std::string name;  // "eth0"
    Endpoint addr;     // port 0
    uint8_t prefix = 0;
    bool running = false;  // IFF_RUNNING: up, with a carrier
};
// The IPv4 and IPv6 addresses of the interfaces that are up, but loopback's
// and IPv6 link-local ones, in interface order (getifaddrs).
std::vector<IfAddr> interface_addrs();
// True when a and b are of one family and agree in their first prefix bits
// (at most the address's; a prefix of 0 matches nothing).
bool same_subnet(const Endpoint &a, const Endpoint &b, unsigned prefix);

// Owned file descriptor.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd &&o) noexcept : fd_(o.release()) {}
    Fd &operator=(Fd &&o) noexcept;
    ~Fd();
    int get() const { return fd_; }
    int release() {
        int f = fd_;
        fd_ = -1;
        return f;
    }
    explicit operator bool() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

// A point in time to be done by, which the owner of a flag may also call off
// (close, or a remove, while a peer connects): waits on it then end within
// kCancelSliceMs with -ECANCELED instead of running to the time.
class Deadline {
public:
    static constexpr int kCancelSliceMs = 20;
    Deadline() = default;
    Deadline(Clock::time_point at, const std::atomic<bool> *cancel = nullptr) : at_(at), cancel_(cancel) {}
    Clock::time_point at() const { return at_; }
    bool cancelled() const { return cancel_ != nullptr && cancel_->load(std::memory_order_relaxed); }
    // The time has come, or the wait was called off.
    bool passed() const { return cancelled() || Clock::now() >= at_; }
    // The same deadline, called off alike, but no later than t.
    Deadline sooner(Clock::time_point t) const { return Deadline(std::min(at_, t), cancel_); }
    // Milliseconds a single wait may last: what is left, cut to slices when
    // the deadline can be called off; 0 once passed.
    int slice_ms() const;

private:
    Clock::time_point at_{};
    const std::atomic<bool> *cancel_ = nullptr;
};

// Milliseconds until deadline, 0 once it has passed (for poll and friends).
int ms_left(Clock::time_point deadline);
// Waits for events (POLLIN, POLLOUT) on fd until the deadline: 0 ready,
// -ETIMEDOUT, -ECANCELED (called off), -errno.
int wait_fd(int fd, short events, const Deadline &deadline);

// accept4() failed for want of descriptors or kernel memory (errno err): a
// level-triggered listener would fire again at once, so pause it instead.
bool accept_exhausted(int err);

// Connects before the deadline, from the local address `from` when given
// (port 0: any); returns 0 with *out set, or -errno.
int connect_by(const Endpoint &e, const Deadline &deadline, Fd *out, const Endpoint *from = nullptr);

// Read/write exactly n bytes before the deadline. Return 0, or -errno
// (-ETIMEDOUT, -ECANCELED, -ECONNRESET for EOF).
int read_full_by(int fd, void *buf, size_t n, const Deadline &deadline);
int write_full_by(int fd, const void *buf, size_t n, const Deadline &deadline);


void set_nodelay(int fd);
// Closes a stream socket with a reset: unsent bytes are discarded (never
// delivered later) and the peer sees ECONNRESET, even while it still has
// received bytes it has not read. fd is empty afterwards.
void abort_close(Fd &fd);
// How long a reset sent on this TCP socket now may take to reach the peer:
// it travels behind every byte already sent, and a peer that keeps reading
// lands those meanwhile. The smoothed round trip plus four deviations
// (TCP_INFO), in microseconds; 0 when the socket has no TCP_INFO.
uint32_t reset_travel_us(int fd);
// The socket's pending error (ECONNRESET once a reset arrived), 0 for none.
// Clears it.
int pending_error(int fd);
// Sets O_NONBLOCK; throws Error(KVX_EBACKEND) naming what.
void set_nonblocking(int fd, const char *what);

// Consumes n bytes from the front of an iovec array: advances *iov past
// the iovecs that are done and trims the first one left. Returns the new count.
size_t advance_iov(iovec *&iov, size_t cnt, size_t n);

}  // namespace kvx::net
