#include "backends/verbs/verbs_wire.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

#include "util/error.h"
#include "wire/bytes.h"

namespace kvx::verbs {

namespace {

using wire::get_le;
using wire::put_le;

void put_header(uint8_t *out, Kind k) {
    put_le(out, kPdMagic, 4);
    out[4] = kPdVersion;
    out[5] = static_cast<uint8_t>(k);
    put_le(out + 6, 0, 2);
}

// AUTH minus its mac: the transcript both proofs cover.
constexpr size_t kAuthSignedLen = kAuthLen - kProofLen;

std::array<uint8_t, kProofLen> proof(const std::array<uint8_t, wire::kSecretLen> &secret, const char *label,
                                     const Challenge &c, const Auth &a) {
    uint8_t msg[64 + kChallengeNonceLen + 4 + kAuthSignedLen];
    size_t ll = strlen(label) + 1;  // with the NUL: labels are prefix-free
    if (ll > 64) fail(KVX_EINTERNAL, "verbs: proof label too long");
    size_t n = 0;
    memcpy(msg + n, label, ll);
    n += ll;
    memcpy(msg + n, c.nonce.data(), kChallengeNonceLen);
    n += kChallengeNonceLen;
    put_le(msg + n, c.challenge_id, 4);
    n += 4;
    Auth unsigned_auth = a;
    unsigned_auth.mac = {};
    AuthBytes ab = encode(unsigned_auth);
    memcpy(msg + n, ab.data(), kAuthSignedLen);
    n += kAuthSignedLen;
    uint8_t full[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, n, full, &len) || len < kProofLen)
        fail(KVX_EINTERNAL, "HMAC-SHA256 failed");
    std::array<uint8_t, kProofLen> out{};
    memcpy(out.data(), full, kProofLen);
    return out;
}

}  // namespace

HelloBytes encode(const Hello &m) {
    HelloBytes b{};
    put_header(b.data(), Kind::hello);
    put_le(b.data() + 8, m.instance_id, 8);
    return b;
}

AuthBytes encode(const Auth &m) {
    AuthBytes b{};
    uint8_t *p = b.data();
    put_header(p, Kind::auth);
    put_le(p + 8, m.instance_id, 8);
    put_le(p + 16, m.challenge_id, 4);
    memcpy(p + 20, m.fingerprint.data(), kFingerprintBytes);
    memcpy(p + 28, m.nonce.data(), kClientNonceLen);
    memcpy(p + 40, m.mac.data(), kProofLen);
    return b;
}

ChallengeBytes encode(const Challenge &m) {
    ChallengeBytes b{};
    put_header(b.data(), Kind::challenge);
    put_le(b.data() + 8, m.challenge_id, 4);
    memcpy(b.data() + 12, m.nonce.data(), kChallengeNonceLen);
    return b;
}

RefuseBytes encode(const Refuse &m) {
    RefuseBytes b{};
    put_header(b.data(), Kind::refuse);
    put_le(b.data() + 8, static_cast<uint32_t>(m.status), 4);
    return b;
}

AcceptBytes encode(const Accept &m) {
    AcceptBytes b{};
    put_header(b.data(), Kind::accept);
    memcpy(b.data() + 8, m.mac.data(), kProofLen);
    return b;
}

Message decode(const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    if (p == nullptr || n < kPdHeaderLen) fail(KVX_EINVAL, "verbs handshake: %zu bytes of private data", p ? n : 0);
    if (get_le(p, 4) != kPdMagic) fail(KVX_EINVAL, "verbs handshake: bad magic 0x%08x", (unsigned)get_le(p, 4));
    if (p[4] != kPdVersion)
        fail(KVX_EVERSION, "verbs handshake: protocol version %u, this kvxfer speaks %u", p[4], kPdVersion);
    if (get_le(p + 6, 2) != 0) fail(KVX_EINVAL, "verbs handshake: reserved header bytes are not 0");
    Message m;
    m.kind = static_cast<Kind>(p[5]);
    auto need = [&](size_t len) {
        if (n < len) fail(KVX_EINVAL, "verbs handshake: message kind %u truncated (%zu of %zu bytes)", p[5], n, len);
    };
    switch (m.kind) {
    case Kind::hello:
        need(kHelloLen);
        m.hello.instance_id = get_le(p + 8, 8);
        break;
    case Kind::auth:
        need(kAuthLen);
        m.auth.instance_id = get_le(p + 8, 8);
        m.auth.challenge_id = static_cast<uint32_t>(get_le(p + 16, 4));
        memcpy(m.auth.fingerprint.data(), p + 20, kFingerprintBytes);
        memcpy(m.auth.nonce.data(), p + 28, kClientNonceLen);
        memcpy(m.auth.mac.data(), p + 40, kProofLen);
        break;
    case Kind::challenge:
        need(kChallengeLen);
        m.challenge.challenge_id = static_cast<uint32_t>(get_le(p + 8, 4));
        memcpy(m.challenge.nonce.data(), p + 12, kChallengeNonceLen);
        break;
    case Kind::refuse: {
        need(kRefuseLen);
        m.refuse.status = static_cast<int32_t>(get_le(p + 8, 4));
        int s = m.refuse.status;
        if (s != KVX_EAUTH && s != KVX_EFINGERPRINT && s != KVX_ECONNREFUSED && s != KVX_EVERSION)
            fail(KVX_EINVAL, "verbs handshake: refusal with unexpected status %d", s);
        break;
    }
    case Kind::accept:
        need(kAcceptLen);
        memcpy(m.accept.mac.data(), p + 8, kProofLen);
        break;
    default:
        fail(KVX_EINVAL, "verbs handshake: unknown message kind %u", p[5]);
    }
    return m;
}

std::array<uint8_t, kProofLen> client_proof(const std::array<uint8_t, wire::kSecretLen> &secret,
                                            const Challenge &c, const Auth &a) {
    return proof(secret, "kvxfer verbs v1 client proof", c, a);
}

std::array<uint8_t, kProofLen> server_proof(const std::array<uint8_t, wire::kSecretLen> &secret,
                                            const Challenge &c, const Auth &a) {
    return proof(secret, "kvxfer verbs v1 server proof", c, a);
}

std::array<uint8_t, kFingerprintBytes> fingerprint_bytes(const std::string &hex) {
    std::array<uint8_t, kFingerprintBytes> out{};
    if (hex.empty()) return out;
    if (hex.size() != 2 * kFingerprintBytes) fail(KVX_EINTERNAL, "verbs: fingerprint '%s' is not 16 hex", hex.c_str());
    auto nib = [&](char c) -> uint8_t {
        if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
        if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
        fail(KVX_EINTERNAL, "verbs: fingerprint '%s' is not lowercase hex", hex.c_str());
    };
    for (size_t i = 0; i < kFingerprintBytes; i++)
        out[i] = static_cast<uint8_t>(nib(hex[2 * i]) << 4 | nib(hex[2 * i + 1]));
    return out;
}

bool fingerprints_compatible(const std::array<uint8_t, kFingerprintBytes> &a,
                             const std::array<uint8_t, kFingerprintBytes> &b) {
    static const std::array<uint8_t, kFingerprintBytes> none{};
    return a == none || b == none || a == b;
}

}  // namespace kvx::verbs
