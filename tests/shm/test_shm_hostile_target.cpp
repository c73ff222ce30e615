// The shm writer seen from a hostile same-host target: a squatter that holds
// a transport's metadata (its secret answers the handshake), binds the
// socket name of that transport once it is gone, and grants what it likes.
// Its huge-page memory loses a page under the writer's mapping or staging
// ring (SIGBUS: a failed transfer, never a dead writer), or its staging
// ring takes every slot and never answers (the transfers fail within about
// transfer_timeout_ms, and the writer's other peers carry on meanwhile).
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "backends/shm/shm.h"
#include "handshake/engine.h"
#include "wire/metadata.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

namespace shm = kvx::shm;
namespace hs = kvx::handshake;

constexpr uint32_t kSeed = 44;
constexpr uint64_t kHBL = 2u << 20;  // 4a: blocks of one huge page
constexpr uint64_t kRNB = 4, kRBL = 1u << 20;  // 4b: the region behind a hugetlb ring
constexpr uint32_t kRingSlots = 3, kRingSlot = 1396736;  // 4b: a ring of two huge pages
static_assert(shm::ring_len(kRingSlots, kRingSlot) == 4u << 20);
constexpr uint64_t kSNB = 128, kSBL = 4096;  // 5: one block per slot
constexpr uint64_t kEvil = shm::kMaxSlots + 8;  // every slot, and (no close) some queued behind them
constexpr uint32_t kT = 2000;  // 5: the writer's transfer_timeout_ms

// ---- huge pages (as root; saved by the group setup, restored by its teardown)

const char *const kNrHuge = "/proc/sys/vm/nr_hugepages", *const kOvercommit = "/proc/sys/vm/nr_overcommit_hugepages";
long g_nr_huge = -1, g_overcommit = -1;

// Reads (set < 0) or writes a /proc/sys value; -1 when it cannot.
long proc_long(const char *path, long set) {
    FILE *f = fopen(path, set < 0 ? "re" : "we");
    long v = -1;
    if (!f) return -1;
    if (set < 0 && fscanf(f, "%ld", &v) != 1) v = -1;
    if (set >= 0) v = fprintf(f, "%ld\n", set) > 0 ? set : -1;
    return fclose(f) == 0 ? v : -1;
}

long meminfo(const char *key) {
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    long v = -1;
    const size_t k = strlen(key);
    while (f && v < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':') v = strtol(line + k + 1, nullptr, 10);
    if (f) fclose(f);
    return v;
}

int save_huge(void **) {
    g_nr_huge = proc_long(kNrHuge, -1);
    g_overcommit = proc_long(kOvercommit, -1);
    if (g_overcommit > 0) proc_long(kOvercommit, 0);  // a fault must not find a surplus page
    return 0;
}

int restore_huge(void **) {
    if (g_nr_huge >= 0) proc_long(kNrHuge, g_nr_huge);
    if (g_overcommit > 0) proc_long(kOvercommit, g_overcommit);
    return 0;
}

// The pool: the huge pages in use and `pages` free ones (only root can set it).
bool huge_pages_ready(long pages) {
    const long total = meminfo("HugePages_Total"), free = meminfo("HugePages_Free");
    if (geteuid() != 0 || g_nr_huge < 0 || total < 0 || free < 0) return false;
    proc_long(kNrHuge, total - free + pages);
    return meminfo("HugePages_Free") >= pages;
}

// Shrinks the pool to the pages in use: a fault in a hole finds none.
bool exhaust_huge_pages() {
    const long in_use = meminfo("HugePages_Total") - meminfo("HugePages_Free");
    return proc_long(kNrHuge, in_use) == in_use && meminfo("HugePages_Free") == 0;
}

// A memfd of len bytes sealed against shrinking and growing (what a writer
// checks of a ring; kvx_region_alloc's seals), mapped shared and touched.
int sealed_memfd(size_t len, bool huge, uint8_t **map) {
    const int fd = memfd_create("kvx-hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0));
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(len)) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0)
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return -1;
    }
    memset(p, 0, len);
    *map = static_cast<uint8_t *>(p);
    return fd;
}

// ---- the squatter's side of the socket

