// tcp backend, seen from a hostile client: a connection without the secret, a
// connection with another fingerprint, and authenticated frames pointing
// outside the region are all closed before a byte reaches the region. And
// from a client that sends a payload in awkward pieces: it still lands.
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

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
    tg.t = transport_new(&tg.r, cfg, test_options("backend=tcp", "tcp.protection=none", NULL));
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
int handshake(const kvx::wire::AgentMetadata &meta, const std::array<uint8_t, 32> &secret, const char *fp,
              int *status, uint32_t flags = 0) {
    namespace hs = kvx::handshake;
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    kvx::net::Fd fd;
    const kvx::wire::Section *sec = meta.find(2);
    assert_non_null(sec);
    assert_int_equal(kvx::net::connect_by(kvx::tcp::decode_section(*sec).back(), deadline, &fd), 0);
    hs::Bytes b{};
    assert_int_equal(kvx::net::write_full_by(fd.get(), b.data(), hs::encode(hs::Hello{meta.instance_id}, b.data()),
                                             deadline), 0);
    hs::Message m = read_message(fd.get(), deadline);
    assert_int_equal(static_cast<int>(m.kind), static_cast<int>(hs::Kind::challenge));
    const hs::Challenge ch = m.challenge;
    hs::Auth a = hs::answer(ch, meta.instance_id, secret, hs::fingerprint_bytes(fp ? fp : ""), flags);
    assert_int_equal(kvx::net::write_full_by(fd.get(), b.data(), hs::encode(a, b.data()), deadline), 0);
    m = read_message(fd.get(), deadline);
    *status = m.kind == hs::Kind::refuse ? m.refuse.status : 0;
    if (m.kind == hs::Kind::accept)  // the target proves it holds the secret too
        hs::expect_accept(m.accept, ch, a, secret, "target");
    return fd.release();
}

// A connection to tg that passed the handshake with the right secret.
int authenticated(const Target &tg, uint32_t flags = 0) {
    int st = 1;
    int fd = handshake(tg.meta, tg.meta.secret, nullptr, &st, flags);
    assert_int_equal(st, 0);
    return fd;
}

// A frame's head (asking for an ack of seq 77) for the given segments.
std::vector<uint8_t> frame_head(const std::vector<kvx::tcp::Segment> &segs, uint64_t total) {
    std::vector<uint8_t> buf(kvx::tcp::kFrameHeaderLen + segs.size() * kvx::tcp::kSegLen);
    kvx::tcp::FrameHeader h;
    h.flags = kvx::tcp::kFlagAck;
    h.seq = 77;
    h.nseg = static_cast<uint32_t>(segs.size());
    h.total_len = total;
    kvx::tcp::encode_frame_header(h, buf.data());
    for (size_t i = 0; i < segs.size(); i++)
        kvx::tcp::encode_segment(segs[i], buf.data() + kvx::tcp::kFrameHeaderLen + i * kvx::tcp::kSegLen);
    return buf;
}

// 0 if the server acknowledged seq 77, -1 if it closed the connection.
int read_ack(int fd, kvx::net::Clock::time_point deadline) {
    uint8_t ack[kvx::tcp::kAckLen];
    if (kvx::net::read_full_by(fd, ack, sizeof ack, deadline) != 0) return -1;
    kvx::tcp::Ack a = kvx::tcp::decode_ack(ack);
    return a.seq == 77 && a.status == 0 ? 0 : -1;
}

// Sends one frame with the given segments and payload; returns 0 if the server
// acknowledged it, -1 if it closed the connection.
int send_frame(int fd, const std::vector<kvx::tcp::Segment> &segs, uint64_t total, const std::vector<uint8_t> &payload) {
    std::vector<uint8_t> buf = frame_head(segs, total);
    buf.insert(buf.end(), payload.begin(), payload.end());
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    kvx::net::write_full_by(fd, buf.data(), buf.size(), deadline);  // may fail half-way once the server closes
    return read_ack(fd, deadline);
}

void test_valid_frame_lands(void **) {
    Target tg;
    target_up(tg, nullptr);
    int fd = authenticated(tg);
    std::vector<uint8_t> payload(2 * kBL, 0xEE);
    assert_int_equal(send_frame(fd, {{kBL, kBL}, {5 * kBL, kBL}}, 2 * kBL, payload), 0);
    assert_true(block_is(tg.r.base + kBL, kBL, 0xEE));
    assert_true(block_is(tg.r.base + 5 * kBL, kBL, 0xEE));
    assert_true(block_is(tg.r.base, kBL, 0x77));
    assert_true(region_guards_ok(&tg.r));
    close(fd);
    target_down(tg);
}

