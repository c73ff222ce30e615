// Writes the seed inputs of the fuzz corpora (deterministic output):
//   kvx_fuzz_gen_seeds OUT_DIR   -> OUT_DIR/{metadata,frame,handshake}/seed-*
// metadata: agent metadata 2.x (src/wire/metadata.h) with tcp and verbs
// sections (src/backends/tcp/tcp_wire.cpp, src/backends/verbs/verbs_wire.cpp:
// versions 0, 1 and 2, valid and hostile);
// frame: tcp streams (src/backends/tcp/tcp_wire.h, input layout in
// fuzz_frame.cpp); handshake: messages of src/handshake/handshake.h.
// The committed corpora (tests/fuzz/corpus/<target>) are these seeds plus
// inputs the fuzzers found interesting (merged with -merge=1). Re-run after a
// wire format change and commit the result:
//   kvx_fuzz_gen_seeds tests/fuzz/corpus

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/tcp/tcp.h"
#include "backends/tcp/tcp_wire.h"
#ifdef KVX_FUZZ_VERBS
#include "backends/verbs/verbs.h"
#include "util/error.h"
#endif
#include "handshake/handshake.h"
#include "kvxfer.h"
#include "meta_writer.h"
#include "util/bytes.h"
#include "util/net.h"
#include "wire/metadata.h"

using namespace kvx::wire;
using namespace kvx::tcp;
using kvx::net::Endpoint;
using kvx::testing::Bytes;
using kvx::testing::Sec;
namespace fs = std::filesystem;
namespace hs = kvx::handshake;

namespace {

constexpr uint16_t kSectionVerbs = 3;  // the verbs backend's id

fs::path g_out;
int g_count = 0;

void emit(const char *dir, const std::string &name, const Bytes &b) {
    fs::path d = g_out / dir;
    fs::create_directories(d);
    std::ofstream f(d / ("seed-" + name), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!f) {
        fprintf(stderr, "gen_seeds: cannot write %s/%s\n", d.c_str(), name.c_str());
        exit(1);
    }
    g_count++;
}

// ------------------------------------------------------------------ metadata

Endpoint ep4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, uint16_t port) {
    Endpoint e;
    e.family = 4;
    e.addr = {a, b, c, d};
    e.port = port;
    return e;
}

Endpoint ep6(uint8_t last, uint16_t port) {
    Endpoint e;
    e.family = 6;
    e.addr = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last};
    e.port = port;
    return e;
}

// One rail of a verbs section: its rdma_cm endpoint and one rkey per slice.
struct Rail {
    Endpoint cm;
    std::vector<uint32_t> rkeys;
};

// n rails (every third IPv6) of `slices` keys each, all keys distinct.
std::vector<Rail> rails(size_t n, size_t slices) {
    std::vector<Rail> out;
    for (size_t i = 0; i < n; i++) {
        const auto r = static_cast<uint8_t>(i);
        Rail rail{i % 3 == 2 ? ep6(r, 4791) : ep4(10, r, 0, 7, 4791), {}};
        for (size_t k = 0; k < slices; k++) rail.rkeys.push_back(static_cast<uint32_t>(0x10000 * (i + 1) + k));
        out.push_back(rail);
    }
    return out;
}

// The verbs section byte by byte after docs/wire-format.md, not by
// kvx::verbs::encode_section: the seeds stay the same with or without the
// verbs backend, and with it the codec is held to them (verbs_seed() below,
// the fuzz target on replay). Version 0: the first rail and the region, len
// its size; 1 appends the further rails; 2 (len: the slice length, also in
// version 0's mr_len) the slice length and count, then each rail's keys of
// the slices after its first. A later version writes version 2 (and appends).
Section verbs_section(uint8_t version, uint64_t mr_addr, uint64_t len, const std::vector<Rail> &rs) {
    kvx::Writer w;
    put_endpoint(w, rs[0].cm);
    w.u64(mr_addr);
    w.u64(len);
    w.u32(rs[0].rkeys[0]);
    w.u32(0);  // reserved
    if (version >= 1) {
        w.u32(static_cast<uint32_t>(rs.size() - 1));
        for (size_t i = 1; i < rs.size(); i++) {
            put_endpoint(w, rs[i].cm);
            w.u32(rs[i].rkeys[0]);
        }
    }
    if (version >= 2) {
        w.u64(len);
        w.u32(static_cast<uint32_t>(rs[0].rkeys.size()));
        for (const Rail &r : rs)
            for (size_t i = 1; i < r.rkeys.size(); i++) w.u32(r.rkeys[i]);
    }
    return Section{kSectionVerbs, version, std::move(w.buf())};
}

