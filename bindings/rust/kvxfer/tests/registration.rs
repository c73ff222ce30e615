//! Registration without blocking (add_remote_peer_async / PendingPeer) and
//! telemetry (stats).
mod common;
use common::*;
use kvxfer::{latency_bucket_bounds, ErrorKind, Scope, Transport, LATENCY_BUCKETS};
use std::net::TcpListener;
use std::time::{Duration, Instant};

const NB: u64 = 8;
const BL: u64 = 512;

fn transport(connect_ms: u32) -> Transport<'static> {
    let opts = tcp_opts().set("connect_timeout_ms", &connect_ms.to_string());
    Transport::new(region(NB, BL, src_byte), NB, BL, None, &opts).unwrap()
}

#[test]
fn async_registration_succeeds_and_counts() {
    let a = transport(5000);
    let b = transport(5000);
    let meta = b.agent_metadata().unwrap();
    let p = a
        .add_remote_peer_async("b", &meta, b.base_addr(), NB, BL, false)
        .unwrap();
    assert_eq!(p.peer_id(), "b");
    p.wait().unwrap();
    assert_eq!(p.poll(), Some(Ok(()))); // the outcome stays
    let id = a.write_blocks("b", &[1, 2], &[3, 4]).unwrap();
    let r = wait_all(&a, None, &[id]);
    assert_eq!(r.done, vec![id]);
    let s = a.stats(Some("b")).unwrap();
    assert_eq!(
        (s.transfers_done, s.bytes_done, s.connects, s.peers),
        (1, 2 * BL, 1, 1)
    );
    assert_eq!(s.latency_buckets.len(), LATENCY_BUCKETS);
    assert_eq!(s.latency_buckets.iter().sum::<u64>(), 1);
    assert!(s.latency_ns_p50 > 0 && s.latency_ns_p50 <= 2 * s.latency_ns_max);
    assert_eq!(a.stats(None).unwrap().transfers_done, 1);
    assert_eq!(
        a.stats(Some("x")).unwrap_err().kind(),
        ErrorKind::UnknownPeer
    );
    let dup = a.add_remote_peer_async("b", &meta, b.base_addr(), NB, BL, false);
    assert_eq!(dup.unwrap_err().kind(), ErrorKind::PeerExists);
    let bad = a.add_remote_peer_async("c", &meta[..10], b.base_addr(), NB, BL, false);
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::BadMetadata);
}

#[test]
fn silent_peer_is_pending_then_times_out_or_is_cancelled() {
    let hole = TcpListener::bind("127.0.0.1:0").unwrap(); // never accepts
    let opts = tcp_opts().set("tcp.advertise", &hole.local_addr().unwrap().to_string());
    let silent = Transport::new(vec![0u8; (NB * BL) as usize], NB, BL, None, &opts).unwrap();
    let meta = silent.agent_metadata().unwrap();
    let a = transport(600);
    let t0 = Instant::now();
    let p = a
        .add_remote_peer_async("s", &meta, silent.base_addr(), NB, BL, false)
        .unwrap();
    assert!(t0.elapsed() < Duration::from_millis(50));
    assert!(p.poll().is_none());
    assert!(p.wait_timeout(Duration::from_millis(50)).is_none());
    let e = p.wait().unwrap_err();
    assert_eq!((e.kind(), e.scope()), (ErrorKind::TimedOut, Scope::Peer));
    assert!(
        t0.elapsed() <= Duration::from_millis(660),
        "{:?}",
        t0.elapsed()
    );
    assert!(!e.message().is_empty());
    // cancelled by remove, at once
    let q = a
        .add_remote_peer_async("s", &meta, silent.base_addr(), NB, BL, false)
        .unwrap();
    q.cancel().unwrap();
    let e = q.wait_timeout(Duration::from_secs(1)).unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Canceled);
    assert_eq!(
        a.write_blocks("s", &[0], &[0]).unwrap_err().kind(),
        ErrorKind::UnknownPeer
    );
    // superseded by a replacing add of a good peer
    let good = transport(5000);
    let slow = a
        .add_remote_peer_async("s", &meta, silent.base_addr(), NB, BL, false)
        .unwrap();
    let gm = good.agent_metadata().unwrap();
    let fast = a
        .add_remote_peer_async("s", &gm, good.base_addr(), NB, BL, true)
        .unwrap();
    assert_eq!(slow.wait().unwrap_err().kind(), ErrorKind::Canceled);
    fast.wait().unwrap();
    let id = a.write_blocks("s", &[0], &[0]).unwrap();
    assert_eq!(wait_all(&a, None, &[id]).done, vec![id]);
}

#[test]
fn bucket_bounds_tile_the_range() {
    for i in 0..LATENCY_BUCKETS - 1 {
        let (lo, hi) = latency_bucket_bounds(i);
        assert_eq!(Some(latency_bucket_bounds(i + 1).0), hi);
        assert!(hi.unwrap() > lo);
    }
    assert_eq!(latency_bucket_bounds(LATENCY_BUCKETS - 1).1, None);
    assert_eq!(latency_bucket_bounds(17), (18, Some(20)));
    // SAFETY: defined for every index.
    assert_eq!(
        unsafe { kvxfer::sys::kvx_stats_bucket_lower_ns(LATENCY_BUCKETS) },
        u64::MAX
    );
}
