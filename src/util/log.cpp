#include "util/log.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "kvxfer.h"

namespace kvx {

namespace {

// Rate limit of a call site: a burst of kBurst messages, then one per
// kInterval (debug is never limited: it is asked for).
constexpr int64_t kInterval = 1'000'000'000, kBurst = 20;
// Records waiting for the application's handler; more are dropped (counted).
constexpr size_t kQueueCap = 4096;

const char *const kLevelNames[] = {"error", "warn", "info", "debug"};

int level_from_env() {
    const char *e = getenv("KVX_LOG");
    if (!e || !*e) return KVX_LOG_WARN;
    if (strcmp(e, "off") == 0 || strcmp(e, "none") == 0) return KVX_LOG_OFF;
    for (int i = 0; i < 4; i++)
        if (strcmp(e, kLevelNames[i]) == 0) return i;
    fprintf(stderr, "kvxfer[%d] warn: KVX_LOG='%.32s' is not off, error, warn, info or debug: using warn\n",
            static_cast<int>(getpid()), e);
    return KVX_LOG_WARN;
}

std::atomic<int> &level_ref() {
    static std::atomic<int> level{level_from_env()};
    return level;
}

int64_t now_ns(clockid_t c) {
    timespec ts{};
    clock_gettime(c, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

pid_t this_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

struct Record {
    int level;
    std::string message, peer;
    bool has_peer;
    const char *component;
    int64_t time_ns;
    uint64_t suppressed;
    uint64_t dropped;  // records dropped (queue full) just before this one
    pid_t tid;
};

// Where records go when the application set a handler: a queue that one
// library thread drains, calling the handler with no library lock held, one
// record at a time, in order.
struct Sink {
    std::mutex mu;
    std::condition_variable work, idle;
    kvx_log_fn fn = nullptr;  // under mu
    void *user = nullptr;
    std::deque<Record> queue;
    uint64_t dropped = 0;          // since the last record queued
    uint64_t queued = 0, done = 0; // records ever queued / delivered (or moved to stderr)
    bool calling = false;          // a handler call is in progress
    uint64_t calls_started = 0, calls_ended = 0;  // handler calls (a setter waits for those begun before it)
    bool running = false;          // the thread exists (in this process)
    pid_t thread_tid = 0;
};

Sink &sink() {
    static Sink *s = [] {
        // Never destroyed: the thread may outlive static destructors. Kept
        // usable in a forked child (no thread there: started again on use).
        auto *p = new Sink();
        pthread_atfork([] { sink().mu.lock(); }, [] { sink().mu.unlock(); },
                       [] {
                           Sink &k = sink();
                           new (&k.work) std::condition_variable();
                           new (&k.idle) std::condition_variable();
                           k.running = false;
                           k.calling = false;
                           k.calls_started = k.calls_ended = 0;
                           k.thread_tid = 0;
                           // What waited is the parent's to deliver (its
                           // thread goes on): never twice.
                           k.queue.clear();
                           k.queued = k.done = 0;
                           k.dropped = 0;
                           k.mu.unlock();
                       });
        return p;
    }();
    return *s;
}

std::string suffix(uint64_t suppressed, uint64_t dropped) {
    std::string out;
    char b[96];
    if (suppressed) {
        snprintf(b, sizeof b, " (%llu more like this suppressed)", static_cast<unsigned long long>(suppressed));
        out += b;
    }
    if (dropped) {
        snprintf(b, sizeof b, " (%llu earlier messages dropped: the log handler fell behind)",
                 static_cast<unsigned long long>(dropped));
        out += b;
    }
    return out;
}

void write_stderr(const Record &r, uint64_t dropped) {  // dropped: just before r
    std::string line = "kvxfer[" + std::to_string(getpid()) + "] " + kLevelNames[r.level] + ": " + r.message +
                       suffix(r.suppressed, dropped) + "\n";
    fwrite(line.data(), 1, line.size(), stderr);
}

void deliver_loop() {
    Sink &s = sink();
    std::unique_lock<std::mutex> lk(s.mu);
    s.thread_tid = this_tid();
    for (;;) {
        s.work.wait(lk, [&] { return s.fn && !s.queue.empty(); });
        Record r = std::move(s.queue.front());
        s.queue.pop_front();
        kvx_log_fn fn = s.fn;
        void *user = s.user;
        s.calling = true;
        s.calls_started++;
        lk.unlock();
        kvx_log_record rec{};
        rec.size = sizeof rec;
        rec.level = r.level;
        rec.message = r.message.c_str();
        rec.component = r.component;
        rec.peer_id = r.has_peer ? r.peer.c_str() : nullptr;
        rec.time_ns = r.time_ns;
        rec.suppressed = r.suppressed;
        rec.dropped = r.dropped;
        rec.thread_id = r.tid;
        fn(&rec, user);
        lk.lock();
        s.calling = false;
        s.calls_ended++;
        s.done++;
        s.idle.notify_all();
    }
}

// A site passes while its bucket holds a token (GCRA: the bucket is empty
// up to next_ns; each message moves that one interval on).
bool site_passes(LogSite &site, int64_t now) {
    int64_t tat = site.next_ns.load(std::memory_order_relaxed);
    for (;;) {
        const int64_t base = tat > now ? tat : now;
        if (base - now > (kBurst - 1) * kInterval) return false;
        if (site.next_ns.compare_exchange_weak(tat, base + kInterval, std::memory_order_relaxed)) return true;
    }
}

}  // namespace

bool log_enabled(LogLevel level) { return static_cast<int>(level) <= level_ref().load(std::memory_order_relaxed); }

void log_msg(LogSite &site, LogLevel level, const char *component, const char *peer_id, const char *fmt, ...) {
    const int lv = static_cast<int>(level);
    if (level != LogLevel::debug && !site_passes(site, now_ns(CLOCK_MONOTONIC))) {
        site.suppressed.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    Record r;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    // One line: a control byte (a newline in a peer id, say) cannot forge
    // a line of its own.
    for (char *c = buf; *c; c++)
        if (static_cast<unsigned char>(*c) < 0x20 || *c == 0x7f) *c = '?';
    r.level = lv;
    r.message = buf;
    r.has_peer = peer_id != nullptr;
    if (peer_id) r.peer = peer_id;
    r.component = component;
    r.time_ns = now_ns(CLOCK_REALTIME);
    r.suppressed = site.suppressed.exchange(0, std::memory_order_relaxed);
    r.tid = this_tid();
    r.dropped = 0;
    Sink &s = sink();
    std::unique_lock<std::mutex> lk(s.mu);
    if (!s.fn) {
        lk.unlock();
        write_stderr(r, 0);
        return;
    }
    if (s.queue.size() >= kQueueCap) {
        s.dropped += 1 + r.suppressed;  // it, and what its site suppressed before it
        return;
    }
    r.dropped = s.dropped;
    s.dropped = 0;
    s.queue.push_back(std::move(r));
    s.queued++;
    if (!s.running) {
        try {
            std::thread(deliver_loop).detach();
            s.running = true;
        } catch (...) {  // no thread to be had (a process limit): this one goes to stderr
            Record own = std::move(s.queue.back());
            s.queue.pop_back();
            s.queued--;
            lk.unlock();
            write_stderr(own, own.dropped);
            return;
        }
    }
    s.work.notify_one();
}

void log_set_handler(void *fn, void *user, int level) {
    Sink &s = sink();
    std::deque<Record> left;
    uint64_t dropped = 0;
    {
        std::unique_lock<std::mutex> lk(s.mu);
        s.fn = reinterpret_cast<kvx_log_fn>(fn);
        s.user = user;
        level_ref().store(level, std::memory_order_relaxed);
        if (!s.fn) {  // what waited for the old handler goes to stderr, in order
            left.swap(s.queue);
            dropped = s.dropped;  // after the last one queued
            s.dropped = 0;
            s.done += left.size();
            s.idle.notify_all();
        } else if (!s.queue.empty()) {
            s.work.notify_one();
        }
        // The call of the old handler in progress, not those of the new one
        // after it (which may block, or never pause under steady logging).
        const uint64_t begun = s.calls_started;
        if (s.thread_tid != this_tid()) s.idle.wait(lk, [&] { return s.calls_ended >= begun; });
    }
    for (const Record &r : left) write_stderr(r, r.dropped);
    if (dropped) {
        Record r{};
        r.level = KVX_LOG_WARN;
        r.message = "log messages were dropped";
        write_stderr(r, dropped);
    }
}

bool log_flush(int timeout_ms) {
    Sink &s = sink();
    std::unique_lock<std::mutex> lk(s.mu);
    const uint64_t target = s.queued;
    auto pred = [&] { return s.done >= target; };  // done counts a record once its call returned
    if (timeout_ms < 0) {
        s.idle.wait(lk, pred);
        return true;
    }
    return s.idle.wait_for(lk, std::chrono::milliseconds(timeout_ms), pred);
}

bool log_on_handler_thread() {
    Sink &s = sink();
    std::lock_guard<std::mutex> lk(s.mu);
    return s.running && s.thread_tid == this_tid();
}

}  // namespace kvx
