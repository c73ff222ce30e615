// Unit tests of the wire codecs (src/wire) and option parsing (src/core/options):
// agent metadata round trip and rejection of every malformed blob we can
// think of, the tcp handshake/frame parsers, and option value validation.
//
// Metadata blobs with invalid values are written byte by byte here (MetaBlob),
// independently of encode_metadata(), with the checksum recomputed (first 8
// bytes of SHA-256 over everything before it), so each case reaches the value
// check it means to exercise instead of failing at the checksum.
// Project headers first: cmocka.h defines a fail() macro that would clash
// with kvx::fail() in util/error.h.
#include "core/options.h"
#include "kvxfer.h"
#include "util/error.h"
#include "wire/frame.h"
#include "wire/metadata.h"

#include <openssl/sha.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

using namespace kvx;
using namespace kvx::wire;

namespace {

// ------------------------------------------------------------------ helpers

constexpr int kNoError = 0;
constexpr int kForeignException = 1;  // something other than kvx::Error escaped

// Runs f; returns 0 if it returned, the kvx::Error code if it threw one.
int code_of(const std::function<void()> &f, std::string *msg = nullptr) {
    try {
        f();
        return kNoError;
    } catch (const Error &e) {
        if (msg) *msg = e.what();
        return e.code();
    } catch (const std::exception &e) {
        if (msg) *msg = std::string("foreign exception: ") + e.what();
        return kForeignException;
    }
}

bool contains(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

#define assert_contains(s, needle)                                                                   \
    do {                                                                                             \
        if (!contains((s), (needle)))                                                                \
            fail_msg("message \"%s\" does not mention \"%s\"", std::string(s).c_str(), (needle));    \
    } while (0)

// Decodes from an exact-size heap copy so that an overread is caught by ASan.
int decode_code(const std::vector<uint8_t> &b, std::string *msg = nullptr, AgentMetadata *out = nullptr) {
    std::unique_ptr<uint8_t[]> copy(b.empty() ? nullptr : new uint8_t[b.size()]);
    if (!b.empty()) memcpy(copy.get(), b.data(), b.size());
    return code_of(
        [&] {
            AgentMetadata m = decode_metadata(copy.get(), b.size());
            if (out) *out = m;
        },
        msg);
}

Endpoint ep4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port) {
    Endpoint e;
    e.family = 4;
    e.addr = {a, b, c, d};
    e.port = port;
    return e;
}

Endpoint ep6_loopback(uint16_t port) {
    Endpoint e;
    e.family = 6;
    e.addr[15] = 1;
    e.port = port;
    return e;
}

Endpoint ep6_sample(uint16_t port) {  // fd00:1:2::a:b
    Endpoint e;
    e.family = 6;
    e.addr = {0xfd, 0x00, 0x00, 0x01, 0x00, 0x02, 0, 0, 0, 0, 0, 0, 0x00, 0x0a, 0x00, 0x0b};
    e.port = port;
    return e;
}

AgentMetadata sample_tcp(const char *fp) {
    AgentMetadata m;
    m.base_addr = 0x7f0000001000ull;
    m.num_blocks = 1024;
    m.block_len = 4096;
    m.instance_id = 0x0123456789abcdefull;
    for (size_t i = 0; i < kSecretLen; i++) m.secret[i] = static_cast<uint8_t>(0xa0 + i);
    m.fingerprint = fp;
    m.backend = BackendKind::tcp;
    m.tcp = {ep4(10, 0, 0, 1, 5000), ep6_loopback(6000), ep6_sample(65535), ep4(127, 0, 0, 1, 1)};
    return m;
}

AgentMetadata sample_verbs(const char *fp) {
    AgentMetadata m = sample_tcp(fp);
    m.backend = BackendKind::verbs;
    VerbsInfo v;
    v.cm = ep6_sample(4791);
    v.mr_addr = m.base_addr;
    v.mr_len = m.num_blocks * m.block_len;
    v.rkey = 0xdeadbeef;
    m.verbs = v;
    return m;
}

// ---- independent metadata writer (docs/wire-format.md layout)

void le(std::vector<uint8_t> &b, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

struct Sec {
    uint16_t type;
    uint16_t flags;
    std::vector<uint8_t> body;
};

struct CoreFields {
    uint64_t base_addr = 0x10000;
    uint64_t num_blocks = 16;
    uint64_t block_len = 256;
    uint64_t instance_id = 42;
    uint8_t secret_byte = 0x5a;
    uint8_t fplen = 0;
    std::array<uint8_t, 16> fp{};
    uint8_t backend = 1;
    std::array<uint8_t, 6> reserved{};
};

Sec core_sec(const CoreFields &c, size_t extra = 0) {
    Sec s{1, 1, {}};
    le(s.body, c.base_addr, 8);
    le(s.body, c.num_blocks, 8);
    le(s.body, c.block_len, 8);
    le(s.body, c.instance_id, 8);
    for (size_t i = 0; i < kSecretLen; i++) s.body.push_back(c.secret_byte);
    s.body.push_back(c.fplen);
    s.body.insert(s.body.end(), c.fp.begin(), c.fp.end());
    s.body.push_back(c.backend);
    s.body.insert(s.body.end(), c.reserved.begin(), c.reserved.end());
    s.body.resize(s.body.size() + extra, 0xee);
    return s;
}

struct RawEp {
    uint8_t family = 4;
    uint8_t pad = 0;
    uint16_t port = 7000;
    std::array<uint8_t, 16> addr{127, 0, 0, 1};
};

void put_ep(std::vector<uint8_t> &b, const RawEp &e) {
    b.push_back(e.family);
    b.push_back(e.pad);
    le(b, e.port, 2);
    b.insert(b.end(), e.addr.begin(), e.addr.end());
}

Sec tcp_sec(const std::vector<RawEp> &eps, int count_override = -1, size_t extra = 0) {
    Sec s{2, 0, {}};
    le(s.body, count_override >= 0 ? static_cast<uint64_t>(count_override) : eps.size(), 2);
    le(s.body, 0, 2);
    for (const auto &e : eps) put_ep(s.body, e);
    s.body.resize(s.body.size() + extra, 0xee);
    return s;
}

Sec verbs_sec(const RawEp &cm, uint64_t mr_addr, uint64_t mr_len, uint32_t rkey) {
    Sec s{3, 0, {}};
    put_ep(s.body, cm);
    le(s.body, mr_addr, 8);
    le(s.body, mr_len, 8);
    le(s.body, rkey, 4);
    le(s.body, 0, 4);
    return s;
}

constexpr int kAuto = -1;

// Header, sections, then total_len and checksum fixed up (unless told otherwise).
std::vector<uint8_t> build(const std::vector<Sec> &secs, uint16_t major = 1, uint16_t minor = 0,
                           int64_t nsec = kAuto, uint32_t magic = kMetaMagic) {
    std::vector<uint8_t> b;
    le(b, magic, 4);
    le(b, major, 2);
    le(b, minor, 2);
    le(b, 0, 4);
    le(b, nsec == kAuto ? secs.size() : static_cast<uint64_t>(nsec), 4);
    for (const auto &s : secs) {
        le(b, s.type, 2);
        le(b, s.flags, 2);
        le(b, s.body.size(), 4);
        b.insert(b.end(), s.body.begin(), s.body.end());
    }
    uint32_t total = static_cast<uint32_t>(b.size() + 8);
    for (size_t i = 0; i < 4; i++) b[8 + i] = static_cast<uint8_t>(total >> (8 * i));
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(b.data(), b.size(), d);
    b.insert(b.end(), d, d + 8);
    return b;
}

// Recomputes the checksum of an edited blob (total_len kept as is).
void reseal(std::vector<uint8_t> &b) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(b.data(), b.size() - 8, d);
    memcpy(b.data() + b.size() - 8, d, 8);
}

std::vector<Sec> good_secs() { return {core_sec(CoreFields{}), tcp_sec({RawEp{}})}; }

void expect_badmeta(const std::vector<uint8_t> &b, const char *mention = nullptr) {
    std::string msg;
    int rc = decode_code(b, &msg);
    if (rc != KVX_EBADMETA) fail_msg("expected KVX_EBADMETA, got %d (%s)", rc, msg.c_str());
    if (mention) assert_contains(msg, mention);
}

// ------------------------------------------------------------------ metadata

void test_meta_roundtrip(void **) {
    for (const char *fp : {"", "0123456789abcdef"}) {
        for (const AgentMetadata &m : {sample_tcp(fp), sample_verbs(fp)}) {
            std::vector<uint8_t> b = encode_metadata(m);
            AgentMetadata d;
            std::string msg;
            assert_int_equal(decode_code(b, &msg, &d), kNoError);
            assert_true(d == m);
            assert_string_equal(d.fingerprint.c_str(), fp);
            assert_int_equal(d.tcp.size(), 4);
            assert_int_equal(d.tcp[1].family, 6);
            assert_int_equal(d.tcp[2].port, 65535);
            assert_true(encode_metadata(d) == b);  // encoding is canonical
        }
    }
    // shm backend: no transport sections at all
    AgentMetadata m = sample_tcp("fedcba9876543210");
    m.backend = BackendKind::shm;
    m.tcp.clear();
    AgentMetadata d;
    assert_int_equal(decode_code(encode_metadata(m), nullptr, &d), kNoError);
    assert_true(d == m);
}

// The independent writer and encode_metadata() agree byte for byte: the
// layout the other tests assume is the real one.
void test_meta_layout_matches_encoder(void **) {
    AgentMetadata m;
    m.base_addr = 0x10000;
    m.num_blocks = 16;
    m.block_len = 256;
    m.instance_id = 42;
    m.secret.fill(0x5a);
    m.backend = BackendKind::verbs;
    m.tcp = {ep4(127, 0, 0, 1, 7000)};
    m.verbs = VerbsInfo{ep4(127, 0, 0, 1, 7000), 0x10000, 16 * 256, 77};
    CoreFields c;
    c.backend = 2;
    std::vector<uint8_t> mine = build({core_sec(c), tcp_sec({RawEp{}}), verbs_sec(RawEp{}, 0x10000, 16 * 256, 77)});
    assert_true(mine == encode_metadata(m));
    assert_int_equal(decode_code(build(good_secs())), kNoError);
}

void test_meta_endpoint_str(void **) {
    assert_string_equal(ep4(10, 0, 0, 1, 5000).str().c_str(), "10.0.0.1:5000");
    assert_string_equal(ep6_loopback(6000).str().c_str(), "[::1]:6000");
    assert_string_equal(backend_kind_name(BackendKind::verbs), "verbs");
}

void test_meta_truncated(void **) {
    for (const AgentMetadata &m : {sample_tcp(""), sample_verbs("0123456789abcdef")}) {
        std::vector<uint8_t> b = encode_metadata(m);
        for (size_t len = 0; len < b.size(); len++) {
            std::vector<uint8_t> prefix(b.begin(), b.begin() + static_cast<long>(len));
            std::string msg;
            int rc = decode_code(prefix, &msg);
            if (rc != KVX_EBADMETA) fail_msg("prefix of %zu/%zu bytes: got %d (%s)", len, b.size(), rc, msg.c_str());
        }
    }
    assert_int_equal(code_of([] { decode_metadata(nullptr, 0); }), KVX_EBADMETA);
    assert_int_equal(code_of([] { decode_metadata(nullptr, 100); }), KVX_EBADMETA);
}

void test_meta_byte_flips(void **) {
    std::vector<uint8_t> b = encode_metadata(sample_verbs("0123456789abcdef"));
    size_t flips = 0;
    for (size_t i = 0; i < b.size(); i++) {
        for (uint8_t mask : {0x01, 0x02, 0x10, 0x80, 0xff}) {
            std::vector<uint8_t> f = b;
            f[i] ^= mask;
            std::string msg;
            int rc = decode_code(f, &msg);
            flips++;
            if (i >= 4 && i < 6) {  // major: refused as a version, before the checksum
                if (rc != KVX_EVERSION) fail_msg("flip 0x%02x at %zu: got %d (%s)", mask, i, rc, msg.c_str());
                continue;
            }
            if (rc != KVX_EBADMETA) fail_msg("flip 0x%02x at %zu: got %d (%s)", mask, i, rc, msg.c_str());
            if (i >= 16 || (i >= 6 && i < 8) || (i >= 12 && i < 16))  // body, minor, section count, checksum
                if (!contains(msg, "checksum")) fail_msg("flip at %zu: \"%s\" is not about the checksum", i, msg.c_str());
        }
    }
    assert_true(flips == b.size() * 5);
}

void test_meta_trailing(void **) {
    std::vector<uint8_t> b = encode_metadata(sample_tcp(""));
    for (size_t extra : {1, 7, 8, 100}) {
        std::vector<uint8_t> t = b;
        t.resize(b.size() + extra, 0);
        expect_badmeta(t, "trailing");
    }
    std::vector<uint8_t> twice = b;
    twice.insert(twice.end(), b.begin(), b.end());
    expect_badmeta(twice, "trailing");
}

void test_meta_major_version(void **) {
    for (uint16_t major : {0, 2, 0xffff}) {
        std::string msg;
        assert_int_equal(decode_code(build(good_secs(), major, 0), &msg), KVX_EVERSION);
        assert_contains(msg, "version");
        assert_int_equal(decode_code(build(good_secs(), major, 7)), KVX_EVERSION);
    }
}

void test_meta_newer_minor(void **) {
    // Version 1.3: longer core and tcp sections, unknown optional sections
    // (before, between and after the known ones), a non-critical flag bit.
    CoreFields c;
    c.fplen = 16;
    memcpy(c.fp.data(), "00aa11bb22cc33dd", 16);
    std::vector<Sec> secs = {
        Sec{0x77, 0, {1, 2, 3}},
        core_sec(c, 24),
        Sec{0x78, 0x8002, {}},
        tcp_sec({RawEp{}, RawEp{6, 0, 9, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}}}, -1, 12),
        Sec{0xffff, 0xfffe, std::vector<uint8_t>(300, 0xab)},
    };
    AgentMetadata d;
    std::string msg;
    int rc = decode_code(build(secs, 1, 3), &msg, &d);
    if (rc != kNoError) fail_msg("newer minor refused: %d (%s)", rc, msg.c_str());
    assert_int_equal(d.num_blocks, 16);
    assert_int_equal(d.block_len, 256);
    assert_string_equal(d.fingerprint.c_str(), "00aa11bb22cc33dd");
    assert_int_equal(d.tcp.size(), 2);
    assert_int_equal(d.tcp[1].family, 6);
    assert_int_equal(d.tcp[1].port, 9);

