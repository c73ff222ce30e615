// kvxfer-info's parts: each fills its piece of one JSON object (the --json
// output; its keys are documented in kvxfer-info(1) and stay stable), which
// the text output renders. Built on the internal core archive (kvxfer_core):
// the tcp AEAD choice and the verbs rails have no public API.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvx::info {

using Json = nlohmann::ordered_json;

struct Config {
    uint64_t region_size = 1ull << 30;  // --region-size: what RLIMIT_MEMLOCK must cover
    std::string options;                // --option texts, joined by spaces (kvx_options_parse syntax)
    bool json = false;
};

// host.cpp: facts about this host that do not depend on a backend.
Json host_facts(const Config &c);           // "host"
Json shm_facts();                           // the facts part of "backends"."shm"
Json ipv4_addresses();  // [{"address", "interface"}]: up, not loopback
// RLIMIT_MEMLOCK soft limit; UINT64_MAX for unlimited.
uint64_t memlock_limit();
bool has_cap_ipc_lock();
// The first line of a file, "" when it cannot be read.
std::string read_line(const std::string &path);

// rdma.cpp: "rdma": every RDMA device, its ports and GIDs (devices only in
// a build with the verbs backend; sysfs names in any build).
Json rdma_facts();
// The entries of /sys/class/infiniband ("" when it is absent: no RDMA core).
std::vector<std::string> sysfs_rdma_devices(bool *present);

// backends.cpp: "build", "auto" and "backends": each backend created for
// real on a small region, and why not when it cannot be.
Json build_facts();
Json auto_facts(const Config &c);
Json backend_facts(const Config &c, const Json &rdma);

// text.cpp: the plain text form of the whole object.
void print_text(const Json &all);

// "1 GiB", "8 MiB", "512 B": binary units, at most one decimal.
std::string human_bytes(uint64_t n);

}  // namespace kvx::info
