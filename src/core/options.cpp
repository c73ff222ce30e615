#include "core/options.h"

#include "backend/registry.h"
#include "util/error.h"

namespace kvx {

namespace {

constexpr OptionSpec kCoreOptions[] = {
    {"backend", OptType::string, 0, 64, "auto",
     "\"auto\" (the most capable backend usable here) or one backend by name (tcp, verbs, shm)"},
    {"connect_timeout_ms", OptType::uint, 1, 3600000, "5000", "connect + authenticate budget of add_remote_peer"},
    {"transfer_timeout_ms", OptType::uint, 1, 3600000, "30000",
     "a transfer not done after this long fails and its peer is marked broken"},
};

void check_backend_name(const std::string &v) {
    if (v == "auto" || is_backend_name(v)) return;
    std::string names = "auto";
    for (const char *n : backend_names()) names += std::string(", ") + n;
    fail(KVX_EINVAL, "option backend: '%s' is not one of %s", v.c_str(), names.c_str());
}

}  // namespace

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
            if (key == "backend") check_backend_name(value);
            return;
        }
    fail(KVX_EINVAL, "unknown option '%s'", key.c_str());
}

CoreOptions CoreOptions::from(const Options &o) {
    CoreOptions c;
    c.backend = o.str("backend");
    c.connect_timeout_ms = static_cast<uint32_t>(o.uint("connect_timeout_ms"));
    c.transfer_timeout_ms = static_cast<uint32_t>(o.uint("transfer_timeout_ms"));
    return c;
}

}  // namespace kvx
