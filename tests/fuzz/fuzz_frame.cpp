// libFuzzer target: the tcp backend's receive path: the frame parsers of
// src/backends/tcp/tcp_wire.cpp as used by src/backends/tcp/tcp_conn.cpp
// after the handshake, and the shared handshake's stream framing
// (src/handshake/handshake.cpp: message_len, decode) on the stream prefix.
//
// Input layout:
//   byte 0, byte 1   geometry (see Geometry below)
//   bytes 2..        the byte stream the receiver reads from the socket:
//                    frame header (32) -> segment table (16 x nseg) -> payload,
//                    frame after frame.
// Real geometries (byte 0 < 0x80) allocate a region of num_blocks x block_len
// bytes (<= 64 x 128) between guard zones, apply every accepted segment's
// payload to it as readv() would (taken from the input; zero-filled when the
// input runs short, as if the peer sent zeros), and abort if a guard byte
// changes. Virtual geometries (byte 0 >= 0x80) use huge block lengths and
// regions (up to 2^64 - 1 bytes) that are never allocated: they exercise the
// overflow-sensitive bound checks, the payload is only consumed.
// Every accepted header/segment table is also checked against the documented
// rules independently of the parser. The same stream prefix also goes through
// the handshake reader (header, message_len, decode: up to two messages, each
// must re-encode to its bytes) and the ack decoder; the deeper handshake
// properties are fuzz_handshake.cpp's. Any exception other than kvx::Error
// with KVX_EINVAL (KVX_EVERSION for a handshake header) is a bug.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kvxfer.h"
#include "util/error.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/handshake.h"

using namespace kvx::tcp;
namespace hs = kvx::handshake;

namespace {

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_frame: %s\n", what);
    abort();
}

constexpr size_t kGuard = 64;
constexpr uint8_t guard_byte(size_t i) { return static_cast<uint8_t>(0xa5 ^ (i * 31)); }
constexpr int kMaxFrames = 32;

struct Geometry {
    uint64_t block_len;
    uint64_t num_blocks;
    bool real;  // a real region is allocated and written
};

Geometry geometry(uint8_t b0, uint8_t b1) {
    if (b0 < 0x80) return {1u + b0, 1u + b1 % 64u, true};
    // block_len = (1..4) << shift, region as large as 64 bits allow (shifted down by b1 & 63)
    unsigned shift = b0 & 63u;
    uint64_t mult = 1u + (b1 >> 6);
    if (shift > 61) mult = 1;
    uint64_t bl = mult << shift;
    uint64_t nb = (UINT64_MAX / bl) >> (b1 & 63u);
    if (nb == 0) nb = 1;
    return {bl, nb, false};
}

void check_code(const kvx::Error &e, bool version_ok) {
    if (e.code() == KVX_EINVAL || (version_ok && e.code() == KVX_EVERSION)) return;
    fprintf(stderr, "fuzz_frame: unexpected code %d: %s\n", e.code(), e.what());
    abort();
}

// Exact-size heap copy of up to n bytes of the input, zero padded, so that an
// overread by a fixed-size decoder is an ASan report.
std::unique_ptr<uint8_t[]> exact(const uint8_t *p, size_t avail, size_t n) {
    std::unique_ptr<uint8_t[]> b(new uint8_t[n]);
    memset(b.get(), 0, n);
    memcpy(b.get(), p, std::min(avail, n));
    return b;
}

// Re-encodes a decoded handshake message; returns its length.
size_t encode_message(const hs::Message &m, uint8_t *out) {
    switch (m.kind) {
    case hs::Kind::hello: return hs::encode(m.hello, out);
    case hs::Kind::auth: return hs::encode(m.auth, out);
    case hs::Kind::challenge: return hs::encode(m.challenge, out);
    case hs::Kind::refuse: return hs::encode(m.refuse, out);
    case hs::Kind::accept: return hs::encode(m.accept, out);
    }
    die("decode returned an unknown message kind");
}

// The stream starts with the shared handshake (HELLO, then AUTH), read as
// tcp_conn.cpp reads it: the 8-byte header, message_len() of it, the rest,
// decode(). The initiator reads acks (decode_ack) from its side of the stream.
void stream_prefix(const uint8_t *p, size_t n) {
    for (int i = 0; i < 2 && n >= hs::kHeaderLen; i++) {
        auto hb = exact(p, n, hs::kHeaderLen);
        size_t len = 0;
        try {
            len = hs::message_len(hb.get());
        } catch (const kvx::Error &e) {
            check_code(e, true);
            break;  // refused, connection closed
        }
        if (len < hs::kHeaderLen || len > hs::kMaxMessageLen) die("message_len out of range");
        if (n < len) break;  // the target would wait for the rest
        auto mb = exact(p, n, len);
        hs::Message m;
        try {
            m = hs::decode(mb.get(), len);
        } catch (const kvx::Error &e) {
            if (e.code() != KVX_EINVAL) die("decode refused with another code than message_len's header accepted");
            break;
        }
        uint8_t re[hs::kMaxMessageLen];
        if (encode_message(m, re) != len || memcmp(re, mb.get(), len) != 0)
            die("handshake message does not re-encode to its bytes");
        p += len;
        n -= len;
    }
}