AgentMetadata base_meta() {
    AgentMetadata m;
    m.base_addr = 0x7f1234560000ull;
    m.num_blocks = 4096;
    m.block_len = 16384;
    m.instance_id = 0x1122334455667788ull;
    for (size_t i = 0; i < kSecretLen; i++) m.secret[i] = static_cast<uint8_t>(i * 13 + 1);
    m.sections = {kvx::tcp::encode_section({ep4(127, 0, 0, 1, 40000)})};
    return m;
}

// Splits an encoded blob back into sections (encoder output is well formed).
std::vector<Sec> sections_of(const Bytes &b) {
    std::vector<Sec> out;
    size_t off = 16;
    while (off + 8 <= b.size() - 8) {
        Sec s;
        s.type = static_cast<uint16_t>(b[off] | b[off + 1] << 8);
        s.flags = static_cast<uint16_t>(b[off + 2] | b[off + 3] << 8);
        uint32_t len = b[off + 4] | b[off + 5] << 8 | b[off + 6] << 16 | static_cast<uint32_t>(b[off + 7]) << 24;
        s.body.assign(b.begin() + static_cast<long>(off + 8), b.begin() + static_cast<long>(off + 8 + len));
        out.push_back(s);
        off += 8 + len;
    }
    return out;
}

Bytes build(const std::vector<Sec> &secs, uint16_t minor = kMetaMinor, uint16_t major = kMetaMajor) {
    return kvx::testing::assemble_metadata(secs, major, minor);
}

uint16_t version_flags(uint8_t version) { return static_cast<uint16_t>(version << 8); }

// A seed with one verbs section; with the verbs backend built, its decoder
// must accept it exactly when it is valid (the fuzz target checks the rest).
void verbs_seed(const std::string &name, const AgentMetadata &m, bool valid) {
#ifdef KVX_FUZZ_VERBS
    std::string why = "accepted";
    try {
        (void)kvx::verbs::decode_section(m.sections.at(0), m);
    } catch (const kvx::Error &e) {
        why = e.what();
    }
    if ((why == "accepted") != valid) {
        fprintf(stderr, "gen_seeds: verbs seed %s is meant to be %s: %s\n", name.c_str(),
                valid ? "accepted" : "refused", why.c_str());
        exit(1);
    }
#else
    (void)valid;
#endif
    emit("metadata", name, encode_metadata(m));
}