bool read_within(int fd, void *p, size_t n, int ms) {
    auto *b = static_cast<uint8_t *>(p);
    const uint64_t end = now_ms() + static_cast<uint64_t>(ms);
    while (n > 0) {
        pollfd q{fd, POLLIN, 0};
        if (poll(&q, 1, static_cast<int>(end - std::min(end, now_ms()))) != 1) return false;
        const ssize_t r = read(fd, b, n);
        if (r <= 0) return false;
        b += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

// One datagram within ms: its length, 0 when none came, -1 when closed.
ssize_t recv_within(int s, uint8_t *b, size_t cap, int ms) {
    pollfd q{s, POLLIN, 0};
    if (poll(&q, 1, ms) != 1) return 0;
    int passed = -1;
    const ssize_t n = shm::recv_msg(s, b, cap, &passed);
    if (passed >= 0) close(passed);
    return n > 0 ? n : -1;
}

bool recv_ctl(int s, shm::CtlMsg *m, int ms) {
    uint8_t b[shm::kCtlMaxLen + 8];
    const ssize_t n = recv_within(s, b, sizeof b, ms);
    try {
        if (n > 0) *m = shm::decode_ctl(b, static_cast<size_t>(n));
    } catch (...) {
        return false;
    }
    return n > 0;
}

kvx_transport *make_transport(void *base, uint64_t nb, uint64_t bl, const char *opts) {
    kvx_options *o = nullptr;
    kvx_transport *t = nullptr;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_parse(o, opts));
    CHECK_OK(kvx_transport_create(&t, base, nb, bl, nullptr, o));
    kvx_options_destroy(o);
    return t;
}

// The metadata of a real staged target, which is then destroyed: its
// socket name is ours, and its secret (with its instance id and
// fingerprint: the library's handshake Identity) answers writers.
struct Squatter {
    metablob blob;
    hs::Identity id;
    int lfd = -1;
};

void squat(Squatter &sq, uint64_t nb, uint64_t bl) {
    region r = region_new(nb, bl, 0);
    kvx_transport *t = make_transport(r.base, nb, bl, "backend=shm shm.private=staged");
    get_meta(t, &sq.blob);
    const kvx::wire::AgentMetadata m = kvx::wire::decode_metadata(sq.blob.bytes, sq.blob.len);
    sq.id = hs::Identity{m.instance_id, m.secret, hs::fingerprint_bytes(m.fingerprint)};
    assert_non_null(m.find(shm::kSectionId));
    const std::string name = shm::decode_section(*m.find(shm::kSectionId)).socket_name;
    kvx_transport_destroy(t);
    region_free(&r);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path + 1, name.data(), name.size());
    sq.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_int_equal(bind(sq.lfd, reinterpret_cast<sockaddr *>(&a),
                          static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())), 0);
    assert_int_equal(listen(sq.lfd, 8), 0);
}

// A writer's connection, authenticated with the leaked secret and granted
// staged; its STAGE answered with ring_fd. -1 when anything fails.
int accept_staged(const Squatter &sq, uint64_t size, int ring_fd, uint32_t slots, uint32_t slot_len) {
    pollfd q{sq.lfd, POLLIN, 0};
    const int s = poll(&q, 1, 10000) == 1 ? accept4(sq.lfd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    hs::Responder r(sq.id, shm::kDataPath, "shm");
    hs::Responder::Session ses;
    bool ok = s >= 0;
    for (bool accepted = false; ok && !accepted;) {
        uint8_t b[hs::kMaxMessageLen + 8];
        const ssize_t n = recv_within(s, b, sizeof b, 5000);
        const hs::Step st = n > 0 ? r.on_message(ses, b, static_cast<size_t>(n), "squatter") : hs::Step{};
        ok = n > 0 && shm::send_msg(s, st.reply.data(), st.reply_len, -1) == 0 &&
             st.outcome != hs::Step::Outcome::refused;
        accepted = st.outcome == hs::Step::Outcome::accepted;
    }
    uint8_t b[shm::kCtlMaxLen];
    shm::CtlMsg g{shm::Ctl::grant}, m, staged{shm::Ctl::staged};
    g.mode = shm::Mode::staged;
    g.size = size;
    staged.slots = slots;
    staged.slot_len = slot_len;
    staged.size = shm::ring_len(slots, slot_len);
    ok = ok && shm::send_msg(s, b, shm::encode_ctl(g, b), -1) == 0 && recv_ctl(s, &m, 5000) &&
         m.kind == shm::Ctl::stage && shm::send_msg(s, b, shm::encode_ctl(staged, b), ring_fd) == 0;
    if (!ok && s >= 0) close(s);
    return ok ? s : -1;
}

std::atomic_ref<uint64_t> state_word(uint8_t *ring, uint32_t slot) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t *>(ring + uint64_t{slot} * 64));
}

