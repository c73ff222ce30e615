// The two AES-GCM codes of protected tcp (tcp.aead_impl: OpenSSL, ipsec-mb)
// are one cipher: records sealed by either are byte-identical and open with
// either, in any split of a payload into pieces, in place or not; a changed
// bit of ciphertext, tag or additional data, or a record out of sequence,
// fails with both. Then two transports that chose different codes move
// blocks between them exactly. Without ipsec-mb in the build, asking for it
// is refused with KVX_ENOTSUP at create (with the default log level, and
// with backend=auto too).
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <random>
#include <vector>

#ifdef KVX_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

#include "backends/tcp/tcp_aead.h"
#include "core/options.h"
#include "util/error.h"

extern "C" {
#include "harness.h"
}

namespace {

using kvx::tcp::Aead;
using kvx::tcp::AeadImpl;

#ifdef KVX_HAVE_IPSEC_MB
const AeadImpl kImpls[] = {AeadImpl::openssl, AeadImpl::ipsec_mb};
#else
const AeadImpl kImpls[] = {AeadImpl::openssl};
#endif

const size_t kSizes[] = {0, 1, 15, 16, 17, 255, 4096, 65539, 1 << 20};

std::array<uint8_t, kvx::handshake::kKeyLen> test_key() {
    std::array<uint8_t, kvx::handshake::kKeyLen> k;
    for (size_t i = 0; i < k.size(); i++) k[i] = static_cast<uint8_t>(0x5a ^ (i * 29));
    return k;
}

// Seals n bytes as one record in random pieces: ciphertext then tag.
std::vector<uint8_t> seal_pieces(Aead &a, const std::vector<uint8_t> &plain, std::mt19937 &rng, bool in_place) {
    std::vector<uint8_t> out(plain.size() + kvx::tcp::kTagLen);
    if (in_place) std::copy(plain.begin(), plain.end(), out.begin());
    const uint8_t aad[1] = {kvx::tcp::kRecordPayload};
    a.begin(aad, sizeof aad);
    for (size_t at = 0; at < plain.size();) {
        const size_t take = std::min<size_t>(plain.size() - at, 1 + rng() % 70000);
        a.update(in_place ? out.data() + at : plain.data() + at, out.data() + at, take);
        at += take;
    }
    a.finish_seal(out.data() + plain.size());
    return out;
}

void test_codes_agree(void **) {
    std::mt19937 rng(7);
    for (AeadImpl si : kImpls)
        for (AeadImpl oi : kImpls) {
            Aead sealer(test_key(), true, si), opener(test_key(), false, oi), ref(test_key(), true, AeadImpl::openssl);
            for (size_t n : kSizes) {
                std::vector<uint8_t> plain(n);
                for (auto &b : plain) b = static_cast<uint8_t>(rng());
                const std::vector<uint8_t> rec = seal_pieces(sealer, plain, rng, n % 2 == 1);
                assert_true(rec == seal_pieces(ref, plain, rng, false));  // byte for byte
                std::vector<uint8_t> back(rec);
                const uint8_t aad[1] = {kvx::tcp::kRecordPayload};
                assert_true(opener.open(aad, sizeof aad, back.data(), n, back.data()));
                assert_memory_equal(back.data(), plain.data(), n);
            }
        }
}

// Each forgery against a fresh pair of the given codes: one record sealed,
// then opened after a change; the untouched record opens.
void test_forgeries_fail(void **) {
    const uint8_t aad[1] = {kvx::tcp::kRecordPayload}, other[1] = {kvx::tcp::kRecordAck};
    for (AeadImpl si : kImpls)
        for (AeadImpl oi : kImpls)
            for (int what = 0; what < 5; what++) {
                Aead s(test_key(), true, si), o(test_key(), false, oi);
                std::vector<uint8_t> plain(3000, 0x42), rec(3000 + kvx::tcp::kTagLen);
                if (what == 4) s.seal(aad, sizeof aad, plain.data(), plain.size(), rec.data());  // record 0 dropped
                s.seal(aad, sizeof aad, plain.data(), plain.size(), rec.data());
                const uint8_t *a = aad;
                if (what == 0) rec[1234] ^= 0x01;                 // ciphertext
                if (what == 1) rec[3000 + 5] ^= 0x80;             // tag
                if (what == 2) a = other;                         // additional data
                if (what == 3) rec.resize(0), rec.resize(3000 + kvx::tcp::kTagLen);  // a tag of zeros
                const bool ok = o.open(a, 1, rec.data(), plain.size(), rec.data());
                if (ok) fail_msg("forgery %d opened (sealer %d, opener %d)", what, (int)si, (int)oi);
            }
}

// What auto must pick, found apart from the library (and from ipsec-mb):
// its VAES code needs every feature of IMB_CPUFLAGS_AVX512_T2, read here
// bit by bit from CPUID (the Intel SDM's leaves 1 and 7), and the kernel
// must save the AVX-512 registers (XCR0 bits 1, 2, 5, 6, 7).
bool vaes_host() {
#if defined(KVX_HAVE_IPSEC_MB) && defined(__x86_64__)
    unsigned a, b, c, d, b7, c7;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool leaf1 = (c >> 1 & 1) && (c >> 20 & 1) && (c >> 25 & 1) && (c >> 27 & 1) && (c >> 28 & 1);  // pclmul sse4.2 aes osxsave avx
    if (!leaf1 || !__get_cpuid_count(7, 0, &a, &b7, &c7, &d)) return false;
    for (int bit : {5, 8, 16, 17, 21, 28, 29, 30, 31})  // avx2 bmi2 avx512f/dq/ifma/cd sha avx512bw/vl
        if (!(b7 >> bit & 1)) return false;
    for (int bit : {8, 9, 10})  // gfni vaes vpclmulqdq
        if (!(c7 >> bit & 1)) return false;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xE6) == 0xE6;
#else
    return false;
#endif
}

