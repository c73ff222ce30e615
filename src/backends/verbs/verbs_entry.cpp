// The verbs backend's registry entry: options, probe, factory, metadata
// section check.
#include "registry/registry.h"
#include "backends/verbs/verbs_listener.h"

namespace kvx::verbs {

namespace {

constexpr OptionSpec kOptions[] = {
    {"verbs.device", OptType::string, 0, 64, "", "RDMA device name (e.g. mlx5_0); default: the first with an ACTIVE port"},
    {"verbs.port", OptType::uint, 1, 255, "", "port number on that device; default: the first ACTIVE port"},
    {"verbs.gid_index", OptType::uint, 0, 65535, "",
     "take the listen address from this GID (RoCE); default: rdma_cm's choice, logged"},
    {"verbs.listen", OptType::hostport, 0, 0, "",
     "IP:PORT for rdma_cm to listen on (an address of the RDMA device; PORT 0 = any); default: the chosen port's IPv4 address"},
    {"verbs.qps_per_peer", OptType::uint, 1, 16, "1", "RC queue pairs per peer; transfers of 512 KiB or more are split over them"},
    {"verbs.post_batch_bytes", OptType::uint, 0, 1ull << 30, "0",
     "when not 0: while this many bytes stay in flight on a QP behind its next completion, new transfers wait for it and "
     "are posted together, one doorbell and one signalled WR for all (0: post each at once)"},
};


bool probe(const Options &o, std::string *why) {
    if (!o.str("verbs.listen").empty()) return true;  // an explicit address: create() finds out
    Placement pl;
    return find_placement(selection(o), &pl, why);
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
    sel.device = o.str("verbs.device");
    sel.port = o.is_set("verbs.port") ? static_cast<int>(o.uint("verbs.port")) : 0;
    sel.gid_index = o.is_set("verbs.gid_index") ? static_cast<int>(o.uint("verbs.gid_index")) : -1;
    return sel;
}

}  // namespace kvx::verbs

extern "C" const kvx::BackendDesc kvx_backend_verbs = {
    "verbs", kvx::verbs::kSectionId, kvx::verbs::kOptions, kvx::verbs::probe, kvx::verbs::create,
    kvx::verbs::check_section,
};
