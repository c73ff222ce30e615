// "build", "auto" and "backends": each backend is created for real (a
// transport over a small malloc'ed region with backend=NAME), and what the
// library says when that fails is the reason; the host's facts add the why
// and what to do about it (hints).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/tcp/tcp_aead.h"
#include "core/options.h"
#include "info/info.h"
#include "kvxfer.h"
#include "registry/registry.h"
#include "util/error.h"
#include "util/options.h"

#ifdef KVX_INFO_VERBS
#include "backends/verbs/verbs.h"
#endif
#ifdef KVX_INFO_PLUGINS
#include "registry/plugin.h"
#endif

namespace kvx::info {

namespace {

constexpr uint64_t kTryBlocks = 4, kTryBlockLen = 4096;

// The hint the verbs backend appends to its "no device" messages points
// here: kvxfer-info itself leaves it out.
std::string without_hint(std::string msg) {
    const size_t at = msg.find("; run kvxfer-info");
    if (at != std::string::npos) msg.erase(at);
    return msg;
}

std::vector<std::string> split(const std::string &text, char sep) {
    std::vector<std::string> out;
    size_t from = 0;
    while (from < text.size()) {
        const size_t to = std::min(text.find(sep, from), text.size());
        if (to > from) out.push_back(text.substr(from, to - from));
        from = to + 1;
    }
    return out;
}

#ifdef KVX_INFO_PLUGINS
// Lines, empty ones kept (split() drops them).
std::vector<std::string> split_lines(const std::string &text) {
    std::vector<std::string> out;
    size_t from = 0;
    for (;;) {
        const size_t to = text.find('\n', from);
        out.push_back(text.substr(from, to == std::string::npos ? std::string::npos : to - from));
        if (to == std::string::npos) return out;
        from = to + 1;
    }
}
#endif

struct Attempt {
    bool ok = false;
    int rc = 0;
    std::string error;   // kvx_last_error_message() when not ok
    std::string served;  // kvx_transport_backends() when ok
};

// A transport over a small region with the user's options and backend=NAME.
Attempt attempt(const Config &c, const std::string &backend) {
    Attempt a;
    kvx_options *o = nullptr;
    void *region = nullptr;
    if (kvx_options_create(&o) != 0 || posix_memalign(&region, 4096, kTryBlocks * kTryBlockLen) != 0) {
        kvx_options_destroy(o);
        a.rc = KVX_ENOMEM;
        a.error = "out of memory";
        return a;
    }
    memset(region, 0, kTryBlocks * kTryBlockLen);
    int rc = c.options.empty() ? 0 : kvx_options_parse(o, c.options.c_str());
    if (rc == 0) rc = kvx_options_set(o, "backend", backend.c_str());
    kvx_transport *t = nullptr;
    if (rc == 0) rc = kvx_transport_create(&t, region, kTryBlocks, kTryBlockLen, nullptr, o);
    if (rc == 0) {
        a.ok = true;
        a.served = kvx_transport_backends(t);
        kvx_transport_destroy(t);
    } else {
        a.rc = rc;
        a.error = without_hint(kvx_last_error_message());
    }
    kvx_options_destroy(o);
    free(region);
    return a;
}

// The user's options, typed as the library reads them.
Options typed_options(const Config &c, OptionBag *bag) {
    for (const auto &[k, v] : split_option_list(c.options)) bag->kv[k] = v;
    return Options(bag, all_option_tables());
}

// tcp.aead_impl: the code in use with the user's options, and each code's
// availability here (the library's own choice, tcp::aead_impl()).
Json aead_facts(const Config &c) {
    OptionBag bag;
    const Options o = typed_options(c, &bag);
    Json out;
    out["protection"] = o.str("tcp.protection");
    out["option"] = o.str("tcp.aead_impl");
    out["in_use"] = nullptr;
    out["error"] = nullptr;
    try {
        if (o.str("tcp.protection") == "aead") out["in_use"] = tcp::aead_impl_name(tcp::aead_impl(o));
    } catch (const Error &e) {
        out["error"] = e.what();
    }
    Json codes = Json::object();
    for (const char *impl : {"openssl", "ipsec-mb"}) {
        OptionBag one = bag;
        one.kv["tcp.aead_impl"] = impl;
        try {
            codes[impl] = Json{{"available", true},
                               {"name", tcp::aead_impl_name(tcp::aead_impl(Options(&one, all_option_tables())))},
                               {"error", nullptr}};
        } catch (const Error &e) {
            codes[impl] = Json{{"available", false}, {"name", nullptr}, {"error", e.what()}};
        }
    }
    out["codes"] = std::move(codes);
    return out;
}

std::string addr_text(const sockaddr_storage &ss) {
    char b[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(ss).sin_addr, b, sizeof b);
    else inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(ss).sin6_addr, b, sizeof b);
    return b;
}

// The rails the verbs backend would serve with these options (its own
// selection, find_placements()), or why none.
void verbs_rails(const Config &c, Json *out) {
    Json rails = Json::array();
    std::string why;
#ifdef KVX_INFO_VERBS
    try {
        OptionBag bag;
        const Options o = typed_options(c, &bag);
        for (const verbs::Placement &p : verbs::find_placements(verbs::selection(o), &why))
            rails.push_back(Json{{"device", p.device}, {"port", p.port}, {"address", addr_text(p.addr)},
                                 {"prefix", p.prefix}, {"netdev", p.netdev.empty() ? Json(nullptr) : Json(p.netdev)},
                                 {"gid_index", p.gid_index < 0 ? Json(nullptr) : Json(p.gid_index)}});
    } catch (const Error &e) {
        why = e.what();
    }
#else
    (void)c;
    why = "this kvxfer was built without the verbs backend (KVX_VERBS=OFF)";
#endif
    (*out)["rails_error"] = rails.empty() ? Json(without_hint(why)) : Json(nullptr);
    (*out)["rails"] = std::move(rails);
}

// Locked memory: every rail registers the whole region, each registration
// pinning it against RLIMIT_MEMLOCK (unless CAP_IPC_LOCK).
Json memlock_facts(const Config &c, size_t rails) {
    const uint64_t limit = memlock_limit();
    const uint64_t needed = c.region_size * (rails ? rails : 1);
    const bool cap = has_cap_ipc_lock();
    return Json{{"limit", limit == UINT64_MAX ? Json(nullptr) : Json(limit)},
                {"needed", needed},
                {"cap_ipc_lock", cap},
                {"sufficient", cap || limit == UINT64_MAX || limit >= needed}};
}

bool any_active_port(const Json &rdma) {
    for (const Json &d : rdma["devices"])
        for (const Json &p : d.value("ports", Json::array()))
            if (p.value("state", "") == "ACTIVE") return true;
    return false;
}

// What to do when the kernel has no RDMA device at all.
std::string load_driver_hint(const Json &rdma) {
    std::string h = "load the RDMA driver of the NIC (e.g. mlx5_ib, irdma, bnxt_re; rdma-core's ibverbs-providers "
                    "for its user-space part), or for Soft-RoCE over an Ethernet interface: modprobe rdma_rxe && "
                    "rdma link add rxe0 type rxe netdev IFACE";
    const Json &rxe = rdma["kernel"]["rdma_rxe_available"];
    if (rxe.is_boolean())
        h += rxe.get<bool>() ? " (this kernel has rdma_rxe)" : " (this kernel has no rdma_rxe module)";
    return h;
}

// The ACTIVE ports here, "rxe0:1, rxe1:1".
std::string active_ports(const Json &rdma) {
    std::string out;
    for (const Json &d : rdma["devices"])
        for (const Json &p : d.value("ports", Json::array()))
            if (p.value("state", "") == "ACTIVE")
                out += (out.empty() ? "" : ", ") + d["name"].get<std::string>() + ":" + p["port"].dump();
    return out;
}

// Whether the verbs.* options narrow the ports served (not verbs.devices=all).
bool narrowed(const Config &c) {
    try {
        OptionBag bag;
        const Options o = typed_options(c, &bag);
        return o.str("verbs.devices") != "all" || o.is_set("verbs.device") || o.is_set("verbs.port") ||
               o.is_set("verbs.gid_index");
    } catch (const Error &) {
        return false;  // a build without the verbs options
    }
}

void device_hints(const Config &c, const Json &rdma, const Json &v, std::vector<std::string> *hints) {
    const Json &k = rdma["kernel"];
    if (!rdma["sysfs"].get<bool>() || rdma["sysfs_devices"].empty()) {
        hints->push_back(std::string(rdma["sysfs"].get<bool>() ? "the kernel has no RDMA device" :
                                     "the kernel has no RDMA subsystem loaded (no /sys/class/infiniband)") +
                         ": " + load_driver_hint(rdma));
        return;
    }
    if (rdma["built"].get<bool>() && rdma["devices"].empty())
        hints->push_back("the kernel has RDMA device(s) but libibverbs lists none: install the user-space driver "
                         "(ibverbs-providers) and load ib_uverbs" +
                         std::string(k["modules"]["ib_uverbs"].get<bool>() ? "" : " (not loaded)"));
    else if (rdma["built"].get<bool>() && !any_active_port(rdma))
        hints->push_back("no port is ACTIVE: check the link (cable, switch; InfiniBand needs a subnet manager such "
                         "as opensm); for RoCE and Soft-RoCE bring the netdev up (ip link set IFACE up)");
    else if (v["rails"].empty() && narrowed(c))
        hints->push_back("the verbs.* options select no ACTIVE port with an IP address; the ACTIVE ports here: " +
                         active_ports(rdma));
    else if (v["rails"].empty())
        hints->push_back("no ACTIVE port has an IP address: give the port's network interface an IPv4 address "
                         "(rdma_cm connects by IP)");
    bool cm = false;
    for (const Json &e : k["dev_infiniband"]) cm |= e == "rdma_cm";
    if (!cm) hints->push_back("no /dev/infiniband/rdma_cm: load rdma_ucm (modprobe rdma_ucm)");
}

// The verbs plugin of a build with plugins, as the libkvxfer.so.0 this host
// would run finds and loads it (its libraries, its ABI and build checked,
// nothing of it called): kvxfer-info has verbs built in, so without this it
// would call verbs usable where the library cannot load the plugin. The
// library beside kvxfer-info first (a build tree), else the one the
// dynamic linker finds; kvx::plugin_report() of that library answers.
#ifdef KVX_INFO_PLUGINS
void *shared_library(std::string *where) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        std::string beside(self, strrchr(self, '/') - self);
        beside += "/libkvxfer.so.0";
        if (void *h = access(beside.c_str(), F_OK) == 0 ? dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr) {
            *where = beside;
            return h;
        }
    }
    void *h = dlopen("libkvxfer.so.0", RTLD_NOW | RTLD_LOCAL);
    const char *e = h ? nullptr : dlerror();
    *where = h ? "libkvxfer.so.0" : std::string("libkvxfer.so.0: ") + (e ? e : "not found");
    return h;
}
#endif

