// Unit tests of the agent-metadata codec (src/wire/metadata) and of the
// backends' section codecs behind it (through the registry, as add_peer
// checks them): round trip and rejection of every malformed blob we can think of. Blobs with invalid values
// are written byte by byte (tests/common/meta_writer.h), independently of
// encode_metadata(), so each case reaches the value check it means to exercise
// instead of failing at the checksum.
// Project headers first: cmocka.h defines a fail() macro that would clash
// with kvx::fail() in util/error.h.
#include "kvxfer.h"
#include "wire/metadata.h"
#include "registry/registry.h"
#include "backends/tcp/tcp.h"
#include "meta_writer.h"
#include "util/error.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "unit_util.h"

using namespace kvx;
using namespace kvx::wire;
using namespace kvx::testing;

namespace {

// Header, sections, then total_len and checksum fixed up (unless told otherwise).
constexpr int64_t kAuto = kAutoCount;
Bytes build(const std::vector<Sec> &secs, uint16_t major = 2, uint16_t minor = 0, int64_t nsec = kAuto,
            uint32_t magic = kMetaMagic) {
    return assemble_metadata(secs, major, minor, nsec, magic);
}

// Decodes from an exact-size heap copy so that an overread is caught by ASan.
int decode_code(const std::vector<uint8_t> &b, std::string *msg = nullptr, AgentMetadata *out = nullptr) {
    std::unique_ptr<uint8_t[]> copy(b.empty() ? nullptr : new uint8_t[b.size()]);
    if (!b.empty()) memcpy(copy.get(), b.data(), b.size());
    return code_of(
        [&] {
            AgentMetadata m = decode_metadata(copy.get(), b.size());
            for (const Section &sec : m.sections)  // as add_peer does, for every section we know
                for (const BackendDesc *d : backend_registry())
                    if (d->id == sec.type) d->check_section(sec, m);
            if (out) *out = m;
        },
        msg);
}

using net::Endpoint;

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
    m.sections = {tcp::encode_section({ep4(10, 0, 0, 1, 5000), ep6_loopback(6000), ep6_sample(65535), ep4(127, 0, 0, 1, 1)})};
    return m;
}

std::vector<Endpoint> tcp_endpoints(const AgentMetadata &m) { return tcp::decode_section(*m.find(2)); }

// ---- independent metadata writer (docs/wire-format.md layout)

struct CoreFields {
    uint64_t base_addr = 0x10000;
    uint64_t num_blocks = 16;
    uint64_t block_len = 256;
    uint64_t instance_id = 42;
    uint8_t secret_byte = 0x5a;
    uint8_t fplen = 0;
    std::array<uint8_t, 16> fp{};
    std::array<uint8_t, 7> reserved{};
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

Sec tcp_sec(const std::vector<RawEp> &eps, int count_override = -1, size_t extra = 0, uint8_t version = 0) {
    Sec s{2, static_cast<uint16_t>(version << 8), {}};
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

std::vector<Sec> good_secs() { return {core_sec(CoreFields{}), tcp_sec({RawEp{}})}; }

AgentMetadata sample_verbs(const char *fp) {  // tcp and verbs sections, the verbs one raw
    AgentMetadata m = sample_tcp(fp);
    Sec v = verbs_sec(RawEp{}, m.base_addr, m.num_blocks * m.block_len, 0xdeadbeef);
    m.sections.push_back(Section{v.type, 0, v.body});
    return m;
}

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
            std::vector<Endpoint> eps = tcp_endpoints(d);
            assert_int_equal(eps.size(), 4);
            assert_int_equal(eps[1].family, 6);
            assert_int_equal(eps[2].port, 65535);
            assert_true(encode_metadata(d) == b);  // encoding is canonical
        }
    }
    // no backend sections at all (the container allows it; add_peer then finds no common backend)
    AgentMetadata m = sample_tcp("fedcba9876543210");
    m.sections.clear();
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
    Sec vs = verbs_sec(RawEp{}, 0x10000, 16 * 256, 77);
    m.sections = {tcp::encode_section({ep4(127, 0, 0, 1, 7000)}), Section{3, 0, vs.body}};
    CoreFields c;
    std::vector<uint8_t> mine = build({core_sec(c), tcp_sec({RawEp{}}), verbs_sec(RawEp{}, 0x10000, 16 * 256, 77)});
    assert_true(mine == encode_metadata(m));
    assert_int_equal(decode_code(build(good_secs())), kNoError);
}

void test_meta_endpoint_str(void **) {
    assert_string_equal(ep4(10, 0, 0, 1, 5000).str().c_str(), "10.0.0.1:5000");
    assert_string_equal(ep6_loopback(6000).str().c_str(), "[::1]:6000");
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
    for (uint16_t major : {0, 1, 3, 0xffff}) {
        std::string msg;
        assert_int_equal(decode_code(build(good_secs(), major, 0), &msg), KVX_EVERSION);
        assert_contains(msg, "version");
        assert_int_equal(decode_code(build(good_secs(), major, 7)), KVX_EVERSION);
    }
}

