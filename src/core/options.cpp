#include "core/options.h"

#include "registry/registry.h"
#include "util/error.h"

namespace kvx {

namespace {

constexpr OptionSpec kCoreOptions[] = {
    {"backend", OptType::string, 0, 64, "auto",
     "`auto`: serve on every backend usable here, in order of preference `shm`, `verbs` (when an RDMA device is "
     "usable), `tcp`; or a comma-separated list of names to serve on exactly those (`shm,tcp`), each of which must be "
     "usable: one this build or host cannot provide makes `kvx_transport_create()` fail with KVX_ENOTSUP "
     "(`kvx_backends()` lists those built in). The metadata carries a section per backend served, and each peer gets "
     "the first path both sides offer that applies: `shm` when the peer is on this host (same boot id, its socket "
     "reachable), else `verbs`, else `tcp`. `kvx_peer_backend()` says which one a peer got; `KVX_LOG=info` logs why."},
    {"peer_backend_fallback", OptType::uint, 0, 1, "1",
     "1: a peer whose preferred path applies but fails to connect gets the next path both sides offer (logged as a "
     "warning); 0: that failure fails `kvx_add_remote_peer()` instead."},
    {"connect_timeout_ms", OptType::uint, 1, 3600000, "5000",
     "Budget of `kvx_add_remote_peer()` for connecting and authenticating, in milliseconds."},
    {"transfer_timeout_ms", OptType::uint, 1, 3600000, "30000",
     "A peer with transfers outstanding that makes no progress for this long (T, in milliseconds) has them failed and "
     "its connection ends (it reconnects: `peer_redial_ms`). When the kernel resent into a silent network in the stall's "
     "second half (tcp: a retransmission timeout or unanswered probes on one of its connections), after 2T + its retransmission timeout + 250 ms instead (at least 2T + "
     "max(T/4, 500 ms), at most 3T): resends double their interval, and an outage shorter than T fails nothing (for "
     "T of 2000 and more). The tcp sockets of both sides get keepalive (from T/2) and `TCP_USER_TIMEOUT` (3T + 1 s) "
     "from it, so the connection of a peer host that vanishes without a FIN is released after about 3T + 2 s. A "
     "verbs target probes each inbound connection every T/2 and closes one whose initiator stopped answering within "
     "about T (at least 0.5 s); a verbs queue pair whose target acknowledges nothing for 7 ACK timeouts (rdma_cm's: "
     "about 4 s on RoCE) breaks its peer, also sooner. Every timer: docs/semantics.md, Timers."},
    {"peer_redial_ms", OptType::uint, 0, 600000, "1000",
     "A peer whose connection failed (since 0.8: a stall past `transfer_timeout_ms`, a reset, every rail down, its "
     "host gone) stays registered and reconnects in the background, authenticating anew: the first attempt this long "
     "(in milliseconds) after the failure, later ones at doubling intervals up to 8 times this, until one succeeds or "
     "the peer is removed. An attempt takes the first path both sides offer that connects within "
     "`connect_timeout_ms`, as `kvx_add_remote_peer()` does: a verbs peer whose rails are all down continues on tcp "
     "when both sides serve it (a warning says so; `peer_backend_fallback=0` forbids it). Meanwhile "
     "`kvx_write_blocks()` fails at once with KVX_EPEERBROKEN and `kvx_get_peer_state()` says "
     "KVX_PEER_RECONNECTING; transfers that failed stay failed. A peer up on such a fallback (since 0.13: tcp while "
     "its preferred verbs failed to connect, after a reconnection or at its add) dials the preferred path again on "
     "the same timer (this long after it landed, then doubling up to 8 times this) and, once it connects, returns to "
     "it by itself: later writes take it at once, transfers in flight end on the old path, nothing fails (a warning "
     "says so; `reconnects` does not count it). The same timer dials a peer's lost rails again while its other rails "
     "carry on (tcp since 0.12, verbs since 0.13). 0: no reconnection, no return and no rail dialled again: the peer "
     "stays broken until it is removed and added again (as before 0.8), a lost rail down until then."},
    {"region_prewarm", OptType::uint, 0, 1, "0",
     "1 (since 0.4.3): `kvx_transport_create()` has the kernel read every page of the region once (through its user "
     "address, read-only: bytes written meanwhile are kept) before it returns, so that the first transfers do not pay "
     "a first kernel access per page, which costs about ten times a later one on some hypervisors (touching the pages "
     "from user space does not help there). Costs one pass over the region at create. For host memory the "
     "application has populated: a page never written is the shared zero page until its first write, which still "
     "faults. A page that cannot be read (device memory, a hole) fails the create with KVX_EINVAL naming its byte "
     "offset and block."},
    {"region_hugepages", OptType::uint, 0, 1, "0",
     "1 (since 0.4.6): `kvx_transport_create()` moves the region onto transparent huge pages before it returns: the "
     "whole, aligned huge pages inside it (2 MiB on x86-64) are advised `MADV_HUGEPAGE` (which replaces an "
     "`MADV_NOHUGEPAGE`) and collapsed with `MADV_COLLAPSE` (Linux 6.1 and later; on older kernels, or with THP "
     "disabled for the process, they are only advised, and khugepaged collapses them in the background unless THP is "
     "set to never). Every byte stays; pages never touched are populated when collapsed; the advice stays after the "
     "transport is destroyed. For private anonymous memory (malloc, a bytearray, a numpy array): a same-host peer "
     "writes into it with `process_vm_writev`, which then walks the region's page table once per 2 MiB instead of "
     "once per 4 KiB (docs/performance.md). A region in a shareable mapping (a /dev/shm file, `kvx_region_alloc()` "
     "memory: the writer maps it), or one that holds no whole huge page, is left as it is, without an error; so is a "
     "collapse the kernel refuses in part (no free huge page, a pinned page). `KVX_LOG=info` logs the outcome. Costs "
     "about one copy of the region at create. KVX_ENOTSUP when the region is private anonymous memory and the kernel "
     "has no transparent huge pages (or /sys does not show them); KVX_EBACKEND when `madvise` fails otherwise (e.g. "
     "vm.max_map_count reached)."},
};

void check_backend_list(const std::string &v) {
    if (v == "auto") return;
    std::vector<std::string> seen;
    for (const std::string &name : split_backend_list(v)) {
        if (!is_backend_name(name)) {
            std::string names = "auto";
            for (const char *n : backend_names()) names += std::string(", ") + n;
            fail(KVX_EINVAL, "option backend: '%s' is not one of %s (or a comma-separated list of them)",
                 name.c_str(), names.c_str());
        }
        for (const std::string &s : seen)
            if (s == name) fail(KVX_EINVAL, "option backend: '%s' is named twice in '%s'", name.c_str(), v.c_str());
        seen.push_back(name);
    }
}

}  // namespace

std::vector<std::string> split_backend_list(const std::string &v) {
    std::vector<std::string> out;
    size_t at = 0;
    for (;;) {
        size_t comma = v.find(',', at);
        out.push_back(v.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) return out;
        at = comma + 1;
    }
}

OptionTable core_options() { return kCoreOptions; }

std::vector<OptionTable> all_option_tables() {
    std::vector<OptionTable> t{core_options()};
    for (const BackendDesc *b : backend_registry()) t.push_back(b->options);
    return t;
}

void validate_option(const std::string &key, const std::string &value) {
    for (OptionTable t : all_option_tables())
        for (const OptionSpec &s : t) {
            if (key != s.key) continue;
            check_option_value(s, value);
            if (key == "backend") check_backend_list(value);
            return;
        }
    fail(KVX_EINVAL, "unknown option '%s'", key.c_str());
}

CoreOptions CoreOptions::from(const Options &o) {
    CoreOptions c;
    c.backend = o.str("backend");
    c.fallback = o.uint("peer_backend_fallback") != 0;
    c.connect_timeout_ms = static_cast<uint32_t>(o.uint("connect_timeout_ms"));
    c.redial_ms = static_cast<uint32_t>(o.uint("peer_redial_ms"));
    c.transfer_timeout_ms = static_cast<uint32_t>(o.uint("transfer_timeout_ms"));
    c.prewarm = o.uint("region_prewarm") != 0;
    c.hugepages = o.uint("region_hugepages") != 0;
    return c;
}

}  // namespace kvx
