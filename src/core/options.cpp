#include "core/options.h"

#include "registry/registry.h"
#include "util/error.h"

namespace kvx {

namespace {

constexpr OptionSpec kCoreOptions[] = {
    {"backend", OptType::string, 0, 64, "auto",
     "\"auto\" (every backend usable here) or a comma-separated list of backend names (shm, verbs, tcp) to serve on"},
    {"peer_backend_fallback", OptType::uint, 0, 1, "1",
     "1: a peer whose preferred path fails to connect gets the next one both sides offer (logged); 0: that fails the add"},
    {"connect_timeout_ms", OptType::uint, 1, 3600000, "5000", "connect + authenticate budget of add_remote_peer"},
    {"transfer_timeout_ms", OptType::uint, 1, 3600000, "30000",
     "a peer with transfers outstanding that makes no progress for this long has them failed and is marked broken "
     "(while the kernel resends into a silent network, after 2x this + its retransmission timeout + 250 ms, at least "
     "max(1/4 of this, 500 ms), at most this: an outage shorter than this fails nothing)"},
    {"region_prewarm", OptType::uint, 0, 1, "0",
     "1: kvx_transport_create() has the kernel read every page of the region once (read-only), so that the first "
     "transfers do not pay a first kernel access per page (slow on some hypervisors); costs one pass over the region"},
    {"region_hugepages", OptType::uint, 0, 1, "0",
     "1: kvx_transport_create() moves the region's private anonymous memory onto transparent huge pages "
     "(MADV_HUGEPAGE + MADV_COLLAPSE): a same-host writer's process_vm_writev walks its page table once per 2 MiB; "
     "costs about one copy of the region"},
};

void check_backend_list(const std::string &v) {
    if (v == "auto") return;
    std::vector<std::string> seen;
    for (const std::string &name : split_backend_list(v)) {
        if (!is_backend_name(name)) {
            std::string names = "auto";
            for (const char *n : backend_names()) names += std::string(", ") + n;
            fail(KVX_EINVAL, "option backend: '%s' is not one of %s (or a comma-separated list of them)",
                 name.c_str(), names.c_str());
        }
        for (const std::string &s : seen)
            if (s == name) fail(KVX_EINVAL, "option backend: '%s' is named twice in '%s'", name.c_str(), v.c_str());
        seen.push_back(name);
    }
}

}  // namespace

std::vector<std::string> split_backend_list(const std::string &v) {
    std::vector<std::string> out;
    size_t at = 0;
    for (;;) {
        size_t comma = v.find(',', at);
        out.push_back(v.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) return out;
        at = comma + 1;
    }
}

OptionTable core_options() { return kCoreOptions; }

std::vector<OptionTable> all_option_tables() {
    std::vector<OptionTable> t{core_options()};
    for (const BackendDesc *b : backend_registry()) t.push_back(b->options);
    return t;
}

void validate_option(const std::string &key, const std::string &value) {
    for (OptionTable t : all_option_tables())
        for (const OptionSpec &s : t) {
            if (key != s.key) continue;
            check_option_value(s, value);
            if (key == "backend") check_backend_list(value);
            return;
        }
    fail(KVX_EINVAL, "unknown option '%s'", key.c_str());
}

CoreOptions CoreOptions::from(const Options &o) {
    CoreOptions c;
    c.backend = o.str("backend");
    c.fallback = o.uint("peer_backend_fallback") != 0;
    c.connect_timeout_ms = static_cast<uint32_t>(o.uint("connect_timeout_ms"));
    c.transfer_timeout_ms = static_cast<uint32_t>(o.uint("transfer_timeout_ms"));
    c.prewarm = o.uint("region_prewarm") != 0;
    c.hugepages = o.uint("region_hugepages") != 0;
    return c;
}

}  // namespace kvx