void test_meta_newer_minor(void **) {
    // Version 2.3: a longer core section, a newer (longer) tcp section,
    // unknown optional sections (before, between and after the known ones),
    // a reserved flag bit.
    CoreFields c;
    c.fplen = 16;
    memcpy(c.fp.data(), "00aa11bb22cc33dd", 16);
    std::vector<Sec> secs = {
        Sec{0x77, 0, {1, 2, 3}},
        core_sec(c, 24),
        Sec{0x78, 0x8002, {}},
        tcp_sec({RawEp{}, RawEp{6, 0, 9, {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}}}, -1, 12, 1),
        Sec{0xffff, 0xfffe, std::vector<uint8_t>(300, 0xab)},
    };
    AgentMetadata d;
    std::string msg;
    int rc = decode_code(build(secs, 2, 3), &msg, &d);
    if (rc != kNoError) fail_msg("newer minor refused: %d (%s)", rc, msg.c_str());
    assert_int_equal(d.num_blocks, 16);
    assert_int_equal(d.block_len, 256);
    assert_string_equal(d.fingerprint.c_str(), "00aa11bb22cc33dd");
    std::vector<Endpoint> eps = tcp_endpoints(d);
    assert_int_equal(eps.size(), 2);
    assert_int_equal(eps[1].family, 6);
    assert_int_equal(eps[1].port, 9);
    assert_int_equal(d.find(2)->version, 1);
    assert_int_equal(d.sections.size(), 4);  // unknown sections are carried, not parsed

    // the same longer sections from a 2.0 writer / a version-0 tcp section are corrupt
    expect_badmeta(build({core_sec(c, 24), tcp_sec({RawEp{}})}, 2, 0));
    expect_badmeta(build({core_sec(c), tcp_sec({RawEp{}}, -1, 12)}, 2, 3), "tcp section");
    // shorter sections are corrupt in any version
    Sec shortcore = core_sec(c);
    shortcore.body.resize(shortcore.body.size() - 1);
    expect_badmeta(build({shortcore, tcp_sec({RawEp{}})}, 2, 3));
    expect_badmeta(build({core_sec(c), tcp_sec({RawEp{}, RawEp{}}, 3, 0, 1)}, 2, 3));
}

void test_meta_unknown_critical(void **) {
    for (uint16_t flags : {1, 3, 0xffff}) {
        std::vector<Sec> secs = good_secs();
        secs.push_back(Sec{9, flags, {0, 0, 0, 0}});
        std::string msg;
        assert_int_equal(decode_code(build(secs, 2, 1), &msg), KVX_EVERSION);
        assert_contains(msg, "critical");
        assert_int_equal(decode_code(build(secs, 2, 0)), KVX_EVERSION);
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
    // verbs section (checked only where the verbs backend is built)
    if (!find_backend("verbs")) return;
    CoreFields v;
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
    const uint64_t mr = v.num_blocks * v.block_len;
    // duplicates
    expect_badmeta(build({core_sec(CoreFields{}), core_sec(CoreFields{}), tcp_sec({RawEp{}})}), "duplicate");
    expect_badmeta(build({core_sec(CoreFields{}), tcp_sec({RawEp{}}), tcp_sec({RawEp{}})}), "duplicate");
    expect_badmeta(build({core_sec(v), verbs_sec(RawEp{}, 1, mr, 5), verbs_sec(RawEp{}, 1, mr, 5)}), "duplicate");
    // the core section must be flagged critical, and be version 0 at this minor
    {
        Sec c = core_sec(CoreFields{});
        c.flags = 0;
        expect_badmeta(build({c, tcp_sec({RawEp{}})}), "critical");
        c.flags = 0x0101;
        expect_badmeta(build({c, tcp_sec({RawEp{}})}), "version 1");
        assert_int_equal(decode_code(build({c, tcp_sec({RawEp{}})}, 2, 1)), kNoError);  // a newer minor's core
    }
    // missing core
    expect_badmeta(build({tcp_sec({RawEp{}})}), "core");
    expect_badmeta(build({Sec{0x55, 0, {}}}), "core");
    // section counts
    expect_badmeta(build(good_secs(), 2, 0, 0), "section count");
    expect_badmeta(build(good_secs(), 2, 0, 65), "section count");
    expect_badmeta(build(good_secs(), 2, 0, 0xffffffffll), "section count");
    expect_badmeta(build(good_secs(), 2, 0, 3));                     // one more announced than present
    expect_badmeta(build(good_secs(), 2, 0, 1), "after the last");   // bytes after the announced ones
    expect_badmeta(build({core_sec(CoreFields{}), Sec{0, 0, {}}}), "type 0");
    // a section length beyond the blob
    {
        std::vector<uint8_t> b = build(good_secs());
        b[16 + 4] = 0xff;  // core section length low byte
        b[16 + 7] = 0x7f;  // ... and high byte
        reseal(b);
        expect_badmeta(b, "truncated");
    }
    // header
    expect_badmeta(build(good_secs(), 2, 0, kAuto, 0x4d58564c), "magic");
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
    expect_badmeta(build({}, 2, 0, 0));
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
