// Logging (kvx_set_log_handler()): warnings on by default, records with
// their context on the library's own thread, the per-site rate limit, the
// bounded queue, replacement and fork, and stderr as the default sink. The
// messages are the library's own (a refused peer) where a transport can make
// them, KVX_LOG from this program where a test needs thousands.
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/log.h"

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace {

struct Got {
    int level;
    std::string message, component, peer;
    bool has_peer;
    int64_t time_ns;
    uint64_t suppressed, dropped;
    int tid, handler_tid;
    uint32_t size;
};

std::mutex g_mu;
std::vector<Got> g_got;
std::atomic<int> g_block{0};      // >0: the handler waits until it is 0
std::atomic<int> g_in_handler{0};
std::atomic<int> g_flush_rc{1};

void collect(const kvx_log_record *r, void *user) {
    g_in_handler.store(1);
    while (g_block.load()) usleep(1000);
    Got g{r->level, r->message, r->component, r->peer_id ? r->peer_id : "", r->peer_id != nullptr,
          r->time_ns, r->suppressed, r->dropped, r->thread_id, static_cast<int>(syscall(SYS_gettid)), r->size};
    if (user) g_flush_rc.store(kvx_log_flush(0));  // from the handler: refused, never a wait for itself
    {
        std::lock_guard<std::mutex> lk(g_mu);
        g_got.push_back(std::move(g));
    }
    g_in_handler.store(0);
}

std::vector<Got> take() {
    assert_int_equal(kvx_log_flush(5000), 0);
    std::lock_guard<std::mutex> lk(g_mu);
    std::vector<Got> out;
    out.swap(g_got);
    return out;
}

int64_t realtime_ns() {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Adds a peer whose config fingerprint differs: refused, logged at warn.
void refused_add(const char *peer) {
    region a = region_new(4, 4096, 0), b = region_new(4, 4096, 0);
    kvx_transport *ta = transport_new(&a, "{\"model\": \"a\"}", test_options("backend=tcp", NULL));
    kvx_transport *tb = transport_new(&b, "{\"model\": \"b\"}", test_options("backend=tcp", NULL));
    metablob m;
    get_meta(tb, &m);
    assert_int_equal(kvx_add_remote_peer(ta, peer, m.bytes, m.len, m.base, m.nb, m.bl), KVX_EFINGERPRINT);
    kvx_transport_destroy(ta);
    kvx_transport_destroy(tb);
    region_free(&a);
    region_free(&b);
}

void test_default_is_warn(void **) {
    // main() cleared KVX_LOG before the first message: warnings and errors.
    assert_int_equal(kvx_get_log_level(), KVX_LOG_WARN);
    assert_true(kvx::log_enabled(kvx::LogLevel::warn));
    assert_false(kvx::log_enabled(kvx::LogLevel::info));
}

void test_refused_peer_record(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_WARN), 0);
    const int64_t t0 = realtime_ns();
    refused_add("p-refused");
    const int64_t t1 = realtime_ns();
    std::vector<Got> got = take();
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
    const Got *g = nullptr;
    for (const Got &x : got)
        if (x.message.find("fingerprint") != std::string::npos) g = &x;
    assert_non_null(g);
    assert_int_equal(g->level, KVX_LOG_WARN);
    assert_string_equal(g->component.c_str(), "core");
    assert_true(g->has_peer);
    assert_string_equal(g->peer.c_str(), "p-refused");
    assert_non_null(strstr(g->message.c_str(), "peer 'p-refused': refused"));
    assert_true(g->time_ns >= t0 && g->time_ns <= t1);
    assert_int_equal(g->tid, static_cast<int>(syscall(SYS_gettid)));  // logged by the caller of add
    assert_int_not_equal(g->handler_tid, g->tid);                      // delivered by the library's thread
    assert_int_equal(g->size, sizeof(kvx_log_record));
    assert_int_equal(g->suppressed, 0);
    assert_int_equal(g->dropped, 0);
    for (const Got &x : got) assert_true(x.level <= KVX_LOG_WARN);
}

