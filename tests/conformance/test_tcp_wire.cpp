// tcp backend, seen from a hostile client: a connection without the secret, a
// connection with another fingerprint, and authenticated frames pointing
// outside the region are all closed before a byte reaches the region.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "util/net.h"
#include "backends/tcp/tcp.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/handshake.h"
#include "wire/metadata.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

constexpr uint64_t kNB = 16, kBL = 4096;

struct Target {
    region r;
    kvx_transport *t = nullptr;
    metablob m;
    kvx::wire::AgentMetadata meta;
};

void target_up(Target &tg, const char *cfg) {
    tg.r = region_new(kNB, kBL, 0x77);
    tg.t = transport_new(&tg.r, cfg, test_options("backend=tcp", NULL));
    get_meta(tg.t, &tg.m);
    tg.meta = kvx::wire::decode_metadata(tg.m.bytes, tg.m.len);
}

void target_down(Target &tg) {
    kvx_transport_destroy(tg.t);
    region_free(&tg.r);
}

bool untouched(const Target &tg) {
    return region_guards_ok(&tg.r) && block_is(tg.r.base, kNB * kBL, 0x77);
}

// Reads one handshake message: its header, then the rest its kind needs.
kvx::handshake::Message read_message(int fd, kvx::net::Clock::time_point deadline) {
    kvx::handshake::Bytes b{};
    assert_int_equal(kvx::net::read_full_by(fd, b.data(), kvx::handshake::kHeaderLen, deadline), 0);
    size_t len = kvx::handshake::message_len(b.data());
    assert_int_equal(kvx::net::read_full_by(fd, b.data() + kvx::handshake::kHeaderLen, len - kvx::handshake::kHeaderLen,
                                            deadline), 0);
    return kvx::handshake::decode(b.data(), len);
}

// Connects and runs the handshake with the given secret and fingerprint;
// returns the fd and the server's verdict (0 or the refusal status).
int handshake(const Target &tg, const std::array<uint8_t, 32> &secret, const char *fp, int *status) {
    namespace hs = kvx::handshake;
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    kvx::net::Fd fd;
    const kvx::wire::Section *sec = tg.meta.find(2);
    assert_non_null(sec);
    assert_int_equal(kvx::net::connect_by(kvx::tcp::decode_section(*sec).back(), deadline, &fd), 0);
    hs::Bytes b{};
    assert_int_equal(kvx::net::write_full_by(fd.get(), b.data(), hs::encode(hs::Hello{tg.meta.instance_id}, b.data()),
                                             deadline), 0);
    hs::Message m = read_message(fd.get(), deadline);
    assert_int_equal(static_cast<int>(m.kind), static_cast<int>(hs::Kind::challenge));
    const hs::Challenge ch = m.challenge;
    hs::Auth a = hs::answer(ch, tg.meta.instance_id, secret, hs::fingerprint_bytes(fp ? fp : ""));
    assert_int_equal(kvx::net::write_full_by(fd.get(), b.data(), hs::encode(a, b.data()), deadline), 0);
    m = read_message(fd.get(), deadline);
    *status = m.kind == hs::Kind::refuse ? m.refuse.status : 0;
    if (m.kind == hs::Kind::accept)  // the target proves it holds the secret too
        hs::expect_accept(b.data(), hs::encode(m.accept, b.data()), ch, a, secret, "target");
    return fd.release();
}

// Sends one frame with the given segments and payload; returns 0 if the server
// acknowledged it, -1 if it closed the connection.
int send_frame(int fd, const std::vector<kvx::tcp::Segment> &segs, uint64_t total, const std::vector<uint8_t> &payload) {
    std::vector<uint8_t> buf(kvx::tcp::kFrameHeaderLen + segs.size() * kvx::tcp::kSegLen);
    kvx::tcp::FrameHeader h;
    h.flags = kvx::tcp::kFlagAck;
    h.seq = 77;
    h.nseg = static_cast<uint32_t>(segs.size());
    h.total_len = total;
    kvx::tcp::encode_frame_header(h, buf.data());
    for (size_t i = 0; i < segs.size(); i++)
        kvx::tcp::encode_segment(segs[i], buf.data() + kvx::tcp::kFrameHeaderLen + i * kvx::tcp::kSegLen);
    buf.insert(buf.end(), payload.begin(), payload.end());
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    kvx::net::write_full_by(fd, buf.data(), buf.size(), deadline);  // may fail half-way once the server closes
    uint8_t ack[kvx::tcp::kAckLen];
    if (kvx::net::read_full_by(fd, ack, sizeof ack, deadline) != 0) return -1;
    kvx::tcp::Ack a = kvx::tcp::decode_ack(ack);
    return a.seq == 77 && a.status == 0 ? 0 : -1;
}

