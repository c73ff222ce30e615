//! `Region`: the owner reads and writes its blocks through copies, without
//! `unsafe`, while transports over it are open and peers write into it.
mod common;
use common::*;
use kvxfer::{ErrorKind, Options, Region, Transport};

const N: u64 = 16;
const BL: u64 = 4096;

fn block(i: u64, f: fn(u64, usize) -> u8) -> Vec<u8> {
    (0..BL as usize).map(|j| f(i, j)).collect()
}

/// Byte j of block i as the owner rewrites it later.
fn second_byte(i: u64, j: usize) -> u8 {
    src_byte(i, j) ^ 0xa5
}

/// The owner fills its blocks after the transport exists, sends some to the
/// peer, receives some from it, rewrites one and sends it again; `opts`
/// picks the backend. Returns the path the peer took into the owner's region.
fn owner_and_peer(owner_region: &Region, opts: &Options) -> (&'static str, &'static str) {
    let peer_region = Region::from_vec(region(N, BL, canary_byte), N, BL).unwrap();
    let owner = Transport::with_region(owner_region, None, opts).unwrap();
    let peer = Transport::with_region(&peer_region, None, opts).unwrap();
    assert_eq!(owner.base_addr(), owner_region.as_ptr() as u64);
    assert_eq!((owner.num_blocks(), owner.block_len()), (N, BL));
    connect(&owner, "peer", &peer).unwrap();
    connect(&peer, "owner", &owner).unwrap();

    for i in 0..N {
        owner_region.write_block(i, &block(i, src_byte)).unwrap();
    }
    let moves = [(0u64, 10u64), (1, 11), (2, 12), (3, 13), (9, 0)];
    let (l, r): (Vec<u64>, Vec<u64>) = moves.iter().copied().unzip();
    let id = owner.write_blocks("peer", &l, &r).unwrap();
    assert!(wait_all(&owner, Some("peer"), &[id]).failed.is_empty());
    verify(&peer_region.to_vec(), BL, &moves);

    // The peer writes its block 5 (a canary) into the owner's block 7.
    let id = peer.write_blocks("owner", &[5], &[7]).unwrap();
    assert!(wait_all(&peer, Some("owner"), &[id]).failed.is_empty());
    assert_eq!(owner_region.block_to_vec(7).unwrap(), block(5, canary_byte));
    let mut buf = vec![0u8; BL as usize];
    owner_region.read_block(6, &mut buf).unwrap();
    assert_eq!(buf, block(6, src_byte), "a block nobody wrote into");

    // Rewritten after a transfer sent it: the new bytes go out.
    owner_region.write_block(0, &block(0, second_byte)).unwrap();
    let id = owner.write_blocks("peer", &[0], &[1]).unwrap();
    assert!(wait_all(&owner, Some("peer"), &[id]).failed.is_empty());
    assert_eq!(peer_region.block_to_vec(1).unwrap(), block(0, second_byte));
    assert_eq!(peer_region.block_to_vec(10).unwrap(), block(0, src_byte));
    peer.peer_backend("owner").unwrap()
}

#[test]
fn owner_keeps_using_its_region_over_tcp() {
    let region = Region::new(N, BL).unwrap();
    assert_eq!(region.to_vec(), vec![0u8; (N * BL) as usize], "zeroed");
    assert_eq!(owner_and_peer(&region, &tcp_opts()), ("tcp", ""));
    // Both transports are gone: the region holds what they left.
    assert_eq!(region.block_to_vec(7).unwrap(), block(5, canary_byte));
    assert_eq!(region.block_to_vec(0).unwrap(), block(0, second_byte));
}

#[test]
fn same_host_peer_maps_a_library_region() {
    let opts = Options::new().backend("shm");
    let region = Region::new(N, BL).unwrap();
    assert_eq!(owner_and_peer(&region, &opts), ("shm", "mapped"));
    // Vec memory is private: the peer cannot map it and copies another way.
    let region = Region::from_vec(vec![0u8; (N * BL) as usize], N, BL).unwrap();
    let (backend, path) = owner_and_peer(&region, &opts);
    assert_eq!(backend, "shm");
    assert_ne!(path, "mapped");
}

