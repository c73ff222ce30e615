// What libkvxfer knows of the verbs backend without rdma-core: its option
// table (so that verbs.* keys validate, and are documented, on a host
// without it) and its metadata section's id. Everything else is in the verbs
// plugin (verbs_plugin.cpp), or built in with -DKVX_PLUGINS=OFF.
#pragma once

#include <cstdint>

#include "util/options.h"

namespace kvx::verbs {

inline constexpr OptionSpec kOptionSpecs[] = {
    {"verbs.devices", OptType::string, 1, 1024, "all",
     "The rails (since 0.7): `all` serves every ACTIVE port that has an IP address, each a rail with its own "
     "registration of the region; or a list `mlx5_0,mlx5_2:1` (a device alone: its ACTIVE ports). Peers pair rails "
     "by subnet and stripe transfers over them; a rail that fails is taken out and its parts go to the others, and it "
     "rejoins by itself once it connects again (since 0.13; `peer_redial_ms`). With backend `verbs`, no usable port (none, none ACTIVE, RLIMIT_MEMLOCK too low for the region, a verbs.* "
     "option naming something absent) fails `kvx_transport_create()` with KVX_ENOTSUP and the reason; with `auto` "
     "the transport serves without verbs (logged)."},
    {"verbs.device", OptType::string, 0, 64, "",
     "One rail: the first ACTIVE port of this RDMA device (`mlx5_0`, `rxe0`, ...); overrides verbs.devices."},
    {"verbs.port", OptType::uint, 1, 255, "",
     "One rail: this port (of verbs.device, or of the first device that has it ACTIVE); overrides verbs.devices."},
    {"verbs.gid_index", OptType::uint, 0, 65535, "",
     "Take the listen address from this GID (RoCE: the IPv4-mapped GID, usually index 1 or 3 for RoCE v2). Unset: "
     "rdma_cm's choice, logged."},
    {"verbs.listen", OptType::hostport, 0, 0, "",
     "`IP:PORT` for rdma_cm to listen on: an address of an RDMA device makes it the one rail; a wildcard address "
     "(`0.0.0.0:PORT`) listens on every rail at PORT; PORT 0 picks a free port. Unset: each rail's address, the first "
     "rail's free port on every rail where it is free."},
    {"verbs.rail_map", OptType::string, 0, 1024, "",
     "Pairs rails by a map instead of by subnet (since 0.12): comma-separated `LOCAL=REMOTE`, LOCAL a device or "
     "`device:port` this transport serves, REMOTE an address or `address/prefix` of a peer's rails (their rdma_cm "
     "addresses), e.g. `mlx5_0=10.1.0.0/16,mlx5_1=10.2.0.0/16`. Each rail of a peer goes with the local rail of the "
     "first entry whose REMOTE holds its address (with the least used one when LOCAL is a device of several ports); "
     "a rail that no entry holds is left out (logged at info). A LOCAL this transport does not serve, or an entry "
     "that does not parse, makes verbs unusable as the other verbs.* options do. Unset: by subnet."},
    {"verbs.qps_per_peer", OptType::uint, 1, 16, "1",
     "RC queue pairs per peer and rail; a transfer of 512 KiB or more is split over up to one per 256 KiB, on the "
     "queue pairs of every rail that would finish it first, in shares of the rails' measured rates."},
    {"verbs.post_batch_bytes", OptType::uint, 0, 1ull << 30, "0",
     "When not 0 (since 0.4): while at least this many bytes stay in flight on a queue pair behind its next "
     "completion, a new transfer waits for that completion and is posted with the others that waited, one doorbell "
     "and one signalled work request for all (for hardware NICs, e.g. 1048576; docs/performance.md); 0 posts each "
     "transfer at once."},
    {"verbs.mr_slice_bytes", OptType::uint, 0, 1ull << 46, "0",
     "When not 0 (since 0.14): every rail registers the region in slices of this many bytes, rounded down to whole "
     "blocks (at least one; larger where that would make more than 256 slices, logged at info), and no work request "
     "crosses a slice, here or at the peer. 0: one registration over the region. Reads from one registration above "
     "4 GiB were published slower than from slices on hardware NICs; Soft-RoCE shows no difference "
     "(docs/performance.md), so it is off by default. A release before 0.14 refuses a sliced transport's metadata "
     "(KVX_EBADMETA: its add fails, also where tcp would serve)."},
};
inline constexpr OptionTable kOptions = kOptionSpecs;
// The type of its metadata section (docs/wire-format.md).
inline constexpr uint16_t kSectionId = 3;

}  // namespace kvx::verbs
