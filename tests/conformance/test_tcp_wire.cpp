// tcp backend, seen from a hostile client: a connection without the secret, a
// connection with another fingerprint, and authenticated frames pointing
// outside the region are all closed before a byte reaches the region.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "util/net.h"
#include "wire/frame.h"
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

// Connects and runs the handshake with the given secret and fingerprint;
// returns the fd and the server's verdict status.
int handshake(const Target &tg, const std::array<uint8_t, 32> &secret, const char *fp, int *status) {
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    kvx::net::Fd fd;
    assert_int_equal(kvx::net::connect_by(tg.meta.tcp.back(), deadline, &fd), 0);
    uint8_t shb[kvx::wire::kServerHelloLen];
    assert_int_equal(kvx::net::read_full_by(fd.get(), shb, sizeof shb, deadline), 0);
    kvx::wire::ServerHello sh = kvx::wire::decode_server_hello(shb);
    kvx::wire::ClientHello ch;
    ch.instance_id = tg.meta.instance_id;
    ch.nonce.fill(3);
    if (fp) memcpy(ch.fingerprint.data(), fp, 16);
    ch.mac = kvx::wire::client_mac(secret, sh, ch);
    uint8_t chb[kvx::wire::kClientHelloLen];
    kvx::wire::encode_client_hello(ch, chb);
    assert_int_equal(kvx::net::write_full_by(fd.get(), chb, sizeof chb, deadline), 0);
    uint8_t vb[kvx::wire::kVerdictLen];
    assert_int_equal(kvx::net::read_full_by(fd.get(), vb, sizeof vb, deadline), 0);
    *status = kvx::wire::decode_verdict(vb).status;
    kvx::net::set_blocking(fd.get(), true);
    return fd.release();
}

// Sends one frame with the given segments and payload; returns 0 if the server
// acknowledged it, -1 if it closed the connection.
int send_frame(int fd, const std::vector<kvx::wire::Segment> &segs, uint64_t total, const std::vector<uint8_t> &payload) {
    std::vector<uint8_t> buf(kvx::wire::kFrameHeaderLen + segs.size() * kvx::wire::kSegLen);
    kvx::wire::FrameHeader h;
    h.flags = kvx::wire::kFlagAck;
    h.seq = 77;
    h.nseg = static_cast<uint32_t>(segs.size());
    h.total_len = total;
    kvx::wire::encode_frame_header(h, buf.data());
    for (size_t i = 0; i < segs.size(); i++)
        kvx::wire::encode_segment(segs[i], buf.data() + kvx::wire::kFrameHeaderLen + i * kvx::wire::kSegLen);
    buf.insert(buf.end(), payload.begin(), payload.end());
    kvx::net::write_full(fd, buf.data(), buf.size());  // may fail half-way once the server closes
    uint8_t ack[kvx::wire::kAckLen];
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (kvx::net::read_full(fd, ack, sizeof ack) != 0) return -1;
    kvx::wire::Ack a = kvx::wire::decode_ack(ack);
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

void bad_frame(const std::vector<kvx::wire::Segment> &segs, uint64_t total) {
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