    // the same longer sections from a 1.0 writer are corrupt
    expect_badmeta(build({core_sec(c, 24), tcp_sec({RawEp{}})}, 1, 0));
    expect_badmeta(build({core_sec(c), tcp_sec({RawEp{}}, -1, 12)}, 1, 0));
    // shorter sections are corrupt in any version
    Sec shortcore = core_sec(c);
    shortcore.body.resize(shortcore.body.size() - 1);
    expect_badmeta(build({shortcore, tcp_sec({RawEp{}})}, 1, 3));
    expect_badmeta(build({core_sec(c), tcp_sec({RawEp{}, RawEp{}}, 3)}, 1, 3));
}

void test_meta_unknown_critical(void **) {
    for (uint16_t flags : {1, 3, 0xffff}) {
        std::vector<Sec> secs = good_secs();
        secs.push_back(Sec{9, flags, {0, 0, 0, 0}});
        std::string msg;
        assert_int_equal(decode_code(build(secs, 1, 1), &msg), KVX_EVERSION);
        assert_contains(msg, "critical");
        assert_int_equal(decode_code(build(secs, 1, 0)), KVX_EVERSION);
    }
}

void test_meta_invalid_core(void **) {
    auto with = [](const std::function<void(CoreFields &)> &edit) {
        CoreFields c;
        edit(c);
        return build({core_sec(c), tcp_sec({RawEp{}})});
    };
    expect_badmeta(with([](CoreFields &c) { c.num_blocks = 0; }), "num_blocks");
    expect_badmeta(with([](CoreFields &c) { c.block_len = 0; }), "block_len");
    expect_badmeta(with([](CoreFields &c) { c.num_blocks = 1ull << 33; c.block_len = 1ull << 31; }), "overflow");
    expect_badmeta(with([](CoreFields &c) { c.num_blocks = UINT64_MAX; c.block_len = 2; }), "overflow");
    // the largest product that fits is fine
    assert_int_equal(decode_code(with([](CoreFields &c) { c.num_blocks = UINT64_MAX; c.block_len = 1; })), kNoError);
    assert_int_equal(decode_code(with([](CoreFields &c) { c.num_blocks = 1ull << 32; c.block_len = (1ull << 32) - 1; })),
                     kNoError);
    // fingerprints
    auto fp = [&](uint8_t len, const char *chars) {
        return with([&](CoreFields &c) {
            c.fplen = len;
            memcpy(c.fp.data(), chars, strlen(chars));
        });
    };
    assert_int_equal(decode_code(fp(16, "0123456789abcdef")), kNoError);
    expect_badmeta(fp(16, "0123456789ABCDEF"), "fingerprint");
    expect_badmeta(fp(16, "0123456789abcdeg"), "fingerprint");
    expect_badmeta(fp(16, "0123456789abcde "), "fingerprint");
    expect_badmeta(fp(16, "012345678\xff" "abcdef"), "fingerprint");
    expect_badmeta(fp(8, "01234567"), "fingerprint");
    expect_badmeta(fp(17, "0123456789abcdef"), "fingerprint");
    expect_badmeta(fp(255, "0123456789abcdef"), "fingerprint");
    expect_badmeta(fp(0, "a"), "fingerprint");                 // bytes after the length must be 0
    {
        std::vector<uint8_t> b = fp(0, "");
        b[16 + 8 + 8 * 4 + kSecretLen + 1 + 15] = 1;  // last fingerprint byte
        reseal(b);
        expect_badmeta(b, "fingerprint");
    }
    // backend kind
    expect_badmeta(with([](CoreFields &c) { c.backend = 0; }), "backend");
    expect_badmeta(with([](CoreFields &c) { c.backend = 4; }), "backend");
    expect_badmeta(with([](CoreFields &c) { c.backend = 2; }), "verbs");  // verbs without a verbs section
}

