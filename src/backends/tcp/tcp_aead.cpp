#include "backends/tcp/tcp_aead.h"

#include <climits>

#include "util/bytes.h"
#include "util/error.h"

namespace kvx::tcp {

namespace {

constexpr int kIvLen = 12;

void check(int ok, const char *what) {
    if (ok != 1) fail(KVX_EINTERNAL, "OpenSSL AES-GCM: %s failed", what);
}

}  // namespace

Aead::Aead(const std::array<uint8_t, handshake::kKeyLen> &key, bool encrypt) : encrypt_(encrypt) {
    ctx_ = EVP_CIPHER_CTX_new();
    if (!ctx_) fail(KVX_EINTERNAL, "OpenSSL: EVP_CIPHER_CTX_new failed");
    check(EVP_CipherInit_ex(ctx_, EVP_aes_128_gcm(), nullptr, key.data(), nullptr, encrypt ? 1 : 0), "init");
}

Aead::~Aead() { EVP_CIPHER_CTX_free(ctx_); }

void Aead::begin(const uint8_t *aad, size_t aad_n) {
    if (seq_ >= kMaxRecords) fail(KVX_ECONNRESET, "tcp: connection used up its nonces; closing it");
    uint8_t iv[kIvLen] = {};
    put_le(iv + 4, seq_++, 8);
    check(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, iv, encrypt_ ? 1 : 0), "nonce");
    int outl = 0;
    check(EVP_CipherUpdate(ctx_, nullptr, &outl, aad, static_cast<int>(aad_n)), "additional data");
}

void Aead::update(const uint8_t *in, uint8_t *out, size_t n) {
    while (n > 0) {
        int step = n > (1u << 30) ? 1 << 30 : static_cast<int>(n);
        int outl = 0;
        check(EVP_CipherUpdate(ctx_, out, &outl, in, step), "update");
        in += step;
        out += step;
        n -= static_cast<size_t>(step);
    }
}

void Aead::finish_seal(uint8_t tag[kTagLen]) {
    int outl = 0;
    check(EVP_CipherFinal_ex(ctx_, nullptr, &outl), "final");
    check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagLen, tag), "tag");
}

bool Aead::finish_open(const uint8_t tag[kTagLen]) {
    check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kTagLen, const_cast<uint8_t *>(tag)), "tag");
    int outl = 0;
    return EVP_CipherFinal_ex(ctx_, nullptr, &outl) == 1;
}

void Aead::seal(const uint8_t *aad, size_t aad_n, const uint8_t *in, size_t n, uint8_t *out) {
    begin(aad, aad_n);
    update(in, out, n);
    finish_seal(out + n);
}

bool Aead::open(const uint8_t *aad, size_t aad_n, const uint8_t *in, size_t n, uint8_t *out) {
    begin(aad, aad_n);
    update(in, out, n);
    return finish_open(in + n);
}

}  // namespace kvx::tcp
