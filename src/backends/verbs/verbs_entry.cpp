// The verbs backend's registry entry: options, probe, factory, metadata
// section check.
#include "registry/registry.h"
#include "backends/verbs/verbs_listener.h"
#include "backends/verbs/verbs_options.h"

namespace kvx::verbs {

namespace {

bool probe(const Options &o, std::string *why) {
    if (!o.str("verbs.listen").empty()) return true;  // an explicit address: create() finds out
    return !find_placements(selection(o), why).empty();
}

std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *why) {
    auto b = std::make_unique<VerbsBackend>(ctx);
    if (!b->init(why)) return nullptr;  // the core logs why
    return b;
}

void check_section(const wire::Section &s, const wire::AgentMetadata &m) { decode_section(s, m); }

}  // namespace

Selection selection(const Options &o) {
    Selection sel;
    const std::string device = o.str("verbs.device");
    const int port = o.is_set("verbs.port") ? static_cast<int>(o.uint("verbs.port")) : 0;
    sel.one = !device.empty() || port != 0;
    if (sel.one && !device.empty()) sel.devices.emplace_back(device, port);
    if (sel.one && device.empty()) sel.port = port;
    auto listed = parse_devices(o.str("verbs.devices"));  // checked even when verbs.device overrides it
    parse_rail_map(o.str("verbs.rail_map"));  // its syntax, before any device is opened
    if (!sel.one) sel.devices = std::move(listed);
    sel.gid_index = o.is_set("verbs.gid_index") ? static_cast<int>(o.uint("verbs.gid_index")) : -1;
    return sel;
}

}  // namespace kvx::verbs

extern "C" const kvx::BackendDesc kvx_backend_verbs = {
    "verbs", kvx::verbs::kSectionId, kvx::verbs::kOptions, kvx::verbs::probe, kvx::verbs::create,
    kvx::verbs::check_section,
};