void test_meta_invalid_endpoints(void **) {
    auto one = [](const std::function<void(RawEp &)> &edit) {
        RawEp e;
        edit(e);
        return build({core_sec(CoreFields{}), tcp_sec({RawEp{}, e})});
    };
    expect_badmeta(one([](RawEp &e) { e.port = 0; }), "port 0");
    expect_badmeta(one([](RawEp &e) { e.family = 5; }), "family");
    expect_badmeta(one([](RawEp &e) { e.family = 0; }), "family");
    expect_badmeta(one([](RawEp &e) { e.family = 0xff; }), "family");
    expect_badmeta(one([](RawEp &e) { e.pad = 1; }), "padding");
    expect_badmeta(one([](RawEp &e) { e.addr[4] = 1; }), "IPv4");
    expect_badmeta(one([](RawEp &e) { e.addr[15] = 1; }), "IPv4");
    assert_int_equal(decode_code(one([](RawEp &e) { e.family = 6; e.addr[15] = 1; e.port = 1; })), kNoError);

    // endpoint counts
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({}, 0)}), "count");
    std::vector<RawEp> sixteen(16), seventeen(17);
    assert_int_equal(decode_code(build({core_sec(CoreFields{}), tcp_sec(sixteen)})), kNoError);
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec(seventeen)}), "count");
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({RawEp{}}, 0xffff)}), "count");
    // count says 2, one present
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({RawEp{}}, 2)}));
    // count says 1, two present (1.0: exact length required)
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({RawEp{}, RawEp{}}, 1)}));
    // tcp section too short to hold its count
    expect_badmeta(build({core_sec(CoreFields{}), Sec{2, 0, {1}}}));
    // tcp backend without endpoints
    expect_badmeta(build({core_sec(CoreFields{})}), "tcp backend");

    // verbs section
    CoreFields v;
    v.backend = 2;
    const uint64_t mr = v.num_blocks * v.block_len;
    assert_int_equal(decode_code(build({core_sec(v), verbs_sec(RawEp{}, 1, mr, 5)})), kNoError);
    expect_badmeta(build({core_sec(v), verbs_sec(RawEp{}, 1, mr + 1, 5)}), "MR length");
    expect_badmeta(build({core_sec(v), verbs_sec(RawEp{}, 1, 0, 5)}), "MR length");
    RawEp bad;
    bad.port = 0;
    expect_badmeta(build({core_sec(v), verbs_sec(bad, 1, mr, 5)}), "port 0");
    Sec vs = verbs_sec(RawEp{}, 1, mr, 5);
    vs.body.pop_back();
    expect_badmeta(build({core_sec(v), vs}));
}

