// The shm staging ring seen from a hostile same-host writer that holds the
// metadata: it speaks the control messages itself and asks the target to
// copy from outside the ring, past the end of the region, or twice for a
// ring. Each such request closes its connection and lands nothing; an
// honest COPY lands exactly its bytes, and a withdrawn slot is skipped.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/shm/shm.h"
#include "handshake/handshake.h"
#include "wire/metadata.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

constexpr uint64_t kNB = 16, kBL = 256 << 10;  // 4 MiB: a COPY longer than a slot still fits
namespace shm = kvx::shm;
namespace hs = kvx::handshake;

struct Target {
    region r;
    kvx_transport *t = nullptr;
    kvx::wire::AgentMetadata meta;
};

void target_up(Target &tg) {
    tg.r = region_new(kNB, kBL, 0x77);
    kvx_options *o = nullptr;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", "shm"));
    CHECK_OK(kvx_options_set(o, "shm.private", "staged"));
    CHECK_OK(kvx_transport_create(&tg.t, tg.r.base, kNB, kBL, nullptr, o));
    kvx_options_destroy(o);
    metablob m;
    get_meta(tg.t, &m);
    tg.meta = kvx::wire::decode_metadata(m.bytes, m.len);
}

void target_down(Target &tg) {
    kvx_transport_destroy(tg.t);
    region_free(&tg.r);
}

// One datagram within 5 s (a passed descriptor into *fd); its length, or
// -1 when the target closed the connection.
ssize_t recv_one(int s, uint8_t *buf, size_t cap, int *fd = nullptr) {
    pollfd p{s, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) fail_msg("the target did not answer within 5 s");
    int passed = -1;
    ssize_t n = shm::recv_msg(s, buf, cap, &passed);
    if (fd) *fd = passed;
    else if (passed >= 0) close(passed);
    return n > 0 ? n : -1;
}

void send_ctl(int s, const shm::CtlMsg &m) {
    uint8_t b[shm::kCtlMaxLen];
    assert_int_equal(shm::send_msg(s, b, shm::encode_ctl(m, b), -1), 0);
}

shm::CtlMsg recv_ctl(int s, int *fd = nullptr) {
    uint8_t b[shm::kCtlMaxLen + 8];
    ssize_t n = recv_one(s, b, sizeof b, fd);
    assert_true(n > 0);
    return shm::decode_ctl(b, static_cast<size_t>(n));
}

// A writer that authenticated, holds a staged grant and its ring.
struct Writer {
    int sock = -1;
    uint8_t *ring = nullptr;
    shm::CtlMsg staged;
    uint8_t *slot(uint32_t i) const { return ring + shm::ring_data_off(staged.slots) + uint64_t{i} * staged.slot_len; }
    std::atomic_ref<uint64_t> state(uint32_t i) const {
        return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t *>(ring + uint64_t{i} * 64));
    }
};