// Frames sent back to back, each with fewer or more segments than the one
// before: the target reads the next head ahead with each payload, as large
// as the last head, so after a large head it reads part of the next payload
// too. Every frame lands whole, in order, each acknowledged once.
void test_frames_back_to_back(void **) {
    Target tg;
    target_up(tg, nullptr);
    int fd = authenticated(tg);
    const size_t shapes[] = {8, 1, 3, 16, 1, 2, 16, 16, 5};
    uint8_t want[kNB];
    for (uint64_t b = 0; b < kNB; b++) want[b] = 0x77;
    std::vector<uint8_t> wire;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        std::vector<kvx::tcp::Segment> segs;
        std::vector<uint8_t> payload;
        for (size_t i = 0; i < shapes[k]; i++) {
            const uint64_t b = (k * 5 + i) % kNB;
            const uint8_t v = static_cast<uint8_t>(0x10 + k * 16 + i);
            segs.push_back({b * kBL, kBL});
            payload.insert(payload.end(), kBL, v);
            want[b] = v;
        }
        std::vector<uint8_t> f = frame_head(segs, shapes[k] * kBL);
        wire.insert(wire.end(), f.begin(), f.end());
        wire.insert(wire.end(), payload.begin(), payload.end());
    }
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    assert_int_equal(kvx::net::write_full_by(fd, wire.data(), wire.size(), deadline), 0);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) assert_int_equal(read_ack(fd, deadline), 0);
    for (uint64_t b = 0; b < kNB; b++)
        if (!block_is(tg.r.base + b * kBL, kBL, want[b])) fail_msg("block %llu does not hold %#x", (unsigned long long)b, want[b]);
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
    int fd = handshake(tg.meta, wrong, nullptr, &st);
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
    int fd = handshake(tg.meta, tg.meta.secret, "0123456789abcdef", &st);
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
    int fd = authenticated(tg);
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

uint16_t port_of(const sockaddr_storage &a) {
    return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6 &>(a).sin6_port
                                         : reinterpret_cast<const sockaddr_in &>(a).sin_port);
}

// Bytes the target's kernel holds on the other end of fd that the target has
// not read yet (its Recv-Q, as ss shows it); -1 when ss does not show it.
long target_unread(int fd) {
    sockaddr_storage me{}, peer{};
    socklen_t l1 = sizeof me, l2 = sizeof peer;
    assert_int_equal(getsockname(fd, reinterpret_cast<sockaddr *>(&me), &l1), 0);
    assert_int_equal(getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &l2), 0);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ss -tnH state established '( sport = :%u and dport = :%u )' 2>/dev/null",
             port_of(peer), port_of(me));
    FILE *f = popen(cmd, "r");
    long q = -1;
    if (f && fscanf(f, "%ld", &q) != 1) q = -1;
    if (f) pclose(f);
    return q;
}

// Waits (at most 10 s) until fd's sent bytes are all acknowledged by the
// target's kernel and, if `read`, also read by the target. False on timeout.
bool settle(int fd, bool read) {
    const uint64_t end = now_ms() + 10000;
    for (int unacked = 1; now_ms() < end; usleep(1000)) {
        assert_int_equal(ioctl(fd, SIOCOUTQ, &unacked), 0);
        if (unacked == 0 && (!read || target_unread(fd) == 0)) return true;
    }
    return false;
}

// A network namespace of this thread's own (as root), with loopback up and a
// default receive buffer of `rcvbuf` bytes for new TCP sockets: a frozen
// target's kernel then takes a whole read chunk whatever the host's
// tcp_rmem and however far autotuning got. Returns the namespace to go back
// to (-1: not root, the host's own loopback is used).
int private_loopback(long rcvbuf) {
    if (geteuid() != 0) return -1;
    int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    assert_true(home >= 0);
    assert_int_equal(unshare(CLONE_NEWNET), 0);
    assert_int_equal(system("ip link set lo up"), 0);
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_rmem", "w");
    assert_non_null(f);
    fprintf(f, "4096 %ld %ld\n", rcvbuf, 4 * rcvbuf);
    assert_int_equal(fclose(f), 0);
    return home;
}

