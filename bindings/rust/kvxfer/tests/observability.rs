//! Log records (`kvx_set_log_handler`), the list of peers (`kvx_list_peers`)
//! and the metrics text (`kvx_metrics_text`).
mod common;
use common::*;
use kvxfer::{ErrorKind, LogLevel, LogRecord, PeerLink, Transport};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The tests that set the (process-wide) log handler run one at a time.
static LOGS: Mutex<()> = Mutex::new(());

fn logs_lock() -> MutexGuard<'static, ()> {
    LOGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Add a peer of another config: the library refuses it (its fingerprint
/// differs) and logs a warning about it; then wait for the handler.
fn refuse(peer: &str) {
    let opts = tcp_opts();
    let a = Transport::new(vec![0; 4 * 64], 4, 64, Some(r#"{"model":"a"}"#), &opts).unwrap();
    let b = Transport::new(vec![0; 4 * 64], 4, 64, Some(r#"{"model":"b"}"#), &opts).unwrap();
    let err = connect(&a, peer, &b).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FingerprintMismatch, "{}", err);
    kvxfer::log_flush(Some(Duration::from_secs(10))).unwrap();
}

type Records = Arc<Mutex<Vec<LogRecord>>>;

fn about(recs: &Records, peer: &str) -> Vec<LogRecord> {
    recs.lock()
        .unwrap()
        .iter()
        .filter(|r| r.peer_id.as_deref() == Some(peer) && r.message.contains("refused"))
        .cloned()
        .collect()
}

fn collect_logs(level: LogLevel) -> Records {
    let recs: Records = Arc::default();
    let sink = recs.clone();
    kvxfer::set_log_handler(level, move |r: &LogRecord| {
        sink.lock().unwrap().push(r.clone())
    })
    .unwrap();
    recs
}

#[test]
fn a_refused_peer_is_a_warning_for_the_handler() {
    let _g = logs_lock();
    let recs = collect_logs(LogLevel::Warn);
    assert_eq!(kvxfer::log_level(), LogLevel::Warn);
    let before = SystemTime::now();
    refuse("X");
    let got = about(&recs, "X");
    assert_eq!(got.len(), 1, "{:?}", recs.lock().unwrap());
    let r = &got[0];
    assert_eq!((r.level, r.component), (LogLevel::Warn, "core"));
    assert!(
        r.message
            .starts_with("peer 'X': refused: its config fingerprint "),
        "{}",
        r.message
    );
    assert!(
        r.time + Duration::from_secs(1) >= before
            && r.time <= SystemTime::now() + Duration::from_secs(1)
    );
    assert!(r.thread_id > 0 && r.suppressed == 0 && r.dropped == 0);
    assert!(r.to_string().starts_with("warn: peer 'X': refused"));

    // error: the warning is not delivered
    kvxfer::set_log_level(LogLevel::Error).unwrap();
    assert_eq!(kvxfer::log_level(), LogLevel::Error);
    refuse("Y");
    assert!(about(&recs, "Y").is_empty());
    kvxfer::set_log_level(LogLevel::Warn).unwrap();
    refuse("Y");
    assert_eq!(about(&recs, "Y").len(), 1);

    // back to stderr: the handler gets nothing more, and is dropped
    kvxfer::clear_log_handler().unwrap();
    assert_eq!(
        Arc::strong_count(&recs),
        1,
        "the handler (and its clone of recs) was dropped"
    );
    refuse("Z");
    assert!(about(&recs, "Z").is_empty());
}

#[test]
fn a_handler_may_call_kvxfer() {
    let _g = logs_lock();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    kvxfer::set_log_handler(LogLevel::Warn, move |_r: &LogRecord| {
        let a = kvxfer::set_log_level(LogLevel::Warn);
        let b = kvxfer::log_flush(Some(Duration::from_secs(1)));
        s.lock()
            .unwrap()
            .push(format!("{:?} {:?}", a.is_ok(), b.map_err(|e| e.kind())));
    })
    .unwrap();
    refuse("C");
    kvxfer::clear_log_handler().unwrap();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|s| s == "true Err(Busy)"), "{:?}", seen);
}

#[test]
fn a_panicking_handler_does_not_take_the_process_down() {
    let _g = logs_lock();
    kvxfer::set_log_handler(LogLevel::Warn, |_r: &LogRecord| {
        panic!("handler panics on purpose")
    })
    .unwrap();
    refuse("P");
    kvxfer::clear_log_handler().unwrap();
}

#[test]
fn peers_sorted_removed_not_listed() {
    let opts = tcp_opts();
    let src = Transport::new(region(8, 512, src_byte), 8, 512, None, &opts).unwrap();
    let b = Transport::new(region(8, 512, canary_byte), 8, 512, None, &opts).unwrap();
    let a = Transport::new(region(8, 512, canary_byte), 8, 512, None, &opts).unwrap();
    assert!(src.peers().unwrap().is_empty());
    connect(&src, "peer-b", &b).unwrap();
    connect(&src, "peer-a", &a).unwrap();
    let peers = src.peers().unwrap();
    let ids: Vec<&str> = peers.iter().map(|p| p.peer_id.as_str()).collect();
    assert_eq!(ids, ["peer-a", "peer-b"]);
    for p in &peers {
        assert_eq!(p.state.link, PeerLink::Up);
        assert_eq!(p.state.link.name(), "up");
        // the same fields as peer_state() (since_ns: the library converts it
        // to CLOCK_REALTIME at each call, which may differ by a few ns)
        let mut st = src.peer_state(&p.peer_id).unwrap();
        assert!((st.since_ns - p.state.since_ns).abs() < 1_000_000);
        st.since_ns = p.state.since_ns;
        assert_eq!(p.state, st);
        assert_eq!((p.state.backend, p.state.last_progress_ns), ("tcp", 0));
    }
    let id = src.write_blocks("peer-b", &[0], &[1]).unwrap();
    wait_all(&src, None, &[id]);
    assert!(src.peer_state("peer-b").unwrap().last_progress_ns > 0);
    src.remove_remote_peer("peer-a").unwrap();
    let ids: Vec<String> = src
        .peers()
        .unwrap()
        .into_iter()
        .map(|p| p.peer_id)
        .collect();
    assert_eq!(ids, ["peer-b"]);
    src.close().unwrap();
    assert_eq!(src.peers().unwrap_err().kind(), ErrorKind::Closed);
}

#[test]
fn a_peer_being_added_is_connecting() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // accepts, never answers
    let silent_opts = tcp_opts().set("tcp.advertise", hole.local_addr().unwrap().to_string());
    let silent = Transport::new(vec![0; 4 * 64], 4, 64, None, &silent_opts).unwrap();
    let opts = tcp_opts().set("connect_timeout_ms", "10000");
    let t = Transport::new(vec![0; 4 * 64], 4, 64, None, &opts).unwrap();
    let meta = silent.agent_metadata().unwrap();
    let pending = t
        .add_remote_peer_async(
            "s",
            &meta,
            silent.base_addr(),
            silent.num_blocks(),
            silent.block_len(),
            false,
        )
        .unwrap();
    let peers = t.peers().unwrap();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].peer_id, "s");
    assert_eq!(peers[0].state.link, PeerLink::Connecting);
    assert!(peers[0].state.since_ns > 0 && peers[0].state.in_flight == 0);
    t.remove_remote_peer("s").unwrap();
    drop(pending);
    assert!(t.peers().unwrap().is_empty());
}