void test_meta_invalid_structure(void **) {
    CoreFields v;
    v.backend = 2;
    const uint64_t mr = v.num_blocks * v.block_len;
    // duplicates
    expect_badmeta(build({core_sec(CoreFields{}), core_sec(CoreFields{}), tcp_sec({RawEp{}})}), "duplicate");
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({RawEp{}}), tcp_sec({RawEp{}})}), "duplicate");
    expect_badmeta(build({core_sec(v), verbs_sec(RawEp{}, 1, mr, 5), verbs_sec(RawEp{}, 1, mr, 5)}), "duplicate");
    // missing core
    expect_badmeta(build({tcp_sec({RawEp{}})}), "core");
    expect_badmeta(build({Sec{0x55, 0, {}}}), "core");
    // section counts
    expect_badmeta(build(good_secs(), 1, 0, 0), "section count");
    expect_badmeta(build(good_secs(), 1, 0, 65), "section count");
    expect_badmeta(build(good_secs(), 1, 0, 0xffffffffll), "section count");
    expect_badmeta(build(good_secs(), 1, 0, 3));                     // one more announced than present
    expect_badmeta(build(good_secs(), 1, 0, 1), "after the last");   // bytes after the announced ones
    // a section length beyond the blob
    {
        std::vector<uint8_t> b = build(good_secs());
        b[16 + 4] = 0xff;  // core section length low byte
        b[16 + 7] = 0x7f;  // ... and high byte
        reseal(b);
        expect_badmeta(b, "truncated");
    }
    // header
    expect_badmeta(build(good_secs(), 1, 0, kAuto, 0x4d58564c), "magic");
    {
        std::vector<uint8_t> b = build(good_secs());
        b.resize(kMetaMaxLen + 1, 0);  // total_len claims more than the limit
        uint32_t total = static_cast<uint32_t>(b.size());
        for (size_t i = 0; i < 4; i++) b[8 + i] = static_cast<uint8_t>(total >> (8 * i));
        expect_badmeta(b, "limit");
    }
    {
        std::vector<uint8_t> b = build(good_secs());
        for (uint32_t total : {0u, 1u, 23u}) {  // total_len below the minimum, blob that long
            std::vector<uint8_t> t(b.begin(), b.begin() + 24);
            t.resize(std::max<size_t>(total, 24));
            for (size_t i = 0; i < 4; i++) t[8 + i] = static_cast<uint8_t>(total >> (8 * i));
            expect_badmeta(t);
        }
    }
    // just a header and a checksum: no sections
    expect_badmeta(build({}, 1, 0, 0));
}

