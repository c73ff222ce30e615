// AES-128-GCM records of one direction of one tcp connection (tcp.protection
// = aead, docs/wire-format.md "Protected records"). The nonce is the record's
// sequence number in its direction, so a record replayed, reordered, dropped,
// injected or moved to another connection fails its tag.
//
// Two implementations of the same cipher, byte for byte (tcp.aead_impl):
// OpenSSL's EVP, and Intel's ipsec-mb where the library was built with it;
// on CPUs where ipsec-mb runs its VAES code the latter seals about three
// times as many bytes per core (docs/security.md).
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
// The most bytes one record may seal (GCM's bound per message); a frame's
// payload is one record, so only a block of 64 GiB or more comes near it.
constexpr uint64_t kMaxRecordBytes = (1ull << 36) - 32;

enum class AeadImpl { openssl, ipsec_mb };

// tcp.aead_impl on this host: auto is ipsec_mb when the library was built
// with it and it runs its VAES code here (the CPU has every feature of
// IMB_CPUFLAGS_AVX512_T2: AVX-512, VAES, VPCLMULQDQ, GFNI, AVX512-IFMA,
// SHA-NI, and the kernel enables the AVX-512 registers), openssl otherwise.
// Throws Error(KVX_ENOTSUP) for ipsec-mb where it cannot run (a build
// without it; a CPU without SSE4.2, AES-NI and PCLMULQDQ).
AeadImpl aead_impl(const Options &o);
const char *aead_impl_name(AeadImpl impl);

// Which of ipsec-mb's codes may run, from the kernel's vector state (XCR0:
// 2 = AVX-512 registers saved, 1 = AVX, 0 = neither) and the CPU's features
// (IMB_FEATURE_* bits): ipsec-mb 1.3 looks at CPUID only, and code that
// uses registers the kernel does not save faults (SIGILL). avx512_vaes is
// the VAES code that auto takes. Exists in builds with ipsec-mb.
enum class IpsecMbCode { none, sse, avx, avx2, avx512, avx512_vaes };
IpsecMbCode choose_ipsec_mb_code(int os_vector_state, uint64_t features);

class Aead {
public:
    // impl: as aead_impl() returned. Throws Error(KVX_EINTERNAL).
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
    uint64_t record_bytes_ = 0;  // of the record begun last
};

// Additional data of each record kind: the kind, and for a frame head its
// cleartext length.
constexpr uint8_t kRecordHead = 1, kRecordPayload = 2, kRecordAck = 3;

}  // namespace kvx::tcp
