// The registry list: one line per backend, in order of preference. A backend
// defines `const kvx::BackendDesc kvx_backend_<name>` in its own folder; one
// that is not built into this library (KVX_VERBS=OFF, or not written yet)
// leaves the weak reference null and is skipped.
#include <algorithm>
#include <array>

#include "registry/registry.h"

#define KVX_BACKEND_LIST(X) \
    X(shm)                  \
    X(verbs)                \
    X(tcp)

#define KVX_DECLARE(name) extern "C" const kvx::BackendDesc kvx_backend_##name __attribute__((weak, visibility("hidden")));
KVX_BACKEND_LIST(KVX_DECLARE)
#undef KVX_DECLARE
// One more entry a test program may define (tests/perf: a backend that completes
// in-process, to measure the core alone). Never defined in the library, so
// it ships no such backend and its name is no valid option there.
extern "C" const kvx::BackendDesc kvx_backend_test __attribute__((weak, visibility("hidden")));

namespace kvx {

namespace {

#define KVX_NAME(name) #name,
constexpr const char *kNames[] = {KVX_BACKEND_LIST(KVX_NAME)};
#undef KVX_NAME

#define KVX_ADDRESS(name) &kvx_backend_##name,
const BackendDesc *const kAll[] = {KVX_BACKEND_LIST(KVX_ADDRESS) &kvx_backend_test};
#undef KVX_ADDRESS

struct Built {
    std::array<const BackendDesc *, std::size(kAll)> list{};
    size_t n = 0;
    Built() {
        for (const BackendDesc *b : kAll)
            if (b) list[n++] = b;
    }
};

}  // namespace

std::span<const BackendDesc *const> backend_registry() {
    static const Built built;
    return {built.list.data(), built.n};
}

const BackendDesc *find_backend(std::string_view name) {
    for (const BackendDesc *b : backend_registry())
        if (name == b->name) return b;
    return nullptr;
}

std::span<const char *const> backend_names() { return kNames; }

bool is_backend_name(std::string_view name) {
    if (&kvx_backend_test && name == kvx_backend_test.name) return true;
    return std::any_of(std::begin(kNames), std::end(kNames), [&](const char *n) { return name == n; });
}

}  // namespace kvx