Json plugin_facts() {
#ifdef KVX_INFO_PLUGINS
    std::string lib;
    void *h = shared_library(&lib);
    auto report = h ? reinterpret_cast<int (*)(const char *, char *, size_t)>(dlsym(h, kPluginReportSymbol)) : nullptr;
    char text[8192];
    if (!report || report("verbs", text, sizeof text) != 0) {
        const std::string why = !h ? "cannot load " + lib : lib + " has no plugin report (another kvxfer version?)";
        return Json{{"file", nullptr}, {"loaded", false}, {"error", why}, {"searched", Json::array()}};
    }
    const std::vector<std::string> f = split_lines(text);
    return Json{{"file", f.size() > 1 && !f[1].empty() ? Json(f[1]) : Json(nullptr)},
                {"loaded", !f.empty() && f[0] == "1"},
                {"error", f.size() > 2 && !f[2].empty() ? Json(f[2]) : Json(nullptr)},
                {"searched", f.size() > 3 ? split(f[3], ':') : std::vector<std::string>{}}};
#else
    return nullptr;  // built into libkvxfer
#endif
}

Json verbs_facts(const Config &c, const Json &rdma, Json b) {
    b["plugin"] = plugin_facts();
    if (b["plugin"].is_object() && !b["plugin"]["loaded"].get<bool>()) {
        b["usable"] = false;
        b["reason"] = b["plugin"]["error"];
    }
    verbs_rails(c, &b);
    b["memlock"] = memlock_facts(c, b["rails"].size());
    std::vector<std::string> hints;
    if (b["built"].get<bool>() && !b["usable"].get<bool>()) device_hints(c, rdma, b, &hints);
    if (!b["memlock"]["sufficient"].get<bool>()) {
        const std::string lim = human_bytes(b["memlock"]["limit"].get<uint64_t>());
        const std::string need = human_bytes(b["memlock"]["needed"].get<uint64_t>());
        const size_t rails = std::max<size_t>(1, b["rails"].size());
        const std::string why = "RLIMIT_MEMLOCK (" + lim + ") is below the " + need + " that registering a " +
                                human_bytes(c.region_size) + " region on " + std::to_string(rails) + " rail(s) pins";
        if (b["usable"].get<bool>()) b["reason"] = why;
        b["usable"] = false;
        hints.push_back("raise the locked-memory limit: ulimit -l unlimited, LimitMEMLOCK=infinity in a systemd "
                        "unit, memlock in /etc/security/limits.d/, --ulimit memlock=-1 for a container");
    }
    if (b["plugin"].is_object() && !b["plugin"]["loaded"].get<bool>())
        hints.insert(hints.begin(), "install the verbs plugin (package libkvxfer0-verbs, kvxfer-verbs as rpm) and "
                                    "rdma-core's libibverbs1 and librdmacm1");
    b["hints"] = hints;
    return b;
}

