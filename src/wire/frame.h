// The tcp backend's wire protocol (docs/wire-format.md, "TCP stream").
// Everything received from a socket goes through these parsers before a byte
// touches the region; they are pure functions, fuzzed in tests/fuzz/fuzz_frame.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/metadata.h"

namespace kvx::wire {

constexpr uint16_t kTcpMajor = 1;
constexpr uint32_t kHelloMagic = 0x4858564bu;  // "KVXH"
constexpr uint32_t kFrameMagic = 0x4658564bu;  // "KVXF"
constexpr uint32_t kAckMagic = 0x4158564bu;    // "KVXA"
constexpr size_t kNonceLen = 32;
constexpr size_t kMacLen = 32;
constexpr size_t kFrameMaxSegs = 1024;                 // one readv() (IOV_MAX)
constexpr uint64_t kFrameMaxPayload = 256ull << 20;    // bytes per frame (a larger block travels alone)

// Server -> client, first bytes on a new connection.
struct ServerHello {
    uint16_t major = kTcpMajor;
    uint64_t instance_id = 0;
    std::array<uint8_t, kNonceLen> nonce{};
};
constexpr size_t kServerHelloLen = 4 + 2 + 2 + 8 + kNonceLen;

// Client -> server: proves it holds the secret without sending it.
struct ClientHello {
    uint16_t major = kTcpMajor;
    uint64_t instance_id = 0;  // the target it means (from the metadata)
    std::array<uint8_t, kNonceLen> nonce{};
    std::array<uint8_t, 16> fingerprint{};  // zero-padded, all zero = none
    std::array<uint8_t, kMacLen> mac{};
};
constexpr size_t kClientHelloLen = 4 + 2 + 2 + 8 + kNonceLen + 16 + kMacLen;

// Server -> client verdict. status 0 = accepted, else a KVX_E* code (negated).
struct ServerVerdict {
    int32_t status = 0;
    std::array<uint8_t, kMacLen> mac{};  // proves the server holds the secret too
};
constexpr size_t kVerdictLen = 4 + 4 + kMacLen;

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

struct Segment {
    uint64_t offset = 0;  // remote region offset
    uint64_t len = 0;
};

struct Ack {
    int32_t status = 0;
    uint64_t seq = 0;
};
constexpr size_t kAckLen = 16;

void encode_server_hello(const ServerHello &h, uint8_t out[kServerHelloLen]);
ServerHello decode_server_hello(const uint8_t in[kServerHelloLen]);
void encode_client_hello(const ClientHello &h, uint8_t out[kClientHelloLen]);
ClientHello decode_client_hello(const uint8_t in[kClientHelloLen]);
void encode_verdict(const ServerVerdict &v, uint8_t out[kVerdictLen]);
ServerVerdict decode_verdict(const uint8_t in[kVerdictLen]);
void encode_frame_header(const FrameHeader &h, uint8_t out[kFrameHeaderLen]);
void encode_segment(const Segment &s, uint8_t out[kSegLen]);
void encode_ack(const Ack &a, uint8_t out[kAckLen]);
Ack decode_ack(const uint8_t in[kAckLen]);

// Validates a received frame header; throws Error(KVX_EINVAL) naming the defect.
FrameHeader decode_frame_header(const uint8_t in[kFrameHeaderLen], uint64_t block_len);

// Validates nseg segments (header already validated): each inside a region
// of region_len bytes, on block boundaries, lengths summing to total_len.
std::vector<Segment> decode_segments(const uint8_t *in, const FrameHeader &h, uint64_t block_len,
                                     uint64_t region_len);

// HMAC-SHA256 over the handshake transcript.
std::array<uint8_t, kMacLen> client_mac(const std::array<uint8_t, kSecretLen> &secret, const ServerHello &s,
                                        const ClientHello &c);
std::array<uint8_t, kMacLen> server_mac(const std::array<uint8_t, kSecretLen> &secret, const ServerHello &s,
                                        const ClientHello &c);

}  // namespace kvx::wire
