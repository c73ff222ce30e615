// The verbs backend's registry entry: options, probe, factory, metadata
// section check.
#include "registry/registry.h"
#include "backends/verbs/verbs_listener.h"

namespace kvx::verbs {

namespace {

constexpr OptionSpec kOptions[] = {
    {"verbs.device", OptType::string, 0, 64, "",
     "RDMA device name (`mlx5_0`, `rxe0`, ...). Unset: the first device with an ACTIVE port. With backend `verbs`, a "
     "device that cannot be used (none, no ACTIVE port, RLIMIT_MEMLOCK too low for the region, a verbs.* option "
     "naming something absent) fails `kvx_transport_create()` with KVX_ENOTSUP and the reason; with `auto` the "
     "transport serves without verbs (logged)."},
    {"verbs.port", OptType::uint, 1, 255, "", "Port number on that device. Unset: the first ACTIVE port."},
    {"verbs.gid_index", OptType::uint, 0, 65535, "",
     "Take the listen address from this GID (RoCE: the IPv4-mapped GID, usually index 1 or 3 for RoCE v2). Unset: "
     "rdma_cm's choice, logged."},
    {"verbs.listen", OptType::hostport, 0, 0, "",
     "`IP:PORT` for rdma_cm to listen on: an address of the RDMA device; PORT 0 picks a free port. Unset: the IPv4 "
     "address of the chosen port, a free port."},
    {"verbs.qps_per_peer", OptType::uint, 1, 16, "1",
     "RC queue pairs per peer; transfers of 512 KiB or more are split over them."},
    {"verbs.post_batch_bytes", OptType::uint, 0, 1ull << 30, "0",
     "When not 0 (since 0.4): while at least this many bytes stay in flight on a queue pair behind its next "
     "completion, a new transfer waits for that completion and is posted with the others that waited, one doorbell "
     "and one signalled work request for all (for hardware NICs, e.g. 1048576; docs/performance.md); 0 posts each "
     "transfer at once."},
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
