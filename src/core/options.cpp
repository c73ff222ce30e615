#include "core/options.h"

#include <cerrno>
#include <cstdlib>

#include "util/error.h"

namespace kvx {

namespace {

struct Known {
    const char *key;
    uint64_t lo, hi;  // integer range; hi == 0: free-form string
};
constexpr Known kKnown[] = {
    {"backend", 0, 0},
    {"connect_timeout_ms", 1, 3600000},
    {"transfer_timeout_ms", 1, 3600000},
    {"tcp.listen", 0, 0},
    {"tcp.advertise", 0, 0},
    {"tcp.streams", 1, 16},
    {"verbs.device", 0, 0},
    {"verbs.port", 1, 255},
    {"verbs.gid_index", 0, 65535},
    {"verbs.qps_per_peer", 1, 16},
    {"verbs.listen", 0, 0},
};

}  // namespace

uint64_t parse_uint_option(const std::string &key, const std::string &value, uint64_t lo, uint64_t hi) {
    const char *s = value.c_str();
    if (*s < '0' || *s > '9') fail(KVX_EINVAL, "option %s: '%s' is not a non-negative integer", key.c_str(), s);
    errno = 0;
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') fail(KVX_EINVAL, "option %s: '%s' is not a non-negative integer", key.c_str(), s);
    if (v < lo || v > hi)
        fail(KVX_EINVAL, "option %s: %llu is out of range %llu..%llu", key.c_str(), v, (unsigned long long)lo,
             (unsigned long long)hi);
    return v;
}

void validate_option(const std::string &key, const std::string &value) {
    for (const auto &k : kKnown) {
        if (key != k.key) continue;
        if (k.hi) {
            parse_uint_option(key, value, k.lo, k.hi);
        } else if (key == "backend") {
            if (value != "auto" && value != "tcp" && value != "verbs" && value != "shm")
                fail(KVX_EINVAL, "option backend: '%s' is not one of auto, tcp, verbs, shm", value.c_str());
        } else if (value.size() > 1024) {
            fail(KVX_EINVAL, "option %s: value of %zu bytes is too long", key.c_str(), value.size());
        }
        return;
    }
    fail(KVX_EINVAL, "unknown option '%s'", key.c_str());
}

Options Options::from(const OptionBag *bag) {
    Options o;
    if (!bag) return o;
    for (const auto &[k, v] : bag->kv) {
        validate_option(k, v);
        if (k == "backend") o.backend = v;
        else if (k == "connect_timeout_ms") o.connect_timeout_ms = static_cast<uint32_t>(parse_uint_option(k, v, 1, 3600000));
        else if (k == "transfer_timeout_ms") o.transfer_timeout_ms = static_cast<uint32_t>(parse_uint_option(k, v, 1, 3600000));
        else if (k == "tcp.listen") o.tcp_listen = v;
        else if (k == "tcp.advertise") o.tcp_advertise = v;
        else if (k == "tcp.streams") o.tcp_streams = static_cast<uint32_t>(parse_uint_option(k, v, 1, 16));
        else o.backend_specific[k] = v;
    }
    return o;
}

}  // namespace kvx