void ack_prefix(const uint8_t *p, size_t n) {
    auto b = exact(p, n, kAckLen);
    try {
        Ack a = decode_ack(b.get());
        uint8_t re[kAckLen];
        encode_ack(a, re);
        if (memcmp(re, b.get(), kAckLen) != 0) die("ack does not re-encode to its bytes");
    } catch (const kvx::Error &e) {
        check_code(e, false);
    }
}

void check_header(const FrameHeader &h, const uint8_t *raw, uint64_t bl) {
    if (h.type != kFrameWrite) die("accepted an unknown frame type");
    if (h.flags & ~kFlagAck) die("accepted unknown frame flags");
    if (h.nseg == 0 || h.nseg > kFrameMaxSegs) die("accepted a segment count out of range");
    if (h.total_len == 0 || h.total_len > std::max<uint64_t>(kFrameMaxPayload, bl)) die("accepted a bad payload length");
    uint8_t re[kFrameHeaderLen];
    encode_frame_header(h, re);
    if (memcmp(re, raw, kFrameHeaderLen) != 0) die("frame header does not re-encode to its bytes");
}

void check_segments(const std::vector<Segment> &segs, const FrameHeader &h, uint64_t bl, uint64_t region_len) {
    if (segs.size() != h.nseg) die("segment vector size differs from nseg");
    uint64_t sum = 0;
    for (const Segment &s : segs) {
        if (s.len == 0) die("accepted an empty segment");
        if (s.offset % bl || s.len % bl) die("accepted a segment not on block boundaries");
        if (s.offset > region_len || s.len > region_len - s.offset) die("accepted a segment outside the region");
        if (s.len > UINT64_MAX - sum) die("accepted segment lengths whose sum overflows");
        sum += s.len;
    }
    if (sum != h.total_len) die("accepted segment lengths that do not add up to total_len");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const Geometry g = geometry(data[0], data[1]);
    const uint8_t *p = data + 2;
    size_t left = size - 2;

    stream_prefix(p, left);
    ack_prefix(p, left);

    const uint64_t region_len = g.num_blocks * g.block_len;
    std::unique_ptr<uint8_t[]> mem;
    uint8_t *region = nullptr;
    if (g.real) {
        mem.reset(new uint8_t[kGuard + region_len + kGuard]);
        for (size_t i = 0; i < kGuard; i++) {
            mem[i] = guard_byte(i);
            mem[kGuard + region_len + i] = guard_byte(i + kGuard);
        }
        memset(mem.get() + kGuard, 0, region_len);
        region = mem.get() + kGuard;
    }

    for (int frame = 0; frame < kMaxFrames && left >= kFrameHeaderLen; frame++) {
        auto hb = exact(p, left, kFrameHeaderLen);
        p += kFrameHeaderLen;
        left -= kFrameHeaderLen;
        FrameHeader h;
        // Half the geometries agree on fencing (kFlagFence): control frames
        // are valid there, a header and a body of kControlLen bytes.
        const bool controls = (g.num_blocks & 1) != 0;
        try {
            h = decode_frame_header(hb.get(), g.block_len, controls);
        } catch (const kvx::Error &e) {
            check_code(e, false);
            break;  // the receiver closes the connection
        }
        if (is_control(h)) {
            if (!controls || h.flags || h.seq || h.nseg || h.total_len) die("control frame accepted against the rules");
            if (left < kControlLen) break;
            auto body = exact(p, left, kControlLen);
            p += kControlLen;
            left -= kControlLen;
            try {
                Control c = decode_control(h, body.get());
                if (c.session == 0 || c.stream >= kMaxStreamIndex) die("control body accepted against the rules");
                uint8_t again[kFrameHeaderLen + kControlLen];
                encode_control(c, again);
                if (memcmp(again, hb.get(), kFrameHeaderLen) != 0 || memcmp(again + kFrameHeaderLen, body.get(), kControlLen) != 0)
                    die("control frame does not re-encode to its bytes");
            } catch (const kvx::Error &e) {
                check_code(e, false);
                break;
            }
            continue;
        }
        check_header(h, hb.get(), g.block_len);

        const size_t table = h.nseg * kSegLen;
        if (left < table) break;  // the receiver would wait for more bytes / see EOF
        auto tb = exact(p, left, table);
        p += table;
        left -= table;
        std::vector<Segment> segs;
        try {
            segs = decode_segments(tb.get(), h, g.block_len, region_len);
        } catch (const kvx::Error &e) {
            check_code(e, false);
            break;
        }
        check_segments(segs, h, g.block_len, region_len);

        // readv(): payload segment after segment, straight into the region
        for (const Segment &s : segs) {
            const size_t have = static_cast<size_t>(std::min<uint64_t>(s.len, left));
            if (g.real) {
                memcpy(region + s.offset, p, have);
                memset(region + s.offset + have, 0, s.len - have);
                if (memcmp(region + s.offset, p, have) != 0) die("payload did not land where the segment says");
            }
            p += have;
            left -= have;
        }
        if (g.real) {
            for (size_t i = 0; i < kGuard; i++)
                if (mem[i] != guard_byte(i) || mem[kGuard + region_len + i] != guard_byte(i + kGuard))
                    die("a write landed outside the region (guard byte changed)");
        }
        if (h.flags & kFlagAck) {
            uint8_t ack[kAckLen];
            encode_ack(Ack{0, h.seq}, ack);
            Ack a = decode_ack(ack);
            if (a.seq != h.seq || a.status != 0) die("ack round trip");
        }
    }
    return 0;
}
