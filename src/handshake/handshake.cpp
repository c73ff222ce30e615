#include "handshake/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/core_names.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "util/bytes.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::handshake {

void random_fill(uint8_t *p, size_t n) {
    if (RAND_bytes(p, static_cast<int>(n)) != 1) fail(KVX_EINTERNAL, "OpenSSL RAND_bytes failed");
}

namespace {

constexpr size_t kAuthSignedLen = kAuthLen - kProofLen;  // AUTH minus its proof

void put_header(uint8_t *out, Kind k) {
    put_le(out, kMagic, 4);
    out[4] = kVersion;
    out[5] = static_cast<uint8_t>(k);
    put_le(out + 6, 0, 2);
}

// HMAC-SHA256(secret, label || challenge || AUTH without proof || accept
// flags), first kProofLen bytes. Labels differ per side, so one proof cannot
// be replayed as the other.
std::array<uint8_t, kProofLen> proof(const wire::Secret &secret, const char *label, const Challenge &c,
                                     const Auth &a, uint32_t accept_flags) {
    uint8_t msg[64 + kChallengeNonceLen + 4 + kAuthSignedLen + 4];
    size_t ll = strlen(label) + 1;  // with the NUL: labels are prefix-free
    if (ll > 64) fail(KVX_EINTERNAL, "handshake: proof label too long");
    size_t n = 0;
    memcpy(msg + n, label, ll);
    n += ll;
    memcpy(msg + n, c.nonce.data(), kChallengeNonceLen);
    n += kChallengeNonceLen;
    put_le(msg + n, c.challenge_id, 4);
    n += 4;
    Auth unsigned_auth = a;
    unsigned_auth.proof = {};
    uint8_t ab[kAuthLen];
    encode(unsigned_auth, ab);
    memcpy(msg + n, ab, kAuthSignedLen);
    n += kAuthSignedLen;
    put_le(msg + n, accept_flags, 4);
    n += 4;
    uint8_t full[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, n, full, &len) || len < kProofLen)
        fail(KVX_EINTERNAL, "HMAC-SHA256 failed");
    std::array<uint8_t, kProofLen> out{};
    memcpy(out.data(), full, kProofLen);
    return out;
}

std::array<uint8_t, kProofLen> client_proof(const wire::Secret &s, const Challenge &c, const Auth &a) {
    return proof(s, "kvxfer handshake v1 client proof", c, a, 0);
}


void decode_body(Message &m, const uint8_t *p) {
    switch (m.kind) {
    case Kind::hello: m.hello.instance_id = get_le(p + 8, 8); break;
    case Kind::auth:
        m.auth.instance_id = get_le(p + 8, 8);
        m.auth.challenge_id = static_cast<uint32_t>(get_le(p + 16, 4));
        memcpy(m.auth.fingerprint.data(), p + 20, kFingerprintBytes);
        m.auth.flags = static_cast<uint32_t>(get_le(p + 28, 4));
        memcpy(m.auth.nonce.data(), p + 32, kClientNonceLen);
        memcpy(m.auth.proof.data(), p + 40, kProofLen);
        break;
    case Kind::challenge:
        m.challenge.challenge_id = static_cast<uint32_t>(get_le(p + 8, 4));
        memcpy(m.challenge.nonce.data(), p + 12, kChallengeNonceLen);
        break;
    case Kind::refuse: {
        m.refuse.status = static_cast<int32_t>(get_le(p + 8, 4));
        if (!refusable(m.refuse.status))
            fail(KVX_EINVAL, "handshake: refusal with unexpected status %d", m.refuse.status);
        break;
    }
    case Kind::accept:
        m.accept.flags = static_cast<uint32_t>(get_le(p + 8, 4));
        memcpy(m.accept.proof.data(), p + 12, kProofLen);
        break;
    }
}

}  // namespace