void test_valid_frame_lands(void **) {
    Target tg;
    target_up(tg, nullptr);
    int st = 1;
    int fd = handshake(tg, tg.meta.secret, nullptr, &st);
    assert_int_equal(st, 0);
    std::vector<uint8_t> payload(2 * kBL, 0xEE);
    assert_int_equal(send_frame(fd, {{kBL, kBL}, {5 * kBL, kBL}}, 2 * kBL, payload), 0);
    assert_true(block_is(tg.r.base + kBL, kBL, 0xEE));
    assert_true(block_is(tg.r.base + 5 * kBL, kBL, 0xEE));
    assert_true(block_is(tg.r.base, kBL, 0x77));
    assert_true(region_guards_ok(&tg.r));
    close(fd);
    target_down(tg);
}

void test_forged_without_secret(void **) {
    Target tg;
    target_up(tg, nullptr);
    std::array<uint8_t, 32> wrong = tg.meta.secret;
    wrong[0] ^= 1;
    int st = 0;
    int fd = handshake(tg, wrong, nullptr, &st);
    assert_int_equal(st, KVX_EAUTH);
    std::vector<uint8_t> payload(kBL, 0xEE);
    assert_int_equal(send_frame(fd, {{0, kBL}}, kBL, payload), -1);
    close(fd);
    assert_true(untouched(tg));
    target_down(tg);
}

void test_wrong_fingerprint(void **) {
    Target tg;
    target_up(tg, "{\"model\":\"a\"}");
    int st = 0;
    int fd = handshake(tg, tg.meta.secret, "0123456789abcdef", &st);
    assert_int_equal(st, KVX_EFINGERPRINT);
    std::vector<uint8_t> payload(kBL, 0xEE);
    assert_int_equal(send_frame(fd, {{0, kBL}}, kBL, payload), -1);
    close(fd);
    assert_true(untouched(tg));
    target_down(tg);
}

void bad_frame(const std::vector<kvx::tcp::Segment> &segs, uint64_t total) {
    Target tg;
    target_up(tg, nullptr);
    int st = 1;
    int fd = handshake(tg, tg.meta.secret, nullptr, &st);
    assert_int_equal(st, 0);
    std::vector<uint8_t> payload(total < (1u << 20) ? total : 0, 0xEE);
    assert_int_equal(send_frame(fd, segs, total, payload), -1);
    close(fd);
    assert_true(untouched(tg));
    target_down(tg);
}

void test_frame_outside_region(void **) {
    bad_frame({{kNB * kBL, kBL}}, kBL);                       // just past the end
    bad_frame({{(kNB - 1) * kBL, 2 * kBL}}, 2 * kBL);         // straddles the end
    bad_frame({{UINT64_MAX - kBL + 1, kBL}}, kBL);            // offset + len wraps
    bad_frame({{kBL / 2, kBL}}, kBL);                         // not on a block boundary
    bad_frame({{0, kBL / 2}}, kBL / 2);                       // not whole blocks
    bad_frame({{0, kBL}, {kBL, kBL}}, kBL);                   // lengths exceed total
    bad_frame({{0, kBL}}, 2 * kBL);                           // total exceeds segments
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_frame_lands),
        cmocka_unit_test(test_forged_without_secret),
        cmocka_unit_test(test_wrong_fingerprint),
        cmocka_unit_test(test_frame_outside_region),
    };
    return cmocka_run_group_tests_name("tcp_wire", tests, nullptr, nullptr);
}