Json region_alloc_try(uint64_t size, unsigned flags) {
    void *p = nullptr;
    const int rc = kvx_region_alloc(&p, size, flags);
    if (rc == 0) kvx_region_free(p);
    if (rc == 0) return Json{{"ok", true}, {"error", nullptr}};
    return Json{{"ok", false}, {"error", std::string(kvx_strerror(rc)) + ": " + kvx_last_error_message()}};
}

Json shm_backend(const Config &c, Json b) {
    Json f = shm_facts();
    f["region_alloc"] = Json{{"plain", region_alloc_try(kTryBlockLen, 0)},
                             {"huge_pages", region_alloc_try(2u << 20, KVX_REGION_HUGE_PAGES)}};
    for (auto &[k, v] : f.items()) b[k] = v;
    std::vector<std::string> hints;
    if (!f["process_vm_writev"]["allowed"].is_boolean() || !f["process_vm_writev"]["allowed"].get<bool>())
        hints.push_back("a writer reaches another process's private region only through the staging ring: put the "
                        "region in kvx_region_alloc() memory (or a /dev/shm file) so writers map it, or allow "
                        "process_vm_writev (kernel.yama.ptrace_scope=0)");
    if (!f["dev_shm"]["tmpfs"].get<bool>())
        hints.push_back("no tmpfs at /dev/shm: regions in /dev/shm files are not possible here (kvx_region_alloc() "
                        "needs none)");
    uint64_t free_huge = 0;
    for (const Json &p : f["hugepages"])
        if (p["page_size"] == (2u << 20)) free_huge = p["free"].get<uint64_t>() * (2u << 20);
    if (free_huge < c.region_size)
        hints.push_back("free 2 MiB huge pages hold " + human_bytes(free_huge) + ", less than " +
                        human_bytes(c.region_size) + ": kvx_region_alloc(KVX_REGION_HUGE_PAGES) of that size fails "
                        "(sysctl vm.nr_hugepages)");
    if (f["thp"]["enabled"] == "never")
        hints.push_back("transparent huge pages are off (never): region_hugepages=1 leaves private regions on 4 KiB "
                        "pages");
    b["hints"] = hints;
    return b;
}

