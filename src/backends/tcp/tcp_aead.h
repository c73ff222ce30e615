// AES-128-GCM records of one direction of one tcp connection (tcp.protection
// = aead, docs/wire-format.md "Protected records"). The nonce is the record's
// sequence number in its direction, so a record replayed, reordered, dropped,
// injected or moved to another connection fails its tag.
//
// Two implementations of the same cipher, byte for byte (tcp.aead_impl):
// OpenSSL's EVP, and Intel's ipsec-mb where the library was built with it;
// on CPUs with VAES, VPCLMULQDQ and AVX-512 the latter seals about three
// times as many bytes per core (docs/security.md "Protected tcp").
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "handshake/handshake.h"
#include "util/options.h"

namespace kvx::tcp {

constexpr size_t kTagLen = 16;
// A connection closes (KVX_ECONNRESET) before its nonces could wrap.
constexpr uint64_t kMaxRecords = 1ull << 48;

enum class AeadImpl { openssl, ipsec_mb };

// tcp.aead_impl on this host: auto is ipsec_mb when the library was built
// with it and the CPU has its VAES code path, openssl otherwise. Throws
// Error(KVX_ENOTSUP) for ipsec-mb where it cannot run.
AeadImpl aead_impl(const Options &o);
const char *aead_impl_name(AeadImpl impl);

class Aead {
public:
    // throws Error(KVX_EINTERNAL)
    Aead(const std::array<uint8_t, handshake::kKeyLen> &key, bool encrypt, AeadImpl impl);
    ~Aead();
    Aead(const Aead &) = delete;
    Aead &operator=(const Aead &) = delete;

    // A whole record: seal writes n bytes of ciphertext then the tag to out;
    // open reads n bytes of ciphertext then the tag from in, writes the
    // plaintext to out and returns false when the tag does not verify.
    void seal(const uint8_t *aad, size_t aad_n, const uint8_t *in, size_t n, uint8_t *out);
    bool open(const uint8_t *aad, size_t aad_n, const uint8_t *in, size_t n, uint8_t *out);

    // A record in pieces (a frame's payload): begin, update any number of
    // times (in == out allowed), then finish_seal or finish_open.
    void begin(const uint8_t *aad, size_t aad_n);
    void update(const uint8_t *in, uint8_t *out, size_t n);
    void finish_seal(uint8_t tag[kTagLen]);
    bool finish_open(const uint8_t tag[kTagLen]);

private:
    struct Fast;  // ipsec-mb's key schedule and running state
    std::unique_ptr<Fast> fast_;
    EVP_CIPHER_CTX *ctx_ = nullptr;
    bool encrypt_;
    uint64_t seq_ = 0;
};

// Additional data of each record kind: the kind, and for a frame head its
// cleartext length.
constexpr uint8_t kRecordHead = 1, kRecordPayload = 2, kRecordAck = 3;

}  // namespace kvx::tcp