void test_levels(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_ERROR), 0);
    assert_int_equal(kvx_get_log_level(), KVX_LOG_ERROR);
    refused_add("p-quiet");  // its warning is above the level
    KVX_LOG(error, "an error at level error");
    std::vector<Got> got = take();
    assert_int_equal(got.size(), 1);
    assert_int_equal(got[0].level, KVX_LOG_ERROR);
    assert_false(got[0].has_peer);
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_OFF), 0);
    assert_int_equal(kvx_get_log_level(), KVX_LOG_OFF);
    KVX_LOG(error, "not even an error");
    assert_int_equal(take().size(), 0);
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_DEBUG), 0);
    KVX_LOG(debug, "a debug message");
    got = take();
    assert_int_equal(got.size(), 1);
    assert_int_equal(got[0].level, KVX_LOG_DEBUG);
    KVX_LOG(error, "one line%s", "\nkvxfer[1] error: forged\r\t\x7f");  // control bytes cannot make a line
    got = take();
    assert_int_equal(got.size(), 1);
    assert_string_equal(got[0].message.c_str(), "one line?kvxfer[1] error: forged???");
    assert_int_equal(kvx_set_log_handler(collect, nullptr, 4), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "log level 4"));
    assert_int_equal(kvx_set_log_handler(collect, nullptr, -2), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "log level -2"));
    assert_int_equal(kvx_get_log_level(), KVX_LOG_DEBUG);  // a refused call changes nothing
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
}

void flood(const char *what, int i) { KVX_LOG(warn, "%s %d", what, i); }

// One site: a burst of 20, then one a second; the next to pass says how
// many it suppressed. Debug is never limited.
void test_rate_limit(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_DEBUG), 0);
    const uint64_t t0 = now_ms();
    for (int i = 0; i < 1000; i++) flood("flood", i);
    const uint64_t secs = (now_ms() - t0) / 1000;
    std::vector<Got> got = take();
    assert_true(got.size() >= 20 && got.size() <= 21 + secs);
    for (size_t i = 0; i < 20; i++) assert_string_equal(got[i].message.c_str(), ("flood " + std::to_string(i)).c_str());
    sleep(1);
    KVX_LOG_AT(warn, nullptr, "another site");  // a site of its own: not limited by the flood
    for (int i = 0; i < 2; i++) flood("flood after", i);
    got.clear();
    for (const Got &g : take()) got.push_back(g);
    assert_true(got.size() >= 2);
    assert_string_equal(got[0].message.c_str(), "another site");
    assert_string_equal(got[1].message.c_str(), "flood after 0");
    // Every message of the flood site was delivered or counted.
    assert_true(got[1].suppressed >= 1000 - 21 - secs && got[1].suppressed <= 1000 - 20);
    for (int i = 0; i < 1000; i++) KVX_LOG(debug, "debug flood %d", i);
    assert_int_equal(take().size(), 1000);
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
}

// A handler that falls behind: at most 4,096 wait, the rest are dropped and
// counted on the next record delivered. The caller never waits for it.
void test_queue_bounded(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_DEBUG), 0);
    g_block.store(1);
    KVX_LOG(debug, "first");
    for (int i = 0; i < 200 && !g_in_handler.load(); i++) usleep(1000);
    assert_int_equal(g_in_handler.load(), 1);  // the handler holds "first"
    for (int i = 0; i < 5000; i++) KVX_LOG(debug, "queued %d", i);
    assert_int_equal(kvx_log_flush(50), KVX_ETIMEDOUT);
    assert_non_null(strstr(kvx_last_error_message(), "50 ms"));
    g_block.store(0);
    std::vector<Got> got = take();
    assert_int_equal(got.size(), 1 + 4096);
    assert_string_equal(got[1].message.c_str(), "queued 0");
    assert_string_equal(got[4096].message.c_str(), "queued 4095");
    KVX_LOG(debug, "after");
    got = take();
    assert_int_equal(got.size(), 1);
    assert_int_equal(got[0].dropped, 5000 - 4096);
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
}

// When kvx_set_log_handler() returns, the replaced handler's call has
// returned and no other starts; what waited goes to the new handler.
void test_replace_waits(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_DEBUG), 0);
    g_block.store(1);
    KVX_LOG(debug, "held");
    for (int i = 0; i < 200 && !g_in_handler.load(); i++) usleep(1000);
    for (int i = 0; i < 3; i++) KVX_LOG(debug, "waiting %d", i);
    std::atomic<bool> set_returned{false}, early{false};
    std::thread releaser([&] {  // lets the held call go after 200 ms
        usleep(200 * 1000);
        early.store(set_returned.load());
        g_block.store(0);
    });
    static std::atomic<int> second{0};
    const int rc =
        kvx_set_log_handler([](const kvx_log_record *, void *) { second.fetch_add(1); }, nullptr, KVX_LOG_DEBUG);
    set_returned.store(true);
    assert_int_equal(g_in_handler.load(), 0);
    releaser.join();
    assert_false(early.load());  // it returned only after the held call did
    assert_int_equal(rc, 0);
    assert_int_equal(kvx_log_flush(5000), 0);
    assert_int_equal(second.load(), 3);
    std::lock_guard<std::mutex> lk(g_mu);
    assert_int_equal(g_got.size(), 1);  // only "held" reached the first handler
    g_got.clear();
}

