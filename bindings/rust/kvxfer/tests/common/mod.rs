//! Helpers shared by the integration tests.
#![allow(dead_code)]
use kvxfer::{Options, PollResult, Transport};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// tcp on loopback, any port.
pub fn tcp_opts() -> Options {
    Options::new()
        .backend("tcp")
        .set("tcp.listen", "127.0.0.1:0")
}

/// Byte j of the sender's block i.
pub fn src_byte(i: u64, j: usize) -> u8 {
    (i as usize * 131 + j * 7 + 3) as u8
}

/// Byte j of the receiver's untouched block i (the canary).
pub fn canary_byte(i: u64, j: usize) -> u8 {
    (i as usize * 17 + j * 13 + 0x5a) as u8 ^ 0xff
}

pub fn region(num_blocks: u64, block_len: u64, f: fn(u64, usize) -> u8) -> Vec<u8> {
    let mut v = vec![0u8; (num_blocks * block_len) as usize];
    for (i, b) in v.chunks_mut(block_len as usize).enumerate() {
        for (j, x) in b.iter_mut().enumerate() {
            *x = f(i as u64, j);
        }
    }
    v
}

/// Register `to` as peer `id` of `from`.
pub fn connect(from: &Transport, id: &str, to: &Transport) -> kvxfer::Result<()> {
    from.add_remote_peer(
        id,
        &to.agent_metadata()?,
        to.base_addr(),
        to.num_blocks(),
        to.block_len(),
    )
}

/// Poll until every id in `ids` surfaced (panics after 30 s). Returns all
/// that was reported meanwhile; panics on an id reported twice.
pub fn wait_all(t: &Transport, peer: Option<&str>, ids: &[u64]) -> PollResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut all = PollResult::default();
    let mut seen = HashSet::new();
    loop {
        let r = t.poll(peer).expect("poll");
        for id in r.done.iter().chain(r.failed.iter()) {
            assert!(seen.insert(*id), "id {} reported twice", id);
        }
        all.done.extend(r.done);
        all.failed.extend(r.failed);
        if ids.iter().all(|id| seen.contains(id)) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "ids {:?} not reported after 30 s (got {:?})",
            ids,
            all
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Check `region`: remote block r holds the sender's block l for every
/// (l, r) in `moved`; every other block still holds its canary.
pub fn verify(region: &[u8], block_len: u64, moved: &[(u64, u64)]) {
    for (i, b) in region.chunks(block_len as usize).enumerate() {
        let i = i as u64;
        let src = moved.iter().find(|(_, r)| *r == i).map(|(l, _)| *l);
        for (j, &x) in b.iter().enumerate() {
            let want = match src {
                Some(l) => src_byte(l, j),
                None => canary_byte(i, j),
            };
            assert_eq!(x, want, "block {} byte {} (source {:?})", i, j, src);
        }
    }
}

/// A fresh empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!(
        "kvxfer-rs-{}-{}-{}",
        tag,
        std::process::id(),
        nanos
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
