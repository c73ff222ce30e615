// The core's cost per call and per block of write_blocks + poll, on the
// test-only "instant" backend (a transfer is done inside submit): nothing but
// kvxfer's own bookkeeping is measured. Each measured loop is bracketed by
// callgrind client requests, so under
//   valgrind --tool=callgrind --collect-atstart=no --separate-threads=yes perf_ops
// every loop becomes one dump named "<scenario> <batch> <calls>" whose main-thread
// Ir divided by calls is the instructions per call (check_counts.py does
// that). Run natively it prints nanoseconds per call instead (informative only).
//   perf_ops [quick]   quick: fewer calls and peers (a smoke test)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(s) (void)(s)
#define RUNNING_ON_VALGRIND 0
#endif

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

constexpr uint64_t kBlocks = 16384;  // a power of two: remote = i * odd stride mod kBlocks is a permutation
constexpr uint64_t kBlockLen = 64;
constexpr uint64_t kStride = 4099;

void check(int rc, const char *what) {
    if (rc == 0) return;
    fprintf(stderr, "perf_ops: %s: %s (%s)\n", what, kvx_strerror(rc), kvx_last_error_message());
    exit(1);
}

double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Scattered indexes (no two consecutive on both sides): one run per block,
// the costliest shape for the core.
struct Batch {
    std::vector<uint64_t> local, remote;
    explicit Batch(size_t n) : local(n), remote(n) {
        for (size_t i = 0; i < n; i++) {
            local[i] = (2 * i) % kBlocks;
            remote[i] = (i * kStride) % kBlocks;
        }
    }
};

struct Bench {
    std::vector<uint8_t> region = std::vector<uint8_t>(kBlocks * kBlockLen);
    kvx_transport *t = nullptr;
    std::vector<uint8_t> meta;

    Bench() {
        kvx_options *o = nullptr;
        check(kvx_options_create(&o), "options");
        check(kvx_options_set(o, "backend", "instant"), "backend=instant");
        check(kvx_transport_create(&t, region.data(), kBlocks, kBlockLen, nullptr, o), "create");
        kvx_options_destroy(o);
        size_t len = 0;
        check(kvx_get_agent_metadata(&len, t, nullptr, 0), "metadata size");
        meta.resize(len);
        check(kvx_get_agent_metadata(&len, t, meta.data(), len), "metadata");
    }
    ~Bench() { kvx_transport_destroy(t); }
    // Our own metadata under another id: the instant backend connects to nothing.
    void add(const std::string &id) {
        check(kvx_add_remote_peer(t, id.c_str(), meta.data(), meta.size(), (uintptr_t)region.data(), kBlocks,
                                  kBlockLen),
              "add_remote_peer");
    }
    // One write_blocks + one poll of the peer; the transfer must be done.
    void cycle(const char *peer, const Batch &b) {
        uint64_t id = 0, done = 0, failed = 0;
        size_t nd = 0, nf = 0;
        check(kvx_write_blocks(&id, t, peer, b.local.data(), b.remote.data(), b.local.size()), "write_blocks");
        check(kvx_poll(&nd, &nf, t, peer, &done, 1, &failed, 1), "poll");
        if (nd != 1 || nf != 0 || done != id) {
            fprintf(stderr, "perf_ops: transfer %llu not reported done at once\n", (unsigned long long)id);
            exit(1);
        }
    }
};

// Measures calls cycles over peers (round robin) at batch n: one callgrind dump.
void measure(Bench &b, const char *scenario, const std::vector<std::string> &peers, size_t n, size_t calls) {
    Batch batch(n);
    for (size_t i = 0; i < 16; i++) b.cycle(peers[i % peers.size()].c_str(), batch);  // warm every container
    char label[96];
    snprintf(label, sizeof label, "%s %zu %zu", scenario, n, calls);
    const double t0 = now_s();
    CALLGRIND_ZERO_STATS;
    for (size_t i = 0; i < calls; i++) b.cycle(peers[i % peers.size()].c_str(), batch);
    CALLGRIND_DUMP_STATS_AT(label);
    const double per_call = (now_s() - t0) / calls * 1e9;
    if (!RUNNING_ON_VALGRIND)
        printf("%-8s batch %5zu  %9.0f ns/call  %7.1f ns/block\n", scenario, n, per_call, per_call / n);
}

// Many peers with many transfers held in flight, then the same cycles.
void scale(size_t npeers, size_t per_peer, size_t calls) {
    Bench b;
    std::vector<std::string> peers;
    for (size_t i = 0; i < npeers; i++) {
        peers.push_back(peer_name(i));
        b.add(peers.back());
    }
    Batch one(1);
    kvx::instant::hold(true);
    for (size_t k = 0; k < per_peer; k++)
        for (size_t i = 0; i < npeers; i++) {
            uint64_t id = 0;
            one.local[0] = k % kBlocks;
            check(kvx_write_blocks(&id, b.t, peers[i].c_str(), one.local.data(), one.remote.data(), 1), "write");
        }
    kvx::instant::hold(false);
    if (!RUNNING_ON_VALGRIND) printf("scale: %zu peers, %zu transfers in flight\n", npeers, npeers * per_peer);
    measure(b, "scale", peers, 16, calls);
}

}  // namespace

int main(int argc, char **argv) {
    const bool quick = argc > 1 && strcmp(argv[1], "quick") == 0;
    const size_t div = quick ? 10 : 1;
    {
        Bench b;
        b.add("p0");
        const std::vector<std::string> p0{"p0"};
        for (size_t n : {1, 16, 256, 4096}) measure(b, "single", p0, n, (n >= 256 ? 200 : 2000) / div);
    }
    scale(quick ? 100 : 1000, 100, 2000 / div);
    return 0;
}