void test_choice(void **) {
    kvx::OptionBag bag;
    for (const char *v : {"auto", "openssl", "ipsec-mb"}) {
        bag.kv.insert_or_assign("tcp.aead_impl", std::string(v));
        kvx::Options o(&bag, kvx::all_option_tables());
        try {
            AeadImpl i = kvx::tcp::aead_impl(o);
            if (v[0] == 'a') assert_int_equal((int)i, (int)(vaes_host() ? AeadImpl::ipsec_mb : AeadImpl::openssl));
            if (v[0] == 'o') assert_int_equal((int)i, (int)AeadImpl::openssl);
            if (v[0] == 'i') assert_int_equal((int)i, (int)AeadImpl::ipsec_mb);
            print_message("tcp.aead_impl=%s: %s\n", v, kvx::tcp::aead_impl_name(i));
        } catch (const kvx::Error &e) {
#ifdef KVX_HAVE_IPSEC_MB
            fail_msg("tcp.aead_impl=%s refused: %s", v, e.what());
#else
            assert_string_equal(v, "ipsec-mb");
            assert_int_equal(e.code(), KVX_ENOTSUP);
#endif
        }
    }
}

// Which ipsec-mb code may run, by the kernel's vector state and the CPU's
// features: never one whose registers the kernel does not save, never one
// whose instructions the CPU lacks, auto's VAES code only with all it needs.
void test_code_choice(void **) {
#ifdef KVX_HAVE_IPSEC_MB
    using kvx::tcp::IpsecMbCode;
    using kvx::tcp::choose_ipsec_mb_code;
    const uint64_t t2 = IMB_CPUFLAGS_AVX512_T2, skx = IMB_CPUFLAGS_AVX512, avx2 = IMB_CPUFLAGS_AVX2;
#if IMB_VERSION_NUM < IMB_VERSION(2, 0, 0)
    const IpsecMbCode avx = IpsecMbCode::avx;
#else
    const IpsecMbCode avx = IpsecMbCode::sse;
#endif
    const struct {
        int os;
        uint64_t features;
        IpsecMbCode want;
    } cases[] = {
        {2, t2, IpsecMbCode::avx512_vaes},
        {2, t2 & ~uint64_t{IMB_FEATURE_GFNI}, IpsecMbCode::avx512},     // one T2 feature short
        {2, t2 & ~uint64_t{IMB_FEATURE_AVX512_IFMA}, IpsecMbCode::avx512},
        {2, skx, IpsecMbCode::avx512},
        {1, t2, IpsecMbCode::avx2},                                     // the kernel saves no AVX-512 state
        {0, t2, IpsecMbCode::sse},                                      // nor AVX state
        {2, avx2, IpsecMbCode::avx2},
        {1, avx2 & ~uint64_t{IMB_FEATURE_BMI2}, avx},
        {2, IMB_CPUFLAGS_SSE, IpsecMbCode::sse},
        {2, IMB_CPUFLAGS_SSE & ~uint64_t{IMB_FEATURE_AESNI}, IpsecMbCode::none},
        {0, 0, IpsecMbCode::none},
    };
    for (const auto &c : cases)
        if (choose_ipsec_mb_code(c.os, c.features) != c.want)
            fail_msg("os %d features %llx: code %d, want %d", c.os, (unsigned long long)c.features,
                     (int)choose_ipsec_mb_code(c.os, c.features), (int)c.want);
#endif
}

