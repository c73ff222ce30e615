// An independent writer of agent-metadata blobs, byte by byte after
// docs/wire-format.md (not through encode_metadata()), for tests and seed
// generation that need malformed or hand-shaped blobs. The checksum (first 8
// bytes of SHA-256 over everything before it) is always recomputed, so a blob
// reaches the value check it is meant to exercise.
#pragma once

#include <openssl/sha.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "wire/metadata.h"

namespace kvx::testing {

using Bytes = std::vector<uint8_t>;

inline void le(Bytes &b, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

struct Sec {
    uint16_t type;
    uint16_t flags;
    Bytes body;
};

constexpr int64_t kAutoCount = -1;

// Header, sections, then total_len and checksum. nsec overrides the section
// count field (kAutoCount: the real count), magic the magic.
inline Bytes assemble_metadata(const std::vector<Sec> &secs, uint16_t major = wire::kMetaMajor, uint16_t minor = 0,
                               int64_t nsec = kAutoCount, uint32_t magic = wire::kMetaMagic) {
    Bytes b;
    le(b, magic, 4);
    le(b, major, 2);
    le(b, minor, 2);
    le(b, 0, 4);
    le(b, nsec == kAutoCount ? secs.size() : static_cast<uint64_t>(nsec), 4);
    for (const auto &s : secs) {
        le(b, s.type, 2);
        le(b, s.flags, 2);
        le(b, s.body.size(), 4);
        b.insert(b.end(), s.body.begin(), s.body.end());
    }
    uint32_t total = static_cast<uint32_t>(b.size() + 8);
    for (size_t i = 0; i < 4; i++) b[8 + i] = static_cast<uint8_t>(total >> (8 * i));
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(b.data(), b.size(), d);
    b.insert(b.end(), d, d + 8);
    return b;
}

// Recomputes the checksum of an edited blob (total_len kept as is).
inline void reseal(Bytes &b) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(b.data(), b.size() - 8, d);
    memcpy(b.data() + b.size() - 8, d, 8);
}

}  // namespace kvx::testing