// ---- 4: a writer in a process of its own, faulting in the target's hole

// 'D' done, 'F' failed, 'N' neither within ms.
char wait_one(kvx_transport *t, uint64_t id, int ms) {
    uint64_t d[8], f[8];
    for (const uint64_t end = now_ms() + static_cast<uint64_t>(ms); now_ms() < end; usleep(1000)) {
        size_t nd = 0, nf = 0;
        if (kvx_poll(&nd, &nf, t, nullptr, d, 8, f, 8) != 0) return 'E';
        if (std::find(d, d + nd, id) != d + nd) return 'D';
        if (std::find(f, f + nf, id) != f + nf) return 'F';
    }
    return 'N';
}

// Connects to the target whose metadata comes on `in`, writes block 0 (says
// 'A' once done, or the step that went wrong), waits for 'G', writes blocks
// 1..n and says how that ended (wait_one's letter), then closes and exits 0.
[[noreturn]] void writer_child(int in, int out, const char *path, uint64_t n) {
    signal(SIGBUS, SIG_DFL);  // an application's default; cmocka's handler would take the fault
    static metablob m;
    if (!read_within(in, &m, sizeof m, 10000)) _exit(20);
    region r = region_new(m.nb, m.bl, 0);
    for (uint64_t i = 0; i < m.nb; i++) fill_block(r.base + i * m.bl, m.bl, i, kSeed);
    kvx_options *o = nullptr;
    kvx_transport *t = nullptr;
    const char *be = "", *p = "";
    uint64_t id = 0, blocks[] = {0, 1, 2};
    char say = 'c', go = 0;
    if (kvx_options_create(&o) == 0 && kvx_options_parse(o, "backend=shm") == 0 &&
        kvx_transport_create(&t, r.base, m.nb, m.bl, nullptr, o) == 0)
        say = 'a';
    kvx_options_destroy(o);
    if (say == 'a' && kvx_add_remote_peer(t, "p", m.bytes, m.len, m.base, m.nb, m.bl) == 0) say = 'p';
    if (say == 'p' && kvx_peer_backend(&be, &p, t, "p") == 0 && strcmp(p, path) == 0) say = 'w';
    if (say == 'w' && kvx_write_blocks(&id, t, "p", blocks, blocks, 1) == 0 && wait_one(t, id, 10000) == 'D') say = 'A';
    if (say != 'A') fprintf(stderr, "writer: step '%c' (path '%s'): %s\n", say, p, kvx_last_error_message());
    if (write_full(out, &say, 1) != 0 || say != 'A' || !read_within(in, &go, 1, 20000)) _exit(21);
    say = kvx_write_blocks(&id, t, "p", blocks + 1, blocks + 1, n) == 0 ? wait_one(t, id, 10000) : 'e';
    write_full(out, &say, 1);
    kvx_transport_destroy(t);
    _exit(0);
}

struct Child {
    pid_t pid;
    int to, from;
};

// Forked before this test makes a transport: the child has no thread of ours.
Child spawn_writer(const char *path, uint64_t n) {
    int down[2], up[2];
    assert_int_equal(pipe2(down, O_CLOEXEC), 0);
    assert_int_equal(pipe2(up, O_CLOEXEC), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) writer_child(down[0], up[1], path, n);
    close(down[0]);
    close(up[1]);
    return Child{pid, down[1], up[0]};
}

// Once the writer's first write is done ('A'): punches [off, off + len)
// out of fd and drains the pool, lets the writer write into the hole ('G'),
// takes its last word and its exit status, and gives the pool back.
struct Outcome {
    char first = '-', said = '-';
    bool dry = false;  // the hole is punched and no huge page is free to fill it
    int status = 0;
};

Outcome into_the_hole(const Child &c, int fd, uint64_t off, uint64_t len) {
    Outcome o;
    if (read_within(c.from, &o.first, 1, 15000) && o.first == 'A') {
        o.dry = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off),
                          static_cast<off_t>(len)) == 0 && exhaust_huge_pages();
        write_full(c.to, "G", 1);
    }
    if (!read_within(c.from, &o.said, 1, 15000)) o.said = '-';
    for (const uint64_t end = now_ms() + 15000; waitpid(c.pid, &o.status, WNOHANG) == 0; usleep(10000))
        if (now_ms() > end) {
            kill(c.pid, SIGKILL);
            waitpid(c.pid, &o.status, 0);
        }
    close(c.to);
    close(c.from);
    proc_long(kNrHuge, g_nr_huge);
    return o;
}

