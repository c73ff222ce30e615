#include "wire/frame.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "util/error.h"
#include "wire/bytes.h"

namespace kvx::wire {

namespace {

void check_magic(uint32_t got, uint32_t want, const char *what) {
    if (got != want) fail(KVX_EINVAL, "%s: bad magic 0x%08x", what, got);
}

void check_major(uint16_t got, const char *what) {
    if (got != kTcpMajor) fail(KVX_EVERSION, "%s: protocol major %u, this kvxfer speaks %u", what, got, kTcpMajor);
}

std::array<uint8_t, kMacLen> mac_over(const std::array<uint8_t, kSecretLen> &secret, const char *label,
                                      const ServerHello &s, const ClientHello &c) {
    Writer w;
    w.bytes(label, strlen(label) + 1);
    uint8_t sh[kServerHelloLen];
    encode_server_hello(s, sh);
    w.bytes(sh, sizeof sh);
    // the client hello without its MAC field
    uint8_t ch[kClientHelloLen];
    ClientHello c0 = c;
    c0.mac = {};
    encode_client_hello(c0, ch);
    w.bytes(ch, kClientHelloLen - kMacLen);
    std::array<uint8_t, kMacLen> out{};
    unsigned len = 0;
    if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), w.buf().data(), w.size(), out.data(), &len) ||
        len != kMacLen)
        fail(KVX_EINTERNAL, "HMAC-SHA256 failed");
    return out;
}

}  // namespace

void encode_server_hello(const ServerHello &h, uint8_t out[kServerHelloLen]) {
    put_le(out, kHelloMagic, 4);
    put_le(out + 4, h.major, 2);
    put_le(out + 6, 1, 2);  // message kind: server hello
    put_le(out + 8, h.instance_id, 8);
    memcpy(out + 16, h.nonce.data(), kNonceLen);
}

ServerHello decode_server_hello(const uint8_t in[kServerHelloLen]) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kHelloMagic, "server hello");
    ServerHello h;
    h.major = static_cast<uint16_t>(get_le(in + 4, 2));
    check_major(h.major, "server hello");
    if (get_le(in + 6, 2) != 1) fail(KVX_EINVAL, "server hello: wrong message kind");
    h.instance_id = get_le(in + 8, 8);
    memcpy(h.nonce.data(), in + 16, kNonceLen);
    return h;
}

void encode_client_hello(const ClientHello &h, uint8_t out[kClientHelloLen]) {
    put_le(out, kHelloMagic, 4);
    put_le(out + 4, h.major, 2);
    put_le(out + 6, 2, 2);  // message kind: client hello
    put_le(out + 8, h.instance_id, 8);
    memcpy(out + 16, h.nonce.data(), kNonceLen);
    memcpy(out + 16 + kNonceLen, h.fingerprint.data(), 16);
    memcpy(out + 32 + kNonceLen, h.mac.data(), kMacLen);
}

ClientHello decode_client_hello(const uint8_t in[kClientHelloLen]) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kHelloMagic, "client hello");
    ClientHello h;
    h.major = static_cast<uint16_t>(get_le(in + 4, 2));
    check_major(h.major, "client hello");
    if (get_le(in + 6, 2) != 2) fail(KVX_EINVAL, "client hello: wrong message kind");
    h.instance_id = get_le(in + 8, 8);
    memcpy(h.nonce.data(), in + 16, kNonceLen);
    memcpy(h.fingerprint.data(), in + 16 + kNonceLen, 16);
    memcpy(h.mac.data(), in + 32 + kNonceLen, kMacLen);
    return h;
}

void encode_verdict(const ServerVerdict &v, uint8_t out[kVerdictLen]) {
    put_le(out, kHelloMagic, 4);
    put_le(out + 4, static_cast<uint32_t>(v.status), 4);
    memcpy(out + 8, v.mac.data(), kMacLen);
}

ServerVerdict decode_verdict(const uint8_t in[kVerdictLen]) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kHelloMagic, "server verdict");
    ServerVerdict v;
    v.status = static_cast<int32_t>(get_le(in + 4, 4));
    if (v.status > 0 || v.status < -2000) fail(KVX_EINVAL, "server verdict: status %d out of range", v.status);
    memcpy(v.mac.data(), in + 8, kMacLen);
    return v;
}