std::array<uint8_t, kProofLen> server_proof(const wire::Secret &s, const Challenge &c, const Auth &a,
                                            uint32_t flags) {
    return proof(s, "kvxfer handshake v1 server proof", c, a, flags);
}

size_t encode(const Hello &m, uint8_t *out) {
    put_header(out, Kind::hello);
    put_le(out + 8, m.instance_id, 8);
    return kHelloLen;
}

size_t encode(const Auth &m, uint8_t *out) {
    put_header(out, Kind::auth);
    put_le(out + 8, m.instance_id, 8);
    put_le(out + 16, m.challenge_id, 4);
    memcpy(out + 20, m.fingerprint.data(), kFingerprintBytes);
    put_le(out + 28, m.flags, 4);
    memcpy(out + 32, m.nonce.data(), kClientNonceLen);
    memcpy(out + 40, m.proof.data(), kProofLen);
    return kAuthLen;
}

namespace {

// Header, a u32, then N bytes: the layout of CHALLENGE and ACCEPT.
template <size_t N>
size_t put_u32_bytes(uint8_t *out, Kind k, uint32_t v, const std::array<uint8_t, N> &b) {
    put_header(out, k);
    put_le(out + 8, v, 4);
    memcpy(out + 12, b.data(), N);
    return 12 + N;
}

}  // namespace

size_t encode(const Challenge &m, uint8_t *out) { return put_u32_bytes(out, Kind::challenge, m.challenge_id, m.nonce); }

size_t encode(const Refuse &m, uint8_t *out) {
    put_header(out, Kind::refuse);
    put_le(out + 8, static_cast<uint32_t>(m.status), 4);
    return kRefuseLen;
}

size_t encode(const Accept &m, uint8_t *out) { return put_u32_bytes(out, Kind::accept, m.flags, m.proof); }

size_t message_len(const uint8_t *p) {
    if (get_le(p, 4) != kMagic) fail(KVX_EINVAL, "handshake: bad magic 0x%08x", (unsigned)get_le(p, 4));
    if (p[4] != kVersion)
        fail(KVX_EVERSION, "handshake: protocol version %u, this kvxfer speaks %u", p[4], kVersion);
    if (get_le(p + 6, 2) != 0) fail(KVX_EINVAL, "handshake: reserved header bytes are not 0");
    switch (static_cast<Kind>(p[5])) {
    case Kind::hello: return kHelloLen;
    case Kind::auth: return kAuthLen;
    case Kind::challenge: return kChallengeLen;
    case Kind::refuse: return kRefuseLen;
    case Kind::accept: return kAcceptLen;
    }
    fail(KVX_EINVAL, "handshake: unknown message kind %u", p[5]);
}

Message decode(const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    if (p == nullptr || n < kHeaderLen) fail(KVX_EINVAL, "handshake: %zu bytes of message", p ? n : 0);
    size_t need = message_len(p);
    if (n < need) fail(KVX_EINVAL, "handshake: message kind %u truncated (%zu of %zu bytes)", p[5], n, need);
    Message m;
    m.kind = static_cast<Kind>(p[5]);
    decode_body(m, p);
    return m;
}

bool refusable(int s) {
    return s == KVX_EAUTH || s == KVX_EFINGERPRINT || s == KVX_ECONNREFUSED || s == KVX_EVERSION || s == KVX_ENOTSUP;
}

int failure_code(int decode_error) { return decode_error == KVX_EVERSION ? KVX_EVERSION : KVX_EAUTH; }

int refusal_code(const Refuse &r) { return r.status; }

Fingerprint fingerprint_bytes(const std::string &hex) {
    Fingerprint out{};
    if (hex.empty()) return out;
    if (hex.size() != 2 * kFingerprintBytes) fail(KVX_EINTERNAL, "fingerprint '%s' is not 16 hex", hex.c_str());
    auto nib = [&](char c) -> uint8_t {
        if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
        if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
        fail(KVX_EINTERNAL, "fingerprint '%s' is not lowercase hex", hex.c_str());
    };
    for (size_t i = 0; i < kFingerprintBytes; i++)
        out[i] = static_cast<uint8_t>(nib(hex[2 * i]) << 4 | nib(hex[2 * i + 1]));
    return out;
}

