#include "core/telemetry.h"

#include <algorithm>
#include <cstring>

namespace kvx {

void LatencyHistogram::add(const LatencyHistogram &o) {
    for (size_t i = 0; i < kBuckets; i++) buckets_[i] += o.buckets_[i];
    count_ += o.count_;
    sum_ += o.sum_;
    max_ = std::max(max_, o.max_);
}

uint64_t LatencyHistogram::percentile(unsigned per_mille) const {
    if (count_ == 0) return 0;
    // The smallest latency with at least per_mille/1000 of the samples at or below it.
    const uint64_t rank = std::max<uint64_t>(1, (count_ * per_mille + 999) / 1000);
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; i++) {
        seen += buckets_[i];
        if (seen < rank) continue;
        if (i + 1 == kBuckets) return max_;
        const uint64_t lo = lower_bound(i), hi = lower_bound(i + 1);
        return std::min(lo + (hi - lo) / 2, max_);
    }
    return max_;
}

Telemetry::Slot Telemetry::slot(const std::string &id) {
    Slot &s = peers_[id];
    if (!s) s = std::make_shared<Counters>();
    return s;
}

const Counters *Telemetry::find(const std::string &id) const {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : it->second.get();
}

void Telemetry::connected(Counters *peer, int64_t ns) {
    if constexpr (!kTelemetry) return;
    const uint64_t v = ns > 0 ? static_cast<uint64_t>(ns) : 0;
    for (Counters *c : {&total_, peer}) {
        c->connects++;
        c->connect_ns_total += v;
        c->connect_ns_last = v;
        c->connect_ns_max = std::max(c->connect_ns_max, v);
    }
}

void Telemetry::connect_failed(const std::string &id) {
    if constexpr (!kTelemetry) return;
    total_.connect_failures++;
    auto it = peers_.find(id);
    if (it != peers_.end()) it->second->connect_failures++;
}

void Telemetry::fill(kvx_stats *out, const Counters &c, uint64_t peers, uint64_t connecting) {
    kvx_stats s;
    s.size = sizeof s;
    s.transfers_done = c.done;
    s.transfers_failed = c.failed;
    s.transfers_cancelled = c.cancelled;
    s.bytes_done = c.bytes_done;
    s.bytes_failed = c.bytes_failed;
    s.bytes_cancelled = c.bytes_cancelled;
    s.transfers_inflight = c.inflight;
    s.bytes_inflight = c.bytes_inflight;
    s.peers = peers;
    s.peers_connecting = connecting;
    s.connects = c.connects;
    s.connect_failures = c.connect_failures;
    s.connect_ns_total = c.connect_ns_total;
    s.connect_ns_max = c.connect_ns_max;
    s.connect_ns_last = c.connect_ns_last;
    s.latency_count = c.latency.count();
    s.latency_ns_p50 = c.latency.percentile(500);
    s.latency_ns_p90 = c.latency.percentile(900);
    s.latency_ns_p99 = c.latency.percentile(990);
    s.latency_ns_p999 = c.latency.percentile(999);
    s.latency_ns_max = c.latency.max();
    std::copy(c.latency.buckets().begin(), c.latency.buckets().end(), s.latency_buckets);
    s.transfers_failed_timeout = c.failed_timeout;
    s.transfers_failed_connection = c.failed_connection;
    s.transfers_failed_removed = c.failed_removed;
    s.transfers_failed_other = c.failed_other;
    s.latency_ns_sum = c.latency.sum();
    // A caller built against an older (smaller) or newer (larger) kvx_stats
    // gets the common prefix; size says how much that was.
    const size_t n = std::min<uint64_t>(out->size, sizeof s) / 8 * 8;
    s.size = n;
    std::memcpy(out, &s, n);
}

}  // namespace kvx
