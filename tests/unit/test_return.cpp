// The return of a peer to its preferred path (issue 29 item 5), on the core
// alone: writer and target serve tcp and the test-only "instant" backend
// (tests/perf/instant_backend.cpp; registered after tcp, so tcp is
// preferred), and the target advertises tcp through a relay on loopback that
// the test turns on and off. The relay refusing, the peer lands on instant;
// the relay forwarding, it moves to tcp by itself with transfers held in
// flight on instant: they are reported once each when released (a cancelled
// one never), later writes land through tcp, the old link goes once
// drained; the stall timeout fails what the old link holds; a remove during
// an attempt returns at once and ends it; peer_redial_ms=0 never returns.
#include <algorithm>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "harness.h"
}

#include "../perf/instant_backend.h"

namespace {

constexpr uint64_t kNB = 64, kBL = 4096;

// Accepts on 127.0.0.1:port; per mode closes each connection at once (the
// handshake fails: tcp does not connect), forwards it to the target's
// listening port, or holds it open saying nothing (an attempt hangs).
struct Relay {
    enum Mode { refuse, forward, hold };
    std::atomic<int> mode{refuse};
    std::atomic<int> accepted{0};
    std::atomic<bool> stop{false};
    int lfd = -1;
    uint16_t port = 0, to = 0;
    std::thread th;
    std::vector<std::thread> pipes;
    std::mutex mu;  // guards held
    std::vector<int> held;

