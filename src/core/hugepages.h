// region_hugepages: kvx_transport_create() moves the region's private
// anonymous memory onto transparent huge pages (MADV_HUGEPAGE, then
// MADV_COLLAPSE), so that a same-host writer's process_vm_writev walks the
// target's page table once per huge page instead of once per 4 KiB page: that
// walk, and the lock of the page table that two copy threads share, are most
// of the kernel path's cost beside the copy itself (docs/performance.md,
// "Release 0.4.6").
#pragma once

#include <cstdint>
#include <string>

namespace kvx {

struct HugepageReport {
    uint64_t page = 0;      // the huge page size (PMD): 2 MiB on x86-64
    uint64_t interior = 0;  // bytes of the region in whole, aligned huge pages
    uint64_t huge = 0;      // of them, on huge pages afterwards (/proc/self/smaps; counted for KVX_LOG=info only)
    std::string note;       // why not all of them, when so
};

// Advises the region's whole aligned huge pages MADV_HUGEPAGE and collapses
// them now (MADV_COLLAPSE, Linux 6.1+): the bytes stay, pages never touched
// are populated (zero) when collapsed, the calling thread copies about the
// region once. Only when every mapping under the region is writable private
// anonymous memory; otherwise nothing is changed, on any kernel (report.note
// says why). Throws Error(KVX_ENOTSUP) when the kernel has no transparent
// huge pages; a collapse the kernel refuses in part (no free huge page, a
// pinned page) is no error: report.huge says how much it got.
HugepageReport hugepages_region(uint8_t *base, uint64_t len);

}  // namespace kvx