bool fingerprints_compatible(const Fingerprint &a, const Fingerprint &b) {
    static const Fingerprint none{};
    return a == none || b == none || a == b;
}

std::string DataPathOptions::describe(uint32_t f) const {
    return name ? name(f) : strfmt("flags 0x%x", f);
}

int verify(const Identity &me, const DataPathOptions &opts, const Challenge &issued, const Auth &a, Accept *out,
           std::string *why) {
    if (a.instance_id != me.instance_id || a.challenge_id != issued.challenge_id) {
        *why = "an AUTH meant for another transport or challenge";
        return KVX_EAUTH;
    }
    if (CRYPTO_memcmp(client_proof(me.secret, issued, a).data(), a.proof.data(), kProofLen) != 0) {
        *why = "no valid proof of the secret";
        return KVX_EAUTH;
    }
    if (a.flags & ~opts.defined) {
        *why = strfmt("flags 0x%x this side does not know", a.flags);
        return KVX_EVERSION;
    }
    if ((a.flags & ~opts.optional) != (opts.flags & ~opts.optional)) {
        *why = strfmt("it offers %s, this side requires %s", opts.describe(a.flags).c_str(),
                      opts.describe(opts.flags).c_str());
        return KVX_ENOTSUP;
    }
    if (!fingerprints_compatible(me.fingerprint, a.fingerprint)) {
        *why = "another config fingerprint";
        return KVX_EFINGERPRINT;
    }
    out->flags = a.flags;
    out->proof = server_proof(me.secret, issued, a, out->flags);
    return 0;
}

ChallengeCookies::ChallengeCookies(std::chrono::milliseconds ttl, size_t max_used)
    : ttl_(std::max(ttl, std::chrono::milliseconds(1))), max_used_(max_used), start_(Clock::now()) {
    for (auto &k : keys_) random_fill(k.data(), k.size());
    random_fill(reinterpret_cast<uint8_t *>(&counter_), sizeof counter_);
}

// Moves to the epoch of now; each new epoch gets a fresh key and forgets the
// ids used two epochs ago.
void ChallengeCookies::advance() {
    const uint64_t now = static_cast<uint64_t>((Clock::now() - start_) / ttl_);
    for (uint64_t e = std::max(epoch_ + 1, now >= 1 ? now - 1 : 0); e <= now && now > epoch_; e++) {
        random_fill(keys_[e & 1].data(), keys_[e & 1].size());
        used_[e & 1].clear();
    }
    epoch_ = std::max(epoch_, now);
}

Challenge ChallengeCookies::make(uint32_t id) const {
    uint8_t msg[4 + 16] = {};
    put_le(msg, id, 4);
    memcpy(msg + 4, "kvxfer challenge", 16);
    uint8_t full[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    const auto &key = keys_[(id >> kEpochShift) & 1];
    if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg, sizeof msg, full, &len) ||
        len < kChallengeNonceLen)
        fail(KVX_EINTERNAL, "HMAC-SHA256 failed");
    Challenge c;
    c.challenge_id = id;
    memcpy(c.nonce.data(), full, kChallengeNonceLen);
    return c;
}

Challenge ChallengeCookies::issue() {
    advance();
    const uint32_t tag = static_cast<uint32_t>(epoch_ & 0xff);
    return make(tag << kEpochShift | (counter_++ & ((1u << kEpochShift) - 1)));
}

Challenge ChallengeCookies::issue_random() {
    Challenge c = issue();
    random_fill(c.nonce.data(), c.nonce.size());
    return c;
}

