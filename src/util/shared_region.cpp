#include "util/shared_region.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "util/error.h"
#include "util/proc_maps.h"

namespace kvx::shared {

namespace {

struct Allocated {
    int fd;
    uint64_t size;  // mapped bytes (page-rounded)
};

std::mutex g_mu;
std::map<uintptr_t, Allocated> g_regions;  // by base

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// The consecutive maps lines covering [lo, hi), all of one file, shared, at
// consecutive file offsets: the first of them in *first.
bool covering_mapping(uintptr_t lo, uintptr_t hi, MapLine *first, std::string *why) {
    ProcLines maps("/proc/self/maps");
    if (!maps.ok()) {
        *why = strfmt("cannot read /proc/self/maps: %s", strerror(maps.error()));
        return false;
    }
    MapLine prev;
    bool in = false;
    uintptr_t covered = 0;
    while (const char *line = maps.next()) {
        MapLine m;
        if (!parse_map_line(line, &m) || m.end <= lo) continue;
        if (!in) {
            if (m.start > lo) break;
            *first = prev = m;
            in = true;
        } else if (m.start != prev.end || m.inode != prev.inode || m.maj != prev.maj || m.min != prev.min ||
                   m.offset != prev.offset + (prev.end - prev.start) || m.path != prev.path) {
            break;
        }
        if (m.perms[3] != 's' || m.perms[1] != 'w' || m.inode == 0) break;
        prev = m;
        covered = m.end;
        if (covered >= hi) break;
    }
    if (in && covered >= hi) return true;
    *why = !in ? std::string("the region is not mapped")
               : strfmt("the region is not one writable MAP_SHARED file mapping (%s %s)", prev.perms,
                        prev.path.empty() ? "anonymous" : prev.path.c_str());
    return false;
}

// True when st is the file of maps line m, large enough for [offset, offset + len).
bool is_mapped_file(const struct stat &st, const MapLine &m, uint64_t offset, uint64_t len) {
    return S_ISREG(st.st_mode) && st.st_ino == m.inode && major(st.st_dev) == m.maj && minor(st.st_dev) == m.min &&
           static_cast<uint64_t>(st.st_size) >= offset + len;
}

// A file with no name to open it by (a memfd, a deleted file): a descriptor
// of it that this process holds open for reading and writing, duplicated.
// Python's mmap keeps one for its mapping; so do most owners of a memfd.
bool open_fd_of(const MapLine &m, uint64_t offset, uint64_t len, Backing *out, std::string *why) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        *why = strfmt("the region's file %s has no name to open it by, and /proc/self/fd cannot be read: %s",
                      m.path.c_str(), strerror(errno));
        return false;
    }
    int found = -1;
    while (dirent *e = readdir(d)) {
        char *end = nullptr;
        const long fd = strtol(e->d_name, &end, 10);
        struct stat st;
        if (end == e->d_name || *end != '\0' || fd == dirfd(d) || fstat(static_cast<int>(fd), &st) != 0) continue;
        const int fl = fcntl(static_cast<int>(fd), F_GETFL);
        if (fl != -1 && (fl & O_ACCMODE) == O_RDWR && is_mapped_file(st, m, offset, len)) {
            found = static_cast<int>(fd);
            break;
        }
    }
    if (found >= 0) out->fd = net::Fd(fcntl(found, F_DUPFD_CLOEXEC, 0));
    closedir(d);
    if (!out->fd) {
        *why = found < 0 ? strfmt("the region's file %s has no name to open it by, and this process holds no "
                                  "descriptor of it open for writing",
                                  m.path.c_str())
                         : strfmt("cannot duplicate the descriptor of %s: %s", m.path.c_str(), strerror(errno));
        return false;
    }
    out->offset = offset;
    out->what = strfmt("%s (an open descriptor)", m.path.c_str());
    return true;
}

