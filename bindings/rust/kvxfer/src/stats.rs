//! Telemetry (`kvx_get_stats`) and a peer's rails (`kvx_peer_rails`).
use crate::error::{check, Result};
use crate::options::cstring;
use crate::transport::{fixed_cstr, Transport};
use kvxfer_sys as sys;
use std::ptr;

/// Buckets of [`Stats::latency_buckets`].
pub const LATENCY_BUCKETS: usize = sys::KVX_STATS_LATENCY_BUCKETS as usize;

/// Counters of a transport or of one peer ([`Transport::stats`]): transfers
/// and bytes by how they ended, what is in flight, connects, and the latency
/// of done transfers (from `write_blocks` to the moment the library learnt
/// the bytes landed) as percentiles and as a histogram of fixed log buckets
/// ([`latency_bucket_bounds`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Stats {
    pub transfers_done: u64,
    pub transfers_failed: u64,
    pub transfers_cancelled: u64,
    pub bytes_done: u64,
    pub bytes_failed: u64,
    pub bytes_cancelled: u64,
    pub transfers_inflight: u64,
    pub bytes_inflight: u64,
    pub peers: u64,
    pub peers_connecting: u64,
    pub connects: u64,
    pub connect_failures: u64,
    pub connect_ns_total: u64,
    pub connect_ns_max: u64,
    pub connect_ns_last: u64,
    pub latency_count: u64,
    pub latency_ns_p50: u64,
    pub latency_ns_p90: u64,
    pub latency_ns_p99: u64,
    pub latency_ns_p999: u64,
    pub latency_ns_max: u64,
    /// Counts per bucket ([`LATENCY_BUCKETS`] of them).
    pub latency_buckets: Vec<u64>,
    /// `transfers_failed` by cause (since 0.9), as
    /// [`Transport::poll_results`] reports each failure; the four add up to
    /// `transfers_failed`. `TimedOut`: the stall timeout.
    pub transfers_failed_timeout: u64,
    /// `ConnectionReset`: the peer's connection failed.
    pub transfers_failed_connection: u64,
    /// `Canceled`: the peer was removed or replaced, or the transport closed.
    pub transfers_failed_removed: u64,
    /// Any other code.
    pub transfers_failed_other: u64,
    /// The latencies of `latency_count` added up, in ns (since 0.10): exact,
    /// unlike a sum of the buckets.
    pub latency_ns_sum: u64,
}

/// `(lo, hi)` in ns of latency bucket `i`, as the library records them
/// (`kvx_stats_bucket_lower_ns`): it holds latencies in `[lo, hi)`; `hi` is
/// `None` for the last bucket. Panics if `i >= LATENCY_BUCKETS`.
pub fn latency_bucket_bounds(i: usize) -> (u64, Option<u64>) {
    assert!(
        i < LATENCY_BUCKETS,
        "latency bucket {} >= {}",
        i,
        LATENCY_BUCKETS
    );
    // SAFETY: a pure function of its argument, defined for every value.
    let lo = |k: usize| -> u64 { unsafe { sys::kvx_stats_bucket_lower_ns(k) } };
    (
        lo(i),
        if i + 1 < LATENCY_BUCKETS {
            Some(lo(i + 1))
        } else {
            None
        },
    )
}

pub(crate) fn get(t: &Transport<'_>, peer_id: Option<&str>) -> Result<Stats> {
    let id = match peer_id {
        Some(p) => Some(cstring("peer id", p)?),
        None => None,
    };
    // SAFETY: kvx_stats is plain integers: all-zero is a valid value.
    let mut s: sys::kvx_stats = unsafe { std::mem::zeroed() };
    s.size = std::mem::size_of::<sys::kvx_stats>() as u64;
    let id_ptr = id.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    // SAFETY: live handle; s is a kvx_stats of the size it says; id is NULL
    // or NUL-terminated.
    check(unsafe { sys::kvx_get_stats(&mut s, t.as_raw(), id_ptr) })?;
    Ok(Stats {
        transfers_done: s.transfers_done,
        transfers_failed: s.transfers_failed,
        transfers_cancelled: s.transfers_cancelled,
        bytes_done: s.bytes_done,
        bytes_failed: s.bytes_failed,
        bytes_cancelled: s.bytes_cancelled,
        transfers_inflight: s.transfers_inflight,
        bytes_inflight: s.bytes_inflight,
        peers: s.peers,
        peers_connecting: s.peers_connecting,
        connects: s.connects,
        connect_failures: s.connect_failures,
        connect_ns_total: s.connect_ns_total,
        connect_ns_max: s.connect_ns_max,
        connect_ns_last: s.connect_ns_last,
        latency_count: s.latency_count,
        latency_ns_p50: s.latency_ns_p50,
        latency_ns_p90: s.latency_ns_p90,
        latency_ns_p99: s.latency_ns_p99,
        latency_ns_p999: s.latency_ns_p999,
        latency_ns_max: s.latency_ns_max,
        latency_buckets: s.latency_buckets.to_vec(),
        transfers_failed_timeout: s.transfers_failed_timeout,
        transfers_failed_connection: s.transfers_failed_connection,
        transfers_failed_removed: s.transfers_failed_removed,
        transfers_failed_other: s.transfers_failed_other,
        latency_ns_sum: s.latency_ns_sum,
    })
}