    void start() {
        lfd = loopback_socket(16, &port);
        th = std::thread([this] { run(); });
    }
    void run() {
        while (!stop.load()) {
            pollfd p{lfd, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            accepted++;
            switch (mode.load()) {
            case refuse: ::close(c); break;
            case hold: {
                std::lock_guard<std::mutex> lk(mu);
                held.push_back(c);
                break;
            }
            default: pipes.emplace_back([this, c] { pipe(c); }); break;
            }
        }
    }
    void pipe(int c) {
        int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(to);
        if (::connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
            char buf[65536];
            pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
            while (!stop.load()) {
                if (::poll(p, 2, 20) <= 0) continue;
                bool end = false;
                for (int i = 0; i < 2 && !end; i++) {
                    if (!p[i].revents) continue;
                    ssize_t n = ::read(p[i].fd, buf, sizeof buf);
                    end = n <= 0 || write_full(p[1 - i].fd, buf, static_cast<size_t>(n)) != 0;
                }
                if (end) break;
            }
        }
        ::close(s);
        ::close(c);
    }
    size_t holding() {
        std::lock_guard<std::mutex> lk(mu);
        return held.size();
    }
    // Whether a held connection was closed by the other end.
    bool held_closed() {
        std::lock_guard<std::mutex> lk(mu);
        for (int c : held) {
            pollfd p{c, POLLIN, 0};
            char b;
            if (::poll(&p, 1, 0) == 1 && ::recv(c, &b, 1, MSG_DONTWAIT) == 0) return true;
        }
        return false;
    }
    void finish() {
        stop.store(true);
        th.join();
        for (auto &t : pipes) t.join();
        for (int c : held) ::close(c);
        ::close(lfd);
    }
};

uint16_t free_port() {
    uint16_t port = 0;
    ::close(loopback_socket(0, &port));
    return port;
}

char g_log[1 << 16];
std::atomic<size_t> g_log_len{0};
void on_log(const kvx_log_record *rec, void *) {
    size_t n = strlen(rec->message), at = g_log_len.fetch_add(n + 1);
    if (at + n + 1 < sizeof g_log) {
        memcpy(g_log + at, rec->message, n);
        g_log[at + n] = '\n';
    }
}

// A target behind a relay and a writer with the target added as "t".
struct Setup {
    Relay relay;
    region ra, rb;
    kvx_transport *a = nullptr, *b = nullptr;
    metablob mb;
    explicit Setup(const char *writer_opts, Relay::Mode first = Relay::refuse) {
        kvx::instant::hold(false);
        relay.mode = first;
        relay.start();
        relay.to = free_port();
        char topts[160];
        snprintf(topts, sizeof topts, "backend=tcp,instant tcp.listen=127.0.0.1:%u tcp.advertise=127.0.0.1:%u",
                 relay.to, relay.port);
        rb = region_new(kNB, kBL, 0x22);
        kvx_options *o = nullptr;
        CHECK_OK(kvx_options_create(&o));
        CHECK_OK(kvx_options_parse(o, topts));
        b = transport_new(&rb, nullptr, o);  // destroys o
        get_meta(b, &mb);
        ra = region_new(kNB, kBL, 0x11);
        for (uint64_t i = 0; i < kNB; i++) fill_block(ra.base + i * kBL, kBL, i, 9);
        CHECK_OK(kvx_options_create(&o));
        // tcp dials again within the connect timeout after each refusal: an
        // add (and a return attempt) through a refusing relay takes all of it
        CHECK_OK(kvx_options_parse(o, "backend=tcp,instant connect_timeout_ms=1000"));
        CHECK_OK(kvx_options_parse(o, writer_opts));
        a = transport_new(&ra, nullptr, o);
        add_peer(a, "t", &mb);
    }
    ~Setup() {
        kvx::instant::hold(false);
        kvx_transport_destroy(a);
        kvx_transport_destroy(b);
        relay.finish();
        region_free(&ra);
        region_free(&rb);
    }
    std::string backend() {
        const char *bk = nullptr, *path = nullptr;
        CHECK_OK(kvx_peer_backend(&bk, &path, a, "t"));
        return bk;
    }
    // Block i to remote block i.
    uint64_t write(uint64_t i) {
        uint64_t id = 0;
        CHECK_OK(kvx_write_blocks(&id, a, "t", &i, &i, 1));
        return id;
    }
    bool wait_backend(const char *want, int ms) {
        const uint64_t until = now_ms() + static_cast<uint64_t>(ms);
        while (backend() != want && now_ms() < until) usleep(5000);
        return backend() == want;
    }
    // On the fallback (instant), n writes held there (ids[0..n-1], blocks
    // 0..n-1), then the relay lets tcp through: back on tcp, they stay on
    // the old link.
    void return_with_held(uint64_t *ids, size_t n) {
        assert_string_equal(backend().c_str(), "instant");  // tcp failed at the handshake: the fallback
        kvx::instant::hold(true);
        for (uint64_t i = 0; i < n; i++) ids[i] = write(i);
        relay.mode = Relay::forward;
        assert_true(wait_backend("tcp", 10000));
    }
    bool wait_no_instant_link(int ms) {
        const uint64_t until = now_ms() + static_cast<uint64_t>(ms);
        while (kvx::instant::live_peers() != 0 && now_ms() < until) usleep(5000);
        return kvx::instant::live_peers() == 0;
    }
};

void test_returns_with_transfers_in_flight(void **) {
    g_log_len = 0;
    CHECK_OK(kvx_set_log_handler(on_log, nullptr, KVX_LOG_WARN));
    Setup s("peer_redial_ms=100");
    assert_string_equal(s.backend().c_str(), "instant");  // tcp failed at the handshake: the fallback
    assert_int_equal(kvx::instant::live_peers(), 1);
    kvx::instant::hold(true);
    enum { kOld = 8, kNew = 16 };
    uint64_t ids[kOld + kNew];
    for (uint64_t i = 0; i < kOld; i++) ids[i] = s.write(i);
    s.relay.mode = Relay::forward;
    const uint64_t t0 = now_ms();
    assert_true(s.wait_backend("tcp", 10000));
    printf("# back on tcp %llu ms after the relay forwards\n", (unsigned long long)(now_ms() - t0));
    kvx_peer_state st;
    CHECK_OK(kvx_get_peer_state(s.a, "t", &st));
    assert_int_equal(st.link, KVX_PEER_UP);
    assert_int_equal(st.reconnects, 0);  // a return is no reconnection
    assert_int_equal(st.in_flight, kOld);
    assert_int_equal(kvx::instant::live_peers(), 1);  // the old link stays while it has transfers
    // New writes go to tcp while the old ones are held on instant.
    for (uint64_t i = 0; i < kNew; i++) ids[kOld + i] = s.write(kOld + i);
    size_t nf = 9;
    assert_int_equal(wait_ids(s.a, "t", ids + kOld, kNew, 10000, &nf, nullptr), kNew);
    assert_int_equal(nf, 0);
    for (uint64_t i = kOld; i < kOld + kNew; i++) assert_true(block_matches(s.rb.base + i * kBL, kBL, i, 9));
    // Cancel reaches an op on the old link: one forgotten, one returned in flight.
    uint64_t inflight[1];
    size_t still = 9;
    CHECK_OK(kvx_cancel(&still, s.a, &ids[0], 1, KVX_CANCEL_IMMEDIATE, nullptr));
    assert_int_equal(still, 0);
    CHECK_OK(kvx_cancel(&still, s.a, &ids[1], 1, KVX_CANCEL_WAIT, inflight));
    assert_int_equal(still, 1);  // started (held): it surfaces in poll
    assert_int_equal(inflight[0], ids[1]);
    CHECK_OK(kvx_get_peer_state(s.a, "t", &st));
    assert_int_equal(st.in_flight, kOld - 1);
    kvx::instant::release();
    assert_int_equal(wait_ids(s.a, "t", ids + 1, kOld - 1, 10000, &nf, nullptr), kOld - 1);
    assert_int_equal(nf, 0);
    assert_true(s.wait_no_instant_link(5000));  // drained: shut down
    CHECK_OK(kvx_get_peer_state(s.a, "t", &st));
    assert_int_equal(st.in_flight, 0);
    assert_string_equal(st.backend, "tcp");
    size_t nd = 0;
    uint64_t d[4], f[4];
    usleep(200 * 1000);
    CHECK_OK(kvx_poll(&nd, &nf, s.a, nullptr, d, 4, f, 4));
    assert_int_equal(nd + nf, 0);  // nothing twice, nothing of the cancelled one
    CHECK_OK(kvx_log_flush(5000));
    CHECK_OK(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN));
    assert_non_null(strstr(g_log, "back on tcp (was instant)"));
}

}  // namespace

