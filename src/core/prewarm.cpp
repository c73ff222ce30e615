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

void prewarm_region(const uint8_t *base, uint64_t len, uint64_t block_len) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        fail(KVX_EBACKEND, "option region_prewarm: pipe2: %s", strerror(errno));
    net::Fd rd(p[0]), wr(p[1]);
    // 1 MiB per write when the system allows pipes that large (pipe-max-size):
    // fewer calls; otherwise the default capacity.
    int cap = fcntl(wr.get(), F_SETPIPE_SZ, 1 << 20);
    if (cap <= 0) cap = fcntl(wr.get(), F_GETPIPE_SZ);
    if (cap <= 0) cap = 1 << 16;
    const size_t step = static_cast<size_t>(cap);
    std::unique_ptr<uint8_t[]> sink(new uint8_t[step]);
    for (uint64_t at = 0; at < len;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(step, len - at));
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
        for (ssize_t left = w; left > 0;) {  // empty the pipe again (nonblocking: never waits)
            const ssize_t r = ::read(rd.get(), sink.get(), static_cast<size_t>(left));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) fail(KVX_EINTERNAL, "option region_prewarm: read from a pipe: %s", r < 0 ? strerror(errno) : "EOF");
            left -= r;
        }
    }
}

}  // namespace kvx