// ------------------------------------------------------------------ tcp frames

constexpr uint64_t kBl = 64;

std::array<uint8_t, kFrameHeaderLen> header_bytes(const FrameHeader &h) {
    std::array<uint8_t, kFrameHeaderLen> b{};
    encode_frame_header(h, b.data());
    return b;
}

int header_code(const std::array<uint8_t, kFrameHeaderLen> &b, uint64_t block_len = kBl, std::string *msg = nullptr,
                FrameHeader *out = nullptr) {
    return code_of(
        [&] {
            FrameHeader h = decode_frame_header(b.data(), block_len);
            if (out) *out = h;
        },
        msg);
}

FrameHeader hdr(uint32_t nseg, uint64_t total) {
    FrameHeader h;
    h.type = kFrameWrite;
    h.flags = kFlagAck;
    h.seq = 0x1122334455667788ull;
    h.nseg = nseg;
    h.total_len = total;
    return h;
}

void test_frame_header(void **) {
    FrameHeader d;
    assert_int_equal(header_code(header_bytes(hdr(3, 3 * kBl)), kBl, nullptr, &d), kNoError);
    assert_int_equal(d.type, kFrameWrite);
    assert_int_equal(d.flags, kFlagAck);
    assert_true(d.seq == 0x1122334455667788ull);
    assert_int_equal(d.nseg, 3);
    assert_int_equal(d.total_len, 3 * kBl);
    FrameHeader noack = hdr(1, kBl);
    noack.flags = 0;
    assert_int_equal(header_code(header_bytes(noack)), kNoError);

    std::string msg;
    auto bad = [&](std::array<uint8_t, kFrameHeaderLen> b, const char *mention, uint64_t bl = kBl) {
        int rc = header_code(b, bl, &msg);
        if (rc != KVX_EINVAL) fail_msg("expected KVX_EINVAL (%s), got %d (%s)", mention, rc, msg.c_str());
        assert_contains(msg, mention);
    };
    auto b = header_bytes(hdr(1, kBl));
    b[0] ^= 1;
    bad(b, "magic");
    for (uint16_t type : {0, 2, 0xffff}) {
        FrameHeader h = hdr(1, kBl);
        h.type = type;
        bad(header_bytes(h), "type");
    }
    for (uint16_t flags : {2, 3, 0x8000}) {
        FrameHeader h = hdr(1, kBl);
        h.flags = flags;
        bad(header_bytes(h), "flags");
    }
    for (size_t i = 20; i < 24; i++) {
        b = header_bytes(hdr(1, kBl));
        b[i] = 1;
        bad(b, "reserved");
    }
    bad(header_bytes(hdr(0, kBl)), "segment count");
    assert_int_equal(header_code(header_bytes(hdr(kFrameMaxSegs, kFrameMaxSegs * kBl))), kNoError);
    bad(header_bytes(hdr(kFrameMaxSegs + 1, kBl)), "segment count");
    bad(header_bytes(hdr(0xffffffffu, kBl)), "segment count");
    bad(header_bytes(hdr(1, 0)), "payload length");
    assert_int_equal(header_code(header_bytes(hdr(1, kFrameMaxPayload))), kNoError);
    bad(header_bytes(hdr(1, kFrameMaxPayload + 1)), "payload length");
    bad(header_bytes(hdr(1, UINT64_MAX)), "payload length");
    // a block larger than the payload limit travels alone
    const uint64_t big = kFrameMaxPayload * 4;
    assert_int_equal(header_code(header_bytes(hdr(1, big)), big), kNoError);
    bad(header_bytes(hdr(1, big + 1)), "payload length", big);
}

std::vector<uint8_t> seg_table(const std::vector<Segment> &segs) {
    std::vector<uint8_t> t(segs.size() * kSegLen);
    for (size_t i = 0; i < segs.size(); i++) encode_segment(segs[i], t.data() + i * kSegLen);
    return t;
}

int segs_code(const std::vector<Segment> &segs, uint64_t total, uint64_t region_len, std::string *msg = nullptr,
              std::vector<Segment> *out = nullptr, uint64_t bl = kBl) {
    std::vector<uint8_t> t = seg_table(segs);
    std::unique_ptr<uint8_t[]> exact(new uint8_t[t.size()]);  // overreads hit ASan
    memcpy(exact.get(), t.data(), t.size());
    FrameHeader h = hdr(static_cast<uint32_t>(segs.size()), total);
    return code_of(
        [&] {
            auto r = decode_segments(exact.get(), h, bl, region_len);
            if (out) *out = r;
        },
        msg);
}