// A payload that reaches the target in awkward pieces: a short read (which
// makes the target wait for a good part of the rest), then exactly one read
// chunk (256 KiB) at once, found whole after the target was frozen, then a
// small tail. The target must wake for the tail: a wait left set for more
// than the rest of the frame stalled it until the initiator's timeout.
void test_tail_after_whole_chunk(void **) {
    if (system("ss -V >/dev/null 2>&1") != 0) skip();
    constexpr uint64_t kFirst = 4096, kChunk = 256 << 10, kTail = 4096, bl = kFirst + kChunk + kTail;
    const int home = private_loopback(4 << 20);
    const char *opts[] = {"backend=tcp", "tcp.protection=none", nullptr};
    child_target c;
    child_start_opts(&c, 2, bl, nullptr, opts, 0);
    const kvx::wire::AgentMetadata meta = kvx::wire::decode_metadata(c.meta.bytes, c.meta.len);
    int st = 1;
    int fd = handshake(meta, meta.secret, nullptr, &st);
    assert_int_equal(st, 0);
    std::vector<uint8_t> payload(bl);
    fill_block(payload.data(), bl, 0, 9);
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(10);
    for (int i = 0; i < 4; i++)  // the receive window opens as whole frames are read
        assert_int_equal(send_frame(fd, {{0, bl}}, bl, payload), 0);
    std::vector<uint8_t> first = frame_head({{bl, bl}}, bl);
    first.insert(first.end(), payload.begin(), payload.begin() + kFirst);
    assert_int_equal(kvx::net::write_full_by(fd, first.data(), first.size(), deadline), 0);
    const char *piece = "first piece";
    bool ok = settle(fd, true);
    if (ok) {
        piece = "chunk";
        child_freeze(&c);
        assert_int_equal(kvx::net::write_full_by(fd, payload.data() + kFirst, kChunk, deadline), 0);
        ok = settle(fd, false);
        assert_int_equal(kill(c.pid, SIGCONT), 0);
    }
    if (!ok) {
        child_kill(&c);  // a stopped child would hold the test's output open
        fail_msg("the target's kernel did not take the %s within 10 s (receive window too small?)", piece);
    }
    if (!settle(fd, true)) {
        child_kill(&c);
        fail_msg("the target did not read the whole chunk within 10 s");
    }
    usleep(300 * 1000);  // past the target's probe of bytes that waited (at most 200 ms): it now waits for more
    assert_int_equal(kvx::net::write_full_by(fd, payload.data() + kFirst + kChunk, kTail, deadline), 0);
    assert_int_equal(read_ack(fd, deadline), 0);
    assert_true(child_verify(&c, 1, 0, 9));
    close(fd);
    assert_int_equal(child_stop(&c), 0);
    if (home >= 0) {
        assert_int_equal(setns(home, CLONE_NEWNET), 0);
        close(home);
    }
}

}  // namespace

// A control frame (kFlagFence agreed).
void send_control(int fd, uint16_t type, uint64_t session, uint32_t stream) {
    uint8_t buf[kvx::tcp::kFrameHeaderLen + kvx::tcp::kControlLen];
    kvx::tcp::encode_control(kvx::tcp::Control{type, session, stream}, buf);
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    assert_int_equal(kvx::net::write_full_by(fd, buf, sizeof buf, deadline), 0);
}