void check_writer(const char *what, const Outcome &o) {
    char how[64];
    if (WIFEXITED(o.status)) snprintf(how, sizeof how, "exited %d", WEXITSTATUS(o.status));
    else snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(o.status), strsignal(WTERMSIG(o.status)));
    printf("%s: the write into the hole was reported '%c' (F: failed); the writer %s\n", what, o.said, how);
    if (o.first != 'A') fail_msg("the writer's first write did not complete (step '%c'; it %s)", o.first, how);
    assert_true(o.dry);
    if (!WIFEXITED(o.status) || WEXITSTATUS(o.status) != 0) fail_msg("the writer %s", how);
    assert_int_equal(o.said, 'F');
}

// 4a. The target's region is a sealed hugetlb memfd: the writer maps it.
// A hole punched in block 1, with no free huge page, faults the writer's
// copy into it: sealed or not, that fails the transfer, not the writer.
void test_sigbus_mapped(void **) {
    if (!huge_pages_ready(2)) skip();
    const Child c = spawn_writer("mapped", 1);
    uint8_t *mem = nullptr;
    const int mfd = sealed_memfd(2 * kHBL, true, &mem);
    assert_true(mfd >= 0);
    kvx_transport *t = make_transport(mem, 2, kHBL, "backend=shm");
    static metablob m;
    get_meta(t, &m);  // mapped: the writer checks its path
    assert_int_equal(write_full(c.to, &m, sizeof m), 0);
    const Outcome o = into_the_hole(c, mfd, kHBL, kHBL);
    const bool landed = block_matches(mem, kHBL, 0, kSeed);
    kvx_transport_destroy(t);  // the target lives on: it faulted nowhere
    munmap(mem, 2 * kHBL);
    close(mfd);
    check_writer("mapped hugetlb region", o);
    assert_true(landed);
}

// 4b. A squatter grants staged and passes a sealed hugetlb memfd as the
// ring (3 slots over two huge pages). Its first COPY is answered; then the
// second huge page is punched out and the pool drained: the writer's copy
// into slot 1 faults, which must fail the transfer, not the writer.
void test_sigbus_ring(void **) {
    if (!huge_pages_ready(2)) skip();
    const Child c = spawn_writer("staged", 2);
    Squatter sq;
    squat(sq, kRNB, kRBL);
    assert_int_equal(write_full(c.to, &sq.blob, sizeof sq.blob), 0);
    uint8_t *ring = nullptr;
    const int rfd = sealed_memfd(shm::ring_len(kRingSlots, kRingSlot), true, &ring);
    assert_true(rfd >= 0);
    const int s = accept_staged(sq, kRNB * kRBL, rfd, kRingSlots, kRingSlot);
    assert_true(s >= 0);
    shm::CtlMsg m;
    assert_true(recv_ctl(s, &m, 10000));
    assert_true(m.kind == shm::Ctl::copy && m.slot == 0 && m.nseg == 1 && m.segs[0].len == kRBL);
    uint64_t t = m.ticket;
    assert_true(state_word(ring, 0).compare_exchange_strong(t, m.ticket | shm::kTaken));
    assert_true(block_matches(ring + shm::ring_data_off(kRingSlots), kRBL, 0, kSeed));
    state_word(ring, 0).store(m.ticket | shm::kCopied);
    shm::CtlMsg done{shm::Ctl::copied};
    done.slot = 0;
    done.ticket = m.ticket;
    uint8_t b[shm::kCtlMaxLen];
    assert_int_equal(shm::send_msg(s, b, shm::encode_ctl(done, b), -1), 0);
    const Outcome o = into_the_hole(c, rfd, 2u << 20, 2u << 20);  // slot 1 (1400832..2797568) crosses it
    close(s);
    close(sq.lfd);
    munmap(ring, shm::ring_len(kRingSlots, kRingSlot));
    close(rfd);
    check_writer("hugetlb staging ring", o);
}

// ---- 5: a staged target that takes every slot and never answers

struct Stall {
    Squatter sq;
    bool close_when_full = false;
    std::atomic<uint32_t> taken{0};
    std::atomic<bool> stop{false}, closed{false};
    std::atomic<uint64_t> closed_ms{0};
    std::thread th;
};