void test_frame_segments(void **) {
    const uint64_t region = 64 * kBl;
    std::vector<Segment> got;
    std::vector<Segment> ok = {{0, kBl}, {10 * kBl, 5 * kBl}, {63 * kBl, kBl}, {0, 2 * kBl}};
    assert_int_equal(segs_code(ok, 9 * kBl, region, nullptr, &got), kNoError);
    assert_int_equal(got.size(), ok.size());
    for (size_t i = 0; i < ok.size(); i++) {
        assert_int_equal(got[i].offset, ok[i].offset);
        assert_int_equal(got[i].len, ok[i].len);
    }
    assert_int_equal(segs_code({{0, region}}, region, region), kNoError);  // the whole region

    std::string msg;
    auto bad = [&](const std::vector<Segment> &s, uint64_t total, const char *mention, uint64_t reg) {
        int rc = segs_code(s, total, reg, &msg);
        if (rc != KVX_EINVAL) fail_msg("expected KVX_EINVAL (%s), got %d (%s)", mention, rc, msg.c_str());
        assert_contains(msg, mention);
    };
    // outside the region
    bad({{region, kBl}}, kBl, "outside", region);
    bad({{region - kBl, 2 * kBl}}, 2 * kBl, "outside", region);
    bad({{0, region + kBl}}, region + kBl, "outside", region);
    bad({{0, kBl}, {region * 2, kBl}}, 2 * kBl, "outside", region);
    // alignment and zero length
    bad({{1, kBl}}, kBl, "whole blocks", region);
    bad({{kBl - 1, kBl}}, kBl, "whole blocks", region);
    bad({{0, kBl + 1}}, kBl + 1, "whole blocks", region);
    bad({{0, kBl - 1}}, kBl - 1, "whole blocks", region);
    bad({{0, 0}}, kBl, "whole blocks", region);
    bad({{0, kBl}, {kBl, 0}}, kBl, "whole blocks", region);
    // lengths not adding up
    bad({{0, kBl}, {kBl, kBl}}, 3 * kBl, "add up", region);
    bad({{0, kBl}, {kBl, kBl}}, kBl, "add up", region);
    bad({{0, 4 * kBl}}, 2 * kBl, "add up", region);
    // offset + len overflowing 64 bits, with a region that is (almost) the address space
    const uint64_t huge = UINT64_MAX / kBl * kBl;
    const uint64_t top = UINT64_MAX - kBl + 1;  // aligned, the last block below 2^64
    bad({{top, kBl}}, kBl, "outside", region);
    bad({{top, 2 * kBl}}, 2 * kBl, "outside", region);
    bad({{top, kBl}}, kBl, "outside", huge);
    bad({{huge - kBl, 2 * kBl}}, 2 * kBl, "outside", huge);
    bad({{kBl, top}}, kBl, "outside", huge);
    assert_int_equal(segs_code({{huge - kBl, kBl}}, kBl, huge), kNoError);
    // lengths whose sum wraps around 2^64 back to total_len
    bad({{0, kBl}, {0, top}}, kBl, "add up", huge);
    bad({{0, 2 * kBl}, {0, top}}, kBl, "add up", huge);
    bad({{0, top}, {0, 2 * kBl}}, kBl, "add up", huge);
    // block_len 1: every offset is aligned; region bound still holds
    assert_int_equal(segs_code({{0, 3}, {5, 1}}, 4, 6, nullptr, nullptr, 1), kNoError);
    assert_int_equal(segs_code({{5, 2}}, 2, 6, nullptr, nullptr, 1), KVX_EINVAL);
}

void test_frame_max_segments(void **) {
    std::vector<Segment> segs;
    for (uint64_t i = 0; i < kFrameMaxSegs; i++) segs.push_back({(i % 64) * kBl, kBl});
    assert_int_equal(segs_code(segs, kFrameMaxSegs * kBl, 64 * kBl), kNoError);
    segs.back().offset = 64 * kBl;
    assert_int_equal(segs_code(segs, kFrameMaxSegs * kBl, 64 * kBl), KVX_EINVAL);
}