Writer writer_up(const Target &tg) {
    const kvx::wire::Section *sec = tg.meta.find(shm::kSectionId);
    assert_non_null(sec);
    const shm::SectionInfo si = shm::decode_section(*sec);
    Writer w;
    w.sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, si.socket_name.data(), si.socket_name.size());
    const socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + si.socket_name.size());
    assert_int_equal(connect(w.sock, reinterpret_cast<sockaddr *>(&a), alen), 0);
    hs::Bytes b{};
    assert_int_equal(shm::send_msg(w.sock, b.data(), hs::encode(hs::Hello{tg.meta.instance_id}, b.data()), -1), 0);
    ssize_t n = recv_one(w.sock, b.data(), b.size());
    const hs::Challenge ch = hs::expect_answer(b.data(), static_cast<size_t>(n), shm::kDataPath, "test", "HELLO").challenge;
    const hs::Auth au = hs::answer(ch, tg.meta.instance_id, tg.meta.secret, hs::fingerprint_bytes(""));
    assert_int_equal(shm::send_msg(w.sock, b.data(), hs::encode(au, b.data()), -1), 0);
    n = recv_one(w.sock, b.data(), b.size());
    hs::expect_accept(hs::expect_answer(b.data(), static_cast<size_t>(n), shm::kDataPath, "test", "AUTH").accept, ch, au,
                      tg.meta.secret, "test");
    const shm::CtlMsg g = recv_ctl(w.sock);
    assert_true(g.kind == shm::Ctl::grant && g.mode == shm::Mode::staged && g.size == kNB * kBL);
    send_ctl(w.sock, shm::CtlMsg{shm::Ctl::stage});
    int fd = -1;
    w.staged = recv_ctl(w.sock, &fd);
    assert_true(w.staged.kind == shm::Ctl::staged && fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(static_cast<uint64_t>(st.st_size), w.staged.size);
    void *p = mmap(nullptr, w.staged.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    close(fd);
    w.ring = static_cast<uint8_t *>(p);
    return w;
}

void writer_down(Writer &w) {
    munmap(w.ring, w.staged.size);
    close(w.sock);
}

// Posts slot i (bytes of value v, len bytes) with ticket t and asks for a copy to dst_off.
void post(const Writer &w, uint32_t i, uint32_t len, uint64_t dst_off, uint64_t t, uint8_t v) {
    memset(w.slot(i), v, len);
    w.state(i).store(t);
    shm::CtlMsg c{shm::Ctl::copy};
    c.slot = i;
    c.nseg = 1;
    c.segs[0] = {dst_off, len};
    c.ticket = t;
    send_ctl(w.sock, c);
}

bool closed_by_target(const Writer &w) {
    uint8_t b[64];
    return recv_one(w.sock, b, sizeof b) < 0;
}

void test_honest_and_withdrawn(void **) {
    Target tg;
    target_up(tg);
    Writer w = writer_up(tg);
    post(w, 0, kBL, 3 * kBL, 1, 0xE1);
    shm::CtlMsg a = recv_ctl(w.sock);
    assert_true(a.kind == shm::Ctl::copied && a.slot == 0 && a.ticket == 1 && a.status == 0);
    assert_int_equal(w.state(0).load(), 1 | shm::kCopied);
    assert_true(block_is(tg.r.base + 3 * kBL, kBL, 0xE1));
    memset(w.slot(2), 0xE3, kBL);
    w.state(2).store(0);  // the writer took it back
    shm::CtlMsg c{shm::Ctl::copy};
    c.slot = 2;
    c.nseg = 1;
    c.segs[0] = {5 * kBL, kBL};
    c.ticket = 3;
    send_ctl(w.sock, c);
    a = recv_ctl(w.sock);
    assert_true(a.slot == 2 && a.ticket == 3 && a.status == 1);
    assert_true(block_is(tg.r.base + 5 * kBL, kBL, 0x77));
    writer_down(w);
    target_down(tg);
}

// One hostile request per connection: it is closed, nothing lands (not
// even its honest first segment: every segment is checked before any is
// copied). The bytes (when the slot exists) are posted honestly; the COPY's
// second segment may lie.
void hostile(uint32_t slot, uint32_t len, uint64_t dst_off, bool stage_twice) {
    Target tg;
    target_up(tg);
    Writer w = writer_up(tg);
    if (stage_twice) {
        send_ctl(w.sock, shm::CtlMsg{shm::Ctl::stage});
    } else {
        if (slot < w.staged.slots) {
            memset(w.slot(slot), 0xEE, std::min(len, w.staged.slot_len));
            w.state(slot).store(7);
        }
        shm::CtlMsg c{shm::Ctl::copy};
        c.slot = slot;
        c.nseg = 2;  // an honest first segment, then the lie
        c.segs[0] = {0, 4096};
        c.segs[1] = {dst_off, len};
        c.ticket = 7;
        send_ctl(w.sock, c);
    }
    assert_true(closed_by_target(w));
    assert_true(block_is(tg.r.base, kNB * kBL, 0x77));
    assert_true(region_guards_ok(&tg.r));
    writer_down(w);
    target_down(tg);
}

void test_hostile_copies_close(void **) {
    hostile(0, kBL, kNB * kBL - 100, false);  // past the region's end
    hostile(0, kBL, UINT64_MAX - 10, false);  // offset + len wraps
    hostile(8, kBL, 0, false);                // a slot the ring does not have
    hostile(0, (1u << 20) + 4096, 0, false);  // longer than a slot
    hostile(0, 1u << 20, 8192, false);        // with the first segment, more than a slot holds
    hostile(0, 0, 0, true);                   // a second ring
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_and_withdrawn),
        cmocka_unit_test(test_hostile_copies_close),
    };
    return cmocka_run_group_tests_name("shm_hostile", tests, nullptr, nullptr);
}
