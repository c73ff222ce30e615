// The backend registry: each backend is one self-describing entry (name,
// probe, option table, metadata section, factory) defined in its own folder
// and listed once in src/backends/registry.cpp. See src/backends/README.md
// for how to add one.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "backend_api/backend.h"

namespace kvx {

struct BackendDesc {
    const char *name;
    uint16_t id;  // the type tag of its metadata section (2 and up; 1 is the core section)
    // Every key this backend reads, all starting with "<name>.".
    OptionTable options;
    // Usable on this host with these options? Cheap and side-effect free;
    // false with *why (for the log and for an explicit request) otherwise.
    bool (*probe)(const Options &o, std::string *why);
    // Starts serving. nullptr with *why when it turns out unusable after all
    // (no device, no registration); throws Error for a configuration error.
    std::unique_ptr<Backend> (*create)(const BackendContext &ctx, std::string *why);
    // Validates a peer's section (untrusted bytes) against the rest of its
    // metadata; throws Error(KVX_EBADMETA) or Error(KVX_EVERSION) naming the defect.
    void (*check_section)(const wire::Section &s, const wire::AgentMetadata &m);
};

// Every backend built into this library, in order of preference.
std::span<const BackendDesc *const> backend_registry();
// The registered backend of this name, or nullptr.
const BackendDesc *find_backend(std::string_view name);
// Every backend name kvxfer knows, built into this library or not (an
// option may name one this build lacks: creation then says KVX_ENOTSUP).
std::span<const char *const> backend_names();
bool is_backend_name(std::string_view name);

}  // namespace kvx
