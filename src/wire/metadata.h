// Agent metadata: the opaque bytes a transport hands to its peers
// (docs/wire-format.md). The container holds the core section (geometry,
// identity, secret, fingerprint) and one opaque, versioned section per
// backend, tagged by the backend's id: this layer never parses a backend's
// bytes, and a reader skips a section it does not know. decode_metadata() is
// the parser of untrusted remote bytes: bounded, validating, fuzzed
// (tests/fuzz/fuzz_metadata.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "util/bytes.h"
#include "util/net.h"

namespace kvx::wire {

constexpr uint32_t kMetaMagic = 0x4d58564bu;  // "KVXM" in file order
constexpr uint16_t kMetaMajor = 2;
constexpr uint16_t kMetaMinor = 0;
constexpr size_t kMetaMaxLen = 64 * 1024;
constexpr size_t kSecretLen = 32;
constexpr size_t kMaxEndpoints = 16;
constexpr uint16_t kSectionCore = 1;  // backend sections use their backend's id (2 and up)
constexpr size_t kMaxSections = 64;

using Secret = std::array<uint8_t, kSecretLen>;

// One backend's section, as carried: its bytes are the backend's to parse.
struct Section {
    uint16_t type = 0;    // backend id
    uint8_t version = 0;  // the backend's own section version
    std::vector<uint8_t> body;
    bool operator==(const Section &) const = default;
};

struct AgentMetadata {
    uint64_t base_addr = 0;
    uint64_t num_blocks = 0;
    uint64_t block_len = 0;
    uint64_t instance_id = 0;  // random per transport; binds connections to it
    Secret secret{};
    std::string fingerprint;  // "" or 16 lowercase hex
    std::vector<Section> sections;  // backend sections, in the writer's order of preference
    const Section *find(uint16_t type) const;
    bool operator==(const AgentMetadata &) const = default;
};

std::vector<uint8_t> encode_metadata(const AgentMetadata &m);

// Throws Error(KVX_EBADMETA) for truncation, corruption, trailing bytes or
// invalid values, Error(KVX_EVERSION) for an unknown major version or an
// unknown critical section.
AgentMetadata decode_metadata(const uint8_t *p, size_t n);

// The endpoint record backends use inside their sections (20 bytes).
constexpr size_t kEndpointLen = 20;
void put_endpoint(Writer &w, const net::Endpoint &e);
// Throws Error(KVX_EBADMETA) naming the defect.
net::Endpoint get_endpoint(Reader &r);

}  // namespace kvx::wire
