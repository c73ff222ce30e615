package kvxfer

import (
	"fmt"

	"kvxfer.dev/kvxfer/internal/capi"
)

// LatencyBuckets is the number of buckets of Stats.LatencyBuckets.
const LatencyBuckets = capi.KVX_STATS_LATENCY_BUCKETS

// Stats are the telemetry counters of a transport or of one peer
// (kvx_get_stats): transfers and their bytes by how they ended, what is in
// flight, connects, and the latency of done transfers (from WriteBlocks to
// the moment the library learnt the bytes landed) as percentiles and as a
// histogram of fixed log buckets (LatencyBucketBounds).
type Stats struct {
	TransfersDone, TransfersFailed, TransfersCancelled uint64
	BytesDone, BytesFailed, BytesCancelled             uint64
	TransfersInflight, BytesInflight                   uint64
	Peers, PeersConnecting                             uint64
	Connects, ConnectFailures                          uint64
	ConnectNsTotal, ConnectNsMax, ConnectNsLast        uint64
	LatencyCount                                       uint64
	LatencyNsP50, LatencyNsP90, LatencyNsP99           uint64
	LatencyNsP999, LatencyNsMax                        uint64
	LatencyBuckets                                     [LatencyBuckets]uint64
}

// statsScalars is the number of uint64 fields of kvx_stats before the
// histogram, the size field included.
const statsScalars = 22

// Stats returns the counters of the transport (peer "": every peer it ever
// had) or of one peer (since it was first added; RemoveRemotePeer forgets
// them). Errors: ErrUnknownPeer, ErrNotSupported (library built without
// telemetry), ErrClosed (Close destroys the C transport, counters included).
func (t *Transport) Stats(peer string) (Stats, error) {
	const op = "Stats"
	var s Stats
	if err := checkPeerID(op, peer, true); err != nil {
		return s, err
	}
	raw := make([]uint64, statsScalars+LatencyBuckets)
	raw[0] = uint64(len(raw) * 8)
	if err := t.do(op, func(h uintptr) int { return capi.Kvx_get_stats(raw, h, peer) }); err != nil {
		return s, err
	}
	f := raw[1:statsScalars]
	s = Stats{
		TransfersDone: f[0], TransfersFailed: f[1], TransfersCancelled: f[2],
		BytesDone: f[3], BytesFailed: f[4], BytesCancelled: f[5],
		TransfersInflight: f[6], BytesInflight: f[7],
		Peers: f[8], PeersConnecting: f[9], Connects: f[10], ConnectFailures: f[11],
		ConnectNsTotal: f[12], ConnectNsMax: f[13], ConnectNsLast: f[14],
		LatencyCount: f[15], LatencyNsP50: f[16], LatencyNsP90: f[17], LatencyNsP99: f[18],
		LatencyNsP999: f[19], LatencyNsMax: f[20],
	}
	copy(s.LatencyBuckets[:], raw[statsScalars:])
	return s, nil
}

// LatencyBucketBounds returns the latencies in ns that bucket i of
// Stats.LatencyBuckets holds, as the C library records them
// (kvx_stats_bucket_lower_ns): [lo, hi); hi is 0 for the last bucket, which
// has no upper bound. It panics if i is not in [0, LatencyBuckets).
func LatencyBucketBounds(i int) (lo, hi uint64) {
	if i < 0 || i >= LatencyBuckets {
		panic(fmt.Sprintf("kvxfer: latency bucket %d is not in [0, %d)", i, LatencyBuckets))
	}
	if i+1 < LatencyBuckets {
		hi = capi.Kvx_stats_bucket_lower_ns(int64(i + 1))
	}
	return capi.Kvx_stats_bucket_lower_ns(int64(i)), hi
}
