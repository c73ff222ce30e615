#include "backends/tcp/tcp_aead.h"

#include <openssl/crypto.h>

#include <climits>

#include "util/bytes.h"
#include "util/error.h"

#ifdef KVX_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

namespace kvx::tcp {

namespace {

constexpr int kIvLen = 12;

void check(int ok, const char *what) {
    if (ok != 1) fail(KVX_EINTERNAL, "OpenSSL AES-GCM: %s failed", what);
}

#ifdef KVX_HAVE_IPSEC_MB
// The process's ipsec-mb manager, set up once for the best code path of
// this CPU (null when it cannot be allocated). Its direct GCM calls keep no
// state in it, so every thread may use it.
struct Mgr {
    IMB_MGR *mgr = nullptr;
    bool vaes = false;  // the VAES + VPCLMULQDQ AVX-512 path
};

const Mgr &mgr() {
    static const Mgr m = [] {
        Mgr r;
        r.mgr = alloc_mb_mgr(0);
        if (!r.mgr) return r;
        IMB_ARCH arch = IMB_ARCH_NONE;
        init_mb_mgr_auto(r.mgr, &arch);
        if (imb_get_errno(r.mgr) != 0) {
            free_mb_mgr(r.mgr);
            r.mgr = nullptr;
            return r;
        }
        const uint64_t need = IMB_FEATURE_VAES | IMB_FEATURE_VPCLMULQDQ;
        r.vaes = arch == IMB_ARCH_AVX512 && (r.mgr->features & need) == need;
        return r;
    }();
    return m;
}
#endif

}  // namespace

AeadImpl aead_impl(const Options &o) {
    const std::string want = o.str("tcp.aead_impl");
    if (want == "openssl") return AeadImpl::openssl;
#ifdef KVX_HAVE_IPSEC_MB
    if (want == "auto") return mgr().mgr && mgr().vaes ? AeadImpl::ipsec_mb : AeadImpl::openssl;
    if (mgr().mgr) return AeadImpl::ipsec_mb;
    fail(KVX_ENOTSUP, "option tcp.aead_impl: ipsec-mb cannot run on this CPU (its manager failed to set up)");
#else
    if (want == "auto") return AeadImpl::openssl;
    fail(KVX_ENOTSUP, "option tcp.aead_impl: ipsec-mb: this libkvxfer was built without libIPSec_MB");
#endif
}

const char *aead_impl_name(AeadImpl impl) {
#ifdef KVX_HAVE_IPSEC_MB
    if (impl == AeadImpl::ipsec_mb) return mgr().vaes ? "ipsec-mb (VAES)" : "ipsec-mb";
#endif
    return impl == AeadImpl::ipsec_mb ? "ipsec-mb" : "OpenSSL";
}

#ifdef KVX_HAVE_IPSEC_MB
struct Aead::Fast {
    alignas(64) gcm_key_data key;
    alignas(64) gcm_context_data ctx;
};
#else
struct Aead::Fast {};
#endif

Aead::Aead(const std::array<uint8_t, handshake::kKeyLen> &key, bool encrypt, AeadImpl impl) : encrypt_(encrypt) {
    static_assert(handshake::kKeyLen == 16, "AES-128");
#ifdef KVX_HAVE_IPSEC_MB
    if (impl == AeadImpl::ipsec_mb && mgr().mgr) {
        fast_ = std::make_unique<Fast>();
        IMB_AES128_GCM_PRE(mgr().mgr, key.data(), &fast_->key);
        return;
    }
#endif
    (void)impl;
    ctx_ = EVP_CIPHER_CTX_new();
    if (!ctx_) fail(KVX_EINTERNAL, "OpenSSL: EVP_CIPHER_CTX_new failed");
    check(EVP_CipherInit_ex(ctx_, EVP_aes_128_gcm(), nullptr, key.data(), nullptr, encrypt ? 1 : 0), "init");
}

Aead::~Aead() {
    if (fast_) OPENSSL_cleanse(fast_.get(), sizeof *fast_);
    EVP_CIPHER_CTX_free(ctx_);
}

void Aead::begin(const uint8_t *aad, size_t aad_n) {
    if (seq_ >= kMaxRecords) fail(KVX_ECONNRESET, "tcp: connection used up its nonces; closing it");
    uint8_t iv[kIvLen] = {};
    put_le(iv + 4, seq_++, 8);
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        IMB_AES128_GCM_INIT(mgr().mgr, &fast_->key, &fast_->ctx, iv, aad, aad_n);
        return;
    }
#endif
    check(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, iv, encrypt_ ? 1 : 0), "nonce");
    int outl = 0;
    check(EVP_CipherUpdate(ctx_, nullptr, &outl, aad, static_cast<int>(aad_n)), "additional data");
}

void Aead::update(const uint8_t *in, uint8_t *out, size_t n) {
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        if (encrypt_) IMB_AES128_GCM_ENC_UPDATE(mgr().mgr, &fast_->key, &fast_->ctx, out, in, n);
        else IMB_AES128_GCM_DEC_UPDATE(mgr().mgr, &fast_->key, &fast_->ctx, out, in, n);
        return;
    }
#endif
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
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) return IMB_AES128_GCM_ENC_FINALIZE(mgr().mgr, &fast_->key, &fast_->ctx, tag, kTagLen);
#endif
    int outl = 0;
    check(EVP_CipherFinal_ex(ctx_, nullptr, &outl), "final");
    check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagLen, tag), "tag");
}

bool Aead::finish_open(const uint8_t tag[kTagLen]) {
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        uint8_t want[kTagLen];
        IMB_AES128_GCM_DEC_FINALIZE(mgr().mgr, &fast_->key, &fast_->ctx, want, kTagLen);
        return CRYPTO_memcmp(want, tag, kTagLen) == 0;
    }
#endif
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
