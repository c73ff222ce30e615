/* Plugins the loader must refuse (tests/plugins/CMakeLists.txt builds each
 * alone in a directory, as libkvxfer-verbs.so): FAKE_abi another plugin
 * ABI, FAKE_build the right ABI from another build, FAKE_size an entry too
 * short, FAKE_noentry no entry point at all. The entry's layout is kvx::PluginEntry's
 * (src/registry/plugin.h); abi is its first field in every version. */
#include <stdint.h>

struct entry {
    uint32_t abi;
    uint32_t size;
    const char *build_id;
    const void *desc;
};

#if defined(FAKE_abi)
static const struct entry e = {999, sizeof e, "never read", 0};
#elif defined(FAKE_build)
static const struct entry e = {1 /* kPluginAbi */, sizeof e, "0.0.0+0000000000000000", 0};
#elif defined(FAKE_size)
static const struct entry e = {1 /* kPluginAbi */, 8, "never read", 0}; /* an entry shorter than it must be */
#endif

#ifndef FAKE_noentry
__attribute__((visibility("default"))) const struct entry *kvx_plugin_entry(void) { return &e; }
#else
__attribute__((visibility("default"))) int kvx_not_a_plugin(void) { return 0; }
#endif