Json tcp_backend(const Config &c, Json b) {
    b["aead"] = aead_facts(c);
    b["ipv4_addresses"] = ipv4_addresses();
    b["hints"] = Json::array();
    return b;
}

}  // namespace

Json build_facts() {
    Json out;
    out["backends"] = split(kvx_backends(), ',');
    std::vector<std::string> codes{"OpenSSL"};
#ifdef KVX_INFO_IPSEC_MB
    codes.push_back("ipsec-mb");
#endif
    out["aead_codes"] = codes;
    out["telemetry"] = KVX_TELEMETRY != 0;
#if defined(__clang__)
    out["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    out["compiler"] = std::string("gcc ") + __VERSION__;
#endif
    return out;
}

Json auto_facts(const Config &c) {
    const Attempt a = attempt(c, "auto");
    return Json{{"backends", split(a.served, ',')}, {"error", a.ok ? Json(nullptr) : Json(a.error)}};
}

Json backend_facts(const Config &c, const Json &rdma) {
    Json out = Json::object();
    for (const char *name : backend_names()) {
        const Attempt a = attempt(c, name);
        Json b;
        b["built"] = find_backend(name) != nullptr;
        b["usable"] = a.ok;
        b["reason"] = a.ok ? Json(nullptr) : Json(a.error);
        b["create_error"] = a.ok ? Json(nullptr) :
                                   Json{{"code", a.rc}, {"text", kvx_strerror(a.rc)}, {"message", a.error}};
        const std::string n = name;
        if (n == "verbs") b = verbs_facts(c, rdma, std::move(b));
        else if (n == "shm") b = shm_backend(c, std::move(b));
        else if (n == "tcp") b = tcp_backend(c, std::move(b));
        else b["hints"] = Json::array();
        out[name] = std::move(b);
    }
    return out;
}

}  // namespace kvx::info
