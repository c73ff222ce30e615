// Counters of a transport and of each of its peers: transfers and bytes by
// how they ended, what is in flight, connects, and a latency histogram of
// fixed log buckets (the layout kvx_stats documents). Everything here is
// guarded by the transport's mutex, which the data path holds anyway to track
// a transfer, so recording is a few plain increments and stays on by default.
// Built with KVX_TELEMETRY=0 the hooks compile to nothing (to measure exactly
// that) and kvx_get_stats() says KVX_ENOTSUP.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kvxfer.h"

#ifndef KVX_TELEMETRY
#define KVX_TELEMETRY 1
#endif

namespace kvx {

inline constexpr bool kTelemetry = KVX_TELEMETRY != 0;

class LatencyHistogram {
public:
    static constexpr size_t kBuckets = KVX_STATS_LATENCY_BUCKETS;

    static size_t bucket_of(uint64_t ns) {
        if (ns < 8) return static_cast<size_t>(ns);
        const unsigned e = 63u - static_cast<unsigned>(__builtin_clzll(ns));  // floor(log2 ns) >= 3
        const size_t i = (e - 2) * 8 + ((ns >> (e - 3)) & 7);
        return i < kBuckets ? i : kBuckets - 1;
    }
    // Smallest latency of bucket i < kBuckets (ns). With bucket_of(), its
    // inverse, the one statement of the layout: kvx_stats_bucket_lower_ns()
    // exports it, and the bench and the bindings call that.
    static constexpr uint64_t lower_bound(size_t i) {
        if (i < 8) return i;
        return (8 + i % 8) << (i / 8 - 1);
    }
    void record(uint64_t ns) {
        buckets_[bucket_of(ns)]++;
        count_++;
        sum_ += ns;
        if (ns > max_) max_ = ns;
    }
    void add(const LatencyHistogram &o);
    // Midpoint of the bucket holding the per_mille-th latency; 0 when empty.
    uint64_t percentile(unsigned per_mille) const;
    uint64_t count() const { return count_; }
    uint64_t max() const { return max_; }
    uint64_t sum() const { return sum_; }
    const std::array<uint64_t, kBuckets> &buckets() const { return buckets_; }

private:
    std::array<uint64_t, kBuckets> buckets_{};
    uint64_t count_ = 0, max_ = 0, sum_ = 0;
};

struct Counters {
    uint64_t done = 0, failed = 0, cancelled = 0;
    uint64_t failed_timeout = 0, failed_connection = 0, failed_removed = 0, failed_other = 0;  // failed, by cause
    uint64_t bytes_done = 0, bytes_failed = 0, bytes_cancelled = 0;
    uint64_t inflight = 0, bytes_inflight = 0;
    uint64_t connects = 0, connect_failures = 0;
    uint64_t connect_ns_total = 0, connect_ns_max = 0, connect_ns_last = 0;
    LatencyHistogram latency;
};

// How a transfer ended, as telemetry counts it.
enum class Ending { done, failed, cancelled };

// A transport's counters: its total and one slot per peer id. Every method
// must be called with the transport's mutex held.
class Telemetry {
public:
    using Slot = std::shared_ptr<Counters>;

    // The slot of peer id (created on first use); a peer keeps it while
    // registered, so the data path never looks it up.
    Slot slot(const std::string &id);
    // The slot of id if it has one, else nullptr.
    const Counters *find(const std::string &id) const;
    // kvx_remove_remote_peer(): the id's counters are forgotten (transfers
    // still ending update the slot its peer holds, and the total).
    void forget(const std::string &id) { peers_.erase(id); }

    void submitted(Counters *peer, uint64_t bytes) {
        if constexpr (kTelemetry) {
            for (Counters *c : {&total_, peer}) {
                c->inflight++;
                c->bytes_inflight += bytes;
            }
        }
    }
    // latency_ns < 0: no sample (a transfer of 0 blocks, or not done).
    // status: a failed transfer's kvx_result status (its cause).
    void ended(Counters *peer, uint64_t bytes, Ending how, int64_t latency_ns, int status = 0, bool was_inflight = true) {
        if constexpr (kTelemetry) {
            for (Counters *c : {&total_, peer}) end_one(*c, bytes, how, latency_ns, status, was_inflight);
        }
    }
    void connected(Counters *peer, int64_t ns);
    void connect_failed(const std::string &id);

    // Fills out (its size already checked) from c; peers/connecting are the
    // caller's counts of registered peers and registrations in progress.
    static void fill(kvx_stats *out, const Counters &c, uint64_t peers, uint64_t connecting);
    const Counters &total() const { return total_; }

private:
    static void end_one(Counters &c, uint64_t bytes, Ending how, int64_t latency_ns, int status, bool was_inflight) {
        if (was_inflight) {
            c.inflight--;
            c.bytes_inflight -= bytes;
        }
        switch (how) {
        case Ending::done:
            c.done++;
            c.bytes_done += bytes;
            if (latency_ns >= 0) c.latency.record(static_cast<uint64_t>(latency_ns));
            break;
        case Ending::failed:
            c.failed++;
            c.bytes_failed += bytes;
            (status == KVX_ETIMEDOUT    ? c.failed_timeout
             : status == KVX_ECONNRESET ? c.failed_connection
             : status == KVX_ECANCELED  ? c.failed_removed
                                        : c.failed_other)++;
            break;
        case Ending::cancelled:
            c.cancelled++;
            c.bytes_cancelled += bytes;
            break;
        }
    }

    Counters total_;
    std::map<std::string, Slot> peers_;
};

}  // namespace kvx
