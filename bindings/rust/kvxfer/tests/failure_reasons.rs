//! Why a transfer failed (`poll_results`, `kvx_poll_results`): done
//! transfers, `poll` and `poll_results` sharing their queues, and a peer
//! removed, then one killed, with transfers in flight, and the stats by
//! cause. The target of the last is this test binary in another process
//! (`helper_target`), stopped with SIGSTOP so that nothing it was sent can
//! complete.
mod common;
use common::{connect, tcp_opts};
use kvxfer::{ErrorKind, PeerLink, Scope, Stats, Transport};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HELPER_ENV: &str = "KVXFER_RS_TEST_HELPER";
const IN_FLIGHT: usize = 16;

fn transport() -> Transport<'static> {
    Transport::new(vec![0u8; 16 * 4096], 16, 4096, None, &tcp_opts()).unwrap()
}

/// Not a test: the tcp target of the tests below, run by them in another
/// process (`--ignored --exact helper_target` with HELPER_ENV set). Prints
/// "target HEXMETA BASE NUMBLOCKS BLOCKLEN", serves until stdin closes.
#[test]
#[ignore]
fn helper_target() {
    if std::env::var(HELPER_ENV).map_or(true, |v| v != "target") {
        return;
    }
    let t = transport();
    let meta: String = t
        .agent_metadata()
        .unwrap()
        .iter()
        .map(|b| format!("{:02x}", b))
        .collect();
    println!(
        "target {} {} {} {}",
        meta,
        t.base_addr(),
        t.num_blocks(),
        t.block_len()
    );
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

struct Target {
    child: Child,
    meta: Vec<u8>,
    geometry: (u64, u64, u64),
}

impl Target {
    fn start() -> Target {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "helper_target", "--nocapture"])
            .env(HELPER_ENV, "target")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("target ") => break l,
                Some(Ok(_)) => continue, // the test harness's own lines
                other => panic!("target did not start: {:?}", other),
            }
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let meta = (0..f[1].len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&f[1][i..i + 2], 16).unwrap())
            .collect();
        let geometry = (
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        );
        Target {
            child,
            meta,
            geometry,
        }
    }

    fn add(&self, t: &Transport, id: &str) {
        let (base, nb, bl) = self.geometry;
        t.add_remote_peer(id, &self.meta, base, nb, bl).unwrap();
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(sig)
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {} failed", sig);
    }

    /// SIGSTOP, and wait until the process is stopped.
    fn freeze(&self) {
        self.signal("-STOP");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
            let after = &stat[stat.rfind(')').unwrap() + 1..];
            if after.split_whitespace().next() == Some("T") {
                return;
            }
            assert!(Instant::now() < deadline, "target not stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_in_flight(t: &Transport, peer: &str) -> Vec<u64> {
    let all: Vec<u64> = (0..16).collect();
    (0..IN_FLIGHT)
        .map(|_| t.write_blocks(peer, &all, &all).unwrap())
        .collect()
}

/// Results of `ids` through `poll_results(peer)`; panics on an id reported
/// twice or unexpected, or after 30 s.
fn results(t: &Transport, peer: Option<&str>, ids: &[u64]) -> HashMap<u64, Option<kvxfer::Error>> {
    let want: HashSet<u64> = ids.iter().copied().collect();
    let mut got = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < want.len() {
        for r in t.poll_results(peer).unwrap() {
            assert!(want.contains(&r.id), "unexpected id {}", r.id);
            assert!(
                got.insert(r.id, r.error).is_none(),
                "id {} reported twice",
                r.id
            );
        }
        assert!(Instant::now() < deadline, "ids not reported after 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

fn check_causes(s: &Stats, timeout: u64, connection: u64, removed: u64) {
    assert_eq!(
        s.transfers_failed_timeout
            + s.transfers_failed_connection
            + s.transfers_failed_removed
            + s.transfers_failed_other,
        s.transfers_failed,
        "{:?}",
        s
    );
    assert_eq!(
        (
            s.transfers_failed_timeout,
            s.transfers_failed_connection,
            s.transfers_failed_removed
        ),
        (timeout, connection, removed)
    );
}

#[test]
fn poll_results_reports_done() {
    let (a, b) = (transport(), transport());
    connect(&a, "b", &b).unwrap();
    let ids: Vec<u64> = (0..8)
        .map(|i| a.write_blocks("b", &[i], &[i]).unwrap())
        .collect();
    for (id, err) in results(&a, Some("b"), &ids) {
        assert!(err.is_none(), "transfer {}: {:?}", id, err);
    }
    assert!(a.poll_results(None).unwrap().is_empty());
    assert!(a.poll_results(Some("nobody")).unwrap().is_empty());
    let id = a.write_blocks("b", &[1], &[2]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut res = Vec::new();
    while res.is_empty() && Instant::now() < deadline {
        res = a.poll_results(None).unwrap();
    }
    assert_eq!(res.len(), 1);
    assert_eq!(res[0].id, id);
    assert!(res[0].is_done() && res[0].error.is_none());
    assert_eq!(
        a.poll_results(Some("a\0b")).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    check_causes(&a.stats(None).unwrap(), 0, 0, 0);
    a.close().unwrap();
    assert_eq!(a.poll_results(None).unwrap_err().kind(), ErrorKind::Closed);
}

#[test]
fn poll_and_poll_results_share_the_queues() {
    let (a, b) = (transport(), transport());
    connect(&a, "b", &b).unwrap();
    let ids: HashSet<u64> = (0..300u64)
        .map(|i| a.write_blocks("b", &[i % 16], &[i % 16]).unwrap())
        .collect();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut k = 0;
    while seen.len() < ids.len() {
        k += 1;
        let got: Vec<u64> = if k % 2 == 1 {
            let r = a.poll(None).unwrap();
            assert!(r.failed.is_empty(), "{:?}", r);
            r.done
        } else {
            a.poll_results(Some("b"))
                .unwrap()
                .into_iter()
                .map(|r| {
                    assert!(r.is_done(), "{:?}", r);
                    r.id
                })
                .collect()
        };
        for id in got {
            assert!(
                ids.contains(&id) && seen.insert(id),
                "id {} twice or unexpected",
                id
            );
        }
        assert!(Instant::now() < deadline, "ids not reported after 30 s");
        std::thread::sleep(Duration::from_micros(500));
    }
}

#[test]
fn removed_then_killed_peer_with_transfers_in_flight() {
    let opts = tcp_opts()
        .set("transfer_timeout_ms", "60000")
        .set("peer_redial_ms", "0");
    let a = Transport::new(vec![0u8; 16 * 4096], 16, 4096, None, &opts).unwrap();
    let mut target = Target::start();

    // removed: each says Canceled
    target.add(&a, "target");
    target.freeze();
    let ids = write_in_flight(&a, "target");
    a.remove_remote_peer("target").unwrap();
    for (id, err) in results(&a, None, &ids) {
        let e = err.unwrap_or_else(|| panic!("transfer {} to a stopped target done", id));
        assert_eq!(e.kind(), ErrorKind::Canceled, "{:?}", e);
        assert_eq!(e.code(), kvxfer::sys::KVX_ECANCELED);
        assert_eq!(e.scope(), Scope::Request);
        assert_eq!(e.message(), format!("transfer {} failed", id));
        assert_eq!(e.description(), "cancelled: the peer was removed or replaced");
    }
    check_causes(&a.stats(None).unwrap(), 0, 0, IN_FLIGHT as u64);

    // killed: each says ConnectionReset
    target.signal("-CONT");
    target.add(&a, "target");
    target.freeze();
    let ids = write_in_flight(&a, "target");
    target.kill();
    for (id, err) in results(&a, Some("target"), &ids) {
        let e = err.unwrap_or_else(|| panic!("transfer {} to a killed target done", id));
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{:?}", e);
        assert_eq!(e.scope(), Scope::Peer);
        assert_eq!(
            e.message(),
            format!("transfer {} to peer 'target' failed", id)
        );
    }
    assert_eq!(a.peer_state("target").unwrap().link, PeerLink::Broken);
    check_causes(&a.stats(Some("target")).unwrap(), 0, IN_FLIGHT as u64, 0);
    let s = a.stats(None).unwrap();
    check_causes(&s, 0, IN_FLIGHT as u64, IN_FLIGHT as u64);
    assert_eq!(s.transfers_failed, 2 * IN_FLIGHT as u64);
}
