// AES-128-GCM records of one direction of one tcp connection (tcp.protection
// = aead, docs/wire-format.md "Protected records"). The nonce is the record's
// sequence number in its direction, so a record replayed, reordered, dropped,
// injected or moved to another connection fails its tag.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "handshake/handshake.h"

namespace kvx::tcp {

constexpr size_t kTagLen = 16;
// A connection closes (KVX_ECONNRESET) before its nonces could wrap.
constexpr uint64_t kMaxRecords = 1ull << 48;

class Aead {
public:
    Aead(const std::array<uint8_t, handshake::kKeyLen> &key, bool encrypt);  // throws Error(KVX_EINTERNAL)
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
    EVP_CIPHER_CTX *ctx_ = nullptr;
    bool encrypt_;
    uint64_t seq_ = 0;
};

// Additional data of each record kind: the kind, and for a frame head its
// cleartext length.
constexpr uint8_t kRecordHead = 1, kRecordPayload = 2, kRecordAck = 3;

}  // namespace kvx::tcp