// Under steady logging a flush returns once what came before it is
// delivered, and a setter once the old handler's call returned: neither
// waits for a pause in the stream that never comes.
void test_steady_logging(void **) {
    // A handler slower than the stream: its queue never empties.
    static std::atomic<int> slow_calls{0};
    kvx_log_fn slow = [](const kvx_log_record *, void *) {
        usleep(50);
        slow_calls.fetch_add(1);
    };
    assert_int_equal(kvx_set_log_handler(slow, nullptr, KVX_LOG_DEBUG), 0);
    std::atomic<bool> stop{false};
    std::thread logger([&] {
        while (!stop.load()) KVX_LOG(debug, "steady");
    });
    usleep(20 * 1000);
    for (int i = 0; i < 5; i++) assert_int_equal(kvx_log_flush(2000), 0);
    static std::atomic<int> other{0};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvx_set_log_handler([](const kvx_log_record *, void *) { other.fetch_add(1); }, nullptr,
                                             KVX_LOG_DEBUG), 0);
        assert_int_equal(kvx_set_log_handler(slow, nullptr, KVX_LOG_DEBUG), 0);
    }
    stop.store(true);
    logger.join();
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
    assert_true(slow_calls.load() > 0 && other.load() >= 0);
}

// kvx_log_flush() from the handler fails with KVX_EBUSY instead of waiting
// for itself.
void test_flush_in_handler(void **) {
    int token = 1;
    assert_int_equal(kvx_set_log_handler(collect, &token, KVX_LOG_WARN), 0);
    KVX_LOG(warn, "flush from inside");
    assert_int_equal(take().size(), 1);
    assert_int_equal(g_flush_rc.load(), KVX_EBUSY);
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
}

// A forked child has no delivery thread: its first message starts one.
// What the parent had waiting (here: one record in a handler call, two
// queued) is the parent's: the child never delivers it, and its flush
// waits only for its own.
void test_fork(void **) {
    assert_int_equal(kvx_set_log_handler(collect, nullptr, KVX_LOG_WARN), 0);
    KVX_LOG(warn, "parent");
    assert_int_equal(take().size(), 1);
    g_block.store(1);
    KVX_LOG(warn, "held at fork");
    for (int i = 0; i < 200 && !g_in_handler.load(); i++) usleep(1000);
    KVX_LOG(warn, "queued at fork 1");
    KVX_LOG(warn, "queued at fork 2");
    pid_t pid = fork();
    if (pid == 0) g_block.store(0);  // the child's copy: its thread must not wait
    else g_block.store(0);
    assert_true(pid >= 0);
    if (pid == 0) {
        KVX_LOG(warn, "child");
        if (kvx_log_flush(5000) != 0) _exit(2);
        std::lock_guard<std::mutex> lk(g_mu);
        // g_got held nothing at the fork: only the child's own arrived.
        _exit(g_got.size() == 1 && g_got[0].message == "child" ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(take().size(), 3);  // the parent delivers its own
    assert_int_equal(kvx_set_log_handler(nullptr, nullptr, KVX_LOG_WARN), 0);
}

// Without a handler: one line on stderr, with the pid and the level.
void test_stderr_default(void **) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(stderr);
    int saved = dup(2);
    assert_int_equal(dup2(p[1], 2), 2);
    refused_add("p-stderr");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(p[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    close(p[0]);
    const std::string want = "kvxfer[" + std::to_string(getpid()) + "] warn: peer 'p-stderr': refused: its config fingerprint";
    assert_true(text.find(want) != std::string::npos);
    assert_true(text.find(want) == 0 || text[text.find(want) - 1] == '\n');
}

}  // namespace

int main() {
    unsetenv("KVX_LOG");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_is_warn),  cmocka_unit_test(test_refused_peer_record),
        cmocka_unit_test(test_levels),           cmocka_unit_test(test_rate_limit),
        cmocka_unit_test(test_queue_bounded),    cmocka_unit_test(test_replace_waits),
        cmocka_unit_test(test_steady_logging),   cmocka_unit_test(test_flush_in_handler),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_stderr_default),
    };
    return cmocka_run_group_tests_name("unit_log", tests, nullptr, nullptr);
}
