// Backends loaded at run time (issue 31): the verbs backend is a plugin,
// libkvxfer-verbs.so, so that libkvxfer itself needs no rdma-core library.
// The registry keeps the backend's entry (name, id, option table) and
// forwards probe, create and check_section to the plugin's, loading it on
// first use (src/backends/verbs/verbs_stub.cpp).
//
// A plugin calls the library's internals, exported in the version node
// KVXFER_PRIVATE, and shares its classes: it must come from the very build
// of the library that loads it. Its entry says which (build_id) and the
// loader refuses any other, naming both, before it calls anything of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "registry/registry.h"

namespace kvx {

// The plugin interface's version: bump it when PluginEntry changes. abi is
// its first field in every version, so that any plugin can be refused.
inline constexpr uint32_t kPluginAbi = 1;

struct PluginEntry {
    uint32_t abi;           // kPluginAbi of the plugin's build
    uint32_t size;          // sizeof(PluginEntry) there
    const char *build_id;   // KVX_BUILD_ID of the plugin's build (cmake/BuildId.cmake)
    const BackendDesc *desc;  // the backend, its name the plugin's
};

// A plugin exports exactly this, extern "C":
//   const kvx::PluginEntry *kvx_plugin_entry(void);
inline constexpr const char kPluginEntrySymbol[] = "kvx_plugin_entry";

// The file a backend's plugin has: libkvxfer-NAME.so.
std::string plugin_file(const char *backend);

// Where plugins are looked for, in order: each directory of
// KVX_PLUGIN_PATH (':'-separated; ignored in setuid programs), then
// kvxfer-0/ beside the libkvxfer that runs (how the packages, the wheels and
// the build tree lay them out), then the install directory
// (LIBDIR/kvxfer-0), for a libkvxfer linked statically.
std::vector<std::string> plugin_dirs();

// The backend of that plugin, loaded on first use (once per process: a
// result, success or failure, is kept; never unloaded). nullptr with *why
// when no plugin file is found (naming the directories searched), when it
// cannot be loaded (dlopen's reason: a missing rdma-core library, a plugin
// of another build whose symbols differ), or when it is refused (not a
// kvxfer plugin, another plugin ABI, another build id). Logged once at info.
// Thread-safe.
const BackendDesc *plugin_backend(const char *backend, std::string *why);

// What plugin_backend() found for that backend so far: the file loaded (or
// tried), and "" or why not. false if it was never asked for.
bool plugin_status(const char *backend, std::string *path, std::string *why);

// kvxfer-info has the internals built in (so that it can report them) and
// asks the libkvxfer.so.0 it finds through this: dlsym of its mangled name,
// kPluginReportSymbol. Loads the plugin as plugin_backend() does and writes
// four lines to out: "1" or "0" (loaded), the file (or ""), why not (or
// ""), the directories searched, ':'-separated. 0, or -1 when out is too
// small (truncated).
int plugin_report(const char *backend, char *out, size_t cap);
inline constexpr const char kPluginReportSymbol[] = "_ZN3kvx13plugin_reportEPKcPcm";

}  // namespace kvx