void test_handshake_messages(void **) {
    ServerHello sh;
    sh.instance_id = 0xfeedfacecafebeefull;
    for (size_t i = 0; i < kNonceLen; i++) sh.nonce[i] = static_cast<uint8_t>(i * 7);
    uint8_t shb[kServerHelloLen];
    encode_server_hello(sh, shb);
    ServerHello sd = decode_server_hello(shb);
    assert_true(sd.instance_id == sh.instance_id && sd.nonce == sh.nonce && sd.major == kTcpMajor);

    ClientHello ch;
    ch.instance_id = sh.instance_id;
    ch.nonce = sh.nonce;
    memcpy(ch.fingerprint.data(), "0123456789abcdef", 16);
    std::array<uint8_t, kSecretLen> secret{};
    secret.fill(3);
    ch.mac = client_mac(secret, sh, ch);
    uint8_t chb[kClientHelloLen];
    encode_client_hello(ch, chb);
    ClientHello cd = decode_client_hello(chb);
    assert_true(cd.instance_id == ch.instance_id && cd.nonce == ch.nonce && cd.fingerprint == ch.fingerprint &&
                cd.mac == ch.mac);
    // the MACs depend on the secret, the role, and every transcript field but the MAC itself
    assert_true(client_mac(secret, sh, cd) == ch.mac);
    assert_true(server_mac(secret, sh, ch) != ch.mac);
    std::array<uint8_t, kSecretLen> other = secret;
    other[31] ^= 1;
    assert_true(client_mac(other, sh, ch) != ch.mac);
    ClientHello ch2 = ch;
    ch2.fingerprint[0] ^= 1;
    assert_true(client_mac(secret, sh, ch2) != ch.mac);
    ServerHello sh2 = sh;
    sh2.nonce[5] ^= 1;
    assert_true(client_mac(secret, sh2, ch) != ch.mac);

    // server hello / client hello confusion and damage
    {
        uint8_t buf[kClientHelloLen] = {};
        memcpy(buf, shb, kServerHelloLen);  // kind 1 read as a client hello
        assert_int_equal(code_of([&] { decode_client_hello(buf); }), KVX_EINVAL);
        memcpy(buf, chb, kServerHelloLen);  // kind 2 read as a server hello
        assert_int_equal(code_of([&] { decode_server_hello(buf); }), KVX_EINVAL);
        buf[0] ^= 0x20;
        assert_int_equal(code_of([&] { decode_server_hello(buf); }), KVX_EINVAL);
    }
    uint8_t bad[kClientHelloLen];
    memcpy(bad, chb, sizeof bad);
    bad[4] = 2;  // major 2
    std::string msg;
    assert_int_equal(code_of([&] { decode_client_hello(bad); }, &msg), KVX_EVERSION);
    assert_contains(msg, "major");
    memcpy(bad, shb, kServerHelloLen);
    bad[5] = 1;  // major 257
    assert_int_equal(code_of([&] { decode_server_hello(bad); }), KVX_EVERSION);
    memcpy(bad, chb, sizeof bad);
    bad[3] = 0;
    assert_int_equal(code_of([&] { decode_client_hello(bad); }, &msg), KVX_EINVAL);
    assert_contains(msg, "magic");

    // verdict
    for (int32_t st : {0, -1, int(KVX_EAUTH), int(KVX_EVERSION), -2000}) {
        ServerVerdict v;
        v.status = st;
        v.mac.fill(9);
        uint8_t vb[kVerdictLen];
        encode_verdict(v, vb);
        ServerVerdict vd{};
        assert_int_equal(code_of([&] { vd = decode_verdict(vb); }), kNoError);
        assert_int_equal(vd.status, st);
        assert_true(vd.mac == v.mac);
    }
    for (int32_t st : {1, -2001, INT32_MIN, INT32_MAX}) {
        ServerVerdict v;
        v.status = st;
        uint8_t vb[kVerdictLen];
        encode_verdict(v, vb);
        assert_int_equal(code_of([&] { decode_verdict(vb); }, &msg), KVX_EINVAL);
        assert_contains(msg, "status");
    }

    // ack
    uint8_t ab[kAckLen];
    encode_ack(Ack{-5, 77}, ab);
    Ack a = decode_ack(ab);
    assert_int_equal(a.status, -5);
    assert_int_equal(a.seq, 77);
    ab[2] ^= 1;
    assert_int_equal(code_of([&] { decode_ack(ab); }), KVX_EINVAL);
    memcpy(bad, chb, kAckLen);
    assert_int_equal(code_of([&] { decode_ack(bad); }), KVX_EINVAL);  // a hello is not an ack
}

// ------------------------------------------------------------------ options

void expect_option_rejected(const char *key, const char *value, const char *mention_value) {
    std::string msg;
    int rc = code_of([&] { validate_option(key, value); }, &msg);
    if (rc != KVX_EINVAL) fail_msg("option %s='%s': expected KVX_EINVAL, got %d (%s)", key, value, rc, msg.c_str());
    assert_contains(msg, key);
    if (mention_value) assert_contains(msg, mention_value);
}

void test_options_unknown_key(void **) {
    for (const char *k : {"", "nope", "Backend", "backend ", "tcp", "tcp.", "tcp.listen.x", "verbs.unknown",
                          "connect_timeout", "shm.path"}) {
        std::string msg;
        assert_int_equal(code_of([&] { validate_option(k, "1"); }, &msg), KVX_EINVAL);
        assert_contains(msg, "unknown option");
        assert_contains(msg, (std::string("'") + k + "'").c_str());
    }
}

void test_options_bad_integers(void **) {
    for (const char *key : {"connect_timeout_ms", "transfer_timeout_ms", "tcp.streams", "verbs.port",
                            "verbs.gid_index", "verbs.qps_per_peer"}) {
        expect_option_rejected(key, "", nullptr);
        expect_option_rejected(key, "-1", "'-1'");
        expect_option_rejected(key, "12abc", "'12abc'");
        expect_option_rejected(key, "+5", "'+5'");
        expect_option_rejected(key, " 5", "' 5'");
        expect_option_rejected(key, "5 ", "'5 '");
        expect_option_rejected(key, "0x10", "'0x10'");
        expect_option_rejected(key, "1e3", "'1e3'");
        expect_option_rejected(key, "99999999999999999999", "99999999999999999999");
        expect_option_rejected(key, "18446744073709551616", "18446744073709551616");
        expect_option_rejected(key, "18446744073709551615", "18446744073709551615");
        expect_option_rejected(key, "3600001", "3600001");
    }
    // just outside each range
    expect_option_rejected("connect_timeout_ms", "0", "0");
    expect_option_rejected("transfer_timeout_ms", "0", "0");
    expect_option_rejected("tcp.streams", "0", "0");
    expect_option_rejected("tcp.streams", "17", "17");
    expect_option_rejected("verbs.port", "256", "256");
    expect_option_rejected("verbs.port", "0", "0");
    expect_option_rejected("verbs.gid_index", "65536", "65536");
    expect_option_rejected("verbs.qps_per_peer", "17", "17");
    // string options
    expect_option_rejected("backend", "rdma", "'rdma'");
    expect_option_rejected("backend", "", "''");
    expect_option_rejected("backend", "TCP", "'TCP'");
    std::string longv(1025, 'x');
    for (const char *key : {"tcp.listen", "tcp.advertise", "verbs.device", "verbs.listen"})
        expect_option_rejected(key, longv.c_str(), "1025");
}

