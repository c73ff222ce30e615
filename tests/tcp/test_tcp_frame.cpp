// Unit tests of the tcp frame parsers (src/backends/tcp/tcp_wire): frame
// headers, segment tables and acknowledgements.
// Project headers first: cmocka.h defines a fail() macro that would clash
// with kvx::fail() in util/error.h.
#include "kvxfer.h"
#include "backends/tcp/tcp_wire.h"
#include "util/error.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "unit_util.h"

using namespace kvx;
using namespace kvx::tcp;
using namespace kvx::testing;

namespace {

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

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_header),
        cmocka_unit_test(test_frame_segments),
        cmocka_unit_test(test_frame_max_segments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