namespace {

// The stall timeout covers the old link: its held transfers fail
// (KVX_ETIMEDOUT) and the peer reconnects.
void test_stall_covers_the_old_link(void **) {
    Setup s("peer_redial_ms=100 transfer_timeout_ms=1000");
    enum { kOld = 4 };
    uint64_t ids[kOld];
    s.return_with_held(ids, kOld);
    int32_t codes[kOld];
    size_t nf = 0;
    assert_int_equal(wait_results(s.a, "t", ids, kOld, 10000, &nf, codes), kOld);
    assert_int_equal(nf, kOld);
    for (int32_t c : codes) assert_int_equal(c, KVX_ETIMEDOUT);
    assert_true(s.wait_no_instant_link(5000));
    kvx_peer_state st;
    assert_true(wait_peer_link(s.a, "t", KVX_PEER_UP, 10000, &st) >= 0);
    assert_string_equal(st.backend, "tcp");
    assert_int_equal(st.reconnects, 1);
    uint64_t id = s.write(7);
    assert_int_equal(wait_ids(s.a, "t", &id, 1, 10000, &nf, nullptr), 1);
    assert_int_equal(nf, 0);
    assert_true(block_matches(s.rb.base + 7 * kBL, kBL, 7, 9));
}

// A remove while a return attempt hangs in its handshake returns at once,
// ends the attempt, and the old link's held transfers fail as on any remove.
// The old link has a stall timeout of its own: while the new link keeps
// making progress (so the peer as a whole never stalls), what the old one
// holds fails with KVX_ETIMEDOUT, the peer stays up with no reconnection,
// and the old link is shut down.
void test_old_link_stalls_alone(void **) {
    g_log_len = 0;
    CHECK_OK(kvx_set_log_handler(on_log, nullptr, KVX_LOG_WARN));
    Setup s("peer_redial_ms=100 transfer_timeout_ms=1000");
    constexpr size_t kOld = 4;
    uint64_t ids[kOld];
    s.return_with_held(ids, kOld);
    kvx_peer_state st;
    CHECK_OK(kvx_get_peer_state(s.a, "t", &st));
    assert_int_equal(st.reconnects, 0);
    assert_int_equal(st.in_flight, kOld);
    // Progress on tcp all along, past the timeout: one write every 20 ms.
    constexpr size_t kNew = 125;
    uint64_t all[kOld + kNew];
    std::copy(ids, ids + kOld, all);
    for (uint64_t i = 0; i < kNew; i++) {
        all[kOld + i] = s.write(kOld + i % 8);
        usleep(20 * 1000);
    }
    int32_t codes[kOld + kNew];
    size_t nf = 0;
    assert_int_equal(wait_results(s.a, "t", all, kOld + kNew, 10000, &nf, codes), kOld + kNew);
    assert_int_equal(nf, kOld);
    for (size_t i = 0; i < kOld + kNew; i++) assert_int_equal(codes[i], i < kOld ? KVX_ETIMEDOUT : 0);
    assert_true(s.wait_no_instant_link(5000));
    CHECK_OK(kvx_get_peer_state(s.a, "t", &st));
    assert_int_equal(st.link, KVX_PEER_UP);
    assert_int_equal(st.reconnects, 0);  // the peer itself never stalled
    assert_string_equal(st.backend, "tcp");
    assert_int_equal(st.in_flight, 0);
    CHECK_OK(kvx_log_flush(5000));
    CHECK_OK(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN));
    assert_non_null(strstr(g_log, "the link it left for a preferred path made no progress"));
}