bool open_mapped_file(const MapLine &m, uintptr_t lo, uint64_t len, Backing *out, std::string *why) {
    const std::string deleted = " (deleted)";
    const uint64_t offset = m.offset + (lo - m.start);
    if (m.path.empty() || m.path[0] != '/' ||
        (m.path.size() >= deleted.size() && m.path.compare(m.path.size() - deleted.size(), deleted.size(), deleted) == 0))
        return open_fd_of(m, offset, len, out, why);
    net::Fd fd(open(m.path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY));
    struct stat st;
    if (!fd || fstat(fd.get(), &st) != 0) {
        *why = strfmt("cannot open %s: %s", m.path.c_str(), strerror(errno));
        return false;
    }
    if (!is_mapped_file(st, m, offset, len)) {
        *why = strfmt("%s is not the file mapped at the region (replaced or shrunk)", m.path.c_str());
        return false;
    }
    out->fd = std::move(fd);
    out->offset = offset;
    out->what = m.path;
    return true;
}

}  // namespace

void *alloc(uint64_t size, bool huge_pages) {
    if (size == 0) fail(KVX_EINVAL, "region size is 0");
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge_pages ? MFD_HUGETLB : 0);
    net::Fd fd(memfd_create("kvxfer-region", flags));
    if (!fd) {
        if (errno == ENOSYS) fail(KVX_ENOTSUP, "memfd_create: %s", strerror(errno));
        fail(errno == EINVAL && huge_pages ? KVX_ENOTSUP : KVX_ENOMEM, "memfd_create: %s", strerror(errno));
    }
    const uint64_t page = huge_pages ? 2u << 20 : static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (size > UINT64_MAX - page || round_up(size, page) > static_cast<uint64_t>(PTRDIFF_MAX))
        fail(KVX_EOVERFLOW, "region size %" PRIu64 " is too large", size);
    const uint64_t mapped = round_up(size, page);
    if (ftruncate(fd.get(), static_cast<off_t>(mapped)) != 0)
        fail(KVX_ENOMEM, "cannot size a region of %" PRIu64 " bytes: %s", mapped, strerror(errno));
    // A peer that maps it never faults past the end: it cannot shrink.
    if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        fail(KVX_ENOTSUP, "cannot seal the region's memfd: %s", strerror(errno));
    void *p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) fail(KVX_ENOMEM, "cannot map a region of %" PRIu64 " bytes: %s", mapped, strerror(errno));
    std::lock_guard<std::mutex> lk(g_mu);
    g_regions[reinterpret_cast<uintptr_t>(p)] = Allocated{fd.release(), mapped};
    return p;
}

bool free(void *base) {
    Allocated a;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_regions.find(reinterpret_cast<uintptr_t>(base));
        if (it == g_regions.end()) return false;
        a = it->second;
        g_regions.erase(it);
    }
    munmap(base, a.size);
    close(a.fd);
    return true;
}

bool find_backing(const void *base, uint64_t len, Backing *out, std::string *why) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base);
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_regions.upper_bound(lo);
        if (it != g_regions.begin()) {
            --it;
            if (lo - it->first <= it->second.size && len <= it->second.size - (lo - it->first)) {
                out->fd = net::Fd(fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0));
                if (!out->fd) fail(KVX_EBACKEND, "dup of a region's memfd: %s", strerror(errno));
                out->offset = lo - it->first;
                out->what = "memfd (kvx_region_alloc)";
                return true;
            }
        }
    }
    MapLine m;
    if (!covering_mapping(lo, lo + len, &m, why) || !open_mapped_file(m, lo, len, out, why)) return false;
    if (!in_memory_fs(out->fd.get())) {
        *why = strfmt("%s is not on tmpfs or hugetlbfs (a writer's page faults there could wait on a disk or a "
                      "FUSE server)", out->what.c_str());
        out->fd = net::Fd();
        return false;
    }
    return true;
}

bool in_memory_fs(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC);
}

}  // namespace kvx::shared
