/*
 * kvxfer - introspection: per-transport and per-peer counters, latency histograms, metrics text.
 *
 * A part of <kvxfer.h>, which includes it where this section stands in the
 * API: include <kvxfer.h>, never this file alone (the conventions, the types
 * and KVX_API it uses are there).
 */
#ifndef KVXFER_STATS_H
#define KVXFER_STATS_H

#ifndef KVXFER_H
#error "include <kvxfer.h>, not <kvxfer/stats.h>"
#endif

/* ---------------------------------------------------------------- introspection */

/** Buckets of the latency histogram in kvx_stats (since 0.2). */
#define KVX_STATS_LATENCY_BUCKETS 304

/**
 * Counters of a transport, or of one of its peers (kvx_get_stats(), since
 * 0.2). A caller-sized struct: the caller sets size (KVX_STATS_INIT does) and
 * the library fills that many bytes at most, so fields added at the end in a
 * later version never break an older caller. Every field is a uint64_t.
 *
 * Transfers are counted when they end: done (the bytes are in the peer's
 * region, reported done by kvx_poll()), failed (reported failed, or lost at
 * close; since 0.9 also by cause, at the end of the struct), cancelled (by
 * kvx_cancel() before they ended). A transfer of 0
 * blocks counts as done, with no bytes and no latency sample.
 * Latency: from kvx_write_blocks() to the moment the library learns the
 * transfer is done (not to the kvx_poll() that reports it), of done
 * transfers, in a histogram of KVX_STATS_LATENCY_BUCKETS fixed log buckets:
 * bucket i holds latencies in [kvx_stats_bucket_lower_ns(i),
 * kvx_stats_bucket_lower_ns(i + 1)) ns (1 ns wide below 8 ns, then at most
 * 12.5 % of its lower bound); the last bucket has no upper bound.
 * Percentiles are the midpoint of the bucket holding them; latency_ns_max is
 * exact.
 */
typedef struct kvx_stats {
    uint64_t size;                /**< in: sizeof(kvx_stats) as the caller knows
                                       it; out: bytes filled by the library  */
    uint64_t transfers_done;
    uint64_t transfers_failed;
    uint64_t transfers_cancelled;
    uint64_t bytes_done;          /**< block bytes of the done transfers       */
    uint64_t bytes_failed;
    uint64_t bytes_cancelled;
    uint64_t transfers_inflight;  /**< submitted, not ended yet                 */
    uint64_t bytes_inflight;
    uint64_t peers;               /**< registered peers (a peer's own: 1 or 0) */
    uint64_t peers_connecting;    /**< registrations in progress (own: 1 or 0) */
    uint64_t connects;            /**< registrations that connected            */
    uint64_t connect_failures;    /**< that failed to connect (not cancelled)  */
    uint64_t connect_ns_total;    /**< time to connect, sum over connects      */
    uint64_t connect_ns_max;
    uint64_t connect_ns_last;
    uint64_t latency_count;       /**< samples in the histogram                 */
    uint64_t latency_ns_p50;
    uint64_t latency_ns_p90;
    uint64_t latency_ns_p99;
    uint64_t latency_ns_p999;
    uint64_t latency_ns_max;
    uint64_t latency_buckets[KVX_STATS_LATENCY_BUCKETS]; /**< counts, see above */
    /* since 0.9: transfers_failed by cause (kvx_result's status); the four add
     * up to transfers_failed */
    uint64_t transfers_failed_timeout;    /**< KVX_ETIMEDOUT: the stall timeout */
    uint64_t transfers_failed_connection; /**< KVX_ECONNRESET: the connection failed */
    uint64_t transfers_failed_removed;    /**< KVX_ECANCELED: the peer was removed or
                                               replaced, or the transport closed */
    uint64_t transfers_failed_other;      /**< any other code */
    /* since 0.10 */
    uint64_t latency_ns_sum;              /**< the histogram's samples added up (ns) */
} kvx_stats;

