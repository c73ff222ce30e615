// Unit tests of the shm control messages (src/backends/shm/shm_wire): every
// kind round-trips, and fields out of range are refused with a message that
// names the value (the staging ring's messages come from another process).
// Also the metadata section's versions, and the check that tells a pinned
// pid's process from one that got the pid later.
#include "kvxfer.h"
#include "backends/shm/shm.h"
#include "backends/shm/shm_wire.h"
#include "util/error.h"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "unit_util.h"

using namespace kvx;
using namespace kvx::shm;
using namespace kvx::testing;

namespace {

CtlMsg round_trip(const CtlMsg &m, size_t want_len) {
    uint8_t b[kCtlMaxLen];
    const size_t n = encode_ctl(m, b);
    assert_int_equal(n, want_len);
    return decode_ctl(b, n);
}

// Encodes m, lets edit change the bytes, decodes: the code, and the message in *msg.
template <class Edit>
int edited(const CtlMsg &m, Edit edit, std::string *msg) {
    uint8_t b[kCtlMaxLen + 8] = {};
    size_t n = encode_ctl(m, b);
    edit(b, &n);
    return code_of([&] { decode_ctl(b, n); }, msg);
}

void test_round_trips(void **) {
    CtlMsg g{Ctl::grant};
    g.mode = Mode::staged;
    g.size = 1 << 20;
    CtlMsg r = round_trip(g, kGrantLen);
    assert_true(r.kind == Ctl::grant && r.mode == Mode::staged && r.size == g.size && r.offset == 0);
    assert_true(round_trip(CtlMsg{Ctl::stage}, kCtlHeaderLen).kind == Ctl::stage);
    CtlMsg s{Ctl::staged};
    s.slots = 8;
    s.slot_len = 1 << 20;
    s.size = ring_len(8, 1 << 20);
    r = round_trip(s, kStagedLen);
    assert_true(r.slots == 8 && r.slot_len == (1u << 20) && r.size == s.size);
    assert_int_equal(ring_data_off(8), 4096);
    CtlMsg c{Ctl::copy};
    c.slot = 63;
    c.nseg = kMaxCopySegs;
    for (uint32_t i = 0; i < kMaxCopySegs; i++) c.segs[i] = {UINT64_MAX - i, kMaxSlotLen / kMaxCopySegs};  // the target checks the offsets against its region
    c.ticket = kCopied - 1;
    r = round_trip(c, kCtlMaxLen);
    assert_true(r.slot == 63 && r.nseg == kMaxCopySegs && r.ticket == kCopied - 1);
    for (uint32_t i = 0; i < kMaxCopySegs; i++)
        assert_true(r.segs[i].dst_off == UINT64_MAX - i && r.segs[i].len == kMaxSlotLen / kMaxCopySegs);
    c.nseg = 1;
    assert_int_equal(round_trip(c, kCopyHeadLen + kCopySegLen).nseg, 1);
    CtlMsg d{Ctl::copied};
    d.slot = 2;
    d.status = 1;
    d.ticket = 9;
    r = round_trip(d, kCopiedLen);
    assert_true(r.slot == 2 && r.status == 1 && r.ticket == 9);
}

void test_refusals(void **) {
    std::string msg;
    CtlMsg s{Ctl::staged};
    s.slots = 8;
    s.slot_len = 1 << 20;
    s.size = ring_len(8, 1 << 20);
    auto set32 = [](size_t at, uint32_t v) { return [=](uint8_t *b, size_t *) { memcpy(b + at, &v, 4); }; };
    auto set64 = [](size_t at, uint64_t v) { return [=](uint8_t *b, size_t *) { memcpy(b + at, &v, 8); }; };
    assert_int_equal(edited(s, set32(8, 0), &msg), KVX_EINVAL);
    assert_contains(msg, "0 slots");
    assert_int_equal(edited(s, set32(8, 65), &msg), KVX_EINVAL);
    assert_contains(msg, "65 slots");
    assert_int_equal(edited(s, set32(12, 5000), &msg), KVX_EINVAL);
    assert_contains(msg, "slot_len 5000");
    assert_int_equal(edited(s, set64(16, 8u << 20), &msg), KVX_EINVAL);  // the header lines forgotten
    assert_contains(msg, "8388608");

    CtlMsg c{Ctl::copy};
    c.slot = 1;
    c.nseg = 2;
    c.segs[0] = {0, 4096};
    c.segs[1] = {8192, 4096};
    c.ticket = 5;
    const size_t seg1 = kCopyHeadLen + kCopySegLen;  // the second segment
    assert_int_equal(edited(c, set32(8, 64), &msg), KVX_EINVAL);
    assert_contains(msg, "slot 64");
    assert_int_equal(edited(c, set32(12, 0), &msg), KVX_EINVAL);
    assert_contains(msg, "0 segments");
    assert_int_equal(edited(c, set32(12, 65), &msg), KVX_EINVAL);
    assert_contains(msg, "65 segments");
    assert_int_equal(edited(c, set32(12, 3), &msg), KVX_EINVAL);  // says 3, carries 2
    assert_contains(msg, "not 72");
    assert_int_equal(edited(c, set32(seg1 + 8, 0), &msg), KVX_EINVAL);
    assert_contains(msg, "segment 1 has length 0");
    assert_int_equal(edited(c, set32(seg1 + 12, 1), &msg), KVX_EINVAL);
    assert_contains(msg, "segment 1: reserved");
    assert_int_equal(edited(c, set32(seg1 + 8, kMaxSlotLen), &msg), KVX_EINVAL);  // 4096 + 16 MiB in one slot
    assert_contains(msg, "16781312 bytes");
    assert_int_equal(edited(c, set64(16, 0), &msg), KVX_EINVAL);
    assert_contains(msg, "ticket 0");
    assert_int_equal(edited(c, set64(16, kCopied | 5), &msg), KVX_EINVAL);
    assert_int_equal(edited(c, [](uint8_t *, size_t *n) { (*n)--; }, &msg), KVX_EINVAL);
    assert_contains(msg, "not 56");

    CtlMsg d{Ctl::copied};
    d.ticket = 5;
    assert_int_equal(edited(d, set32(12, 2), &msg), KVX_EINVAL);
    assert_contains(msg, "status 2");
    CtlMsg g{Ctl::grant};
    g.mode = Mode::staged;
    g.size = 4096;
    assert_int_equal(edited(g, set64(8, 4096), &msg), KVX_EINVAL);  // an offset only for mapped
    assert_contains(msg, "offset");
    assert_int_equal(edited(g, [](uint8_t *b, size_t *) { b[5] = 4; }, &msg), KVX_EINVAL);
    assert_contains(msg, "mode 4");
    assert_int_equal(edited(CtlMsg{Ctl::stage}, [](uint8_t *b, size_t *) { b[4] = 8; }, &msg), KVX_EINVAL);
    assert_contains(msg, "kind 8");
}

// Version 2 appends the target's start time; version 1 (0.8 and older
// targets) still decodes, without it, and refuses trailing bytes as before.
void test_section_versions(void **) {
    SectionInfo in;
    in.boot_id.fill(7);
    in.netns = 42;
    in.pid = 1234;
    in.mode = Mode::kernel;
    in.socket_name = "kvxfer-shm-1234-x";
    in.start_time = 987654321;
    wire::Section s = encode_section(in);
    assert_int_equal(s.version, 2);
    SectionInfo out = decode_section(s);
    assert_true(out.start_time == in.start_time && out.pid == in.pid && out.socket_name == in.socket_name);
    wire::Section v1 = s;
    v1.version = 1;
    v1.body.resize(v1.body.size() - 8);
    out = decode_section(v1);
    assert_true(out.start_time == 0 && out.socket_name == in.socket_name);
    v1.body.push_back(0);
    std::string msg;
    assert_int_equal(code_of([&] { decode_section(v1); }, &msg), KVX_EBADMETA);
    assert_non_null(strstr(msg.c_str(), "trailing"));
    wire::Section v2 = s;
    v2.body.resize(v2.body.size() - 1);
    assert_int_equal(code_of([&] { decode_section(v2); }, &msg), KVX_EBADMETA);
    assert_non_null(strstr(msg.c_str(), "start_time"));
    wire::Section v3 = s;  // a later version may append
    v3.version = 3;
    v3.body.push_back(9);
    assert_true(decode_section(v3).start_time == in.start_time);
}

// A pidfd of a live process with its start time passes; a wrong start time
// (a process that got the pid later) or an exited process does not.
void test_pinned_start_time(void **) {
    const pid_t me = getpid();
    const uint64_t t = process_start_time(me);
    assert_true(t != 0);
    net::Fd self(static_cast<int>(syscall(SYS_pidfd_open, me, 0)));
    assert_true(self.get() >= 0);
    assert_true(pinned_started_at(self.get(), me, t));
    assert_false(pinned_started_at(self.get(), me, t + 1));
    assert_false(pinned_started_at(self.get(), me, 0));
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) _exit(0);
    net::Fd gone(static_cast<int>(syscall(SYS_pidfd_open, child, 0)));
    const uint64_t ct = process_start_time(child);
    int st = 0;
    waitpid(child, &st, 0);
    assert_true(gone.get() >= 0);
    assert_false(pinned_started_at(gone.get(), child, ct));  // exited: whatever has its pid now is not it
    assert_int_equal(process_start_time(child), 0);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_section_versions),
        cmocka_unit_test(test_pinned_start_time),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("shm_wire", tests, nullptr, nullptr);
}