pub(crate) fn metrics_text(t: &Transport<'_>) -> Result<String> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let mut len = 0usize;
        let buf_ptr = if buf.is_empty() {
            ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast()
        };
        // SAFETY: live handle; buf_ptr is NULL with cap 0 or points to
        // buf.len() writable bytes.
        let rc = unsafe { sys::kvx_metrics_text(&mut len, t.as_raw(), buf_ptr, buf.len()) };
        if rc == sys::KVX_ENOBUFS {
            // len is the size with its NUL; the text may grow before the
            // next call: some more room, and again if that was not enough.
            buf = vec![0u8; len + len / 8 + 1024];
            continue;
        }
        check(rc)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        return Ok(String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()));
    }
}

/// Most bytes of [`RailStats::name`] in C, with its NUL
/// (`KVX_RAIL_NAME_LEN`).
pub const RAIL_NAME_LEN: usize = sys::KVX_RAIL_NAME_LEN as usize;

/// One rail of a peer ([`Transport::peer_rails`], `kvx_rail_stats`): a local
/// RDMA port paired with one of the peer's (option `verbs.devices`), over
/// which the peer's transfers are striped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RailStats {
    /// `"rxe0:1 -> 198.18.0.1:20049"`: local device:port -> the peer's
    /// rdma_cm address (at most [`RAIL_NAME_LEN`]` - 1` bytes).
    pub name: String,
    /// The rail carries transfers; `false`: taken out (failed, or never
    /// connected). A rail taken out does not come back for this peer.
    pub up: bool,
    /// Bytes of the parts of transfers it completed.
    pub bytes: u64,
    /// Parts of transfers it completed.
    pub parts: u64,
    /// Times it was taken out (0 or 1 today).
    pub failures: u32,
    /// When it last changed state (connected, taken out), in ns since the
    /// epoch (`CLOCK_REALTIME`).
    pub changed_ns: i64,
}

pub(crate) fn rails(t: &Transport<'_>, peer_id: &str) -> Result<Vec<RailStats>> {
    let id = cstring("peer id", peer_id)?;
    // SAFETY: kvx_rail_stats is a char array and integers: all-zero is a
    // valid value.
    let zero: sys::kvx_rail_stats = unsafe { std::mem::zeroed() };
    let mut out: Vec<sys::kvx_rail_stats> = Vec::new();
    loop {
        let mut n = 0usize;
        let out_ptr = if out.is_empty() {
            ptr::null_mut()
        } else {
            out.as_mut_ptr()
        };
        // SAFETY: live handle; id NUL-terminated; out_ptr is NULL with cap 0
        // or points to out.len() writable entries.
        check(unsafe { sys::kvx_peer_rails(t.as_raw(), id.as_ptr(), out_ptr, out.len(), &mut n) })?;
        if n <= out.len() {
            out.truncate(n);
            break;
        }
        // Ask again with room for every rail (again if the peer was replaced
        // meanwhile by one with more rails).
        out = vec![zero; n];
    }
    Ok(out
        .iter()
        .map(|r| RailStats {
            name: fixed_cstr(&r.name),
            up: r.up != 0,
            bytes: r.bytes,
            parts: r.parts,
            failures: r.failures,
            changed_ns: r.changed_ns,
        })
        .collect())
}