void test_options_good_values(void **) {
    struct KV {
        const char *k, *v;
    };
    for (const KV &kv : std::initializer_list<KV>{
             {"backend", "auto"}, {"backend", "tcp"}, {"backend", "verbs"}, {"backend", "shm"},
             {"connect_timeout_ms", "1"}, {"connect_timeout_ms", "3600000"}, {"connect_timeout_ms", "007"},
             {"transfer_timeout_ms", "30000"}, {"tcp.listen", "127.0.0.1:0"}, {"tcp.listen", "[::1]:5000"},
             {"tcp.listen", ""}, {"tcp.advertise", "10.0.0.1:1,10.0.0.2:0"}, {"tcp.streams", "1"},
             {"tcp.streams", "16"}, {"verbs.device", "rxe0"}, {"verbs.port", "1"}, {"verbs.port", "255"},
             {"verbs.gid_index", "0"}, {"verbs.gid_index", "65535"}, {"verbs.qps_per_peer", "16"},
             {"verbs.listen", "0.0.0.0:0"}}) {
        std::string msg;
        int rc = code_of([&] { validate_option(kv.k, kv.v); }, &msg);
        if (rc != kNoError) fail_msg("option %s='%s' refused: %s", kv.k, kv.v, msg.c_str());
    }
    std::string maxv(1024, 'x');
    assert_int_equal(code_of([&] { validate_option("tcp.advertise", maxv); }), kNoError);
}

void test_options_parse_uint(void **) {
    assert_int_equal(parse_uint_option("k", "0", 0, 10), 0);
    assert_int_equal(parse_uint_option("k", "10", 0, 10), 10);
    assert_true(parse_uint_option("k", "18446744073709551615", 0, UINT64_MAX) == UINT64_MAX);
    std::string msg;
    assert_int_equal(code_of([&] { parse_uint_option("k", "18446744073709551616", 0, UINT64_MAX); }, &msg), KVX_EINVAL);
    assert_contains(msg, "option k");
    assert_int_equal(code_of([&] { parse_uint_option("k", "11", 0, 10); }, &msg), KVX_EINVAL);
    assert_contains(msg, "11");
    assert_contains(msg, "0..10");
    assert_int_equal(code_of([&] { parse_uint_option("k", "4", 5, 10); }), KVX_EINVAL);
}

void test_options_from_bag(void **) {
    Options d = Options::from(nullptr);
    assert_string_equal(d.backend.c_str(), "auto");
    assert_int_equal(d.connect_timeout_ms, 5000);
    assert_int_equal(d.transfer_timeout_ms, 30000);
    assert_int_equal(d.tcp_streams, 1);
    assert_string_equal(d.tcp_listen.c_str(), "0.0.0.0:0");

    OptionBag bag;
    bag.kv = {{"backend", "tcp"},       {"connect_timeout_ms", "250"}, {"transfer_timeout_ms", "3600000"},
              {"tcp.listen", "[::]:0"}, {"tcp.advertise", "h:1"},      {"tcp.streams", "4"},
              {"verbs.port", "2"}};
    Options o = Options::from(&bag);
    assert_string_equal(o.backend.c_str(), "tcp");
    assert_int_equal(o.connect_timeout_ms, 250);
    assert_int_equal(o.transfer_timeout_ms, 3600000);
    assert_string_equal(o.tcp_listen.c_str(), "[::]:0");
    assert_string_equal(o.tcp_advertise.c_str(), "h:1");
    assert_int_equal(o.tcp_streams, 4);
    assert_string_equal(o.backend_specific.at("verbs.port").c_str(), "2");

    bag.kv["tcp.streams"] = "99";
    std::string msg;
    assert_int_equal(code_of([&] { Options::from(&bag); }, &msg), KVX_EINVAL);
    assert_contains(msg, "tcp.streams");
    bag.kv.erase("tcp.streams");
    bag.kv["bogus"] = "1";
    assert_int_equal(code_of([&] { Options::from(&bag); }, &msg), KVX_EINVAL);
    assert_contains(msg, "bogus");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meta_roundtrip),
        cmocka_unit_test(test_meta_layout_matches_encoder),
        cmocka_unit_test(test_meta_endpoint_str),
        cmocka_unit_test(test_meta_truncated),
        cmocka_unit_test(test_meta_byte_flips),
        cmocka_unit_test(test_meta_trailing),
        cmocka_unit_test(test_meta_major_version),
        cmocka_unit_test(test_meta_newer_minor),
        cmocka_unit_test(test_meta_unknown_critical),
        cmocka_unit_test(test_meta_invalid_core),
        cmocka_unit_test(test_meta_invalid_endpoints),
        cmocka_unit_test(test_meta_invalid_structure),
        cmocka_unit_test(test_frame_header),
        cmocka_unit_test(test_frame_segments),
        cmocka_unit_test(test_frame_max_segments),
        cmocka_unit_test(test_handshake_messages),
        cmocka_unit_test(test_options_unknown_key),
        cmocka_unit_test(test_options_bad_integers),
        cmocka_unit_test(test_options_good_values),
        cmocka_unit_test(test_options_parse_uint),
        cmocka_unit_test(test_options_from_bag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
