// Host facts: kernel, CPU features the AEAD codes care about, the locked
// memory limit, and what the shm backend meets here (Yama's ptrace_scope,
// /dev/shm, hugetlbfs, transparent huge pages).
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <fstream>
#include <sstream>

#include "info/info.h"

namespace kvx::info {

namespace {

constexpr long kTmpfsMagic = 0x01021994;
constexpr int kCapSysPtrace = 19, kCapIpcLock = 14;

// Bit `cap` of CapEff in /proc/self/status.
bool has_cap(int cap) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> cap) & 1;
    return false;
}

// The selected word of a sysfs choice file ("always [madvise] never").
std::string bracketed(const std::string &path) {
    const std::string s = read_line(path);
    const size_t a = s.find('['), b = s.find(']');
    if (a == std::string::npos || b == std::string::npos || b < a) return s;
    return s.substr(a + 1, b - a - 1);
}

Json limit_json(rlim_t v) { return v == RLIM_INFINITY ? Json(nullptr) : Json(static_cast<uint64_t>(v)); }

Json cpu_facts() {
    // The features tcp.aead_impl's codes need (ipsec-mb: SSE4.2, AES-NI and
    // PCLMULQDQ; its VAES code, which auto takes: the rest).
    static const char *const kFlags[] = {"aes", "pclmulqdq", "sse4_2", "avx2", "avx512f", "vaes",
                                         "vpclmulqdq", "gfni", "avx512ifma", "sha_ni"};
    Json out = Json::object();
    std::ifstream f("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(f, line)) {
        const std::string key = line.substr(0, line.find(':'));
        const std::string value = line.find(": ") == std::string::npos ? "" : line.substr(line.find(": ") + 2);
        if (model.empty() && key.rfind("model name", 0) == 0) model = value;
        if (flags.empty() && key.rfind("flags", 0) == 0) flags = " " + value + " ";
    }
    out["model"] = model.empty() ? Json(nullptr) : Json(model);
    Json present = Json::object();
    for (const char *fl : kFlags) present[fl] = flags.find(std::string(" ") + fl + " ") != std::string::npos;
    out["flags"] = flags.empty() ? Json(nullptr) : present;
    return out;
}

const char *ptrace_meaning(int scope) {
    switch (scope) {
    case -1:
        return "Yama is not active: process_vm_writev follows the classic ptrace rules (a writer of the same user "
               "reaches a dumpable target)";
    case 0:
        return "classic ptrace permissions: a writer of the same user reaches any dumpable target with "
               "process_vm_writev";
    case 1:
        return "restricted: process_vm_writev reaches only the writer's descendants (or a process that named it "
               "with PR_SET_PTRACER, or with CAP_SYS_PTRACE); shm writers into another process's private memory "
               "copy through the staging ring instead (shm.private=auto)";
    case 2:
        return "admin-only: only a writer with CAP_SYS_PTRACE may use process_vm_writev; others copy through the "
               "staging ring (shm.private=auto)";
    case 3:
        return "no attach: process_vm_writev into another process is refused; shm writers into private memory copy "
               "through the staging ring (shm.private=auto)";
    }
    return "unknown value";
}

