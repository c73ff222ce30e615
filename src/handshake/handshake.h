// The one connection handshake of every backend: challenge, HMAC proofs of
// the metadata's secret over the transcript, the fingerprint rule, binding to
// the target transport's instance, and the refusal codes a target may send.
// Backends only carry these bytes (the engine, engine.h, decides): tcp on the
// stream, shm in seqpacket datagrams, verbs in rdma_cm
// private data (docs/wire-format.md, "Handshake").
//
//   initiator --HELLO{instance_id}--------------------------> target
//   initiator <--CHALLENGE{challenge id, nonce}-------------- target
//             (or REFUSE: no such transport here)
//   initiator --AUTH{instance_id, challenge id, fingerprint,
//                    flags, nonce, proof}--------------------> target
//   initiator <--ACCEPT{flags, proof}------------------------ target
//             (or REFUSE{status})
//
// Messages are little-endian, start with the 8-byte header {magic "KVXS",
// version, kind, reserved}, and have a fixed length per kind. AUTH is 56
// bytes: the most an RC connect request carries through rdma_cm on IB/RoCE.
// Parsers here are pure functions over untrusted bytes (bounded, no
// allocation), fuzzed in tests/fuzz/fuzz_handshake.cpp.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_set>

#include "wire/metadata.h"

