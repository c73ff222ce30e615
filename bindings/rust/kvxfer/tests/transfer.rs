//! Real data over tcp between two transports in one process.
mod common;
use common::*;
use kvxfer::{CancelMode, Options, Transport};

const BL: u64 = 1000; // deliberately not a power of two

#[test]
fn owned_regions_byte_for_byte() {
    let opts = tcp_opts();
    let a = Transport::new(region(8, BL, src_byte), 8, BL, Some(r#"{"m":1}"#), &opts).unwrap();
    let b = Transport::new(
        region(12, BL, canary_byte),
        12,
        BL,
        Some(r#"{"m":1}"#),
        &opts,
    )
    .unwrap();
    assert_eq!(a.backend(), "tcp");
    assert_eq!(a.backends(), vec!["tcp".to_string()]);
    assert_eq!((a.num_blocks(), a.block_len()), (8, BL));
    assert_eq!((b.num_blocks(), b.block_len()), (12, BL));
    assert_eq!(b.base_addr(), b.region_ptr() as u64);
    assert_eq!(
        a.config_fingerprint(),
        kvxfer::fingerprint(r#"{"m":1}"#).unwrap()
    );
    connect(&a, "b", &b).unwrap();
    assert_eq!(a.peer_backend("b").unwrap(), ("tcp", ""));
    assert!(a.peer_backend("nobody").is_err());

    // A run (0,1,2 -> 3,4,5), a single block, and a backwards pair in one call.
    let moves1 = [(0u64, 3u64), (1, 4), (2, 5), (7, 11), (6, 0), (5, 1)];
    let (l1, r1): (Vec<u64>, Vec<u64>) = moves1.iter().copied().unzip();
    let id1 = a.write_blocks("b", &l1, &r1).unwrap();
    let id2 = a.write_blocks("b", &[3], &[9]).unwrap();
    let empty = a.write_blocks("b", &[], &[]).unwrap();
    assert!(id1 != 0 && id2 != 0 && empty != 0);
    assert!(id1 != id2 && id2 != empty);
    let res = wait_all(&a, Some("b"), &[id1, id2, empty]);
    assert!(res.failed.is_empty(), "{:?}", res);
    assert!(a.poll(None).unwrap().is_empty());

    let src = a.into_region().unwrap();
    assert_eq!(src, region(8, BL, src_byte), "sender region changed");
    let dst = b.into_region().unwrap();
    let mut moved = moves1.to_vec();
    moved.push((3, 9));
    verify(&dst, BL, &moved);
}

#[test]
fn both_directions_and_large_blocks() {
    const N: u64 = 64;
    const L: u64 = 64 * 1024;
    let opts = tcp_opts().set("tcp.streams", "3");
    let a = Transport::new(region(N, L, src_byte), N, L, None, &opts).unwrap();
    let b = Transport::new(region(N, L, canary_byte), N, L, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    connect(&b, "a", &a).unwrap();
    // a -> b: even local blocks 0..58 to b's blocks 0..30 (one call, ~2 MiB);
    // a's blocks 60..64 are only written (by b), never read, meanwhile.
    let l: Vec<u64> = (0..30).map(|i| i * 2).collect();
    let r: Vec<u64> = (0..30).collect();
    let ab = a.write_blocks("b", &l, &r).unwrap();
    // b -> a: b's canary blocks 60..64 into a's blocks 60..64
    let ba = b
        .write_blocks("a", &[60, 61, 62, 63], &[60, 61, 62, 63])
        .unwrap();
    assert!(wait_all(&a, None, &[ab]).failed.is_empty());
    assert!(wait_all(&b, None, &[ba]).failed.is_empty());
    let ra = a.into_region().unwrap();
    let rb = b.into_region().unwrap();
    let moved: Vec<(u64, u64)> = l.iter().copied().zip(r.iter().copied()).collect();
    verify(&rb, L, &moved);
    for (i, blk) in ra.chunks(L as usize).enumerate() {
        for (j, &x) in blk.iter().enumerate() {
            let want = if i >= 60 {
                canary_byte(i as u64, j)
            } else {
                src_byte(i as u64, j)
            };
            assert_eq!(x, want, "a block {} byte {}", i, j);
        }
    }
}

#[test]
fn scoped_borrowed_regions() {
    let opts = tcp_opts();
    let mut src = region(4, BL, src_byte);
    let mut dst = region(4, BL, canary_byte);
    let n = Transport::scope(&mut dst, 4, BL, None, &opts, |b| {
        Transport::scope(&mut src, 4, BL, None, &opts, |a| {
            connect(a, "b", b).unwrap();
            let id = a.write_blocks("b", &[0, 3], &[2, 1]).unwrap();
            wait_all(a, None, &[id]).done.len()
        })
        .unwrap()
    })
    .unwrap();
    assert_eq!(n, 1);
    verify(&dst, BL, &[(0, 2), (3, 1)]);
    assert_eq!(src, region(4, BL, src_byte));
}

#[test]
fn unsafe_borrowed_region_and_block_access() {
    let opts = tcp_opts();
    let mut dst = region(4, BL, canary_byte);
    let a = Transport::new(region(4, BL, canary_byte), 4, BL, None, &opts).unwrap();
    {
        // SAFETY: b is dropped at the end of this block, before dst is read.
        let b = unsafe { Transport::new_borrowed(&mut dst, 4, BL, None, &opts) }.unwrap();
        connect(&a, "b", &b).unwrap();
        // Prepare a's block 2 in place, then send it; no peer writes into a.
        unsafe {
            for (j, x) in a.block_mut(2).iter_mut().enumerate() {
                *x = src_byte(2, j);
            }
        }
        let id = a.write_blocks("b", &[2], &[0]).unwrap();
        assert!(wait_all(&a, None, &[id]).failed.is_empty());
        // The transfer is done and nobody else writes b's block 0.
        let blk = unsafe { b.block(0) };
        assert!(blk.iter().enumerate().all(|(j, &x)| x == src_byte(2, j)));
        assert!(b.into_region().is_none());
    }
    verify(&dst, BL, &[(2, 0)]);
}

#[test]
fn poll_filters_by_peer() {
    let opts = tcp_opts();
    let a = Transport::new(region(4, BL, src_byte), 4, BL, None, &opts).unwrap();
    let b = Transport::new(region(4, BL, canary_byte), 4, BL, None, &opts).unwrap();
    let c = Transport::new(region(4, BL, canary_byte), 4, BL, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    connect(&a, "c", &c).unwrap();
    let to_b = a.write_blocks("b", &[0], &[0]).unwrap();
    let to_c = a.write_blocks("c", &[1], &[1]).unwrap();
    let rb = wait_all(&a, Some("b"), &[to_b]);
    assert_eq!(rb.done, vec![to_b]);
    assert!(a.poll(Some("nobody")).unwrap().is_empty());
    let rc = wait_all(&a, Some("c"), &[to_c]);
    assert_eq!(rc.done, vec![to_c]);
    verify(&b.into_region().unwrap(), BL, &[(0, 0)]);
    verify(&c.into_region().unwrap(), BL, &[(1, 1)]);
}

#[test]
fn poll_collects_more_than_one_chunk() {
    // More finished ids than the wrapper's 256-entry poll arrays.
    let opts = tcp_opts();
    let a = Transport::new(region(4, 64, src_byte), 4, 64, None, &opts).unwrap();
    let b = Transport::new(region(4, 64, canary_byte), 4, 64, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    let ids: Vec<u64> = (0..700)
        .map(|i| a.write_blocks("b", &[i % 4], &[i % 4]).unwrap())
        .collect();
    // Let them all finish before the first poll.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let res = wait_all(&a, None, &ids);
    assert_eq!(res.done.len(), 700);
    assert!(res.failed.is_empty());
}

/// Everything `t` reports within ~200 ms of quiet, checking no id twice.
fn drain(t: &Transport) -> Vec<u64> {
    let mut all = Vec::new();
    let mut quiet = 0;
    while quiet < 20 {
        let r = t.poll(None).unwrap();
        if r.is_empty() {
            quiet += 1;
        } else {
            quiet = 0;
        }
        all.extend(r.done.into_iter().chain(r.failed));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        all.len(),
        "an id was reported twice: {:?}",
        all
    );
    all
}

#[test]
fn cancel_modes() {
    let opts = tcp_opts();
    let a = Transport::new(region(8, BL, src_byte), 8, BL, None, &opts).unwrap();
    let b = Transport::new(region(8, BL, canary_byte), 8, BL, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();

    assert_eq!(
        a.cancel(&[], CancelMode::Immediate).unwrap(),
        Vec::<u64>::new()
    );
    assert_eq!(a.cancel(&[], CancelMode::Wait).unwrap(), Vec::<u64>::new());
    assert!(
        a.cancel(&[12345, 999], CancelMode::Wait)
            .unwrap()
            .is_empty(),
        "unknown ids are ignored"
    );

    // Immediate: returns nothing; the ids not cancelled all surface.
    let ids: Vec<u64> = (0..40)
        .map(|i| a.write_blocks("b", &[i % 8], &[i % 8]).unwrap())
        .collect();
    assert!(a
        .cancel(&ids[20..], CancelMode::Immediate)
        .unwrap()
        .is_empty());
    let reported = drain(&a);
    assert!(
        ids[..20].iter().all(|id| reported.contains(id)),
        "{:?}",
        reported
    );
    assert!(reported.iter().all(|id| ids.contains(id)), "{:?}", reported);

    // Wait: the returned ids (a subset) all surface later.
    let ids: Vec<u64> = (0..40)
        .map(|i| a.write_blocks("b", &[i % 8], &[i % 8]).unwrap())
        .collect();
    let inflight = a.cancel(&ids, CancelMode::Wait).unwrap();
    assert!(
        inflight.iter().all(|id| ids.contains(id)),
        "{:?} not a subset",
        inflight
    );
    let reported = drain(&a);
    assert!(
        inflight.iter().all(|id| reported.contains(id)),
        "{:?} vs {:?}",
        inflight,
        reported
    );
    assert!(reported.iter().all(|id| ids.contains(id)), "{:?}", reported);
}

/// kvxfer.h: with KVX_CANCEL_IMMEDIATE the ids "are never reported"; an id
/// that finished before the cancel but was not polled yet is neither unknown
/// nor already reported, so it is forgotten too.
#[test]
fn cancel_immediate_forgets_finished_unpolled_ids() {
    let opts = tcp_opts();
    let a = Transport::new(region(8, BL, src_byte), 8, BL, None, &opts).unwrap();
    let b = Transport::new(region(8, BL, canary_byte), 8, BL, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    let id = a.write_blocks("b", &[0], &[0]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300)); // done, not polled
    a.cancel(&[id], CancelMode::Immediate).unwrap();
    assert!(drain(&a).is_empty(), "cancelled id {} was reported", id);
}

#[test]
fn remove_and_readd_peer() {
    let opts = tcp_opts();
    let a = Transport::new(region(4, BL, src_byte), 4, BL, None, &opts).unwrap();
    let b = Transport::new(region(4, BL, canary_byte), 4, BL, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    let id = a.write_blocks("b", &[0], &[0]).unwrap();
    wait_all(&a, None, &[id]);
    a.remove_remote_peer("b").unwrap();
    assert_eq!(
        a.write_blocks("b", &[1], &[1]).unwrap_err().kind(),
        kvxfer::ErrorKind::UnknownPeer
    );
    connect(&a, "b", &b).unwrap();
    let id = a.write_blocks("b", &[1], &[1]).unwrap();
    assert!(wait_all(&a, None, &[id]).failed.is_empty());
    verify(&b.into_region().unwrap(), BL, &[(0, 0), (1, 1)]);
}

#[test]
fn metadata_and_properties() {
    let a = Transport::new(vec![0; 2 * 10], 2, 10, None, &Options::new().backend("tcp")).unwrap();
    let m1 = a.agent_metadata().unwrap();
    let m2 = a.agent_metadata().unwrap();
    assert!(!m1.is_empty());
    assert_eq!(m1, m2);
    assert_eq!(a.config_fingerprint(), "");
    assert_eq!(a.region_len(), 20);
    let dbg = format!("{:?}", a);
    assert!(
        dbg.contains("tcp") && dbg.contains("num_blocks: 2"),
        "{}",
        dbg
    );
    a.close().unwrap();
    a.close().unwrap(); // idempotent
    assert_eq!((a.num_blocks(), a.block_len()), (2, 10)); // still readable
    assert_eq!(a.into_region().unwrap(), vec![0; 20]);
}

#[test]
fn version() {
    assert_eq!(
        kvxfer::version_number() / 10000,
        kvxfer::HEADER_VERSION_NUMBER / 10000
    );
    let n = kvxfer::version_number();
    assert_eq!(
        kvxfer::version(),
        format!("{}.{}.{}", n / 10000, n / 100 % 100, n % 100)
    );
}

#[test]
fn backends_come_from_the_library() {
    let names = kvxfer::backends();
    assert!(
        names.contains(&"tcp") && names.contains(&"shm"),
        "{:?}",
        names
    );
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{:?}", names);
}

/// A SharedRegion target: a same-host writer maps it and copies directly
/// ("mapped"); the blocks land, the others keep their bytes.
#[test]
fn shared_region_takes_the_mapped_path() {
    let opts = Options::new().backend("shm");
    let mut dst = kvxfer::SharedRegion::new((8 * BL) as usize, false).unwrap();
    assert!(dst.iter().all(|&b| b == 0));
    dst.fill(0x22);
    let a = Transport::new(region(8, BL, src_byte), 8, BL, None, &opts).unwrap();
    Transport::scope(&mut dst, 8, BL, None, &opts, |b| {
        connect(&a, "b", b).unwrap();
        assert_eq!(a.peer_backend("b").unwrap(), ("shm", "mapped"));
        let id = a.write_blocks("b", &[1, 2], &[6, 3]).unwrap();
        let res = wait_all(&a, Some("b"), &[id]);
        assert_eq!(res.done, vec![id]);
        a.remove_remote_peer("b").unwrap();
    })
    .unwrap();
    for i in 0..8u64 {
        let blk = &dst[(i * BL) as usize..((i + 1) * BL) as usize];
        let from = match i {
            6 => Some(1),
            3 => Some(2),
            _ => None,
        };
        for (j, &byte) in blk.iter().enumerate() {
            assert_eq!(
                byte,
                from.map_or(0x22, |f| src_byte(f, j)),
                "block {i} byte {j}"
            );
        }
    }
    assert!(kvxfer::SharedRegion::new(0, false).is_err());
}
