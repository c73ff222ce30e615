// Agent metadata: the opaque bytes a transport hands to its peers
// (docs/wire-format.md). decode() is the parser of untrusted remote bytes:
// bounded, validating, fuzzed (tests/fuzz/fuzz_metadata.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvx::wire {

constexpr uint32_t kMetaMagic = 0x4d58564bu;  // "KVXM" in file order
constexpr uint16_t kMetaMajor = 1;
constexpr uint16_t kMetaMinor = 0;
constexpr size_t kMetaMaxLen = 64 * 1024;
constexpr size_t kSecretLen = 32;
constexpr size_t kMaxEndpoints = 16;

enum class BackendKind : uint8_t { tcp = 1, verbs = 2, shm = 3 };
const char *backend_kind_name(BackendKind k);

// An IPv4 or IPv6 address and port.
struct Endpoint {
    uint8_t family = 4;  // 4 or 6
    std::array<uint8_t, 16> addr{};
    uint16_t port = 0;
    std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
    bool operator==(const Endpoint &) const = default;
};

// What a verbs peer needs: the rdma_cm address, and the MR it writes into.
struct VerbsInfo {
    Endpoint cm;
    uint64_t mr_addr = 0;
    uint64_t mr_len = 0;
    uint32_t rkey = 0;
    bool operator==(const VerbsInfo &) const = default;
};

struct AgentMetadata {
    uint64_t base_addr = 0;
    uint64_t num_blocks = 0;
    uint64_t block_len = 0;
    uint64_t instance_id = 0;  // random per transport; binds connections to it
    std::array<uint8_t, kSecretLen> secret{};
    std::string fingerprint;  // "" or 16 lowercase hex
    BackendKind backend = BackendKind::tcp;
    std::vector<Endpoint> tcp;     // backend tcp
    std::optional<VerbsInfo> verbs;  // backend verbs
    bool operator==(const AgentMetadata &) const = default;
};

std::vector<uint8_t> encode_metadata(const AgentMetadata &m);

// Throws Error(KVX_EBADMETA) for truncation, corruption, trailing bytes or
// invalid values, Error(KVX_EVERSION) for an unknown major version.
AgentMetadata decode_metadata(const uint8_t *p, size_t n);

}  // namespace kvx::wire
