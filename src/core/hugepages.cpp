#include "core/hugepages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "util/error.h"
#include "util/log.h"
#include "util/proc_maps.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older C headers lack it
#endif

namespace kvx {

namespace {

// The PMD huge page size, 0 when the kernel has no transparent huge pages
// (or hides them: /sys not mounted).
uint64_t pmd_size() {
    ProcLines f("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    const char *line = f.next();
    unsigned long long v = 0;
    if (!line || sscanf(line, "%llu", &v) != 1) return 0;
    return v;
}

// True when [lo, hi) is covered, without a gap, by writable private
// anonymous mappings; false with *why naming the first that is not.
bool anonymous_private(uintptr_t lo, uintptr_t hi, std::string *why) {
    ProcLines maps("/proc/self/maps");
    if (!maps.ok()) {
        *why = strfmt("cannot read /proc/self/maps: %s", strerror(maps.error()));
        return false;
    }
    uintptr_t covered = lo;
    while (covered < hi) {
        const char *line = maps.next();
        if (!line) break;
        MapLine m;
        if (!parse_map_line(line, &m) || m.end <= covered) continue;
        if (m.start > covered) break;  // a gap
        if (!m.anonymous_private() || m.perms[1] != 'w') {
            *why = strfmt("the region is not writable private anonymous memory (a mapping %s %s at %#" PRIxPTR ")",
                          m.perms, m.path.empty() ? (m.inode ? "of a file" : "anonymous") : m.path.c_str(), m.start);
            return false;
        }
        covered = m.end;
    }
    if (covered >= hi) return true;
    *why = strfmt("the region is not mapped at %#" PRIxPTR, covered);
    return false;
}

// Bytes of [lo, hi) on transparent huge pages in this process, from the
// AnonHugePages of /proc/self/smaps (each mapping counted within the range
// at most).
uint64_t anon_huge_bytes(uintptr_t lo, uintptr_t hi) {
    ProcLines smaps("/proc/self/smaps");
    uint64_t total = 0;
    MapLine m;
    bool in = false;
    while (const char *buf = smaps.next()) {
        MapLine next;
        if (parse_map_line(buf, &next)) {
            if (next.start >= hi) break;
            m = next;
            in = m.end > lo;
            continue;
        }
        unsigned long long kb = 0;
        if (in && sscanf(buf, "AnonHugePages: %llu kB", &kb) == 1) {
            const uint64_t overlap = std::min<uintptr_t>(m.end, hi) - std::max<uintptr_t>(m.start, lo);
            total += std::min<uint64_t>(kb * 1024, overlap);
        }
    }
    return total;
}

}  // namespace

HugepageReport hugepages_region(uint8_t *base, uint64_t len) {
    HugepageReport r;
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    if (!anonymous_private(b, b + len, &r.note)) return r;  // not ours to change, on any kernel
    r.page = pmd_size();
    if (r.page == 0 || (r.page & (r.page - 1)) != 0)
        fail(KVX_ENOTSUP, "option region_hugepages: this kernel has no transparent huge pages "
                          "(/sys/kernel/mm/transparent_hugepage/hpage_pmd_size cannot be read)");
    const uintptr_t lo = (b + r.page - 1) & ~(r.page - 1), hi = (b + len) & ~(r.page - 1);
    if (hi <= lo) {
        r.note = strfmt("the region holds no whole, aligned huge page of %llu bytes", (unsigned long long)r.page);
        return r;
    }
    r.interior = hi - lo;
    void *at = reinterpret_cast<void *>(lo);
    if (madvise(at, r.interior, MADV_HUGEPAGE) != 0)
        fail(errno == EINVAL ? KVX_ENOTSUP : KVX_EBACKEND,
             "option region_hugepages: madvise(MADV_HUGEPAGE) of %llu bytes at %p: %s",
             (unsigned long long)r.interior, at, strerror(errno));
    int rc = madvise(at, r.interior, MADV_COLLAPSE);
    for (int again = 0; rc != 0 && errno == EAGAIN && again < 3; again++)  // a page busy for a moment
        rc = madvise(at, r.interior, MADV_COLLAPSE);
    if (rc != 0)
        r.note = errno == EINVAL ? std::string("MADV_COLLAPSE: EINVAL (a kernel before 6.1, or THP disabled for this "
                                               "process): the pages are advised, khugepaged collapses them in the "
                                               "background unless THP is set to never")
                                 : strfmt("MADV_COLLAPSE: %s", strerror(errno));
    if (log_enabled(LogLevel::info)) r.huge = anon_huge_bytes(lo, hi);  // smaps walks every page table
    return r;
}

}  // namespace kvx
