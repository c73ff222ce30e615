#include "backends/tcp/tcp_wire.h"

#include "util/error.h"
#include "util/bytes.h"

namespace kvx::tcp {

namespace {

void check_magic(uint32_t got, uint32_t want, const char *what) {
    if (got != want) fail(KVX_EINVAL, "%s: bad magic 0x%08x", what, got);
}

}  // namespace

void encode_frame_header(const FrameHeader &h, uint8_t out[kFrameHeaderLen]) {
    put_le(out, kFrameMagic, 4);
    put_le(out + 4, h.type, 2);
    put_le(out + 6, h.flags, 2);
    put_le(out + 8, h.seq, 8);
    put_le(out + 16, h.nseg, 4);
    put_le(out + 20, 0, 4);
    put_le(out + 24, h.total_len, 8);
}

bool is_control(const FrameHeader &h) { return h.type == kFrameJoin || h.type == kFrameFence || h.type == kFrameNop; }

void encode_control(const Control &c, uint8_t out[kFrameHeaderLen + kControlLen]) {
    FrameHeader h;
    h.type = c.type;
    encode_frame_header(h, out);
    put_le(out + kFrameHeaderLen, c.session, 8);
    put_le(out + kFrameHeaderLen + 8, c.stream, 4);
    put_le(out + kFrameHeaderLen + 12, 0, 4);
}

Control decode_control(const FrameHeader &h, const uint8_t body[kControlLen]) {
    Control c;
    c.type = h.type;
    c.session = get_le(body, 8);
    c.stream = static_cast<uint32_t>(get_le(body + 8, 4));
    const uint32_t reserved = static_cast<uint32_t>(get_le(body + 12, 4));
    if (c.session == 0) fail(KVX_EINVAL, "control frame: session 0");
    if (c.stream >= kMaxStreamIndex)
        fail(KVX_EINVAL, "control frame: stream %u out of range 0..%u", c.stream, kMaxStreamIndex - 1);
    if (reserved != 0) fail(KVX_EINVAL, "control frame: reserved field is 0x%x, not 0", reserved);
    return c;
}

FrameHeader decode_frame_header(const uint8_t in[kFrameHeaderLen], uint64_t block_len, bool controls) {
    check_magic(static_cast<uint32_t>(get_le(in, 4)), kFrameMagic, "frame");
    FrameHeader h;
    h.type = static_cast<uint16_t>(get_le(in + 4, 2));
    h.flags = static_cast<uint16_t>(get_le(in + 6, 2));
    h.seq = get_le(in + 8, 8);
    h.nseg = static_cast<uint32_t>(get_le(in + 16, 4));
    uint32_t reserved = static_cast<uint32_t>(get_le(in + 20, 4));
    h.total_len = get_le(in + 24, 8);
    if (controls && is_control(h)) {
        if (h.flags != 0 || h.seq != 0 || h.nseg != 0 || reserved != 0 || h.total_len != 0)
            fail(KVX_EINVAL, "frame: control frame (type %u) with a field that must be 0", h.type);
        return h;
    }
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

wire::Section encode_section(const std::vector<net::Endpoint> &eps, uint16_t flags) {
    Writer w;
    w.u16(static_cast<uint16_t>(eps.size()));
    w.u16(flags);
    for (const auto &e : eps) wire::put_endpoint(w, e);
    return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
}

uint16_t section_flags(const wire::Section &s) {
    return s.body.size() >= 4 ? static_cast<uint16_t>(get_le(s.body.data() + 2, 2)) : 0;
}

std::vector<net::Endpoint> decode_section(const wire::Section &s) {
    Reader r(s.body.data(), s.body.size(), KVX_EBADMETA, "metadata tcp section");
    uint16_t cnt = r.u16("tcp.count");
    r.u16("tcp.flags");  // section_flags()
    if (cnt == 0 || cnt > wire::kMaxEndpoints)
        fail(KVX_EBADMETA, "metadata: tcp endpoint count %u out of range 1..%zu", cnt, wire::kMaxEndpoints);
    size_t want = 4 + wire::kEndpointLen * cnt;
    if (s.body.size() != want && !(s.version > kSectionVersion && s.body.size() > want))
        fail(KVX_EBADMETA, "metadata: tcp section is %zu bytes, expected %zu", s.body.size(), want);
    std::vector<net::Endpoint> eps;
    for (uint16_t i = 0; i < cnt; i++) eps.push_back(wire::get_endpoint(r));
    return eps;
}

}  // namespace kvx::tcp
