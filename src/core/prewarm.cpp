#include "core/prewarm.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "util/error.h"
#include "util/net.h"

namespace kvx {

namespace {

// Empties n bytes out of the pipe: spliced into /dev/null when it can be
// opened (no copy), else read into a buffer.
class Drain {
public:
    explicit Drain(size_t cap) : null_(::open("/dev/null", O_WRONLY | O_CLOEXEC)) {
        if (null_.get() < 0) buf_.reset(new uint8_t[cap]);
    }
    void take(int rd, size_t n) {
        while (n > 0) {
            const ssize_t r = buf_ ? ::read(rd, buf_.get(), n) : ::splice(rd, nullptr, null_.get(), nullptr, n, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                fail(KVX_EBACKEND, "option region_prewarm: emptying a pipe: %s", r < 0 ? strerror(errno) : "EOF");
            n -= static_cast<size_t>(r);
        }
    }

private:
    net::Fd null_;
    std::unique_ptr<uint8_t[]> buf_;
};

}  // namespace

void prewarm_region(const uint8_t *base, uint64_t len, uint64_t block_len) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        fail(KVX_EBACKEND, "option region_prewarm: pipe2: %s", strerror(errno));
    net::Fd rd(p[0]), wr(p[1]);
    // 1 MiB per write when the system allows pipes that large (pipe-max-size):
    // fewer calls; otherwise the default capacity (a whole number of pages).
    int cap = fcntl(wr.get(), F_SETPIPE_SZ, 1 << 20);
    if (cap <= 0) cap = fcntl(wr.get(), F_GETPIPE_SZ);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t step = cap > 0 ? static_cast<size_t>(cap) : page;
    Drain drain(step);
    for (uint64_t at = 0; at < len;) {
        // Every write but the first starts on a page boundary: a page that
        // cannot be read then ends the write exactly where it begins (a pipe
        // keeps no partly copied page), and the next write names it.
        const size_t mis = reinterpret_cast<uintptr_t>(base + at) & (page - 1);
        const size_t want = static_cast<size_t>(std::min<uint64_t>(mis ? page - mis : step, len - at));
        const ssize_t w = ::write(wr.get(), base + at, want);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EFAULT)
                fail(KVX_EINVAL, "option region_prewarm: the region is not readable at byte offset %llu (block %llu, address %p)",
                     (unsigned long long)at, (unsigned long long)(at / block_len), static_cast<const void *>(base + at));
            fail(KVX_EBACKEND, "option region_prewarm: write to a pipe: %s", strerror(errno));
        }
        if (w == 0) fail(KVX_EINTERNAL, "option region_prewarm: a pipe took nothing");
        at += static_cast<uint64_t>(w);
        drain.take(rd.get(), static_cast<size_t>(w));  // empty again: the next write never waits
    }
}

}  // namespace kvx
