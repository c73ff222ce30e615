//! Send/Sync promises (checked at compile time) and concurrent use.
mod common;
use common::*;
use kvxfer::{CancelMode, Error, Options, PollResult, Transport};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

// Compile-time: these functions only have to type-check.
#[allow(dead_code)]
fn static_assertions() {
    assert_send_sync::<Transport<'static>>();
    assert_send_sync::<Transport<'_>>();
    assert_send_sync::<Options>();
    assert_send_sync::<Error>();
    assert_send_sync::<PollResult>();
    assert_send_sync::<CancelMode>();
    assert_send::<Arc<Transport<'static>>>();
}

#[test]
fn many_threads_one_transport() {
    const N: u64 = 64;
    const L: u64 = 512;
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 50;
    let opts = tcp_opts().set("tcp.streams", "2");
    let a = Transport::new(region(N, L, src_byte), N, L, None, &opts).unwrap();
    let b = Transport::new(region(N, L, canary_byte), N, L, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();

    let submitted = Mutex::new(Vec::new());
    let reported = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        // Writers: thread t owns remote blocks t*8..t*8+8 and sends local
        // blocks there, over and over; they also poll (any thread may get
        // any id) and read properties/metadata concurrently.
        for t in 0..THREADS {
            let (a, b, submitted, reported) = (&a, &b, &submitted, &reported);
            s.spawn(move || {
                for k in 0..PER_THREAD {
                    let r = t * 8 + k % 8;
                    let id = a.write_blocks("b", &[r], &[r]).unwrap();
                    submitted.lock().unwrap().push(id);
                    if k % 7 == 0 {
                        let p = a.poll(None).unwrap();
                        reported
                            .lock()
                            .unwrap()
                            .extend(p.done.iter().chain(&p.failed).copied());
                    }
                    assert_eq!(b.num_blocks(), N);
                    if k % 10 == 0 {
                        assert!(!b.agent_metadata().unwrap().is_empty());
                    }
                }
            });
        }
        // Errors on several threads at once keep their own messages.
        for t in 0..4 {
            let a = &a;
            s.spawn(move || {
                for _ in 0..50 {
                    let name = format!("ghost-{}", t);
                    let e = a.write_blocks(&name, &[0], &[0]).unwrap_err();
                    assert!(e.message().contains(&name), "{:?}", e);
                    let e = a.write_blocks("b", &[N + t], &[0]).unwrap_err();
                    assert!(e.message().contains(&(N + t).to_string()), "{:?}", e);
                }
            });
        }
    });
    let submitted = submitted.into_inner().unwrap();
    assert_eq!(submitted.len() as u64, THREADS * PER_THREAD);
    let mut reported = reported.into_inner().unwrap();
    let rest = wait_all(
        &a,
        None,
        &submitted
            .iter()
            .filter(|id| !reported.contains(id))
            .copied()
            .collect::<Vec<_>>(),
    );
    assert!(rest.failed.is_empty());
    reported.extend(rest.done);
    let unique: HashSet<u64> = reported.iter().copied().collect();
    assert_eq!(unique.len(), reported.len(), "an id was reported twice");
    assert_eq!(unique, submitted.iter().copied().collect::<HashSet<u64>>());

    let dst = b.into_region().unwrap();
    assert_eq!(
        dst,
        region(N, L, src_byte),
        "every block was sent to itself"
    );
}

#[test]
fn shared_through_arc_and_dropped_on_another_thread() {
    let opts = tcp_opts();
    let a = Arc::new(Transport::new(region(4, 256, src_byte), 4, 256, None, &opts).unwrap());
    let b = Transport::new(region(4, 256, canary_byte), 4, 256, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    let handles: Vec<_> = (0..4u64)
        .map(|i| {
            let a = Arc::clone(&a);
            std::thread::spawn(move || a.write_blocks("b", &[i], &[3 - i]).unwrap())
        })
        .collect();
    let ids: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(wait_all(&a, None, &ids).failed.is_empty());
    // The last reference goes away on another thread: destroy runs there.
    std::thread::spawn(move || drop(a)).join().unwrap();
    // Moving a transport to another thread and getting its region back there.
    let dst = std::thread::spawn(move || b.into_region().unwrap())
        .join()
        .unwrap();
    verify(&dst, 256, &[(0, 3), (1, 2), (2, 1), (3, 0)]);
}

#[test]
fn close_while_other_threads_work() {
    let opts = tcp_opts();
    let a = Transport::new(region(8, 256, src_byte), 8, 256, None, &opts).unwrap();
    let b = Transport::new(region(8, 256, canary_byte), 8, 256, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let a = &a;
            s.spawn(move || loop {
                match a.write_blocks("b", &[1, 2], &[3, 4]) {
                    Ok(_) => {
                        let _ = a.cancel(&[1, 2, 3], CancelMode::Wait);
                        let _ = a.poll(None);
                    }
                    // A call racing with close may see the peer's link shut
                    // down before it sees the closed flag (PeerBroken); the
                    // next call must then say Closed.
                    Err(e) if e.kind() == kvxfer::ErrorKind::PeerBroken => {}
                    Err(e) => {
                        assert_eq!(e.kind(), kvxfer::ErrorKind::Closed, "{:?}", e);
                        break;
                    }
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        a.close().unwrap();
    });
    assert_eq!(a.poll(None).unwrap_err().kind(), kvxfer::ErrorKind::Closed);
}

#[test]
fn wait_sleeps_until_ready_and_close_wakes_it() {
    const N: u64 = 8;
    const L: u64 = 512;
    let opts = tcp_opts();
    let a = Transport::new(region(N, L, src_byte), N, L, None, &opts).unwrap();
    let b = Transport::new(region(N, L, canary_byte), N, L, None, &opts).unwrap();
    connect(&a, "b", &b).unwrap();
    assert_eq!(a.wait(Some(std::time::Duration::ZERO)).unwrap(), 0);
    assert_eq!(a.wait(Some(std::time::Duration::from_millis(20))).unwrap(), 0);
    let fd = a.completion_fd().unwrap();
    assert!(fd >= 0);
    assert_eq!(a.completion_fd().unwrap(), fd);
    let id = a.write_blocks("b", &[1], &[2]).unwrap();
    assert_eq!(a.wait(None).unwrap(), 1);
    let p = a.poll(None).unwrap();
    assert_eq!(p.done, vec![id]);
    assert_eq!(a.wait(Some(std::time::Duration::ZERO)).unwrap(), 0);

    // A thread waiting without limit leaves with Closed when another closes.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| a.wait(None));
        std::thread::sleep(std::time::Duration::from_millis(100));
        a.close().unwrap();
        let got = waiter.join().unwrap();
        assert!(matches!(&got, Err(e) if e.kind() == kvxfer::ErrorKind::Closed), "{:?}", got);
    });
}
