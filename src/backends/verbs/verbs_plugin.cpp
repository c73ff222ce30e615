// The verbs plugin's entry point (libkvxfer-verbs.so; src/registry/plugin.h):
// the backend of verbs_entry.cpp and the build it belongs to.
#include "kvx_build_id.h"
#include "registry/plugin.h"

extern "C" const kvx::BackendDesc kvx_backend_verbs;  // verbs_entry.cpp

extern "C" __attribute__((visibility("default"))) const kvx::PluginEntry *kvx_plugin_entry(void) {
    static const kvx::PluginEntry entry{kvx::kPluginAbi, sizeof(kvx::PluginEntry), KVX_BUILD_ID, &kvx_backend_verbs};
    return &entry;
}