// Grants staged with a ring of kMaxSlots slots of 4 KiB, marks each posted
// slot taken (in its own mapping) as its COPY comes, and answers none; with
// close_when_full it closes its socket once every slot is taken.
void stall_serve(Stall *st) {
    uint8_t *ring = nullptr;
    const uint32_t slots = shm::kMaxSlots, len = shm::kMinSlotLen;
    const int rfd = sealed_memfd(shm::ring_len(slots, len), false, &ring);
    int s = rfd >= 0 ? accept_staged(st->sq, kSNB * kSBL, rfd, slots, len) : -1;
    while (s >= 0 && !st->stop.load()) {
        shm::CtlMsg m;
        uint8_t b[shm::kCtlMaxLen + 8];
        const ssize_t n = recv_within(s, b, sizeof b, 20);
        if (n < 0) break;  // the writer let go
        try {
            if (n == 0 || (m = shm::decode_ctl(b, static_cast<size_t>(n))).kind != shm::Ctl::copy || m.slot >= slots)
                continue;
        } catch (...) {
            continue;
        }
        uint64_t t = m.ticket;
        if (state_word(ring, m.slot).compare_exchange_strong(t, m.ticket | shm::kTaken)) st->taken++;
        if (st->close_when_full && st->taken.load() == slots) {
            close(s);
            s = -1;
            st->closed_ms = now_ms();
            st->closed = true;
        }
    }
    if (s >= 0) close(s);
    if (rfd >= 0) {
        munmap(ring, shm::ring_len(slots, len));
        close(rfd);
    }
}

struct Honest {
    region r;
    kvx_transport *t;
    metablob m;
};

void honest_up(Honest &h) {
    h.r = region_new(kSNB, kSBL, 0x11);
    h.t = make_transport(h.r.base, kSNB, kSBL, "backend=shm");
    get_meta(h.t, &h.m);
}

void honest_down(Honest &h) {
    kvx_transport_destroy(h.t);
    region_free(&h.r);
}

// What the writer saw from its submit to the hostile peer on.
struct Seen {
    size_t failed = 0, done = 0, honest = 0, honest_failed = 0;
    uint64_t last_ms = 0, add_t0 = 0, add_ms = 0, reg = 0;
    int add_state = KVX_REGISTRATION_PENDING, add_err = 0;
};

// Until every hostile transfer surfaced (and, with a close, 500 ms more)
// or 3 x kT: keeps one write to "honest" going, counting those done during
// the stall (after the close: the event loop must not be stuck), and
// starts adding the third target once the stall is on.
void watch(kvx_transport *w, Stall *st, const Honest &third, uint64_t t0, uint64_t evil, Seen *s) {
    const bool close = st->close_when_full;
    uint64_t hid = 0, d[128], f[128], n = 0;
    while (now_ms() < t0 + 3 * kT) {
        size_t nd = 0, nf = 0;
        CHECK_OK(kvx_poll(&nd, &nf, w, "evil", d, 128, f, 128));
        s->done += nd;
        s->failed += nf;
        if (nd + nf > 0) s->last_ms = now_ms();
        const bool stalled = s->done + s->failed < evil;
        const bool on = close ? st->closed.load() : stalled && st->taken.load() == shm::kMaxSlots && now_ms() >= t0 + 300;
        if (hid == 0) {
            const uint64_t blk = n++ % kSNB;
            CHECK_OK(kvx_write_blocks(&hid, w, "honest", &blk, &blk, 1));
        }
        CHECK_OK(kvx_poll(&nd, &nf, w, "honest", d, 128, f, 128));
        if (nd + nf > 0) hid = 0;  // one at a time: it is hid
        if (nd > 0 && (close ? on : stalled)) s->honest++;
        s->honest_failed += nf;
        if (on && s->reg == 0) {
            s->add_t0 = now_ms();
            CHECK_OK(kvx_add_remote_peer_async(&s->reg, w, "third", third.m.bytes, third.m.len, third.m.base,
                                               third.m.nb, third.m.bl, 0));
        }
        if (s->reg && s->add_state == KVX_REGISTRATION_PENDING) {
            CHECK_OK(kvx_registration_status(&s->add_state, &s->add_err, w, s->reg, 0));
            if (s->add_state != KVX_REGISTRATION_PENDING) s->add_ms = now_ms() - s->add_t0;
        }
        if (!stalled && s->add_state != KVX_REGISTRATION_PENDING && (!close || now_ms() >= st->closed_ms + 500)) break;
        usleep(1000);
    }
    if (s->reg && s->add_state == KVX_REGISTRATION_PENDING) {  // 3 s in all for the add
        const int left = static_cast<int>(s->add_t0 + 3000 - std::min(s->add_t0 + 3000, now_ms()));
        CHECK_OK(kvx_registration_status(&s->add_state, &s->add_err, w, s->reg, left));
        s->add_ms = now_ms() - s->add_t0;
    }
}