#[test]
fn metrics_text_matches_stats() {
    let opts = tcp_opts();
    let src = Transport::new(region(8, 512, src_byte), 8, 512, None, &opts).unwrap();
    let dst = Transport::new(region(8, 512, canary_byte), 8, 512, None, &opts).unwrap();
    connect(&src, "dst", &dst).unwrap();
    let ids: Vec<u64> = (0..5)
        .map(|i| {
            src.write_blocks("dst", &[0, 1, 2], &[i, i + 1, i + 2])
                .unwrap()
        })
        .collect();
    wait_all(&src, None, &ids);
    let st = src.stats(None).unwrap();
    assert_eq!((st.transfers_done, st.bytes_done), (5, 5 * 3 * 512));
    assert!(st.latency_ns_sum > 0 && st.latency_ns_sum <= st.latency_count * st.latency_ns_max);
    let text = src.metrics_text().unwrap();
    for line in [
        "# TYPE kvxfer_transfers_total counter".to_string(),
        format!(
            "kvxfer_transfers_total{{outcome=\"done\"}} {}",
            st.transfers_done
        ),
        format!(
            "kvxfer_transfer_bytes_total{{outcome=\"done\"}} {}",
            st.bytes_done
        ),
        format!("kvxfer_transfer_latency_seconds_count {}", st.latency_count),
        "kvxfer_peer_transfers_total{peer=\"dst\",outcome=\"done\"} 5".to_string(),
    ] {
        assert!(
            text.contains(&format!("\n{}\n", line)),
            "no line {:?} in\n{}",
            line,
            text
        );
    }
    assert!(!text.contains('\0'));
    src.close().unwrap();
    assert_eq!(src.metrics_text().unwrap_err().kind(), ErrorKind::Closed);
}
