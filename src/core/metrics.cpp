// Prometheus text exposition (format 0.0.4) of a transport's counters and
// its peers (kvx_metrics_text()). The families, their labels and help are
// the table kFamilies: docs/metrics.md lists the same, and
// bindings/python/tests/test_metrics.py checks that it does.
#include "core/metrics.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "core/telemetry.h"
#include "util/clock.h"
#include "util/error.h"

namespace kvx {

namespace {

struct Family {
    const char *name, *type, *help;
};

constexpr Family kFamilies[] = {
    {"kvxfer_transfers_total", "counter",
     "Transfers that ended since the transport was created, removed peers' included, by outcome."},
    {"kvxfer_transfer_failures_total", "counter", "Failed transfers by cause: timeout, connection, removed, other."},
    {"kvxfer_transfer_bytes_total", "counter", "Block bytes of the transfers that ended, by outcome."},
    {"kvxfer_transfers_in_flight", "gauge", "Transfers submitted and not ended yet."},
    {"kvxfer_transfer_bytes_in_flight", "gauge", "Block bytes of the transfers in flight."},
    {"kvxfer_peers", "gauge", "Peers by state: up, reconnecting, broken, connecting (being added)."},
    {"kvxfer_connects_total", "counter", "Peer registrations that connected."},
    {"kvxfer_connect_failures_total", "counter", "Peer registrations that failed to connect."},
    {"kvxfer_transfer_latency_seconds", "histogram",
     "Time from write_blocks to the transfer known done, of done transfers."},
    {"kvxfer_peer_info", "gauge", "1 per peer, with the backend and path its transfers take."},
    {"kvxfer_peer_state", "gauge", "1 for the peer's state, 0 for the others."},
    {"kvxfer_peer_transfers_total", "counter", "A peer's transfers that ended, by outcome (since it was added)."},
    {"kvxfer_peer_transfer_failures_total", "counter", "A peer's failed transfers by cause."},
    {"kvxfer_peer_transfer_bytes_total", "counter", "Block bytes of a peer's transfers that ended, by outcome."},
    {"kvxfer_peer_transfers_in_flight", "gauge", "A peer's transfers in flight."},
    {"kvxfer_peer_reconnects_total", "counter", "Times a peer reconnected after its connection failed."},
    {"kvxfer_peer_last_progress_timestamp_seconds", "gauge",
     "When a peer last made progress (Unix time); 0 before its first transfer."},
    {"kvxfer_peer_transfer_latency_seconds", "histogram", "A peer's transfer latency, as the transport's."},
};

// Upper bounds of the exported latency buckets, in ns (then +Inf): 1, 2.5,
// 5 per decade from 1 us to 10 s. A sample is counted in the first of them
// at or above the upper bound of its bucket of kvx_stats (12.5 % wide at
// most), so each count is exact or low by the samples of one straddling
// bucket.
constexpr uint64_t kLe[] = {1000,        2500,        5000,        10000,       25000,       50000,
                            100000,      250000,      500000,      1000000,     2500000,     5000000,
                            10000000,    25000000,    50000000,    100000000,   250000000,   500000000,
                            1000000000,  2500000000,  5000000000,  10000000000};

const char *const kStates[] = {"up", "reconnecting", "broken", "connecting"};  // by kvx_peer_link

class Text {
public:
    void family(const char *name) {
        for (const Family &f : kFamilies)
            if (strcmp(f.name, name) == 0) {
                // TYPE names the family without _total for counters only in
                // OpenMetrics; format 0.0.4 uses the sample name.
                out_ += "# HELP ";
                out_ += f.name;
                out_ += ' ';
                out_ += f.help;
                out_ += "\n# TYPE ";
                out_ += f.name;
                out_ += ' ';
                out_ += f.type;
                out_ += '\n';
                return;
            }
        fail(KVX_EINTERNAL, "metric family %s is not in the table", name);
    }
    // name{labels} value; labels: "k", "v", ... (values escaped here).
    void sample(const char *name, std::initializer_list<const char *> labels, uint64_t v) {
        char b[24];
        snprintf(b, sizeof b, "%" PRIu64, v);
        sample_text(name, labels, b);
    }
    void sample_seconds(const char *name, std::initializer_list<const char *> labels, uint64_t ns) {
        char b[40];
        snprintf(b, sizeof b, "%" PRIu64 ".%09" PRIu64, ns / 1000000000, ns % 1000000000);
        sample_text(name, labels, b);
    }
    void sample_text(const char *name, std::initializer_list<const char *> labels, const char *value) {
        out_ += name;
        if (labels.size()) {
            out_ += '{';
            bool key = true, first = true;
            for (const char *l : labels) {
                if (key) {
                    if (!first) out_ += ',';
                    out_ += l;
                    out_ += "=\"";
                } else {
                    escape(l);
                    out_ += '"';
                }
                key = !key;
                first = false;
            }
            out_ += '}';
        }
        out_ += ' ';
        out_ += value;
        out_ += '\n';
    }
    void histogram(const char *name, const char *peer, const kvx_stats &s) {
        std::string bucket = std::string(name) + "_bucket";
        uint64_t cum = 0;
        size_t i = 0;
        for (uint64_t le : kLe) {
            // Buckets whose upper bound (the next one's lower) is at most le.
            while (i + 1 < KVX_STATS_LATENCY_BUCKETS && LatencyHistogram::lower_bound(i + 1) <= le)
                cum += s.latency_buckets[i++];
            char b[32];
            snprintf(b, sizeof b, "%g", static_cast<double>(le) / 1e9);
            if (peer) sample(bucket.c_str(), {"peer", peer, "le", b}, cum);
            else sample(bucket.c_str(), {"le", b}, cum);
        }
        if (peer) sample(bucket.c_str(), {"peer", peer, "le", "+Inf"}, s.latency_count);
        else sample(bucket.c_str(), {"le", "+Inf"}, s.latency_count);
        const std::string sum = std::string(name) + "_sum", count = std::string(name) + "_count";
        if (peer) {
            sample_seconds(sum.c_str(), {"peer", peer}, s.latency_ns_sum);
            sample(count.c_str(), {"peer", peer}, s.latency_count);
        } else {
            sample_seconds(sum.c_str(), {}, s.latency_ns_sum);
            sample(count.c_str(), {}, s.latency_count);
        }
    }
    std::string take() { return std::move(out_); }

private:
    // A label value: \, " and newline escaped; bytes that are not UTF-8
    // become U+FFFD (peer ids are bytes; the format wants UTF-8).
    void escape(const char *v) {
        const auto *p = reinterpret_cast<const unsigned char *>(v);
        while (*p) {
            const unsigned char c = *p;
            size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
            bool ok = n != 0;
            for (size_t k = 1; ok && k < n; k++) ok = (p[k] & 0xC0) == 0x80;
            if (ok && n == 2) ok = c >= 0xC2;                                    // overlong
            if (ok && n == 3) ok = !(c == 0xE0 && p[1] < 0xA0) && !(c == 0xED && p[1] >= 0xA0);  // overlong, surrogate
            if (ok && n == 4) ok = c <= 0xF4 && !(c == 0xF0 && p[1] < 0x90) && !(c == 0xF4 && p[1] >= 0x90);
            if (!ok) {
                out_ += "\xEF\xBF\xBD";
                p++;
                continue;
            }
            if (c == '\\') out_ += "\\\\";
            else if (c == '"') out_ += "\\\"";
            else if (c == '\n') out_ += "\\n";
            else out_.append(reinterpret_cast<const char *>(p), n);
            p += n;
        }
    }
    std::string out_;
};

const char *const kOutcomes[] = {"done", "failed", "cancelled"};
const char *const kCauses[] = {"timeout", "connection", "removed", "other"};

// The transport's transfers, failures and bytes by outcome or cause.
void totals(Text &t, const kvx_stats &s) {
    const uint64_t n[] = {s.transfers_done, s.transfers_failed, s.transfers_cancelled};
    const uint64_t b[] = {s.bytes_done, s.bytes_failed, s.bytes_cancelled};
    const uint64_t c[] = {s.transfers_failed_timeout, s.transfers_failed_connection, s.transfers_failed_removed,
                          s.transfers_failed_other};
    t.family("kvxfer_transfers_total");
    for (int i = 0; i < 3; i++) t.sample("kvxfer_transfers_total", {"outcome", kOutcomes[i]}, n[i]);
    t.family("kvxfer_transfer_failures_total");
    for (int i = 0; i < 4; i++) t.sample("kvxfer_transfer_failures_total", {"cause", kCauses[i]}, c[i]);
    t.family("kvxfer_transfer_bytes_total");
    for (int i = 0; i < 3; i++) t.sample("kvxfer_transfer_bytes_total", {"outcome", kOutcomes[i]}, b[i]);
}

}  // namespace

namespace {

// A peer as listed, with its counters when it has them (a peer's first add,
// still connecting, has none yet; one removed since the list neither).
struct One {
    const std::string *id;
    const Transport::PeerState *st;
    kvx_stats s;
    bool counted;
};

void transport_part(Text &t, const kvx_stats &total, const std::vector<One> &each) {
    totals(t, total);
    t.family("kvxfer_transfers_in_flight");
    t.sample("kvxfer_transfers_in_flight", {}, total.transfers_inflight);
    t.family("kvxfer_transfer_bytes_in_flight");
    t.sample("kvxfer_transfer_bytes_in_flight", {}, total.bytes_inflight);
    uint64_t by_state[4] = {};
    for (const One &o : each) by_state[o.st->link]++;
    t.family("kvxfer_peers");
    for (int i = 0; i < 4; i++) t.sample("kvxfer_peers", {"state", kStates[i]}, by_state[i]);
    t.family("kvxfer_connects_total");
    t.sample("kvxfer_connects_total", {}, total.connects);
    t.family("kvxfer_connect_failures_total");
    t.sample("kvxfer_connect_failures_total", {}, total.connect_failures);
    t.family("kvxfer_transfer_latency_seconds");
    t.histogram("kvxfer_transfer_latency_seconds", nullptr, total);
}

// The peers' transfers, failures and bytes: family by family, each family's
// samples together as the format wants.
void peer_counts(Text &t, const std::vector<One> &each) {
    const char *fam[] = {"kvxfer_peer_transfers_total", "kvxfer_peer_transfer_failures_total",
                         "kvxfer_peer_transfer_bytes_total"};
    for (int f = 0; f < 3; f++) {
        t.family(fam[f]);
        for (const One &o : each) {
            if (!o.counted) continue;
            const kvx_stats &s = o.s;
            const char *peer = o.id->c_str();
            if (f == 0) {
                const uint64_t n[] = {s.transfers_done, s.transfers_failed, s.transfers_cancelled};
                for (int i = 0; i < 3; i++) t.sample(fam[f], {"peer", peer, "outcome", kOutcomes[i]}, n[i]);
            } else if (f == 1) {
                const uint64_t c[] = {s.transfers_failed_timeout, s.transfers_failed_connection,
                                      s.transfers_failed_removed, s.transfers_failed_other};
                for (int i = 0; i < 4; i++) t.sample(fam[f], {"peer", peer, "cause", kCauses[i]}, c[i]);
            } else {
                const uint64_t b[] = {s.bytes_done, s.bytes_failed, s.bytes_cancelled};
                for (int i = 0; i < 3; i++) t.sample(fam[f], {"peer", peer, "outcome", kOutcomes[i]}, b[i]);
            }
        }
    }
}

void peer_part(Text &t, const std::vector<One> &each) {
    t.family("kvxfer_peer_info");
    for (const One &o : each)
        t.sample("kvxfer_peer_info", {"peer", o.id->c_str(), "backend", o.st->backend, "path", o.st->path}, 1);
    t.family("kvxfer_peer_state");
    for (const One &o : each)
        for (int i = 0; i < 4; i++)
            t.sample("kvxfer_peer_state", {"peer", o.id->c_str(), "state", kStates[i]}, o.st->link == i ? 1 : 0);
    peer_counts(t, each);
    t.family("kvxfer_peer_transfers_in_flight");
    for (const One &o : each)
        if (o.counted) t.sample("kvxfer_peer_transfers_in_flight", {"peer", o.id->c_str()}, o.s.transfers_inflight);
    t.family("kvxfer_peer_reconnects_total");
    for (const One &o : each) t.sample("kvxfer_peer_reconnects_total", {"peer", o.id->c_str()}, o.st->reconnects);
    t.family("kvxfer_peer_last_progress_timestamp_seconds");
    const int64_t steady_now = Clock::now().time_since_epoch().count(), real_now = realtime_ns();
    for (const One &o : each) {
        const int64_t at = o.st->progress_ns ? real_now - (steady_now - o.st->progress_ns) : 0;
        t.sample_seconds("kvxfer_peer_last_progress_timestamp_seconds", {"peer", o.id->c_str()},
                         static_cast<uint64_t>(at > 0 ? at : 0));
    }
    t.family("kvxfer_peer_transfer_latency_seconds");
    for (const One &o : each)
        if (o.counted) t.histogram("kvxfer_peer_transfer_latency_seconds", o.id->c_str(), o.s);
}

}  // namespace

std::string metrics_text(const Transport &tr) {
    if constexpr (!kTelemetry) fail(KVX_ENOTSUP, "this libkvxfer was built without telemetry (KVX_TELEMETRY=OFF)");
    const auto peers = tr.list_peers();
    kvx_stats total{};
    total.size = sizeof total;
    tr.stats(&total, nullptr);
    std::vector<One> each;
    each.reserve(peers.size());
    for (const auto &[id, st] : peers) {
        One o{&id, &st, {}, true};
        o.s.size = sizeof o.s;
        try {
            tr.stats(&o.s, id.c_str());
        } catch (const Error &e) {
            if (e.code() != KVX_ENOENT) throw;
            o.counted = false;
        }
        each.push_back(o);
    }
    Text t;
    transport_part(t, total, each);
    if (!each.empty()) peer_part(t, each);
    return t.take();
}

}  // namespace kvx