#[test]
fn threads_write_blocks_while_transfers_run() {
    let region = Region::new(N, BL).unwrap();
    let dst = Region::new(N, BL).unwrap();
    let opts = tcp_opts();
    let owner = Transport::with_region(&region, None, &opts).unwrap();
    let peer = Transport::with_region(&dst, None, &opts).unwrap();
    connect(&owner, "peer", &peer).unwrap();
    // Two threads each write their half of the blocks and send each block
    // once written, while the others are in flight; a third reads blocks
    // meanwhile (whole blocks of one version or the other: the lock).
    let ids = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (old, new) = (vec![0u8; BL as usize], block(N - 1, src_byte));
            for _ in 0..200 {
                let b = region.block_to_vec(N - 1).unwrap();
                assert!(
                    b == old || b == new,
                    "a torn block between two writes of ours"
                );
            }
        });
        let writers: Vec<_> = (0..2u64)
            .map(|half| {
                let (region, owner) = (&region, &owner);
                s.spawn(move || {
                    ((half * N / 2)..((half + 1) * N / 2))
                        .map(|i| {
                            region.write_block(i, &block(i, src_byte)).unwrap();
                            owner.write_blocks("peer", &[i], &[N - 1 - i]).unwrap()
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        reader.join().unwrap();
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect::<Vec<u64>>()
    });
    let res = wait_all(&owner, Some("peer"), &ids);
    assert!(res.failed.is_empty(), "{:?}", res);
    for i in 0..N {
        assert_eq!(dst.block_to_vec(N - 1 - i).unwrap(), block(i, src_byte));
    }
}

/// A transport leaked with mem::forget keeps the region's memory alive
/// (leaked), so peers writing into it afterwards write into live memory.
#[test]
fn leaked_transport_keeps_the_memory() {
    let region = Region::new(N, BL).unwrap();
    let opts = tcp_opts();
    let leaked = Transport::with_region(&region, None, &opts).unwrap();
    let peer = Transport::new(region_vec(), N, BL, None, &opts).unwrap();
    connect(&peer, "leaked", &leaked).unwrap();
    std::mem::forget(leaked);
    drop(region); // allowed: the borrow ended with the forget
    let id = peer.write_blocks("leaked", &[1, 2], &[3, 4]).unwrap();
    let res = wait_all(&peer, Some("leaked"), &[id]);
    assert_eq!(res.done, vec![id], "{:?}", res);
}

fn region_vec() -> Vec<u8> {
    region(N, BL, src_byte)
}

#[test]
fn region_errors_and_partial_copies() {
    let err = Region::new(0, BL).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{}", err);
    assert!(err.message().contains("empty"), "{}", err);
    assert_eq!(
        Region::new(u64::MAX, 2).unwrap_err().kind(),
        ErrorKind::Overflow
    );
    let err = Region::from_vec(vec![0u8; 10], 2, 4).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("10 bytes"), "{}", err);

    let r = Region::from_vec(vec![1u8; 8], 2, 4).unwrap();
    assert_eq!((r.num_blocks(), r.block_len(), r.len()), (2, 4, 8));
    let err = r.write_block(2, &[0; 4]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange);
    assert!(
        err.message().contains("block index 2 >= 2 blocks"),
        "{}",
        err
    );
    assert_eq!(r.block_to_vec(5).unwrap_err().kind(), ErrorKind::OutOfRange);
    let err = r.write_block(0, &[0; 3]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        r.read_block(0, &mut [0; 5]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let err = r.write_block_at(1, 3, &[9, 9]).unwrap_err();
    assert!(err.message().contains("past the end"), "{}", err);
    assert!(r.write_block_at(1, 5, &[]).is_err());

    r.write_block_at(1, 1, &[7, 8]).unwrap();
    r.write_block_at(1, 4, &[]).unwrap();
    let mut two = [0u8; 2];
    r.read_block_at(1, 2, &mut two).unwrap();
    assert_eq!(two, [8, 1]);
    assert_eq!(r.to_vec(), vec![1, 1, 1, 1, 1, 7, 8, 1]);
    assert!(format!("{:?}", r).contains("Vec"));
    assert!(format!("{:?}", Region::new(1, 1).unwrap()).contains("kvx_region_alloc"));
}

/// Transport::new, scope and new_borrowed still work beside with_region.
#[test]
fn with_region_beside_the_other_constructors() {
    let opts = tcp_opts();
    let region = Region::new(N, BL).unwrap();
    let a = Transport::with_region(&region, None, &opts).unwrap();
    let b = Transport::with_region(&region, None, &opts).unwrap(); // two over one region
    assert_eq!(a.base_addr(), b.base_addr());
    assert!(a.into_region().is_none());
    region.write_block(0, &block(0, src_byte)).unwrap();
    drop(b);
    let owned = Transport::new(region_vec(), N, BL, None, &opts).unwrap();
    assert_eq!(owned.into_region().unwrap(), region_vec());
}
