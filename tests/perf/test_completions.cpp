// The completion queues on the instant backend (deterministic: a transfer is
// done inside write_blocks, or held until its peer goes): every id is reported
// exactly once through poll(peer) and poll(NULL) mixed, also after its peer
// was removed or re-added, and a cancelled unpolled id never; removed peers'
// queues go also when only poll(peer) drains them; a remove racing a
// write_blocks reports no backend leak.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/transport.h"  // before cmocka, whose fail() macro it would meet
#include "util/error.h"

extern "C" {
#include <cmocka.h>
}

#include "instant_backend.h"
#include "kvxfer.h"

namespace {

// "p<i>", appended rather than "p" + std::to_string(i): gcc 12 at -O3 warns
// on the latter (-Wrestrict false positive, GCC bug 105651).
std::string peer_name(long i) {
    std::string s("p");
    s += std::to_string(i);
    return s;
}

constexpr uint64_t kBlockLen = 64;

struct Fixture {
    uint64_t kBlocks;
    std::vector<uint8_t> region;
    kvx_transport *t = nullptr;
    std::vector<uint8_t> meta = std::vector<uint8_t>(4096);
    explicit Fixture(uint64_t blocks = 64) : kBlocks(blocks), region(blocks * kBlockLen) {
        kvx_options *o = nullptr;
        assert_int_equal(kvx_options_create(&o), 0);
        assert_int_equal(kvx_options_set(o, "backend", "instant"), 0);
        assert_int_equal(kvx_transport_create(&t, region.data(), kBlocks, kBlockLen, nullptr, o), 0);
        kvx_options_destroy(o);
        size_t len = 0;
        assert_int_equal(kvx_get_agent_metadata(&len, t, meta.data(), meta.size()), 0);
        meta.resize(len);
    }
    ~Fixture() {
        kvx::instant::hold(false);
        kvx_transport_destroy(t);
    }
    void add(const char *id) {
        assert_int_equal(kvx_add_remote_peer(t, id, meta.data(), meta.size(), (uintptr_t)region.data(), kBlocks,
                                             kBlockLen), 0);
    }
    uint64_t write(const char *peer, uint64_t block) {
        uint64_t id = 0;
        assert_int_equal(kvx_write_blocks(&id, t, peer, &block, &block, 1), 0);
        return id;
    }
    // One poll with room for cap ids of each kind: (done, failed).
    std::pair<std::vector<uint64_t>, std::vector<uint64_t>> poll(const char *peer, size_t cap = 16) {
        std::vector<uint64_t> d(cap), f(cap);
        size_t nd = 0, nf = 0;
        assert_int_equal(kvx_poll(&nd, &nf, t, peer, d.data(), cap, f.data(), cap), 0);
        d.resize(nd);
        f.resize(nf);
        return {d, f};
    }
};

void test_poll_by_peer_and_all(void **) {
    Fixture x;
    x.add("a");
    x.add("b");
    const uint64_t a1 = x.write("a", 1), b1 = x.write("b", 1), a2 = x.write("a", 2);
    assert_true(x.poll("b").first == std::vector<uint64_t>{b1});
    assert_true(x.poll("b").first.empty());
    assert_true(x.poll(nullptr, 1).first == std::vector<uint64_t>{a1});  // a stays listed: one left
    assert_true(x.poll(nullptr).first == std::vector<uint64_t>{a2});
    assert_true(x.poll(nullptr).first.empty());
    assert_true(x.poll("a").first.empty());
    const uint64_t b2 = x.write("b", 3);
    assert_true(x.poll(nullptr).first == std::vector<uint64_t>{b2});
}

void test_removed_peer_reports_once(void **) {
    Fixture x;
    x.add("a");
    kvx::instant::hold(true);
    const uint64_t held = x.write("a", 1);
    kvx::instant::hold(false);
    const uint64_t done = x.write("a", 2);
    assert_int_equal(kvx_remove_remote_peer(x.t, "a"), 0);
    auto [d, f] = x.poll("a");
    assert_true(d == std::vector<uint64_t>{done});
    assert_true(f == std::vector<uint64_t>{held});
    assert_true(x.poll(nullptr).first.empty() && x.poll(nullptr).second.empty());
    x.add("a");  // the same id again: a fresh queue, nothing stale
    const uint64_t again = x.write("a", 3);
    assert_true(x.poll(nullptr).first == std::vector<uint64_t>{again});
    assert_true(x.poll("a").first.empty());
}

void test_removed_peer_drained_by_poll_all(void **) {
    Fixture x;
    x.add("a");
    kvx::instant::hold(true);
    const uint64_t held = x.write("a", 1);
    kvx::instant::hold(false);
    assert_int_equal(kvx_remove_remote_peer(x.t, "a"), 0);
    assert_true(x.poll(nullptr).second == std::vector<uint64_t>{held});
    assert_true(x.poll("a").second.empty());
}

void test_cancel_unpolled(void **) {
    Fixture x;
    x.add("a");
    const uint64_t id = x.write("a", 1), kept = x.write("a", 2);
    size_t still = 9;
    assert_int_equal(kvx_cancel(&still, x.t, &id, 1, KVX_CANCEL_IMMEDIATE, nullptr), 0);
    assert_int_equal(still, 0);
    assert_true(x.poll(nullptr).first == std::vector<uint64_t>{kept});
}

void test_many_peers_small_polls(void **) {
    Fixture x;
    std::set<uint64_t> want, got;
    for (int p = 0; p < 20; p++) x.add(peer_name(p).c_str());
    for (int k = 0; k < 5; k++)
        for (int p = 0; p < 20; p++) want.insert(x.write(peer_name(p).c_str(), (uint64_t)k));
    for (int i = 0; i < 200 && got.size() < want.size(); i++) {
        auto [d, f] = i % 3 ? x.poll(nullptr, 3) : x.poll(peer_name(i % 20).c_str(), 2);
        assert_true(f.empty());
        for (uint64_t id : d) assert_true(got.insert(id).second);  // never twice
    }
    assert_true(got == want);
}

// A repeated remote index is refused whichever way it is found: pairwise
// (small batch), bitmap (large batch), sort (large batch, huge region).
void test_duplicate_remote_index(void **) {
    for (uint64_t blocks : {uint64_t{64}, uint64_t{1} << 16})
        for (size_t n : {size_t{2}, size_t{32}, size_t{33}, size_t{64}}) {
            Fixture x(blocks);
            x.add("a");
            std::vector<uint64_t> local(n), remote(n);
            for (size_t i = 0; i < n; i++) local[i] = remote[i] = i;
            uint64_t id = 0;
            assert_int_equal(kvx_write_blocks(&id, x.t, "a", local.data(), remote.data(), n), 0);
            remote[n - 1] = remote[n / 2 - 1];
            assert_int_equal(kvx_write_blocks(&id, x.t, "a", local.data(), remote.data(), n), KVX_EINVAL);
            assert_non_null(strstr(kvx_last_error_message(), "appears more than once"));
        }
}


// The core itself (kvx::Transport), for what the C API does not show: how
// many completion queues it keeps.
struct Core {
    static constexpr uint64_t kBlocks = 64;
    std::vector<uint8_t> region = std::vector<uint8_t>(kBlocks * kBlockLen);
    std::unique_ptr<kvx::Transport> t;
    std::vector<uint8_t> meta;
    Core() {
        kvx::OptionBag bag;
        bag.kv.insert_or_assign("backend", std::string("instant"));
        t = std::make_unique<kvx::Transport>(region.data(), kBlocks, kBlockLen, nullptr, &bag);
        meta = t->metadata();
    }
    ~Core() { kvx::instant::hold(false); }
    void add(const std::string &id) {
        t->add_peer(id, meta.data(), meta.size(), (uintptr_t)region.data(), kBlocks, kBlockLen);
    }
    uint64_t write(const std::string &id, uint64_t block) { return t->write_blocks(id, &block, &block, 1); }
    // Every id poll(peer) has for id now, done and failed alike, into *got (each once).
    void drain(const char *id, std::set<uint64_t> *got) {
        uint64_t d[8], f[8];
        size_t nd = 0, nf = 0;
        do {
            t->poll(id, d, 8, &nd, f, 8, &nf);
            for (size_t i = 0; i < nd; i++) assert_true(got->insert(d[i]).second);
            for (size_t i = 0; i < nf; i++) assert_true(got->insert(f[i]).second);
        } while (nd + nf > 0);
    }
};

// Peers added and removed over and over, with transfers done and failed (held
// until remove), polled only by peer id, before and after their remove: every
// id is reported once, and the queues of removed peers go (they stayed, and
// stayed listed, until a poll(NULL) that never came).
void test_removed_queues_go_by_peer_poll(void **) {
    Core x;
    x.add("keep");
    std::set<uint64_t> want, got;
    for (int i = 0; i < 600; i++) {
        const std::string id = peer_name(i);
        x.add(id);
        want.insert(x.write("keep", (uint64_t)i % 64));
        if (i % 3 != 1) {
            kvx::instant::hold(true);
            want.insert(x.write(id, 1));
            kvx::instant::hold(false);
        }
        want.insert(x.write(id, 2));
        if (i % 3 != 0) x.drain(id.c_str(), &got);  // drained before the remove too
        x.t->remove_peer(id);
        x.drain(id.c_str(), &got);
        if (i % 50 == 0) x.drain("keep", &got);
    }
    x.drain("keep", &got);
    assert_true(got == want);
    const kvx::Transport::QueueCounts c = x.t->queue_counts();
    print_message("after 600 peers came and went: %zu queues, %zu slots listed\n", c.queues, c.listed);
    assert_int_equal(c.queues, 1);  // keep's
    assert_true(c.listed <= 2);
    uint64_t d[8], f[8];
    size_t nd = 9, nf = 9;
    x.t->poll(nullptr, d, 8, &nd, f, 8, &nf);  // nothing left for poll(NULL) either
    assert_int_equal(nd + nf, 0);
}

// stderr while fn runs.
template <class F>
std::string stderr_of(F fn) {
    fflush(stderr);
    const int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string out(4096, '\0');
    rewind(tmp);
    out.resize(fread(out.data(), 1, out.size(), tmp));
    fclose(tmp);
    return out;
}

// A remove that runs while a write_blocks of the peer is inside submit() (the
// instant backend sleeps there): the transfer fails on the shut-down link and
// is reported once, and remove logs no "transfers unreported" (it did: it took
// that transfer for the backend's leak).
void test_remove_racing_write(void **) {
    Core x;
    x.add("a");
    kvx::instant::submit_delay_ms(300);
    uint64_t id = 0;
    std::thread w([&] { id = x.write("a", 1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // inside submit()
    const std::string log = stderr_of([&] { x.t->remove_peer("a"); });
    kvx::instant::submit_delay_ms(0);
    w.join();
    std::set<uint64_t> got;
    x.drain("a", &got);
    assert_true(got == std::set<uint64_t>{id});
    if (!log.empty()) print_message("remove logged: %s", log.c_str());
    assert_null(strstr(log.c_str(), "unreported"));
    // A write that finds the peer gone fails: nothing is added to it.
    uint64_t b = 1;
    try {
        x.t->write_blocks("a", &b, &b, 1);
        fail_msg("write_blocks to a removed peer succeeded");
    } catch (const kvx::Error &e) {
        assert_int_equal(e.code(), KVX_ENOENT);
    }
}

}  // namespace

int main(void) {
    setenv("KVX_LOG", "error", 0);  // before the first log: test_remove_racing_write reads it
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_by_peer_and_all),
        cmocka_unit_test(test_removed_peer_reports_once),
        cmocka_unit_test(test_removed_peer_drained_by_poll_all),
        cmocka_unit_test(test_cancel_unpolled),
        cmocka_unit_test(test_many_peers_small_polls),
        cmocka_unit_test(test_duplicate_remote_index),
        cmocka_unit_test(test_removed_queues_go_by_peer_poll),
        cmocka_unit_test(test_remove_racing_write),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
