// Memory that same-host peers can map: the regions of kvx_region_alloc()
// (a sealed memfd each), and the lookup of the shareable file behind any
// address range of this process (such a region, or a MAP_SHARED mapping of a
// file in /proc/self/maps: vLLM's /dev/shm files, hugetlbfs).
#pragma once

#include <cstdint>
#include <string>

#include "util/net.h"

namespace kvx::shared {

// Allocates size bytes (page-rounded) backed by a memfd sealed against
// shrinking; throws Error(KVX_ENOMEM / KVX_ENOTSUP / KVX_EINVAL).
void *alloc(uint64_t size, bool huge_pages);
// Frees a region of alloc(); false for an address it did not return.
bool free(void *base);

// The file that backs [base, base + len) in this process, opened read-write,
// and the offset of base in it.
struct Backing {
    net::Fd fd;
    uint64_t offset = 0;
    std::string what;  // for the log: "memfd (kvx_region_alloc)", the file's path
};
// True with *out when the whole range lies in one shareable file mapped
// MAP_SHARED at consecutive offsets, and the file can be had: a region of
// alloc(), a file reopened by its path, or (a memfd, a deleted file) a
// descriptor of it this process holds open read-write; false with *why. The
// file must be on tmpfs or hugetlbfs (in_memory_fs).
bool find_backing(const void *base, uint64_t len, Backing *out, std::string *why);
// fd's file lives in memory (tmpfs, hugetlbfs): a page fault on a mapping of
// it never waits for a disk or a FUSE server.
bool in_memory_fs(int fd);

}  // namespace kvx::shared
