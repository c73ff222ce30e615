#include "backends/tcp/tcp_aead.h"

#include <openssl/crypto.h>

#include <climits>

#include "util/bytes.h"
#include "util/error.h"

#ifdef KVX_HAVE_IPSEC_MB
#include <cpuid.h>
#include <dlfcn.h>
#include <intel-ipsec-mb.h>

#include <string>
#endif

namespace kvx::tcp {

namespace {

constexpr int kIvLen = 12;

void check(int ok, const char *what) {
    if (ok != 1) fail(KVX_EINTERNAL, "OpenSSL AES-GCM: %s failed", what);
}

#ifdef KVX_HAVE_IPSEC_MB
// What the kernel saves of the vector registers (XCR0): 2 = AVX-512 state
// (opmask, ZMM), 1 = AVX state (YMM), 0 = neither. Code that uses them
// faults (SIGILL) without it, whatever CPUID says (a hypervisor or
// clearcpuid may hide it); ipsec-mb 1.3 looks at CPUID only, so this decides
// which of its code paths may be set up.
int os_vector_state() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xE6) == 0xE6 ? 2 : (lo & 0x6) == 0x6 ? 1 : 0;
}

bool has(uint64_t features, uint64_t flags) { return (features & flags) == flags; }

// libIPSec_MB, loaded on first use: libkvxfer does not need it to load, and
// a host without it keeps protected tcp on OpenSSL. These are the functions
// it exports that this file calls; its AES-GCM code is reached through the
// manager's function pointers (the IMB_AES128_GCM_* macros).
struct Imb {
    decltype(&alloc_mb_mgr) alloc = nullptr;
    decltype(&free_mb_mgr) free = nullptr;
    decltype(&init_mb_mgr_sse) init_sse = nullptr;
    decltype(&init_mb_mgr_avx2) init_avx2 = nullptr;
    decltype(&init_mb_mgr_avx512) init_avx512 = nullptr;
#if IMB_VERSION_NUM < IMB_VERSION(2, 0, 0)
    decltype(&init_mb_mgr_avx) init_avx = nullptr;
#endif
    decltype(&imb_get_errno) get_errno = nullptr;
    std::string error;  // why it is not loaded ("" when it is)
};

const Imb &imb() {
    static const Imb lib = [] {
        Imb l;
        void *h = ::dlopen(KVX_IPSEC_MB_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *e = ::dlerror();
            l.error = std::string("cannot load " KVX_IPSEC_MB_SONAME ": ") + (e ? e : "unknown error") +
                      " (install ipsec-mb, e.g. apt-get install libipsec-mb1)";
            return l;
        }
        auto sym = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
            if (!fn && l.error.empty()) l.error = std::string(KVX_IPSEC_MB_SONAME " has no ") + name;
        };
        sym(l.alloc, "alloc_mb_mgr");
        sym(l.free, "free_mb_mgr");
        sym(l.init_sse, "init_mb_mgr_sse");
        sym(l.init_avx2, "init_mb_mgr_avx2");
        sym(l.init_avx512, "init_mb_mgr_avx512");
#if IMB_VERSION_NUM < IMB_VERSION(2, 0, 0)
        sym(l.init_avx, "init_mb_mgr_avx");
#endif
        sym(l.get_errno, "imb_get_errno");
        return l;  // the handle stays open for the life of the process
    }();
    return lib;
}

// The ipsec-mb code this host may run, chosen once from the CPU's features
// as ipsec-mb detects them (alloc_mb_mgr runs none of its vector code) and
// the kernel's vector state, before any of its code (self-test included) runs.
IpsecMbCode host_code() {
    static const IpsecMbCode c = [] {
        if (!imb().error.empty()) return IpsecMbCode::none;
        IMB_MGR *g = imb().alloc(0);
        if (!g) return IpsecMbCode::none;
        const uint64_t features = g->features;
        imb().free(g);
        return choose_ipsec_mb_code(os_vector_state(), features);
    }();
    return c;
}

// The process's ipsec-mb manager, set up once, on first use, with the code
// choose_ipsec_mb_code() names (null: none, or its self-test failed). Its
// direct GCM calls keep no state in it, so every thread may use it.
IMB_MGR *mgr() {
    static IMB_MGR *const m = []() -> IMB_MGR * {
        const IpsecMbCode code = host_code();
        if (code == IpsecMbCode::none) return nullptr;
        IMB_MGR *g = imb().alloc(0);
        if (!g) return nullptr;
        switch (code) {
        case IpsecMbCode::avx512_vaes:
        case IpsecMbCode::avx512: imb().init_avx512(g); break;
        case IpsecMbCode::avx2: imb().init_avx2(g); break;
#if IMB_VERSION_NUM < IMB_VERSION(2, 0, 0)  // 2.0 dropped its AVX (not AVX2) code
        case IpsecMbCode::avx: imb().init_avx(g); break;
#endif
        default: imb().init_sse(g); break;
        }
        if (imb().get_errno(g) != 0) {
            imb().free(g);
            return nullptr;
        }
        return g;
    }();
    return m;
}
#endif

}  // namespace