bool ChallengeCookies::find(uint32_t id, Challenge *out) {
    advance();
    const uint32_t tag = id >> kEpochShift;
    const bool live = tag == (epoch_ & 0xff) || (epoch_ > 0 && tag == ((epoch_ - 1) & 0xff));
    if (!live || used_[tag & 1].count(id)) return false;
    *out = make(id);
    return true;
}

bool ChallengeCookies::use(uint32_t id) {
    auto &used = used_[(id >> kEpochShift) & 1];
    if (used.size() >= max_used_) return false;
    return used.insert(id).second;
}

Auth answer(const Challenge &c, uint64_t instance_id, const wire::Secret &secret, const Fingerprint &ours,
            uint32_t flags) {
    Auth a;
    a.flags = flags;
    a.instance_id = instance_id;
    a.challenge_id = c.challenge_id;
    a.fingerprint = ours;
    random_fill(a.nonce.data(), a.nonce.size());
    a.proof = client_proof(secret, c, a);
    return a;
}

Message expect_answer(const void *p, size_t n, const DataPathOptions &opts, const char *where, const char *to) {
    Message m;
    try {
        m = decode(p, n);
    } catch (const Error &e) {
        fail(failure_code(e.code()), "%s: bad answer to %s: %s", where, to, e.what());
    }
    if (m.kind == Kind::refuse && m.refuse.status == KVX_ENOTSUP)
        fail(KVX_ENOTSUP, "%s refused the connection: it does not run the data path with %s", where,
             opts.describe(opts.flags).c_str());
    if (m.kind == Kind::refuse)
        fail(refusal_code(m.refuse), "%s refused the connection: %s", where, error_name(m.refuse.status));
    if (m.kind != Kind::challenge && m.kind != Kind::accept)
        fail(KVX_EAUTH, "%s answered %s with an unexpected message", where, to);
    return m;
}

void expect_accept(const Accept &acc, const Challenge &c, const Auth &a, const wire::Secret &secret,
                   const char *where) {
    // The proof first: it covers the flags, so flags changed on the way are
    // a failed proof (KVX_EAUTH), never taken for another version.
    if (CRYPTO_memcmp(server_proof(secret, c, a, acc.flags).data(), acc.proof.data(), kProofLen) != 0)
        fail(KVX_EAUTH, "%s could not prove it holds the metadata's secret", where);
    if (acc.flags != a.flags)
        fail(KVX_EVERSION, "%s accepted with flags 0x%x, we offered 0x%x", where, acc.flags, a.flags);
}

Keys derive_keys(const wire::Secret &secret, const Challenge &c, const Auth &a, const Accept &acc) {
    static const char kLabel[] = "kvxfer handshake v1 data keys";
    uint8_t salt[kChallengeNonceLen + 4];
    memcpy(salt, c.nonce.data(), kChallengeNonceLen);
    put_le(salt + kChallengeNonceLen, c.challenge_id, 4);
    uint8_t info[sizeof kLabel + kAuthLen + kAcceptLen];
    memcpy(info, kLabel, sizeof kLabel);
    encode(a, info + sizeof kLabel);
    encode(acc, info + sizeof kLabel + kAuthLen);
    uint8_t out[2 * kKeyLen];
    EVP_KDF *kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
    EVP_KDF_CTX *kctx = kdf ? EVP_KDF_CTX_new(kdf) : nullptr;
    EVP_KDF_free(kdf);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t *>(secret.data()), secret.size()),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt, sizeof salt),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, sizeof info),
        OSSL_PARAM_construct_end(),
    };
    int ok = kctx && EVP_KDF_derive(kctx, out, sizeof out, params) == 1;
    EVP_KDF_CTX_free(kctx);
    if (!ok) fail(KVX_EINTERNAL, "OpenSSL HKDF-SHA256 failed");
    Keys k;
    memcpy(k.to_target.data(), out, kKeyLen);
    memcpy(k.to_initiator.data(), out + kKeyLen, kKeyLen);
    OPENSSL_cleanse(out, sizeof out);
    return k;
}

}  // namespace kvx::handshake
