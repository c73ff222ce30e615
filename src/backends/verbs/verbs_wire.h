// The verbs backend's connection handshake, carried entirely in rdma_cm
// private data (docs: src/backends/verbs/README.md, "Handshake"):
//
//   active  --REQ{HELLO instance_id}-------------------------> passive
//   active  <--REJ{CHALLENGE id, 16-byte nonce}--------------- passive
//   active  --REQ{AUTH instance_id, challenge id, fingerprint,
//                 client nonce, HMAC(secret, challenge, fields)}> passive
//                     passive verifies, only then creates its QP
//   active  <--REP{ACCEPT HMAC(secret, challenge, fields)}---- passive
//                     or REJ{REFUSE status}
//
// All messages are little-endian and start with the 8-byte header
// {magic "KVXR", version, kind, reserved}. REQ private data is limited to 56
// bytes for RC on IB/RoCE (92 minus rdma_cm's 36-byte header): AUTH is
// exactly 56. These are pure functions over untrusted bytes (bounded, no
// allocation), tested in tests/verbs/verbs_wire_test.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/metadata.h"

namespace kvx::verbs {

constexpr uint32_t kPdMagic = 0x5258564bu;  // "KVXR" in wire order
constexpr uint8_t kPdVersion = 1;
constexpr size_t kPdHeaderLen = 8;
constexpr size_t kMaxReqPrivateData = 56;  // RC REQ on IB/RoCE through rdma_cm

constexpr size_t kChallengeNonceLen = 16;
constexpr size_t kClientNonceLen = 12;
constexpr size_t kProofLen = 16;  // HMAC-SHA256 truncated to 128 bits
constexpr size_t kFingerprintBytes = 8;

enum class Kind : uint8_t { hello = 1, auth = 2, challenge = 3, refuse = 4, accept = 5 };

constexpr size_t kHelloLen = kPdHeaderLen + 8;
constexpr size_t kAuthLen = kPdHeaderLen + 8 + 4 + kFingerprintBytes + kClientNonceLen + kProofLen;
constexpr size_t kChallengeLen = kPdHeaderLen + 4 + kChallengeNonceLen;
constexpr size_t kRefuseLen = kPdHeaderLen + 4;
constexpr size_t kAcceptLen = kPdHeaderLen + kProofLen;
static_assert(kAuthLen <= kMaxReqPrivateData, "AUTH must fit the RC REQ private data");

struct Hello {
    uint64_t instance_id = 0;  // the target transport the initiator means
};

struct Auth {
    uint64_t instance_id = 0;
    uint32_t challenge_id = 0;
    std::array<uint8_t, kFingerprintBytes> fingerprint{};  // binary; all zero = none
    std::array<uint8_t, kClientNonceLen> nonce{};
    std::array<uint8_t, kProofLen> mac{};
};

struct Challenge {
    uint32_t challenge_id = 0;
    std::array<uint8_t, kChallengeNonceLen> nonce{};
};

struct Refuse {
    int32_t status = 0;  // KVX_EAUTH, KVX_EFINGERPRINT, KVX_ECONNREFUSED or KVX_EVERSION
};

struct Accept {
    std::array<uint8_t, kProofLen> mac{};
};

// One decoded message; only the member named by kind is meaningful.
struct Message {
    Kind kind = Kind::hello;
    Hello hello;
    Auth auth;
    Challenge challenge;
    Refuse refuse;
    Accept accept;
};

using HelloBytes = std::array<uint8_t, kHelloLen>;
using AuthBytes = std::array<uint8_t, kAuthLen>;
using ChallengeBytes = std::array<uint8_t, kChallengeLen>;
using RefuseBytes = std::array<uint8_t, kRefuseLen>;
using AcceptBytes = std::array<uint8_t, kAcceptLen>;

HelloBytes encode(const Hello &m);
AuthBytes encode(const Auth &m);
ChallengeBytes encode(const Challenge &m);
RefuseBytes encode(const Refuse &m);
AcceptBytes encode(const Accept &m);

// Parses private data received from the other side. n may exceed the
// message (IB CM pads private data with zeros to its fixed size). Throws
// Error(KVX_EVERSION) for another protocol version, Error(KVX_EINVAL) for
// anything else that is not a well-formed message.
Message decode(const void *p, size_t n);

// Proofs of the secret: HMAC-SHA256(secret, label || challenge || AUTH
// without its mac field), first kProofLen bytes. Client and server use
// different labels, so one cannot be replayed as the other.
std::array<uint8_t, kProofLen> client_proof(const std::array<uint8_t, wire::kSecretLen> &secret,
                                            const Challenge &c, const Auth &a);
std::array<uint8_t, kProofLen> server_proof(const std::array<uint8_t, wire::kSecretLen> &secret,
                                            const Challenge &c, const Auth &a);

// "" -> all zero; 16 lowercase hex -> 8 bytes. Throws Error(KVX_EINTERNAL) otherwise.
std::array<uint8_t, kFingerprintBytes> fingerprint_bytes(const std::string &hex);
// The fingerprint rule of the tcp backend: both set and different -> incompatible.
bool fingerprints_compatible(const std::array<uint8_t, kFingerprintBytes> &a,
                             const std::array<uint8_t, kFingerprintBytes> &b);

}  // namespace kvx::verbs