// GCM's bound per record (2^36 - 32 bytes) holds with each code: one byte
// more is refused before any memory is touched. A region whose blocks are
// larger (each is one record) is refused at create with aead, not with none.
void test_record_bound(void **) {
    const uint8_t aad[1] = {kvx::tcp::kRecordPayload};
    for (AeadImpl i : kImpls) {
        Aead a(test_key(), true, i);
        a.begin(aad, sizeof aad);
        try {
            a.update(nullptr, nullptr, kvx::tcp::kMaxRecordBytes + 1);
            fail_msg("a record past GCM's bound was sealed (code %d)", (int)i);
        } catch (const kvx::Error &e) {
            assert_int_equal(e.code(), KVX_EINTERNAL);
        }
    }
    const uint64_t bl = uint64_t{1} << 36;  // one 64 GiB block: address space only
    void *p = mmap(nullptr, bl, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        print_message("no 64 GiB of address space: the create half is skipped\n");
        return;
    }
    for (const char *prot : {"tcp.protection=aead", "tcp.protection=none"}) {
        kvx_transport *t = NULL;
        kvx_options *o = test_options("backend=tcp", prot, NULL);
        const int rc = kvx_transport_create(&t, p, 1, bl, NULL, o);
        kvx_options_destroy(o);
        if (prot[15] == 'a') {
            assert_int_equal(rc, KVX_EINVAL);
            assert_null(t);
        } else {
            assert_int_equal(rc, KVX_OK);
            kvx_transport_destroy(t);
        }
    }
    munmap(p, bl);
}

// A target with one code, an initiator with the other: 64 blocks of 64 KiB
// land exactly, the rest of the target's region keeps its bytes.
void test_mixed_transports(void **) {
    constexpr uint64_t nb = 128, bl = 64 * 1024;
    const char *impls[] = {"openssl", "ipsec-mb"};
#ifndef KVX_HAVE_IPSEC_MB
    region r = region_new(nb, bl, 1);
    for (const char *backend : {"backend=tcp", "backend=auto"}) {
        kvx_transport *t = NULL;
        kvx_options *o = test_options(backend, "tcp.aead_impl=ipsec-mb", NULL);
        assert_int_equal(kvx_transport_create(&t, r.base, nb, bl, NULL, o), KVX_ENOTSUP);
        assert_null(t);
        kvx_options_destroy(o);
    }
    region_free(&r);
    (void)impls;
    return;
#else
    for (int dir = 0; dir < 2; dir++) {
        region tr = region_new(nb, bl, 0x22), ir = region_new(nb, bl, 0x11);
        for (uint64_t i = 0; i < nb; i++) fill_block(ir.base + i * bl, bl, i, 9);
        char tk[64], ik[64];
        snprintf(tk, sizeof tk, "tcp.aead_impl=%s", impls[dir]);
        snprintf(ik, sizeof ik, "tcp.aead_impl=%s", impls[1 - dir]);
        kvx_transport *target = transport_new(&tr, NULL, test_options("backend=tcp", tk, NULL));
        kvx_transport *init = transport_new(&ir, NULL, test_options("backend=tcp", ik, NULL));
        metablob mb;
        get_meta(target, &mb);
        add_peer(init, "t", &mb);
        std::vector<uint64_t> local(64), remote(64), ids;
        for (uint64_t i = 0; i < 64; i++) local[i] = i, remote[i] = 2 * i;
        for (uint64_t i = 0; i < 64; i += 16) {
            uint64_t id = 0;
            assert_int_equal(kvx_write_blocks(&id, init, "t", &local[i], &remote[i], 16), KVX_OK);
            ids.push_back(id);
        }
        size_t failed = 0;
        assert_int_equal(wait_ids(init, "t", ids.data(), ids.size(), 20000, &failed, NULL), ids.size());
        assert_int_equal(failed, 0);
        for (uint64_t i = 0; i < nb; i++) {
            if (i % 2 == 0 && i < 128) assert_true(block_matches(tr.base + i * bl, bl, i / 2, 9));
            else assert_true(block_is(tr.base + i * bl, bl, 0x22));
        }
        kvx_transport_destroy(init);
        kvx_transport_destroy(target);
        region_free(&tr);
        region_free(&ir);
    }
#endif
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_agree),
        cmocka_unit_test(test_forgeries_fail),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_code_choice),
        cmocka_unit_test(test_record_bound),
        cmocka_unit_test(test_mixed_transports),
    };
    return cmocka_run_group_tests_name("tcp_aead", tests, nullptr, nullptr);
}