void encode_frame_header(const FrameHeader &h, uint8_t out[kFrameHeaderLen]) {
    put_le(out, kFrameMagic, 4);
    put_le(out + 4, h.type, 2);
    put_le(out + 6, h.flags, 2);
    put_le(out + 8, h.seq, 8);
    put_le(out + 16, h.nseg, 4);
    put_le(out + 20, 0, 4);
    put_le(out + 24, h.total_len, 8);
}

FrameHeader decode_frame_header(const uint8_t in[kFrameHeaderLen], uint64_t block_len) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kFrameMagic, "frame");
    FrameHeader h;
    h.type = static_cast<uint16_t>(get_le(in + 4, 2));
    h.flags = static_cast<uint16_t>(get_le(in + 6, 2));
    h.seq = get_le(in + 8, 8);
    h.nseg = static_cast<uint32_t>(get_le(in + 16, 4));
    uint32_t reserved = static_cast<uint32_t>(get_le(in + 20, 4));
    h.total_len = get_le(in + 24, 8);
    if (h.type != kFrameWrite) fail(KVX_EINVAL, "frame: unknown type %u", h.type);
    if (h.flags & ~kFlagAck) fail(KVX_EINVAL, "frame: unknown flags 0x%x", h.flags);
    if (reserved != 0) fail(KVX_EINVAL, "frame: reserved field is 0x%x, not 0", reserved);
    if (h.nseg == 0 || h.nseg > kFrameMaxSegs) fail(KVX_EINVAL, "frame: segment count %u out of range 1..%zu", h.nseg, kFrameMaxSegs);
    uint64_t max = std::max<uint64_t>(kFrameMaxPayload, block_len);
    if (h.total_len == 0 || h.total_len > max)
        fail(KVX_EINVAL, "frame: payload length %llu out of range 1..%llu", (unsigned long long)h.total_len,
             (unsigned long long)max);
    return h;
}

void encode_segment(const Segment &s, uint8_t out[kSegLen]) {
    put_le(out, s.offset, 8);
    put_le(out + 8, s.len, 8);
}

std::vector<Segment> decode_segments(const uint8_t *in, const FrameHeader &h, uint64_t block_len,
                                     uint64_t region_len) {
    std::vector<Segment> segs(h.nseg);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < h.nseg; i++) {
        Segment &s = segs[i];
        s.offset = get_le(in + i * kSegLen, 8);
        s.len = get_le(in + i * kSegLen + 8, 8);
        if (s.len == 0 || s.len % block_len != 0 || s.offset % block_len != 0)
            fail(KVX_EINVAL, "frame: segment %u (offset %llu, length %llu) is not whole blocks of %llu", i,
                 (unsigned long long)s.offset, (unsigned long long)s.len, (unsigned long long)block_len);
        if (s.offset > region_len || s.len > region_len - s.offset)
            fail(KVX_EINVAL, "frame: segment %u (offset %llu, length %llu) outside the %llu byte region", i,
                 (unsigned long long)s.offset, (unsigned long long)s.len, (unsigned long long)region_len);
        if (s.len > h.total_len - sum) {
            sum = h.total_len + 1;  // more than announced
            break;
        }
        sum += s.len;
    }
    if (sum != h.total_len)
        fail(KVX_EINVAL, "frame: segment lengths do not add up to the payload length %llu",
             (unsigned long long)h.total_len);
    return segs;
}

void encode_ack(const Ack &a, uint8_t out[kAckLen]) {
    put_le(out, kAckMagic, 4);
    put_le(out + 4, static_cast<uint32_t>(a.status), 4);
    put_le(out + 8, a.seq, 8);
}

Ack decode_ack(const uint8_t in[kAckLen]) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kAckMagic, "ack");
    Ack a;
    a.status = static_cast<int32_t>(get_le(in + 4, 4));
    a.seq = get_le(in + 8, 8);
    return a;
}

std::array<uint8_t, kMacLen> client_mac(const std::array<uint8_t, kSecretLen> &secret, const ServerHello &s,
                                        const ClientHello &c) {
    return mac_over(secret, "kvxfer tcp v1 client proof", s, c);
}

std::array<uint8_t, kMacLen> server_mac(const std::array<uint8_t, kSecretLen> &secret, const ServerHello &s,
                                        const ClientHello &c) {
    return mac_over(secret, "kvxfer tcp v1 server proof", s, c);
}

}  // namespace kvx::wire