// 1 once the target closed fd (EOF or reset), 0 if it is still open after ms.
int closed_within(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return 0;
    char c;
    return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// Fencing (docs/semantics.md, "Rails"): two streams join a session; half a
// frame on stream 0; stream 1 fences stream 0: the target closes it, and the
// rest of that frame, sent after, lands nothing. Stream 1 goes on. A stream
// fenced before it joined may not join; control frames break the rules
// (a second JOIN, a FENCE of itself or of another session, a NOP of another
// session, nonzero reserved fields, a WRITE before the JOIN) close the
// stream that sent them; without kFlagFence a control frame is an unknown type.
void test_fence(void **) {
    namespace t = kvx::tcp;
    Target tg;
    target_up(tg, nullptr);
    const uint64_t session = 0x1234567890abcdefull;
    int a = authenticated(tg, t::kFlagFence), b = authenticated(tg, t::kFlagFence);
    send_control(a, t::kFrameJoin, session, 0);
    send_control(b, t::kFrameJoin, session, 1);
    std::vector<uint8_t> head = frame_head({{2 * kBL, kBL}}, kBL);
    std::vector<uint8_t> half(kBL / 2, 0xAB);
    auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
    assert_int_equal(kvx::net::write_full_by(a, head.data(), head.size(), deadline), 0);
    assert_int_equal(kvx::net::write_full_by(a, half.data(), half.size(), deadline), 0);
    usleep(100 * 1000);  // the half lands (cleartext lands as it arrives)
    send_control(b, t::kFrameNop, session, 1);
    send_control(b, t::kFrameFence, session, 0);
    assert_int_equal(send_frame(b, {{3 * kBL, kBL}}, kBL, std::vector<uint8_t>(kBL, 0xCD)), 0);
    assert_int_equal(closed_within(a, 2000), 1);
    kvx::net::write_full_by(a, half.data(), half.size(), deadline);  // fails, or is dropped
    usleep(100 * 1000);
    assert_true(block_is(tg.r.base + 3 * kBL, kBL, 0xCD));
    assert_true(block_is(tg.r.base + 2 * kBL + kBL / 2, kBL / 2, 0x77));  // the rest never landed
    // fenced before it joined: stream 2 may not join, stream 3 may
    send_control(b, t::kFrameFence, session, 2);
    int c = authenticated(tg, t::kFlagFence), d = authenticated(tg, t::kFlagFence);
    send_control(c, t::kFrameJoin, session, 2);
    assert_int_equal(closed_within(c, 2000), 1);
    send_control(d, t::kFrameJoin, session, 3);
    assert_int_equal(send_frame(d, {{4 * kBL, kBL}}, kBL, std::vector<uint8_t>(kBL, 0xEF)), 0);
    close(c);
    // rule breakers are closed
    send_control(d, t::kFrameJoin, session, 4);  // a second JOIN
    assert_int_equal(closed_within(d, 2000), 1);
    close(d);
    send_control(b, t::kFrameFence, session, 1);  // itself
    assert_int_equal(closed_within(b, 2000), 1);
    close(b);
    int e = authenticated(tg, t::kFlagFence);
    send_control(e, t::kFrameJoin, session + 1, 0);
    send_control(e, t::kFrameFence, session, 3);  // another session's
    assert_int_equal(closed_within(e, 2000), 1);
    close(e);
    int f = authenticated(tg, t::kFlagFence);
    send_control(f, t::kFrameNop, session, 0);  // before its JOIN
    assert_int_equal(closed_within(f, 2000), 1);
    close(f);
    int h = authenticated(tg, t::kFlagFence);  // a WRITE before its JOIN: closed, nothing lands
    assert_int_equal(send_frame(h, {{6 * kBL, kBL}}, kBL, std::vector<uint8_t>(kBL, 0x99)), -1);
    assert_true(block_is(tg.r.base + 6 * kBL, kBL, 0x77));
    close(h);
    int g = authenticated(tg);  // no kFlagFence: an unknown frame type
    send_control(g, t::kFrameJoin, session + 2, 0);
    assert_int_equal(closed_within(g, 2000), 1);
    close(g);
    close(a);
    assert_true(region_guards_ok(&tg.r));
    target_down(tg);
}

// The control frame's parser: every field checked.
void test_control_parser(void **) {
    namespace t = kvx::tcp;
    uint8_t buf[t::kFrameHeaderLen + t::kControlLen];
    t::encode_control(t::Control{t::kFrameFence, 9, 3}, buf);
    t::FrameHeader h = t::decode_frame_header(buf, kBL, true);
    t::Control c = t::decode_control(h, buf + t::kFrameHeaderLen);
    assert_int_equal(c.type, t::kFrameFence);
    assert_int_equal(c.session, 9);
    assert_int_equal(c.stream, 3);
    bool threw = false;
    try {
        t::decode_frame_header(buf, kBL, false);  // not agreed
    } catch (const kvx::Error &) {
        threw = true;
    }
    assert_true(threw);
    const size_t bad[] = {6, 8, 16, 20, 24};  // flags, seq, nseg, reserved, total_len: must be 0
    for (size_t off : bad) {
        uint8_t x[sizeof buf];
        memcpy(x, buf, sizeof buf);
        x[off] ^= 1;
        threw = false;
        try {
            t::decode_frame_header(x, kBL, true);
        } catch (const kvx::Error &) {
            threw = true;
        }
        assert_true(threw);
    }
    const size_t body_bad[] = {0, 11, 12};  // session 0 (its one byte cleared), stream past the limit, reserved
    uint8_t x[sizeof buf];
    for (size_t k = 0; k < 3; k++) {
        memcpy(x, buf, sizeof buf);
        if (k == 0) x[t::kFrameHeaderLen + body_bad[0]] = 0;
        else x[t::kFrameHeaderLen + body_bad[k]] = 1;
        threw = false;
        try {
            t::decode_control(h, x + t::kFrameHeaderLen);
        } catch (const kvx::Error &) {
            threw = true;
        }
        assert_true(threw);
    }
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_frame_lands),
        cmocka_unit_test(test_fence),
        cmocka_unit_test(test_control_parser),
        cmocka_unit_test(test_frames_back_to_back),
        cmocka_unit_test(test_forged_without_secret),
        cmocka_unit_test(test_wrong_fingerprint),
        cmocka_unit_test(test_frame_outside_region),
        cmocka_unit_test(test_tail_after_whole_chunk),
    };
    return cmocka_run_group_tests_name("tcp_wire", tests, nullptr, nullptr);
}
