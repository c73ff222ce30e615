// region_prewarm: the kernel reads every page of the region once at
// kvx_transport_create(), so that the first transfers do not pay a first
// kernel access per page (on some hypervisors, e.g. a PVM guest, the first
// access through a user address from kernel mode costs about ten times a
// later one; touching the pages from user space or MADV_POPULATE_WRITE does
// not help). Read-only: bytes the application writes meanwhile are kept.
#pragma once

#include <cstdint>

namespace kvx {

// Every byte of [base, base + len) is read by the kernel through its user
// address (write() into a pipe, then discarded). Throws Error(KVX_EINVAL)
// naming the offset and block (of block_len bytes) when a part of it cannot be read (not mapped, no read
// access, a file mapping past its end), KVX_EBACKEND when no pipe can be
// made. Blocks the calling thread; about one copy of the region in time.
void prewarm_region(const uint8_t *base, uint64_t len, uint64_t block_len);

}  // namespace kvx