// 5. The writer (transfer_timeout_ms=2000) fills the squatter's 64 slots
// and queues more; the squatter takes them all and answers none (or closes
// its socket). Every transfer fails within 2 x the timeout (the bar is
// 2.2 s; with a close, before the timeout), while the writer's honest peer
// keeps completing writes and a new peer can be added.
void stall_case(bool close_when_full) {
    Honest honest, third;
    honest_up(honest);
    honest_up(third);
    auto *st = new Stall;  // left behind when the test fails: the writer may still be stuck on it
    squat(st->sq, kSNB, kSBL);
    st->close_when_full = close_when_full;
    st->th = std::thread(stall_serve, st);
    region rw = region_new(kSNB, kSBL, 0x33);
    kvx_transport *w = make_transport(rw.base, kSNB, kSBL, "backend=shm transfer_timeout_ms=2000 peer_redial_ms=0");
    add_peer(w, "honest", &honest.m);
    add_peer(w, "evil", &st->sq.blob);
    const char *be = "", *path = "";
    CHECK_OK(kvx_peer_backend(&be, &path, w, "evil"));
    assert_string_equal(path, "staged");
    // With a close, exactly the slots: a write after it may fail at once (KVX_EPEERBROKEN).
    const uint64_t evil = close_when_full ? shm::kMaxSlots : kEvil, t0 = now_ms();
    for (uint64_t i = 0, id; i < evil; i++) CHECK_OK(kvx_write_blocks(&id, w, "evil", &i, &i, 1));
    Seen s;
    watch(w, st, third, t0, evil, &s);
    const char *add = s.reg == 0 ? "never started" : s.add_state == KVX_REGISTRATION_DONE ? "done"
                      : s.add_state == KVX_REGISTRATION_FAILED ? kvx_strerror(s.add_err) : "still pending";
    printf("stall%s: %u slots taken; %zu of %llu transfers failed (%zu done), the last %lld ms after submit",
           close_when_full ? " then close" : "", st->taken.load(), s.failed, (unsigned long long)evil, s.done,
           s.last_ms ? (long long)(s.last_ms - t0) : -1LL);
    if (close_when_full) printf(" (%lld after the close)", s.last_ms ? (long long)(s.last_ms - st->closed_ms) : -1LL);
    printf(", bar %u, asserted < %u; honest peer: %zu writes done %s, %zu failed; a new add: %s after %llu ms\n",
           kT + kT / 10, 2 * kT, s.honest, close_when_full ? "after the close" : "during the stall", s.honest_failed,
           add, (unsigned long long)s.add_ms);
    st->stop = true;
    st->th.join();
    assert_int_equal(st->taken.load(), shm::kMaxSlots);
    if (s.failed != evil) fail_msg("%zu of %llu transfers failed within %u ms", s.failed, (unsigned long long)evil, 3 * kT);
    if (s.last_ms - t0 >= 2 * kT) fail_msg("the last transfer failed %llu ms after submit", (unsigned long long)(s.last_ms - t0));
    if (close_when_full && s.last_ms - st->closed_ms.load() >= kT) fail_msg("not promptly after the close");
    if (s.honest == 0 || s.honest_failed != 0) fail_msg("the honest peer stalled with the hostile one");
    if (s.add_state != KVX_REGISTRATION_DONE) fail_msg("adding a peer during the stall: %s", add);
    uint64_t id, blk = 1;
    size_t nf = 0;
    CHECK_OK(kvx_write_blocks(&id, w, "third", &blk, &blk, 1));
    assert_int_equal(wait_ids(w, "third", &id, 1, 5000, &nf, nullptr), 1);
    assert_int_equal(nf, 0);
    kvx_transport_destroy(w);
    region_free(&rw);
    honest_down(honest);
    honest_down(third);
    close(st->sq.lfd);
    delete st;
}

void test_stall_never_answered(void **) { stall_case(false); }
void test_stall_then_close(void **) { stall_case(true); }

}  // namespace

int main() {
    signal(SIGPIPE, SIG_IGN);  // a writer that died: our pipe write fails, we do not
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigbus_mapped),
        cmocka_unit_test(test_sigbus_ring),
        cmocka_unit_test(test_stall_never_answered),
        cmocka_unit_test(test_stall_then_close),
    };
    return cmocka_run_group_tests_name("shm_hostile_target", tests, save_huge, restore_huge);
}
