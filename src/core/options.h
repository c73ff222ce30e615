// Transport options: string key/value pairs from the C API, parsed once into
// typed fields at transport creation.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kvx {

struct OptionBag {
    std::map<std::string, std::string> kv;
};

// Throws Error(KVX_EINVAL) for an unknown key or a malformed value.
void validate_option(const std::string &key, const std::string &value);

struct Options {
    std::string backend = "auto";
    uint32_t connect_timeout_ms = 5000;
    uint32_t transfer_timeout_ms = 30000;
    std::string tcp_listen = "0.0.0.0:0";
    std::string tcp_advertise;  // "" = derive from tcp_listen
    uint32_t tcp_streams = 1;
    std::map<std::string, std::string> backend_specific;  // verbs.* keys

    static Options from(const OptionBag *bag);
};

// Parses a decimal integer within [lo, hi]; throws Error(KVX_EINVAL) naming key.
uint64_t parse_uint_option(const std::string &key, const std::string &value, uint64_t lo, uint64_t hi);

}  // namespace kvx
