// The transport's own options (backend choice, timeouts) and the validation
// of every key against the owning table: the core's, or a backend's from the
// registry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/options.h"

namespace kvx {

// The core's option table.
OptionTable core_options();

// Every table: the core's, then each registered backend's.
std::vector<OptionTable> all_option_tables();

// Throws Error(KVX_EINVAL) for an unknown key or a malformed value.
void validate_option(const std::string &key, const std::string &value);

// "shm,tcp" -> {"shm", "tcp"}; empty names stay (the check rejects them).
std::vector<std::string> split_backend_list(const std::string &v);

// The core's options, typed, read once at transport creation.
struct CoreOptions {
    std::string backend = "auto";  // "auto" or a comma-separated list of names
    bool fallback = true;          // peer_backend_fallback
    uint32_t connect_timeout_ms = 5000;
    uint32_t transfer_timeout_ms = 30000;
    uint32_t redial_ms = 1000;  // peer_redial_ms; 0: a broken peer stays broken
    bool prewarm = false;    // region_prewarm
    bool hugepages = false;  // region_hugepages

    static CoreOptions from(const Options &o);
};

}  // namespace kvx