// Verbs sections of each version, at their limits and past them. Each seed
// holds the section alone (the core section is always there).
void verbs_seeds() {
    AgentMetadata m = base_meta();
    const uint64_t bl = m.block_len, region = m.num_blocks * bl;
    auto with = [&](const Section &s) {
        m.sections = {s};
        return m;
    };
    auto poked = [](Section s, size_t at, uint64_t val, int bytes) {
        for (int i = 0; i < bytes; i++) s.body[at + static_cast<size_t>(i)] = static_cast<uint8_t>(val >> (8 * i));
        return s;
    };
    auto grown = [](Section s, size_t n) {
        s.body.resize(s.body.size() + n, 0x5a);
        return s;
    };
    auto relabeled = [](Section s, uint8_t version, size_t len) {
        s.version = version;
        s.body.resize(len);
        return s;
    };

    // version 1: several rails, the most rails, and one past
    const Section v1 = verbs_section(1, m.base_addr, region, rails(3, 1));
    verbs_seed("verbs-v1-3rails", with(v1), true);
    verbs_seed("verbs-v1-16rails", with(verbs_section(1, m.base_addr, region, rails(16, 1))), true);
    verbs_seed("verbs-v1-17rails", with(verbs_section(1, m.base_addr, region, rails(17, 1))), false);
    verbs_seed("verbs-v1-reserved-set", with(poked(v1, 40, 0xa5a5a5a5, 4)), true);  // not read
    verbs_seed("verbs-v1-mr-len", with(poked(v1, 28, region - bl, 8)), false);
    verbs_seed("verbs-v1-long", with(grown(v1, 4)), false);
    verbs_seed("verbs-v0-long", with(grown(relabeled(v1, 0, 44), 4)), false);
    // the region ends at the top of the address space; one byte higher wraps
    verbs_seed("verbs-v1-top", with(verbs_section(1, UINT64_MAX - region, region, rails(2, 1))), true);
    verbs_seed("verbs-v1-wraps", with(verbs_section(1, UINT64_MAX - region + 1, region, rails(2, 1))), false);

    // version 2: 16 blocks in slices of 5 (5 + 5 + 5 + 1) on 2 rails
    m.num_blocks = 16;
    const uint64_t r16 = 16 * bl;
    const Section v2 = verbs_section(2, m.base_addr, 5 * bl, rails(2, 4));
    const size_t v1_len = 48 + 24;  // v2's version 1 prefix: 2 rails
    verbs_seed("verbs-v2-sliced", with(v2), true);
    verbs_seed("verbs-v2-3rails-even", with(verbs_section(2, m.base_addr, 4 * bl, rails(3, 4))), true);  // 4 x 4
    verbs_seed("verbs-v2-16rails", with(verbs_section(2, m.base_addr, 8 * bl, rails(16, 2))), true);
    verbs_seed("verbs-v2-reserved-set", with(poked(v2, 40, 1, 1)), true);
    verbs_seed("verbs-v2-top", with(verbs_section(2, UINT64_MAX - r16, 5 * bl, rails(2, 4))), true);
    verbs_seed("verbs-v2-wraps", with(verbs_section(2, UINT64_MAX - r16 + 1, 5 * bl, rails(2, 4))), false);
    // what readers before 0.14 take of it, and version 2 cut or grown
    verbs_seed("verbs-v2-as-v0", with(relabeled(v2, 0, 44)), false);
    verbs_seed("verbs-v2-as-v1", with(relabeled(v2, 1, v1_len)), false);
    verbs_seed("verbs-v2-no-slices", with(relabeled(v2, 2, v1_len)), false);
    verbs_seed("verbs-v2-slices-cut", with(relabeled(v2, 2, v1_len + 11)), false);
    verbs_seed("verbs-v2-key-missing", with(relabeled(v2, 2, v2.body.size() - 4)), false);
    verbs_seed("verbs-v2-key-extra", with(grown(v2, 4)), false);
    // hostile slice lengths and counts
    verbs_seed("verbs-v2-first-len-region", with(poked(v2, 28, r16, 8)), false);
    verbs_seed("verbs-v2-slice-len0", with(poked(poked(v2, 28, 0, 8), v1_len, 0, 8)), false);
    verbs_seed("verbs-v2-slice-unaligned", with(verbs_section(2, m.base_addr, 5 * bl + 1, rails(2, 4))), false);
    verbs_seed("verbs-v2-slice-over", with(verbs_section(2, m.base_addr, 2 * r16, rails(2, 1))), false);
    verbs_seed("verbs-v2-count-short", with(verbs_section(2, m.base_addr, 5 * bl, rails(2, 3))), false);
    verbs_seed("verbs-v2-count-huge", with(poked(v2, v1_len + 8, 0xffffffff, 4)), false);
    // the most slices (511 blocks in slices of 2: the last one block), and one more
    m.num_blocks = 511;
    verbs_seed("verbs-v2-256slices", with(verbs_section(2, m.base_addr, 2 * bl, rails(1, 256))), true);
    m.num_blocks = 257;
    verbs_seed("verbs-v2-257slices", with(verbs_section(2, m.base_addr, bl, rails(1, 257))), false);
    // a later version: version 2 and whatever it appends
    m.num_blocks = 16;
    Section v3 = grown(v2, 12);
    v3.version = 3;
    verbs_seed("verbs-v3-appended", with(v3), true);
    verbs_seed("verbs-v3-keys-cut", with(relabeled(v3, 3, v2.body.size() - 4)), false);
    // one slice (the region's size) is one registration: written as version
    // 1, read in version 2 so that a later version can describe it
    const Section one = verbs_section(2, m.base_addr, r16, rails(2, 1));
    verbs_seed("verbs-v2-one-slice", with(one), true);
    verbs_seed("verbs-v2-one-slice-key", with(grown(one, 4)), false);
    Section one3 = grown(one, 8);
    one3.version = 3;
    verbs_seed("verbs-v3-one-slice", with(one3), true);
    verbs_seed("verbs-v3-one-slice-count2", with(poked(one3, v1_len + 8, 2, 4)), false);
}

