// The verbs backend's registry entry in a libkvxfer built with plugins: its
// name, id and option table are here; probe, create and check_section are
// the plugin's (libkvxfer-verbs.so, src/registry/plugin.h), loaded on first
// use. Without the plugin, or without the rdma-core libraries it needs, the
// backend is unusable and says why; the library itself loads all the same.
#include "backends/verbs/verbs_options.h"
#include "registry/plugin.h"
#include "util/error.h"

namespace kvx::verbs {

namespace {

const BackendDesc *loaded(std::string *why) { return plugin_backend("verbs", why); }

bool probe(const Options &o, std::string *why) {
    const BackendDesc *d = loaded(why);
    return d && d->probe(o, why);
}

std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *why) {
    const BackendDesc *d = loaded(why);
    return d ? d->create(ctx, why) : nullptr;
}

void check_section(const wire::Section &s, const wire::AgentMetadata &m) {
    std::string why;
    const BackendDesc *d = loaded(&why);
    if (!d) fail(KVX_ENOTSUP, "verbs: %s", why.c_str());
    d->check_section(s, m);
}

}  // namespace

}  // namespace kvx::verbs

extern "C" const kvx::BackendDesc kvx_backend_verbs = {
    "verbs", kvx::verbs::kSectionId, kvx::verbs::kOptions, kvx::verbs::probe, kvx::verbs::create,
    kvx::verbs::check_section,
};