/** Initializer of a kvx_stats: kvx_stats s = KVX_STATS_INIT; */
#define KVX_STATS_INIT                                                              \
    {                                                                               \
        sizeof(kvx_stats), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
            0, 0, { 0 }, 0, 0, 0, 0, 0                                              \
    }

/**
 * Read the counters of the transport (peer_id NULL: every peer it ever had,
 * removed ones included) or of one peer (since its first registration; a
 * re-add with KVX_PEER_REPLACE keeps counting, kvx_remove_remote_peer()
 * forgets them). The counters are kept by default and cost a few increments
 * per transfer; a library built with KVX_TELEMETRY=OFF has none.
 * @param out      caller's struct with out->size set (KVX_STATS_INIT); at
 *                 most out->size bytes are written, and out->size is set to
 *                 the number of bytes filled (fields past it are untouched).
 * @param peer_id  NULL, or a peer id registered or being re-added.
 * @return 0; KVX_EINVAL (NULL, out->size < 8); KVX_ENOENT (peer_id unknown);
 *         KVX_ENOTSUP (telemetry compiled out).
 * Thread safety: any thread; also after kvx_transport_close() (final values).
 * A consistent snapshot: every field is read at the same instant.
 */
KVX_API int kvx_get_stats(kvx_stats *out, kvx_transport *t, const char *peer_id);

/**
 * Lower bound, in ns, of bucket i of kvx_stats.latency_buckets (since 0.6):
 * the bucket holds latencies in [kvx_stats_bucket_lower_ns(i),
 * kvx_stats_bucket_lower_ns(i + 1)). Use it instead of a formula of your
 * own; the bounds are those the library records with.
 * They are 0, 1, ..., 7 for i < 8; from there each power of two is split into
 * 8 equal buckets: with e = i / 8 + 2 and m = i % 8, the bound is
 * (8 + m) << (e - 3), so a bucket is at most 12.5 % of its lower bound wide.
 * The last bucket, KVX_STATS_LATENCY_BUCKETS - 1, holds everything from its
 * bound (about 17 minutes) up.
 * @param i  a bucket index, or any larger value.
 * @return the bound, strictly increasing in i below KVX_STATS_LATENCY_BUCKETS;
 *         UINT64_MAX for every i >= KVX_STATS_LATENCY_BUCKETS (so that
 *         i + 1 = KVX_STATS_LATENCY_BUCKETS gives the last bucket no upper
 *         bound). Never fails and never changes kvx_last_error_message().
 * Thread safety: any thread, at any time (no transport needed).
 */
KVX_API uint64_t kvx_stats_bucket_lower_ns(size_t i);

/**
 * The transport's counters and peers as Prometheus text (exposition format
 * 0.0.4, since 0.10), to serve on an HTTP /metrics endpoint or hand to a
 * Prometheus client library. docs/metrics.md lists every family: transport
 * totals (kvxfer_transfers_total{outcome}, kvxfer_transfer_failures_total
 * {cause}, bytes, in flight, peers by state, connects, a latency histogram
 * in seconds) and the same per peer (label peer; kvxfer_peer_info{peer,
 * backend,path}, kvxfer_peer_state{peer,state}, last progress). Label values
 * are escaped; bytes of a peer id that are not UTF-8 show as U+FFFD. The
 * totals count every peer the transport had; a peer's series end at its
 * removal. The text has no timestamps (the scraper adds them).
 * @param out_len  receives the text's length plus its NUL, also on
 *                 KVX_ENOBUFS (the text may be longer at the next call).
 * @param buf      cap bytes (may be NULL when cap is 0), receives the text,
 *                 NUL-terminated; the caller owns it.
 * @return 0; KVX_ENOBUFS (cap too small: nothing written); KVX_EINVAL (NULL
 *         argument); KVX_ECLOSED; KVX_ENOTSUP (telemetry compiled out).
 * Thread safety: any thread. Each peer's counters are one snapshot; the
 * peers are read one after another.
 */
KVX_API int kvx_metrics_text(size_t *out_len, kvx_transport *t, char *buf, size_t cap);

#endif /* KVXFER_STATS_H */