#ifdef KVX_HAVE_IPSEC_MB
IpsecMbCode choose_ipsec_mb_code(int os, uint64_t features) {
    if (os == 2 && has(features, IMB_CPUFLAGS_AVX512_T2)) return IpsecMbCode::avx512_vaes;
    if (os == 2 && has(features, IMB_CPUFLAGS_AVX512)) return IpsecMbCode::avx512;
    if (os >= 1 && has(features, IMB_CPUFLAGS_AVX2)) return IpsecMbCode::avx2;
#if IMB_VERSION_NUM < IMB_VERSION(2, 0, 0)
    if (os >= 1 && has(features, IMB_CPUFLAGS_AVX)) return IpsecMbCode::avx;
#endif
    if (has(features, IMB_CPUFLAGS_SSE)) return IpsecMbCode::sse;
    return IpsecMbCode::none;
}
#endif

AeadImpl aead_impl(const Options &o) {
    const std::string want = o.str("tcp.aead_impl");
    if (want == "openssl") return AeadImpl::openssl;
#ifdef KVX_HAVE_IPSEC_MB
    // auto: only its VAES code, and ipsec-mb is set up (and self-tests) only then
    if (want == "auto") return host_code() == IpsecMbCode::avx512_vaes && mgr() ? AeadImpl::ipsec_mb : AeadImpl::openssl;
    if (mgr()) return AeadImpl::ipsec_mb;
    if (!imb().error.empty()) fail(KVX_ENOTSUP, "option tcp.aead_impl: ipsec-mb: %s", imb().error.c_str());
    fail(KVX_ENOTSUP, "option tcp.aead_impl: ipsec-mb cannot run on this CPU (it needs SSE4.2, AES-NI and PCLMULQDQ)");
#else
    if (want == "auto") return AeadImpl::openssl;
    fail(KVX_ENOTSUP, "option tcp.aead_impl: ipsec-mb: this libkvxfer was built without libIPSec_MB");
#endif
}

const char *aead_impl_name(AeadImpl impl) {
#ifdef KVX_HAVE_IPSEC_MB
    if (impl == AeadImpl::ipsec_mb) return host_code() == IpsecMbCode::avx512_vaes ? "ipsec-mb (VAES)" : "ipsec-mb";
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
    if (impl == AeadImpl::ipsec_mb) {
#ifdef KVX_HAVE_IPSEC_MB
        if (!mgr()) fail(KVX_EINTERNAL, "ipsec-mb AES-GCM asked for where it cannot run");
        fast_ = std::make_unique<Fast>();
        IMB_AES128_GCM_PRE(mgr(), key.data(), &fast_->key);
        return;
#else
        fail(KVX_EINTERNAL, "ipsec-mb AES-GCM asked for in a build without it");
#endif
    }
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
    record_bytes_ = 0;
    uint8_t iv[kIvLen] = {};
    put_le(iv + 4, seq_++, 8);
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        IMB_AES128_GCM_INIT(mgr(), &fast_->key, &fast_->ctx, iv, aad, aad_n);
        return;
    }
#endif
    check(EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, iv, encrypt_ ? 1 : 0), "nonce");
    int outl = 0;
    check(EVP_CipherUpdate(ctx_, nullptr, &outl, aad, static_cast<int>(aad_n)), "additional data");
}

void Aead::update(const uint8_t *in, uint8_t *out, size_t n) {
    // GCM's bound per message (SP 800-38D): past it the counter would wrap
    // and reuse keystream. OpenSSL refuses it; ipsec-mb does not count.
    if (n > kMaxRecordBytes - record_bytes_) fail(KVX_EINTERNAL, "AES-GCM: a record of more than 2^36 - 32 bytes");
    record_bytes_ += n;
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        if (encrypt_) IMB_AES128_GCM_ENC_UPDATE(mgr(), &fast_->key, &fast_->ctx, out, in, n);
        else IMB_AES128_GCM_DEC_UPDATE(mgr(), &fast_->key, &fast_->ctx, out, in, n);
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
    if (fast_) return IMB_AES128_GCM_ENC_FINALIZE(mgr(), &fast_->key, &fast_->ctx, tag, kTagLen);
#endif
    int outl = 0;
    check(EVP_CipherFinal_ex(ctx_, nullptr, &outl), "final");
    check(EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kTagLen, tag), "tag");
}

bool Aead::finish_open(const uint8_t tag[kTagLen]) {
#ifdef KVX_HAVE_IPSEC_MB
    if (fast_) {
        uint8_t want[kTagLen];
        IMB_AES128_GCM_DEC_FINALIZE(mgr(), &fast_->key, &fast_->ctx, want, kTagLen);
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
