// The tcp backend's data frames (docs/wire-format.md, "tcp stream"); the
// connection starts with the shared handshake (handshake/handshake.h).
// Everything received from a socket goes through these parsers before a byte
// touches the region; they are pure functions, fuzzed in tests/fuzz/fuzz_frame.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>


#include "util/net.h"
#include "wire/metadata.h"

namespace kvx::tcp {

// The tcp section of the metadata (its registry id, the section's type):
// the endpoints to connect to, in order of preference.
constexpr uint16_t kSectionId = 2;
constexpr uint8_t kSectionVersion = 0;

// tcp's flag in the handshake's AUTH and ACCEPT (docs/wire-format.md): after
// the handshake every record is AES-128-GCM with the handshake's data keys.
constexpr uint32_t kFlagAead = 1u << 0;
// With kFlagAead (since 0.8, offered and taken when the other side knows it):
// a frame's payload is sealed as records of at most kSealedRecordMax bytes,
// each with its tag, so the target opens one record aside and lands only
// authenticated bytes (docs/wire-format.md, "Staged records").
constexpr uint32_t kFlagAeadRecords = 1u << 1;
constexpr size_t kSealedRecordMax = 256 << 10;
// Offered by an initiator (since 0.12) to a target whose section says
// kSectionFence: its streams join a session (kFrameJoin), and a stream may
// close another of its session at the target (kFrameFence) before it carries
// what the other owed, so a stream taken out lands nothing afterwards.
constexpr uint32_t kFlagFence = 1u << 2;
// The section's flags (its second u16, zero before 0.8, which readers of
// 0.7 and older ignore): what this target's tcp knows.
constexpr uint16_t kSectionRecords = 1u << 0;  // it takes kFlagAeadRecords (0.8 and later)
constexpr uint16_t kSectionFence = 1u << 1;    // it takes kFlagFence (0.12 and later)
wire::Section encode_section(const std::vector<net::Endpoint> &eps, uint16_t flags = 0);
uint16_t section_flags(const wire::Section &s);
// Throws Error(KVX_EBADMETA) naming the defect.
std::vector<net::Endpoint> decode_section(const wire::Section &s);


constexpr uint32_t kFrameMagic = 0x4658564bu;  // "KVXF"
constexpr uint32_t kAckMagic = 0x4158564bu;    // "KVXA"
constexpr size_t kFrameMaxSegs = 1024;                 // one readv() (IOV_MAX)
constexpr uint64_t kFrameMaxPayload = 256ull << 20;    // bytes per frame (a larger block travels alone)

struct FrameHeader {
    uint16_t type = 1;   // 1 = WRITE
    uint16_t flags = 0;  // bit 0: ACK requested after this frame
    uint64_t seq = 0;
    uint32_t nseg = 0;
    uint64_t total_len = 0;
};
constexpr size_t kFrameHeaderLen = 32;
constexpr size_t kSegLen = 16;
constexpr uint16_t kFrameWrite = 1;
constexpr uint16_t kFlagAck = 1;
// Control frames (kFlagFence agreed): a header (flags, seq, nseg, total_len
// all 0) and a body of kControlLen bytes, no payload.
constexpr uint16_t kFrameJoin = 2;   // this stream is number `stream` of `session`
constexpr uint16_t kFrameFence = 3;  // close stream number `stream` of this stream's session
constexpr uint16_t kFrameNop = 4;    // nothing (bytes in flight, so that a dead path shows as resends)
constexpr size_t kControlLen = 16;
constexpr uint32_t kMaxStreamIndex = 1u << 16;  // indexes of one session, never reused

struct Control {
    uint16_t type = kFrameJoin;
    uint64_t session = 0;  // random, not 0
    uint32_t stream = 0;   // < kMaxStreamIndex
};

struct Segment {
    uint64_t offset = 0;  // remote region offset
    uint64_t len = 0;
};

struct Ack {
    int32_t status = 0;
    uint64_t seq = 0;
};
constexpr size_t kAckLen = 16;

void encode_frame_header(const FrameHeader &h, uint8_t out[kFrameHeaderLen]);
void encode_segment(const Segment &s, uint8_t out[kSegLen]);
void encode_ack(const Ack &a, uint8_t out[kAckLen]);
Ack decode_ack(const uint8_t in[kAckLen]);

// Validates a received frame header; throws Error(KVX_EINVAL) naming the
// defect. Control frames are valid only where `controls` (kFlagFence agreed).
FrameHeader decode_frame_header(const uint8_t in[kFrameHeaderLen], uint64_t block_len, bool controls = false);
bool is_control(const FrameHeader &h);

// A control frame: header and body, kFrameHeaderLen + kControlLen bytes.
void encode_control(const Control &c, uint8_t out[kFrameHeaderLen + kControlLen]);
// The body of a control frame whose header decoded; throws Error(KVX_EINVAL).
Control decode_control(const FrameHeader &h, const uint8_t body[kControlLen]);

// Validates nseg segments (header already validated): each inside a region
// of region_len bytes, on block boundaries, lengths summing to total_len.
std::vector<Segment> decode_segments(const uint8_t *in, const FrameHeader &h, uint64_t block_len,
                                     uint64_t region_len);

}  // namespace kvx::tcp