// Remove while the old link holds transfers: they are reported (failed)
// before the remove returns, and the old link is shut down by then.
void test_remove_with_an_old_link(void **) {
    Setup s("peer_redial_ms=100");
    enum { kOld = 4 };
    uint64_t ids[kOld];
    s.return_with_held(ids, kOld);
    assert_int_equal(kvx::instant::live_peers(), 1);
    CHECK_OK(kvx_remove_remote_peer(s.a, "t"));
    assert_int_equal(kvx::instant::live_peers(), 0);  // shut down before remove returned
    size_t nd = 0, nf = 0;
    uint64_t d[8], f[8];
    CHECK_OK(kvx_poll(&nd, &nf, s.a, nullptr, d, 8, f, 8));
    assert_int_equal(nd, 0);
    assert_int_equal(nf, kOld);  // each held transfer reported once, failed
    for (uint64_t id : ids) assert_true(std::find(f, f + nf, id) != f + nf);
}

void test_remove_during_an_attempt(void **) {
    Setup s("peer_redial_ms=50 connect_timeout_ms=5000");
    assert_string_equal(s.backend().c_str(), "instant");
    kvx::instant::hold(true);
    uint64_t id = s.write(1);
    s.relay.mode = Relay::hold;
    const uint64_t until = now_ms() + 5000;
    while (s.relay.holding() == 0 && now_ms() < until) usleep(2000);
    assert_int_equal(s.relay.holding(), 1);
    usleep(50 * 1000);  // into the handshake
    uint64_t t0 = now_ms();
    CHECK_OK(kvx_remove_remote_peer(s.a, "t"));
    const uint64_t took = now_ms() - t0;
    int32_t code = 0;
    size_t nf = 0;
    assert_int_equal(wait_results(s.a, "t", &id, 1, 1000, &nf, &code), 1);
    assert_int_equal(code, KVX_ECANCELED);
    t0 = now_ms();
    while (!s.relay.held_closed() && now_ms() < t0 + 2000) usleep(5000);
    printf("# remove took %llu ms; the attempt's connection closed %llu ms later\n", (unsigned long long)took,
           (unsigned long long)(now_ms() - t0));
    assert_true(took < 500);
    assert_true(s.relay.held_closed());
    assert_true(s.wait_no_instant_link(2000));  // (the ended attempt held the peer a moment longer)
    // Added again (the relay forwarding now): straight on tcp.
    s.relay.mode = Relay::forward;
    add_peer(s.a, "t", &s.mb);
    assert_string_equal(s.backend().c_str(), "tcp");
}

// peer_redial_ms=0: no return, however long the preferred path is back.
void test_no_return_without_redial(void **) {
    Setup s("peer_redial_ms=0");
    assert_string_equal(s.backend().c_str(), "instant");
    s.relay.mode = Relay::forward;
    usleep(100 * 1000);  // the add's last dial may wait in the backlog
    const int tried = s.relay.accepted.load();
    usleep(500 * 1000);
    assert_string_equal(s.backend().c_str(), "instant");
    assert_int_equal(s.relay.accepted.load(), tried);  // never dialled again
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_returns_with_transfers_in_flight),
        cmocka_unit_test(test_stall_covers_the_old_link),
        cmocka_unit_test(test_old_link_stalls_alone),
        cmocka_unit_test(test_remove_with_an_old_link),
        cmocka_unit_test(test_remove_during_an_attempt),
        cmocka_unit_test(test_no_return_without_redial),
    };
    return cmocka_run_group_tests_name("return", tests, NULL, NULL);
}