// A child writes one byte into its parent with process_vm_writev, as a
// writer process into an unrelated target (the parent is no descendant of
// the child, so Yama's scope 1 refuses it as it refuses an unrelated one).
Json try_process_vm_writev() {
    static volatile char target = 0;
    const pid_t parent = getpid();
    const pid_t child = fork();
    if (child < 0) return Json{{"allowed", nullptr}, {"detail", std::string("fork: ") + strerror(errno)}};
    if (child == 0) {
        char one = 1;
        iovec local{&one, 1}, remote{const_cast<char *>(&target), 1};
        _exit(process_vm_writev(parent, &local, 1, &remote, 1, 0) == 1 ? 0 : (errno & 0x7f) + 1);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 255;
    Json out;
    out["allowed"] = code == 0;
    std::string detail = code == 0 ? "a child process wrote into its parent" :
                         code == 255 ? "the probe process died" :
                                       std::string("a child process writing into its parent: ") + strerror(code - 1);
    if (has_cap(kCapSysPtrace)) detail += " (this process has CAP_SYS_PTRACE, which overrides Yama's scopes 1 and 2)";
    out["detail"] = detail;
    return out;
}

Json dev_shm() {
    Json out;
    struct statfs st{};
    const bool present = statfs("/dev/shm", &st) == 0;
    out["present"] = present;
    out["tmpfs"] = present && static_cast<long>(st.f_type) == kTmpfsMagic;
    out["writable"] = present && access("/dev/shm", W_OK | X_OK) == 0;
    out["size"] = present ? Json(static_cast<uint64_t>(st.f_blocks) * st.f_bsize) : Json(nullptr);
    out["free"] = present ? Json(static_cast<uint64_t>(st.f_bavail) * st.f_bsize) : Json(nullptr);
    return out;
}

uint64_t parse_page_size(const std::string &text) {  // "2M", "1G", "2048k"
    char *end = nullptr;
    uint64_t v = strtoull(text.c_str(), &end, 10);
    switch (end && *end ? *end : 0) {
    case 'k': case 'K': return v << 10;
    case 'm': case 'M': return v << 20;
    case 'g': case 'G': return v << 30;
    }
    return v;
}

uint64_t default_huge_page() {
    std::ifstream f("/proc/meminfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("Hugepagesize:", 0) == 0) return strtoull(line.c_str() + 13, nullptr, 10) << 10;
    return 0;
}

Json hugetlbfs_mounts() {
    Json out = Json::array();
    std::ifstream f("/proc/self/mounts");
    std::string dev, dir, type, opts;
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream in(line);
        if (!(in >> dev >> dir >> type >> opts) || type != "hugetlbfs") continue;
        uint64_t page = default_huge_page();
        const size_t at = opts.find("pagesize=");
        if (at != std::string::npos) page = parse_page_size(opts.substr(at + 9));
        out.push_back(Json{{"mount", dir}, {"page_size", page}, {"writable", access(dir.c_str(), W_OK | X_OK) == 0}});
    }
    return out;
}

Json huge_page_pools() {
    std::vector<uint64_t> sizes;  // "hugepages-2048kB", in page size order
    const std::string dir = "/sys/kernel/mm/hugepages/";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d))
            if (strncmp(e->d_name, "hugepages-", 10) == 0) sizes.push_back(strtoull(e->d_name + 10, nullptr, 10));
        closedir(d);
    }
    std::sort(sizes.begin(), sizes.end());
    Json out = Json::array();
    for (uint64_t kb : sizes) {
        const std::string pool = dir + "hugepages-" + std::to_string(kb) + "kB/";
        out.push_back(Json{{"page_size", kb << 10},
                           {"total", strtoull(read_line(pool + "nr_hugepages").c_str(), nullptr, 10)},
                           {"free", strtoull(read_line(pool + "free_hugepages").c_str(), nullptr, 10)}});
    }
    return out;
}

Json thp() {
    const std::string dir = "/sys/kernel/mm/transparent_hugepage/";
    auto value = [&](const char *name) {
        const std::string v = bracketed(dir + name);
        return v.empty() ? Json(nullptr) : Json(v);
    };
    return Json{{"enabled", value("enabled")}, {"defrag", value("defrag")}, {"shmem_enabled", value("shmem_enabled")}};
}

}  // namespace

std::string read_line(const std::string &path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

uint64_t memlock_limit() {
    rlimit rl{};
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return rl.rlim_cur;
}

bool has_cap_ipc_lock() { return has_cap(kCapIpcLock); }

Json ipv4_addresses() {
    Json out = Json::array();
    ifaddrs *ifa = nullptr;
    if (getifaddrs(&ifa) != 0) return out;
    for (ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        char b[INET_ADDRSTRLEN] = "";
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(i->ifa_addr)->sin_addr, b, sizeof b);
        out.push_back(Json{{"address", b}, {"interface", i->ifa_name}});
    }
    freeifaddrs(ifa);
    return out;
}

Json host_facts(const Config &c) {
    Json out;
    utsname u{};
    uname(&u);
    out["kernel"] = u.release;
    out["machine"] = u.machine;
    out["cpu"] = cpu_facts();
    rlimit rl{};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    out["memlock"] = Json{{"soft", limit_json(rl.rlim_cur)}, {"hard", limit_json(rl.rlim_max)},
                          {"cap_ipc_lock", has_cap_ipc_lock()}};
    out["region_size"] = c.region_size;
    out["boot_id"] = !read_line("/proc/sys/kernel/random/boot_id").empty();
    return out;
}

Json shm_facts() {
    Json out;
    const std::string scope = read_line("/proc/sys/kernel/yama/ptrace_scope");
    const int v = scope.empty() ? -1 : atoi(scope.c_str());
    out["ptrace_scope"] = v < 0 ? Json(nullptr) : Json(v);
    out["ptrace_scope_meaning"] = ptrace_meaning(v);
    out["process_vm_writev"] = try_process_vm_writev();
    out["dev_shm"] = dev_shm();
    out["hugetlbfs"] = hugetlbfs_mounts();
    out["hugepages"] = huge_page_pools();
    out["thp"] = thp();
    return out;
}

std::string human_bytes(uint64_t n) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double v = static_cast<double>(n);
    while (v >= 1024 && u < 5) v /= 1024, u++;
    char b[48];
    if (u == 0 || v == static_cast<double>(static_cast<uint64_t>(v))) snprintf(b, sizeof b, "%.0f %s", v, units[u]);
    else snprintf(b, sizeof b, "%.1f %s", v, units[u]);
    return b;
}

}  // namespace kvx::info