namespace kvx::handshake {

constexpr uint32_t kMagic = 0x5358564bu;  // "KVXS" in wire order
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderLen = 8;
constexpr size_t kChallengeNonceLen = 16;
constexpr size_t kClientNonceLen = 8;
constexpr size_t kProofLen = 16;  // HMAC-SHA256 truncated to 128 bits
constexpr size_t kFingerprintBytes = 8;
constexpr size_t kKeyLen = 16;  // AES-128-GCM

// n random bytes from OpenSSL's generator; throws Error(KVX_EINTERNAL).
void random_fill(uint8_t *p, size_t n);

// AUTH.flags (offered) and ACCEPT.flags (chosen) carry the data path's
// options. Their bits belong to the backend whose carrier runs the handshake
// (tcp defines its protection there, docs/wire-format.md); this layer only
// requires that both sides offer exactly the same ones.
struct DataPathOptions {
    uint32_t flags = 0;    // what this side offers and requires, exactly (but optional bits)
    uint32_t defined = 0;  // the bits this backend defines; any other one is KVX_EVERSION
    // Names a set of flags for a message ("tcp.protection=aead"); null: hex.
    std::string (*name)(uint32_t flags) = nullptr;
    // Of flags, the bits a target takes or leaves: an AUTH agrees when it
    // matches flags outside them (ACCEPT echoes the AUTH's). An initiator
    // refused with KVX_EVERSION (a target that does not define them) tries
    // again without them.
    uint32_t optional = 0;
    std::string describe(uint32_t f) const;
};

enum class Kind : uint8_t { hello = 1, auth = 2, challenge = 3, refuse = 4, accept = 5 };

constexpr size_t kHelloLen = kHeaderLen + 8;
constexpr size_t kAuthLen = kHeaderLen + 8 + 4 + kFingerprintBytes + 4 + kClientNonceLen + kProofLen;
constexpr size_t kChallengeLen = kHeaderLen + 4 + kChallengeNonceLen;
constexpr size_t kRefuseLen = kHeaderLen + 4;
constexpr size_t kAcceptLen = kHeaderLen + 4 + kProofLen;
constexpr size_t kMaxMessageLen = kAuthLen;
static_assert(kAuthLen == 56, "AUTH must fit an RC connect request's private data");

using Fingerprint = std::array<uint8_t, kFingerprintBytes>;  // all zero = none

struct Hello {
    uint64_t instance_id = 0;  // the target transport the initiator means
};
struct Challenge {
    uint32_t challenge_id = 0;
    std::array<uint8_t, kChallengeNonceLen> nonce{};
};
struct Auth {
    uint64_t instance_id = 0;
    uint32_t challenge_id = 0;
    Fingerprint fingerprint{};
    uint32_t flags = 0;  // offered data path options (the backend's DataPathOptions)
    std::array<uint8_t, kClientNonceLen> nonce{};
    std::array<uint8_t, kProofLen> proof{};
};
struct Refuse {
    int32_t status = 0;  // KVX_EAUTH, KVX_EFINGERPRINT, KVX_ECONNREFUSED, KVX_EVERSION or KVX_ENOTSUP
};
struct Accept {
    uint32_t flags = 0;  // chosen options: always the offered ones (a target refuses others)
    std::array<uint8_t, kProofLen> proof{};
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

using Bytes = std::array<uint8_t, kMaxMessageLen>;
// Encodes into out; returns the message's length.
size_t encode(const Hello &m, uint8_t *out);
size_t encode(const Challenge &m, uint8_t *out);
size_t encode(const Auth &m, uint8_t *out);
size_t encode(const Refuse &m, uint8_t *out);
size_t encode(const Accept &m, uint8_t *out);

// Length of the whole message from its 8-byte header (stream transports read
// the header first). Throws like decode() for a bad header.
size_t message_len(const uint8_t header[kHeaderLen]);

// Parses a message from the other side. n may exceed the message (IB CM pads
// private data with zeros to its fixed size). Throws Error(KVX_EVERSION) for
// another protocol version, Error(KVX_EINVAL) for anything else that is not a
// well-formed message.
Message decode(const void *p, size_t n);

// What a failed decode of the other side's bytes means to the caller:
// KVX_EVERSION stays, anything else is an authentication failure.
int failure_code(int decode_error);

// The codes a REFUSE may carry: KVX_EAUTH, KVX_EFINGERPRINT,
// KVX_ECONNREFUSED, KVX_EVERSION, KVX_ENOTSUP.
bool refusable(int status);

// A refusal is unauthenticated: only the codes a target may send pass, as
// themselves; decode() already rejected any other.
int refusal_code(const Refuse &r);

// "" -> all zero; 16 lowercase hex -> 8 bytes. Throws Error(KVX_EINTERNAL) otherwise.
Fingerprint fingerprint_bytes(const std::string &hex);
// Both set and different: incompatible. Unset on either side: compatible.
bool fingerprints_compatible(const Fingerprint &a, const Fingerprint &b);

// Who we are, as the metadata we handed out says.
struct Identity {
    uint64_t instance_id = 0;
    wire::Secret secret{};
    Fingerprint fingerprint{};
};

// The primitives below are the engine's (handshake/engine.h); backends drive
// the engine, never these.

// ---- target side

// Verifies an AUTH against the challenge that was issued for it. 0:
// accepted, *out is the ACCEPT to send. Else the refusal code to send
// (KVX_EAUTH; KVX_EVERSION for flags opts does not define; KVX_ENOTSUP when
// the offered flags are not exactly opts.flags; KVX_EFINGERPRINT), and *why
// says why, for the log.
int verify(const Identity &me, const DataPathOptions &opts, const Challenge &issued, const Auth &a, Accept *out,
           std::string *why);

// Challenges of a connectionless carrier (verbs: the challenge travels in a
// reject, the AUTH arrives on a new request), with no state per HELLO: the
// nonce is an HMAC of the challenge id under a key that changes every ttl,
// and the id names the key's epoch. A flood of HELLOs therefore costs no
// memory and cannot push out an honest peer's challenge. A challenge lives
// from ttl to 2 * ttl. Single use: the ids of AUTHs that verified are kept
// until their key is gone (at most max_used per epoch), so a replayed AUTH
// finds nothing.
class ChallengeCookies {
public:
    using Clock = std::chrono::steady_clock;
    // Throws Error(KVX_EINTERNAL) when OpenSSL fails.
    ChallengeCookies(std::chrono::milliseconds ttl, size_t max_used);
    Challenge issue();
    // A challenge bound to one connection: the next id, and a nonce from the
    // CSPRNG rather than the epoch's key (a connection keeps its challenge,
    // so nothing needs to find it again, and it never repeats). Throws
    // Error(KVX_EINTERNAL) when OpenSSL fails.
    Challenge issue_random();
    // The challenge with this id, if its epoch is live and it is not used up.
    bool find(uint32_t id, Challenge *out);
    // Uses up id (its AUTH verified); false when it was used already or the
    // epoch has no room left (then the peer gets a fresh challenge).
    bool use(uint32_t id);

private:
    static constexpr int kEpochShift = 24;  // id = epoch tag (8 bits) | counter (24 bits)
    void advance();
    Challenge make(uint32_t id) const;
    std::chrono::milliseconds ttl_;
    size_t max_used_;
    Clock::time_point start_;
    uint64_t epoch_ = 0;
    std::array<std::array<uint8_t, 32>, 2> keys_{};  // by epoch parity: the current and the previous
    std::array<std::unordered_set<uint32_t>, 2> used_;
    uint32_t counter_ = 0;
};

// ---- initiator side

// The AUTH answering challenge c for the target that metadata m describes.
// flags: the data path options offered (DataPathOptions::flags).
Auth answer(const Challenge &c, uint64_t instance_id, const wire::Secret &secret, const Fingerprint &ours,
            uint32_t flags = 0);

// The target's answer, as received: a decoded CHALLENGE or ACCEPT (checked
// by expect_accept). Throws the refusal's code (KVX_ENOTSUP naming opts'
// flags), or Error(KVX_EAUTH)/(KVX_EVERSION) for anything else; where names
// the peer for the message, to the message it answers.
Message expect_answer(const void *p, size_t n, const DataPathOptions &opts, const char *where, const char *to);

// The target's proof in an ACCEPT that chooses flags for AUTH a (exposed
// for tests of the initiator's checks).
std::array<uint8_t, kProofLen> server_proof(const wire::Secret &s, const Challenge &c, const Auth &a, uint32_t flags);

// An ACCEPT answering a, checked: its proof shows the target holds the
// secret (checked first: the proof covers the flags). Throws
// Error(KVX_EAUTH) naming where; Error(KVX_EVERSION) when, with a valid
// proof, it chose flags other than a.flags.
void expect_accept(const Accept &acc, const Challenge &c, const Auth &a, const wire::Secret &secret,
                   const char *where);

// ---- both sides

// The data path keys of one connection, one per direction: HKDF-SHA256 with
// the metadata secret as input key, the challenge (nonce, id) as salt and the
// label, the whole AUTH (client nonce and proof included) and the whole
// ACCEPT as info. Fresh per connection: both nonces are random.
struct Keys {
    std::array<uint8_t, kKeyLen> to_target{};     // initiator -> target records
    std::array<uint8_t, kKeyLen> to_initiator{};  // target -> initiator records
};
// Throws Error(KVX_EINTERNAL) when OpenSSL fails.
Keys derive_keys(const wire::Secret &secret, const Challenge &c, const Auth &a, const Accept &acc);

}  // namespace kvx::handshake