void metadata_seeds() {
    AgentMetadata m = base_meta();
    emit("metadata", "tcp-1ep", encode_metadata(m));

    m.fingerprint = "0123456789abcdef";
    m.sections = {kvx::tcp::encode_section({ep4(10, 1, 2, 3, 5000), ep6(1, 5001), ep4(127, 0, 0, 1, 5000)})};
    emit("metadata", "tcp-v4-v6-fp", encode_metadata(m));

    std::vector<Endpoint> eps;
    for (uint8_t i = 0; i < kMaxEndpoints; i++) eps.push_back(i % 2 ? ep6(i, 1000 + i) : ep4(10, 0, 0, i, 1000 + i));
    m.sections = {kvx::tcp::encode_section(eps)};
    emit("metadata", "tcp-16ep", encode_metadata(m));

    AgentMetadata v = base_meta();
    const uint64_t region = v.num_blocks * v.block_len;
    const Section vs = verbs_section(0, v.base_addr, region, {{ep4(192, 168, 0, 7, 4791), {0x1234}}});
    v.sections = {vs};
    v.fingerprint = "fedcba9876543210";
    emit("metadata", "verbs", encode_metadata(v));
    v.sections = {verbs_section(0, v.base_addr, region, {{ep6(9, 4791), {0x1234}}})};
    emit("metadata", "verbs-v6", encode_metadata(v));
    v = base_meta();
    v.sections = {vs, v.sections[0]};
    emit("metadata", "verbs-then-tcp", encode_metadata(v));
    v.sections = {v.sections[1], vs};
    emit("metadata", "tcp-then-verbs", encode_metadata(v));

    verbs_seeds();

    AgentMetadata core = base_meta();
    core.sections.clear();
    emit("metadata", "core-only", encode_metadata(core));

    AgentMetadata big = base_meta();
    big.num_blocks = UINT64_MAX;
    big.block_len = 1;
    emit("metadata", "max-region", encode_metadata(big));
    big.num_blocks = 1;
    big.block_len = UINT64_MAX;
    emit("metadata", "max-block", encode_metadata(big));

    // sections this reader does not know, or knows in an older version
    AgentMetadata u = base_meta();
    u.sections.push_back(Section{9, 0, Bytes(12, 0x33)});
    u.sections.push_back(Section{0x101, 3, {}});
    emit("metadata", "unknown-optional-sections", encode_metadata(u));
    AgentMetadata hv = base_meta();
    hv.sections[0].version = 1;
    hv.sections[0].body.resize(hv.sections[0].body.size() + 8, 0x22);  // a newer tcp section appends
    Section vs3 = verbs_section(3, hv.base_addr, 1024 * hv.block_len, rails(2, 4));  // a newer verbs section appends
    vs3.body.resize(vs3.body.size() + 16, 0x44);
    hv.sections.push_back(vs3);
    emit("metadata", "higher-section-versions", encode_metadata(hv));
    AgentMetadata lv = base_meta();
    lv.sections[0].body.resize(lv.sections[0].body.size() + 8, 0x22);  // same version, longer: refused by tcp
    emit("metadata", "tcp-v0-too-long", encode_metadata(lv));

    const std::vector<Sec> plain = sections_of(encode_metadata(base_meta()));  // core, tcp

    // a newer minor: a longer core section, optional sections of unknown type
    std::vector<Sec> secs = plain;
    secs[0].body.resize(secs[0].body.size() + 16, 0x11);
    secs.insert(secs.begin() + 1, Sec{0x100, 0, Bytes(12, 0x33)});
    secs.push_back(Sec{0x102, version_flags(7), {}});
    emit("metadata", "minor1-extended", build(secs, 1));

    // accepted, but not as encode_metadata() writes it (the reader ignores these)
    std::vector<Sec> odd = plain;
    std::swap(odd[0], odd[1]);
    emit("metadata", "core-last", build(odd));
    odd = plain;
    odd[0].flags = 0x0100;
    std::fill(odd[0].body.begin() + 81, odd[0].body.end(), 0x5a);
    odd[1].flags = 0x00fe;  // reserved flag bits
    odd[1].body[2] = 0x77;  // tcp reserved
    emit("metadata", "ignored-bytes-set", build(odd));

    // refused versions and sections
    emit("metadata", "major1", build(plain, 0, 1));
    emit("metadata", "major3", build(plain, 0, 3));
    std::vector<Sec> e = plain;
    e.push_back(Sec{0x200, 1, Bytes(4, 0)});
    emit("metadata", "unknown-critical", build(e, 1));
    e = plain;
    e.push_back(plain[1]);
    emit("metadata", "duplicate-tcp", build(e));
    e = plain;
    e.push_back(plain[0]);
    emit("metadata", "duplicate-core", build(e));
    e = {plain[1]};
    emit("metadata", "no-core", build(e));
    e = plain;
    e.push_back(Sec{0, 0, Bytes(4, 0)});
    emit("metadata", "section-type0", build(e));

    // invalid values behind a valid checksum (the fuzz target's invariant
    // checks catch a decoder that accepts them)
    auto edited = [&](const char *name, size_t sec, size_t off, const Bytes &val) {
        std::vector<Sec> x = plain;
        std::copy(val.begin(), val.end(), x[sec].body.begin() + static_cast<long>(off));
        emit("metadata", name, build(x));
    };
    edited("tcp-port0", 1, 4 + 2, {0, 0});
    edited("tcp-family5", 1, 4, {5});
    edited("tcp-pad", 1, 5, {1});
    edited("tcp-ipv4-tail", 1, 4 + 4 + 4, {1});
    edited("tcp-count17", 1, 0, {17, 0});
    edited("tcp-count0", 1, 0, {0, 0});
    edited("tcp-count2-short", 1, 0, {2, 0});
    edited("bad-blocks0", 0, 8, Bytes(8, 0));
    edited("bad-blocklen0", 0, 16, Bytes(8, 0));
    edited("bad-overflow", 0, 8, {0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0});  // 2^33 x 2^31
    edited("bad-fplen8", 0, 64, {8, '0', '1', '2', '3', '4', '5', '6', '7'});
    edited("bad-fp-upper", 0, 64, {16, 'A', 'B', 'C', 'D', 'E', 'F', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'});

    // damaged blobs
    Bytes t = encode_metadata(base_meta());
    Bytes trunc(t.begin(), t.end() - 9);
    emit("metadata", "truncated", trunc);
    Bytes trail = t;
    trail.push_back(0);
    emit("metadata", "trailing", trail);
    Bytes flip = t;
    flip[40] ^= 0x10;
    emit("metadata", "bad-checksum", flip);
}

// ------------------------------------------------------------------ handshake

hs::Hello hello() { return hs::Hello{0x1122334455667788ull}; }

hs::Challenge challenge() {
    hs::Challenge c;
    c.challenge_id = 0x01020304;
    for (size_t i = 0; i < c.nonce.size(); i++) c.nonce[i] = static_cast<uint8_t>(0xc0 + i);
    return c;
}

// Fixed bytes where the real protocol has random ones or proofs (decoding
// does not check proofs; the fuzz target computes its own).
hs::Auth auth() {
    hs::Auth a;
    a.instance_id = hello().instance_id;
    a.challenge_id = challenge().challenge_id;
    a.fingerprint = hs::fingerprint_bytes("0123456789abcdef");
    for (size_t i = 0; i < a.nonce.size(); i++) a.nonce[i] = static_cast<uint8_t>(0xa0 + i);
    for (size_t i = 0; i < a.proof.size(); i++) a.proof[i] = static_cast<uint8_t>(0x70 + i);
    return a;
}

hs::Accept accept() {
    hs::Accept a;
    for (size_t i = 0; i < a.proof.size(); i++) a.proof[i] = static_cast<uint8_t>(0x90 + i);
    return a;
}

template <typename M>
Bytes msg(const M &m) {
    uint8_t b[hs::kMaxMessageLen];
    size_t n = hs::encode(m, b);
    return Bytes(b, b + n);
}

void handshake_seeds() {
    emit("handshake", "hello", msg(hello()));
    emit("handshake", "challenge", msg(challenge()));
    emit("handshake", "auth", msg(auth()));
    hs::Auth none = auth();
    none.fingerprint = {};
    emit("handshake", "auth-no-fingerprint", msg(none));
    emit("handshake", "accept", msg(accept()));
    emit("handshake", "refuse-eauth", msg(hs::Refuse{KVX_EAUTH}));
    emit("handshake", "refuse-efingerprint", msg(hs::Refuse{KVX_EFINGERPRINT}));
    emit("handshake", "refuse-econnrefused", msg(hs::Refuse{KVX_ECONNREFUSED}));
    emit("handshake", "refuse-eversion", msg(hs::Refuse{KVX_EVERSION}));

    // padded as IB CM pads private data (56 bytes in a REQ, more in a REJECT)
    Bytes b = msg(hello());
    b.resize(hs::kAuthLen, 0);
    emit("handshake", "hello-padded", b);
    b = msg(challenge());
    b.resize(148, 0);
    emit("handshake", "challenge-padded", b);
    b = msg(accept());
    b.resize(196, 0);
    emit("handshake", "accept-padded", b);

    // truncated
    b = msg(auth());
    b.pop_back();
    emit("handshake", "auth-truncated", b);
    b.resize(hs::kHeaderLen);
    emit("handshake", "header-only", b);
    b.resize(5);
    emit("handshake", "short-header", b);

    // another protocol version, and headers or bodies this version refuses
    b = msg(hello());
    b[4] = hs::kVersion + 1;
    emit("handshake", "version-2", b);
    b = msg(auth());
    b[4] = 0;
    emit("handshake", "version-0-auth", b);
    b = msg(hello());
    b[5] = 6;
    emit("handshake", "unknown-kind", b);
    b = msg(hello());
    b[6] = 1;
    emit("handshake", "reserved-set", b);
    b = msg(hello());
    b[0] = 'X';
    emit("handshake", "bad-magic", b);
    emit("handshake", "refuse-bad-status", msg(hs::Refuse{-1}));
    hs::Auth flagged = auth();
    flagged.flags = 1;
    emit("handshake", "auth-flags", msg(flagged));
    hs::Accept aflags = accept();
    aflags.flags = 1;
    emit("handshake", "accept-flags", msg(aflags));
}

// ------------------------------------------------------------------ frames

// geometry bytes for a real region of nb blocks of bl bytes (see fuzz_frame.cpp)
Bytes real_geom(unsigned bl, unsigned nb) { return {static_cast<uint8_t>(bl - 1), static_cast<uint8_t>(nb - 1)}; }

void frame(Bytes &b, uint16_t flags, uint64_t seq, const std::vector<Segment> &segs, bool with_payload = true,
           uint8_t fill = 0x5c) {
    FrameHeader h;
    h.type = kFrameWrite;
    h.flags = flags;
    h.seq = seq;
    h.nseg = static_cast<uint32_t>(segs.size());
    for (const auto &s : segs) h.total_len += s.len;
    uint8_t hb[kFrameHeaderLen];
    encode_frame_header(h, hb);
    b.insert(b.end(), hb, hb + sizeof hb);
    for (const auto &s : segs) {
        uint8_t sb[kSegLen];
        encode_segment(s, sb);
        b.insert(b.end(), sb, sb + sizeof sb);
    }
    if (with_payload)
        for (const auto &s : segs)
            for (uint64_t i = 0; i < s.len; i++) b.push_back(static_cast<uint8_t>(fill + i));
}

void frame_seeds() {
    Bytes b = real_geom(64, 64);
    frame(b, 0, 1, {{0, 64}});
    emit("frame", "one-block", b);

    b = real_geom(64, 64);
    frame(b, kFlagAck, 7, {{64 * 3, 128}, {64 * 63, 64}, {0, 64}});
    frame(b, 0, 8, {{64 * 10, 64 * 4}});
    frame(b, kFlagAck, 9, {{64 * 62, 128}});
    emit("frame", "three-frames-ack", b);

    b = real_geom(16, 8);
    frame(b, kFlagAck, 1, {{0, 16 * 8}}, false);  // payload missing: zero filled
    emit("frame", "whole-region-short-payload", b);

    b = real_geom(1, 64);
    std::vector<Segment> many;
    for (uint64_t i = 0; i < kFrameMaxSegs; i++) many.push_back({(i * 7) % 64, 1});
    frame(b, kFlagAck, 2, many, false);
    emit("frame", "max-segments", b);

    b = real_geom(3, 5);
    frame(b, 0, 1, {{3, 6}, {12, 3}});
    emit("frame", "odd-block-len", b);

    b = real_geom(128, 1);
    frame(b, kFlagAck, 0xffffffffffffffffull, {{0, 128}});
    emit("frame", "single-block-region", b);

    // a frame that must be refused after a good one
    b = real_geom(64, 64);
    frame(b, 0, 1, {{0, 64}});
    frame(b, 0, 2, {{64 * 64, 64}});
    emit("frame", "outside-after-good", b);
    b = real_geom(64, 64);
    frame(b, 0, 1, {{32, 64}});
    emit("frame", "unaligned", b);

    // virtual geometries (never allocated): regions up to 2^64 - 1 bytes, where
    // offset + length would wrap around. A payload left out is consumed from
    // whatever follows, so frames without payload come last.
    b = {0x80 | 20, 0};  // block_len 2^20, region 2^64 - 2^20
    const uint64_t bl20 = 1ull << 20, top20 = (UINT64_MAX / bl20) * bl20;
    frame(b, 0, 1, {{top20 - bl20, bl20}}, false);
    emit("frame", "virtual-last-block", b);
    b = {0x80 | 20, 0};
    frame(b, 0, 1, {{top20 - bl20, 2 * bl20}}, false);
    emit("frame", "virtual-wraps", b);
    b = {0x80, 0};  // block_len 1, region 2^64 - 1
    frame(b, kFlagAck, 1, {{UINT64_MAX - 4, 4}, {0, 1}});
    frame(b, 0, 2, {{UINT64_MAX - 1, 2}});
    emit("frame", "virtual-bl1-wraps", b);
    b = {0x80, 0};
    frame(b, 0, 1, {{0, 3}, {0, UINT64_MAX}}, false);  // lengths sum to 2 modulo 2^64 = total_len
    emit("frame", "virtual-sum-wraps", b);
    b = {0x80 | 40, 0x80};
    const uint64_t bl40 = 3ull << 40;
    frame(b, kFlagAck, 1, {{bl40 * 5, bl40 * 2}, {0, bl40}}, false);
    emit("frame", "virtual-3x2e40", b);
    b = {0x80 | 30, 2};  // block_len 2^30 > kFrameMaxPayload: one block per frame
    frame(b, 0, 1, {{1ull << 31, 1ull << 30}}, false);
    emit("frame", "virtual-huge-block", b);

    // the handshake a target reads first (HELLO, AUTH), then a frame
    b = real_geom(64, 64);
    uint8_t mb[hs::kMaxMessageLen];
    b.insert(b.end(), mb, mb + hs::encode(hello(), mb));
    b.insert(b.end(), mb, mb + hs::encode(auth(), mb));
    frame(b, kFlagAck, 1, {{0, 64}});
    emit("frame", "handshake-then-frame", b);

    uint8_t ab[kAckLen];
    encode_ack(Ack{0, 42}, ab);
    b = real_geom(64, 64);
    b.insert(b.end(), ab, ab + sizeof ab);
    emit("frame", "ack", b);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    g_out = argv[1];
    metadata_seeds();
    frame_seeds();
    handshake_seeds();
    fprintf(stderr, "gen_seeds: wrote %d seeds under %s\n", g_count, argv[1]);
    return 0;
}
