//! Error codes, kinds, scopes and messages through the safe API.
mod common;
use common::*;
use kvxfer::{CancelMode, Error, ErrorKind, Options, PeerLink, Scope, Transport};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn pair() -> (Transport<'static>, Transport<'static>) {
    let opts = tcp_opts();
    let a = Transport::new(vec![1; 8 * 64], 8, 64, Some(r#"{"m":1}"#), &opts).unwrap();
    let b = Transport::new(vec![2; 4 * 64], 4, 64, Some(r#"{"m":1}"#), &opts).unwrap();
    (a, b)
}

/// A query of a registered peer fails as peer_backend does: for an unknown
/// peer (same kind, scope and code), an empty id, and (last: it closes `a`)
/// a closed transport; `a` has a peer "b".
fn fails_as_peer_backend<T: std::fmt::Debug>(
    a: &Transport,
    query: impl Fn(&Transport, &str) -> kvxfer::Result<T>,
) {
    let e = assert_err(
        query(a, "ghost"),
        ErrorKind::UnknownPeer,
        Scope::Request,
        "ghost",
    );
    let be = a
        .peer_backend("ghost")
        .expect_err("peer_backend of an unknown peer");
    assert_eq!(
        (e.kind(), e.scope(), e.code()),
        (be.kind(), be.scope(), be.code())
    );
    assert_err(query(a, ""), ErrorKind::InvalidArgument, Scope::Request, "");
    a.close().unwrap();
    assert_err(query(a, "b"), ErrorKind::Closed, Scope::Transport, "");
}

fn assert_err<T: std::fmt::Debug>(
    r: kvxfer::Result<T>,
    kind: ErrorKind,
    scope: Scope,
    needle: &str,
) -> Error {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind(), kind, "{:?}", e);
    assert_eq!(e.scope(), scope, "{:?}", e);
    assert!(e.code() < 0);
    assert!(
        e.message().contains(needle),
        "message {:?} should contain {:?}",
        e.message(),
        needle
    );
    let shown = e.to_string();
    assert!(
        shown.contains(e.message()) && shown.contains(e.description()),
        "{}",
        shown
    );
    e
}

#[test]
fn unknown_peer() {
    let (a, _b) = pair();
    assert_err(
        a.write_blocks("ghost", &[0], &[0]),
        ErrorKind::UnknownPeer,
        Scope::Request,
        "ghost",
    );
    assert_err(
        a.remove_remote_peer("ghost"),
        ErrorKind::UnknownPeer,
        Scope::Request,
        "ghost",
    );
    // poll of an unknown peer is not an error
    assert!(a.poll(Some("ghost")).unwrap().is_empty());
}

#[test]
fn peer_rails_only_verbs_has_rails() {
    let (a, b) = pair();
    connect(&a, "b", &b).unwrap();
    assert_eq!(a.peer_backend("b").unwrap(), ("tcp", ""));
    // A tcp peer has no rails, and that is no error.
    assert_eq!(a.peer_rails("b").unwrap(), Vec::<kvxfer::RailStats>::new());
    fails_as_peer_backend(&a, |t, id| t.peer_rails(id));
}

#[test]
fn peer_state_up() {
    let (a, b) = pair();
    connect(&a, "b", &b).unwrap();
    let st = a.peer_state("b").unwrap();
    assert_eq!(st.link, PeerLink::Up, "{:?}", st);
    assert_eq!((st.backend, st.path), a.peer_backend("b").unwrap());
    assert_eq!((st.backend, st.path), ("tcp", ""));
    assert_eq!((st.error.clone(), st.reason.as_str()), (None, ""));
    assert_eq!(
        (st.in_flight, st.reconnects, st.attempts, st.next_attempt_ns),
        (0, 0, 0, 0)
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    assert!(
        (st.since_ns - now).abs() < 600_000_000_000,
        "since_ns {} is not CLOCK_REALTIME near {}",
        st.since_ns,
        now
    );
    fails_as_peer_backend(&a, |t, id| t.peer_state(id));
}

/// The target goes away: the peer stays registered and goes reconnecting
/// (attempts that fail: nobody answers) or, with peer_redial_ms=0, broken.
fn peer_state_after_target_closed(redial_ms: &str, want: PeerLink) {
    let opts = tcp_opts().set("peer_redial_ms", redial_ms);
    let a = Transport::new(vec![1; 8 * 64], 8, 64, Some(r#"{"m":1}"#), &opts).unwrap();
    let b = Transport::new(vec![2; 4 * 64], 4, 64, Some(r#"{"m":1}"#), &tcp_opts()).unwrap();
    connect(&a, "b", &b).unwrap();
    assert_eq!(a.peer_state("b").unwrap().link, PeerLink::Up);
    b.close().unwrap();
    // A write notices the break if nothing else did (it fails, or is
    // accepted and surfaces failed).
    if let Ok(id) = a.write_blocks("b", &[1], &[1]) {
        assert_eq!(wait_all(&a, None, &[id]).failed, vec![id]);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = a.peer_state("b").unwrap();
    while st.link != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        st = a.peer_state("b").unwrap();
    }
    assert_eq!(st.link, want, "{:?}", st);
    let err = st.error.clone().expect("the failure's error");
    assert!(err.code() < 0 && err.message() == st.reason && !st.reason.is_empty());
    assert_eq!((st.backend, st.reconnects), ("tcp", 0));
    assert_err(
        a.write_blocks("b", &[1], &[1]),
        ErrorKind::PeerBroken,
        Scope::Peer,
        "",
    );
    if want == PeerLink::Reconnecting {
        while st.attempts < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            st = a.peer_state("b").unwrap();
        }
        assert!(
            st.attempts >= 2 && st.link == PeerLink::Reconnecting,
            "{:?}",
            st
        );
    } else {
        std::thread::sleep(Duration::from_millis(300));
        st = a.peer_state("b").unwrap();
        assert_eq!(
            (st.link, st.attempts, st.next_attempt_ns),
            (PeerLink::Broken, 0, 0),
            "{:?}",
            st
        );
    }
    a.remove_remote_peer("b").unwrap();
    assert_err(
        a.peer_state("b"),
        ErrorKind::UnknownPeer,
        Scope::Request,
        "b",
    );
}

#[test]
fn peer_state_reconnecting_after_target_closed() {
    peer_state_after_target_closed("50", PeerLink::Reconnecting);
}

#[test]
fn peer_state_broken_without_redial() {
    peer_state_after_target_closed("0", PeerLink::Broken);
}

#[test]
fn out_of_range_and_bad_indexes() {
    let (a, b) = pair();
    connect(&a, "b", &b).unwrap();
    assert_err(
        a.write_blocks("b", &[8], &[0]),
        ErrorKind::OutOfRange,
        Scope::Request,
        "8",
    );
    assert_err(
        a.write_blocks("b", &[0, 1], &[1, 4]),
        ErrorKind::OutOfRange,
        Scope::Request,
        "4",
    );
    assert_err(
        a.write_blocks("b", &[0, 1], &[2, 2]),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "2",
    );
    // checked in Rust before the call
    let e = assert_err(
        a.write_blocks("b", &[0, 1], &[0]),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "2",
    );
    assert_eq!(e.code(), kvxfer::sys::KVX_EINVAL);
    // still usable afterwards
    let id = a.write_blocks("b", &[0], &[0]).unwrap();
    wait_all(&a, None, &[id]);
}

#[test]
fn closed_transport() {
    let (a, b) = pair();
    connect(&a, "b", &b).unwrap();
    a.close().unwrap();
    assert_err(
        a.write_blocks("b", &[0], &[0]),
        ErrorKind::Closed,
        Scope::Transport,
        "",
    );
    assert_err(a.poll(None), ErrorKind::Closed, Scope::Transport, "");
    assert_err(a.agent_metadata(), ErrorKind::Closed, Scope::Transport, "");
    assert_err(
        a.cancel(&[1], CancelMode::Wait),
        ErrorKind::Closed,
        Scope::Transport,
        "",
    );
    assert_err(
        a.remove_remote_peer("b"),
        ErrorKind::Closed,
        Scope::Transport,
        "",
    );
    assert_err(
        connect(&a, "c", &b),
        ErrorKind::Closed,
        Scope::Transport,
        "",
    );
    a.close().unwrap();
    assert_eq!(a.num_blocks(), 8);
}

#[test]
fn peer_registration_errors() {
    let (a, b) = pair();
    let meta = b.agent_metadata().unwrap();
    connect(&a, "b", &b).unwrap();
    assert_err(
        connect(&a, "b", &b),
        ErrorKind::PeerExists,
        Scope::Request,
        "b",
    );
    assert_err(
        a.add_remote_peer("x", &meta[..meta.len() / 2], b.base_addr(), 4, 64),
        ErrorKind::BadMetadata,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("x", b"definitely not metadata", b.base_addr(), 4, 64),
        ErrorKind::BadMetadata,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("x", &meta, b.base_addr(), 4, 32),
        ErrorKind::Geometry,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("x", &meta, b.base_addr() + 64, 4, 64),
        ErrorKind::Geometry,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("x", &meta, b.base_addr(), 5, 64),
        ErrorKind::Geometry,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("", &meta, b.base_addr(), 4, 64),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "",
    );
    let long = "p".repeat(kvxfer::PEER_ID_MAX + 1);
    assert_err(
        a.add_remote_peer(&long, &meta, b.base_addr(), 4, 64),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "",
    );
    assert_err(
        a.add_remote_peer("n\0ul", &meta, b.base_addr(), 4, 64),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "NUL",
    );
    assert_err(
        a.write_blocks("n\0ul", &[0], &[0]),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "NUL",
    );
    // a peer id of exactly PEER_ID_MAX bytes is fine
    connect(&a, &"q".repeat(kvxfer::PEER_ID_MAX), &b).unwrap();
}

#[test]
fn fingerprint_mismatch_and_none_is_compatible() {
    let opts = tcp_opts();
    let a = Transport::new(vec![0; 64], 1, 64, Some(r#"{"model":"a"}"#), &opts).unwrap();
    let b = Transport::new(vec![0; 64], 1, 64, Some(r#"{"model":"b"}"#), &opts).unwrap();
    let n = Transport::new(vec![0; 64], 1, 64, None, &opts).unwrap();
    assert_err(
        connect(&a, "b", &b),
        ErrorKind::FingerprintMismatch,
        Scope::Request,
        "",
    );
    connect(&a, "n", &n).unwrap();
    connect(&n, "b", &b).unwrap();
}

#[test]
fn dead_peer_is_a_peer_scope_error() {
    let (a, b) = pair();
    let meta = b.agent_metadata().unwrap();
    let (base, nb, bl) = (b.base_addr(), b.num_blocks(), b.block_len());
    drop(b);
    let opts = Options::new()
        .backend("tcp")
        .set("tcp.listen", "127.0.0.1:0")
        .set("connect_timeout_ms", "2000");
    let c = Transport::new(vec![1; 8 * 64], 8, 64, Some(r#"{"m":1}"#), &opts).unwrap();
    for t in [&a, &c] {
        let e = t.add_remote_peer("gone", &meta, base, nb, bl).unwrap_err();
        assert_eq!(e.scope(), Scope::Peer, "{:?}", e);
    }
}

#[test]
fn creation_errors() {
    let o = Options::new();
    assert_err(
        Transport::new(vec![0; 10], 2, 4, None, &o),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "10",
    );
    assert_err(
        Transport::new(vec![], 0, 4, None, &o),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "",
    );
    assert_err(
        Transport::new(vec![0; 4], u64::MAX, 2, None, &o),
        ErrorKind::Overflow,
        Scope::Request,
        "",
    );
    assert_err(
        Transport::new(vec![0; 4], 1, 4, Some("[1,2]"), &o),
        ErrorKind::Config,
        Scope::Request,
        "",
    );
    assert_err(
        Transport::new(vec![0; 4], 1, 4, Some("{\"a\":"), &o),
        ErrorKind::Config,
        Scope::Request,
        "",
    );
    assert_err(
        Transport::new(vec![0; 4], 1, 4, Some("{}\0"), &o),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "NUL",
    );
    let bad_key = Options::new().set("no.such.key", "1");
    assert_err(
        bad_key.validate(),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "no.such.key",
    );
    assert_err(
        Transport::new(vec![0; 4], 1, 4, None, &bad_key),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "no.such.key",
    );
    let bad_val = Options::new().set("tcp.streams", "99");
    assert_err(
        bad_val.validate(),
        ErrorKind::InvalidArgument,
        Scope::Request,
        "99",
    );
    let bad_backend = Options::new().backend("carrier-pigeon");
    let e = Transport::new(vec![0; 4], 1, 4, None, &bad_backend).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidArgument | ErrorKind::NotSupported
        ),
        "{:?}",
        e
    );
    let bad_listen = Options::new()
        .backend("tcp")
        .set("tcp.listen", "256.1.1.1:1");
    assert!(Transport::new(vec![0; 4], 1, 4, None, &bad_listen).is_err());
}

#[test]
fn options_builder() {
    let o = Options::new()
        .backend("tcp")
        .set("tcp.streams", "2")
        .set("backend", "auto");
    assert_eq!(o.get("backend"), Some("auto"));
    assert_eq!(o.get("tcp.streams"), Some("2"));
    assert_eq!(o.get("tcp.listen"), None);
    assert_eq!(
        o.iter().collect::<Vec<_>>(),
        vec![("backend", "auto"), ("tcp.streams", "2")]
    );
    o.validate().unwrap();
    let mut p = Options::new();
    p.insert("connect_timeout_ms", "100")
        .insert("transfer_timeout_ms", "200");
    p.validate().unwrap();
}

#[test]
fn message_is_captured_at_failure() {
    let (a, _b) = pair();
    let e = a.write_blocks("first", &[0], &[0]).unwrap_err();
    // Another failure on this thread does not change the captured message.
    let _ = a.write_blocks("second", &[0], &[0]).unwrap_err();
    assert!(e.message().contains("first"), "{:?}", e);
    // A failure on another thread does not leak into this one's errors.
    std::thread::scope(|s| {
        s.spawn(|| {
            let e2 = a.write_blocks("other-thread", &[0], &[0]).unwrap_err();
            assert!(e2.message().contains("other-thread"));
        });
    });
    let e3 = a.write_blocks("third", &[0], &[0]).unwrap_err();
    assert!(e3.message().contains("third"), "{:?}", e3);
}

#[test]
fn error_trait_and_strerror() {
    let e = kvxfer::fingerprint("[").unwrap_err();
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e.clone());
    assert!(boxed.to_string().starts_with("kvxfer: "));
    assert!(format!("{:?}", e).contains("Config"));
    assert_eq!(
        ErrorKind::from_code(kvxfer::sys::KVX_EAUTH),
        ErrorKind::Auth
    );
    assert_eq!(ErrorKind::from_code(-4242), ErrorKind::Other);
    assert!(!kvxfer::strerror(-4242).is_empty());
    assert_ne!(
        kvxfer::strerror(kvxfer::sys::KVX_ENOENT),
        kvxfer::strerror(kvxfer::sys::KVX_ERANGE)
    );
    fn uses_question_mark() -> Result<String, Box<dyn std::error::Error>> {
        Ok(kvxfer::fingerprint("{")?)
    }
    assert!(uses_question_mark().is_err());
}
