// Writes the seed inputs of the fuzz corpora:
//   kvx_fuzz_gen_seeds OUT_DIR      -> OUT_DIR/metadata/seed-*, OUT_DIR/frame/seed-*
// The committed corpora (tests/fuzz/corpus/{metadata,frame}) are these seeds
// plus inputs the fuzzers found interesting (merged with -merge=1). Re-run
// after a wire format change and commit the result:
//   kvx_fuzz_gen_seeds tests/fuzz/corpus

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvxfer.h"
#include "wire/frame.h"
#include "wire/metadata.h"
#include "meta_writer.h"

using namespace kvx::wire;
using kvx::testing::Bytes;
using kvx::testing::le;
using kvx::testing::Sec;
namespace fs = std::filesystem;

namespace {

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

AgentMetadata base_meta() {
    AgentMetadata m;
    m.base_addr = 0x7f1234560000ull;
    m.num_blocks = 4096;
    m.block_len = 16384;
    m.instance_id = 0x1122334455667788ull;
    for (size_t i = 0; i < kSecretLen; i++) m.secret[i] = static_cast<uint8_t>(i * 13 + 1);
    m.tcp = {ep4(127, 0, 0, 1, 40000)};
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

Bytes build(const std::vector<Sec> &secs, uint16_t major, uint16_t minor) {
    return kvx::testing::assemble_metadata(secs, major, minor);
}

void metadata_seeds() {
    AgentMetadata m = base_meta();
    emit("metadata", "tcp-1ep", encode_metadata(m));

    m.fingerprint = "0123456789abcdef";
    m.tcp = {ep4(10, 1, 2, 3, 5000), ep6(1, 5001), ep4(127, 0, 0, 1, 5000)};
    emit("metadata", "tcp-v4-v6-fp", encode_metadata(m));

    m.tcp.clear();
    for (uint8_t i = 0; i < kMaxEndpoints; i++) m.tcp.push_back(i % 2 ? ep6(i, 1000 + i) : ep4(10, 0, 0, i, 1000 + i));
    emit("metadata", "tcp-16ep", encode_metadata(m));

    AgentMetadata v = base_meta();
    v.backend = BackendKind::verbs;
    v.verbs = VerbsInfo{ep4(192, 168, 0, 7, 4791), v.base_addr, v.num_blocks * v.block_len, 0x1234};
    emit("metadata", "verbs-and-tcp", encode_metadata(v));
    v.tcp.clear();
    v.fingerprint = "fedcba9876543210";
    v.verbs->cm = ep6(9, 4791);
    emit("metadata", "verbs-only-v6", encode_metadata(v));

    AgentMetadata s = base_meta();
    s.backend = BackendKind::shm;
    s.tcp.clear();
    emit("metadata", "shm", encode_metadata(s));

    AgentMetadata big = base_meta();
    big.num_blocks = UINT64_MAX;
    big.block_len = 1;
    emit("metadata", "max-region", encode_metadata(big));
    big.num_blocks = 1;
    big.block_len = UINT64_MAX;
    emit("metadata", "max-block", encode_metadata(big));

    // a newer minor: longer known sections, optional unknown sections
    std::vector<Sec> secs = sections_of(encode_metadata(base_meta()));
    secs[0].body.resize(secs[0].body.size() + 16, 0x11);
    secs[1].body.resize(secs[1].body.size() + 8, 0x22);
    secs.insert(secs.begin() + 1, Sec{0x100, 0, Bytes(12, 0x33)});
    secs.push_back(Sec{0x101, 0x8000, {}});
    emit("metadata", "minor1-extended", build(secs, 1, 1));

    // refused versions and sections
    std::vector<Sec> plain = sections_of(encode_metadata(base_meta()));
    emit("metadata", "major2", build(plain, 2, 0));
    std::vector<Sec> crit = plain;
    crit.push_back(Sec{0x200, 1, Bytes(4, 0)});
    emit("metadata", "unknown-critical", build(crit, 1, 1));
    std::vector<Sec> dup = plain;
    dup.push_back(plain[1]);
    emit("metadata", "duplicate-tcp", build(dup, 1, 0));

    // invalid values behind a valid checksum (the fuzz target's invariant
    // checks catch a decoder that accepts them)
    auto edited = [&](const char *name, size_t sec, size_t off, const Bytes &val) {
        std::vector<Sec> e = plain;
        std::copy(val.begin(), val.end(), e[sec].body.begin() + static_cast<long>(off));
        emit("metadata", name, build(e, 1, 0));
    };
    edited("bad-port0", 1, 4 + 2, {0, 0});
    edited("bad-family5", 1, 4, {5});
    edited("bad-pad", 1, 5, {1});
    edited("bad-ipv4-tail", 1, 4 + 4 + 4, {1});
    edited("bad-count17", 1, 0, {17, 0});
    edited("bad-count0", 1, 0, {0, 0});
    edited("bad-blocks0", 0, 8, Bytes(8, 0));
    edited("bad-blocklen0", 0, 16, Bytes(8, 0));
    edited("bad-overflow", 0, 8, {0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0});  // 2^33 x 2^31
    edited("bad-fplen8", 0, 64, {8, '0', '1', '2', '3', '4', '5', '6', '7'});
    edited("bad-fp-upper", 0, 64, {16, 'A', 'B', 'C', 'D', 'E', 'F', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'});
    edited("bad-backend4", 0, 81, {4});
    edited("bad-backend-verbs-no-section", 0, 81, {2});

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

    // handshake messages at the start of the stream
    ServerHello sh;
    sh.instance_id = 0xabcdef;
    for (size_t i = 0; i < kNonceLen; i++) sh.nonce[i] = static_cast<uint8_t>(i);
    uint8_t shb[kServerHelloLen];
    encode_server_hello(sh, shb);
    b = real_geom(64, 64);
    b.insert(b.end(), shb, shb + sizeof shb);
    emit("frame", "server-hello", b);

    ClientHello ch;
    ch.instance_id = sh.instance_id;
    ch.nonce = sh.nonce;
    memcpy(ch.fingerprint.data(), "0123456789abcdef", 16);
    std::array<uint8_t, kSecretLen> secret{};
    ch.mac = client_mac(secret, sh, ch);
    uint8_t chb[kClientHelloLen];
    encode_client_hello(ch, chb);
    b = real_geom(64, 64);
    b.insert(b.end(), chb, chb + sizeof chb);
    emit("frame", "client-hello", b);

    ServerVerdict v;
    v.status = KVX_EAUTH;
    uint8_t vb[kVerdictLen];
    encode_verdict(v, vb);
    b = real_geom(64, 64);
    b.insert(b.end(), vb, vb + sizeof vb);
    emit("frame", "verdict", b);

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
    fprintf(stderr, "gen_seeds: wrote %d seeds under %s\n", g_count, argv[1]);
    return 0;
}
