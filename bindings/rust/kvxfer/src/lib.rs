//! Safe Rust API for **kvxfer**, one-sided KV-cache block transfer between
//! hosts (C library `libkvxfer`, contract in `include/kvxfer.h`).
//!
//! A [`Transport`] owns (or borrows) one local region of
//! `num_blocks x block_len` bytes, hands out opaque agent metadata, registers
//! remote peers from theirs, and writes local blocks into a peer's blocks:
//! the peer never calls anything for the bytes to land.
//!
//! ```
//! use kvxfer::{Options, Transport};
//! # fn main() -> kvxfer::Result<()> {
//! let opts = Options::new().backend("tcp").set("tcp.listen", "127.0.0.1:0");
//! let a = Transport::new(vec![7u8; 4 * 64], 4, 64, None, &opts)?;
//! let b = Transport::new(vec![0u8; 4 * 64], 4, 64, None, &opts)?;
//! a.add_remote_peer("b", &b.agent_metadata()?, b.base_addr(), b.num_blocks(), b.block_len())?;
//! let id = a.write_blocks("b", &[0, 1], &[2, 3])?;
//! loop {
//!     let res = a.poll(None)?;
//!     assert!(!res.failed.contains(&id));
//!     if res.done.contains(&id) {
//!         break;
//!     }
//!     std::thread::sleep(std::time::Duration::from_millis(1));
//! }
//! let region = b.into_region().unwrap(); // destroys b, returns its memory
//! assert_eq!(&region[..128], &[0u8; 128][..]);
//! assert_eq!(&region[128..], &[7u8; 128][..]);
//! # Ok(()) }
//! ```
//!
//! To keep filling and reading its own blocks while the transport is open,
//! without `unsafe`, the owner gives it a [`Region`]
//! ([`Transport::with_region`]) and copies blocks in and out with
//! [`Region::write_block`] and [`Region::read_block`].
//!
//! The library's log messages go to stderr (warnings and errors by
//! default, `KVX_LOG` sets the level) or to a handler of yours
//! ([`set_log_handler`]). [`Transport::peers`] lists a transport's peers
//! with their state; [`Transport::metrics_text`] renders its counters as
//! Prometheus text.
//!
//! Errors are [`Error`]s carrying the library's code, [`Scope`] and message.
//! Every public type is `Send + Sync`: `Options` is plain Rust data (the C
//! options object, which is not thread-safe, only exists inside
//! [`Transport::new`]), and `Transport` follows the library's threading
//! contract (see its "Threads" section).
#![warn(missing_docs)]

mod error;
mod log;
mod options;
mod peer;
mod region;
mod registration;
mod stats;
mod transport;

pub use error::{strerror, Error, ErrorKind, Result, Scope};
pub use log::{
    clear_log_handler, log_flush, log_level, set_log_handler, set_log_level, LogLevel, LogRecord,
};
pub use options::Options;
pub use peer::{PeerInfo, PeerLink, PeerState, PEER_REASON_LEN};
pub use region::{Region, SharedRegion};
pub use registration::PendingPeer;
pub use stats::{latency_bucket_bounds, RailStats, Stats, LATENCY_BUCKETS, RAIL_NAME_LEN};
pub use transport::{CancelMode, PollResult, TransferResult, Transport};

/// The raw bindings, for what this crate does not wrap.
pub use kvxfer_sys as sys;

use std::os::raw::c_char;

/// Largest peer id accepted, in bytes.
pub const PEER_ID_MAX: usize = sys::KVX_PEER_ID_MAX as usize;

/// Length of a config fingerprint in hex characters.
pub const FINGERPRINT_LEN: usize = sys::KVX_FINGERPRINT_LEN as usize;

/// `MAJOR*10000 + MINOR*100 + PATCH` of the header these bindings were made
/// from (compare with [`version_number`], the library loaded at run time).
pub const HEADER_VERSION_NUMBER: u32 = sys::KVX_VERSION_NUMBER;

/// `"MAJOR.MINOR.PATCH"` of the library loaded at run time.
pub fn version() -> &'static str {
    // SAFETY: static storage.
    unsafe { transport::static_str(sys::kvx_version_string()) }
}

/// `MAJOR*10000 + MINOR*100 + PATCH` of the library loaded at run time.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::kvx_version_number() }
}

/// Names of the backends built into the library loaded at run time, in order
/// of preference (`["shm", "verbs", "tcp"]`): each a value of the `backend`
/// option. A backend is listed whether or not it is usable on this host
/// (verbs needs an RDMA device); `"auto"` serves on the usable ones.
pub fn backends() -> Vec<&'static str> {
    // SAFETY: static storage, never NULL.
    let list = unsafe { transport::static_str(sys::kvx_backends()) };
    list.split(',').filter(|n| !n.is_empty()).collect()
}

/// The fingerprint of a model config JSON object text, exactly as a
/// transport computes it: the first 16 hex characters of the sha256 of
/// Python's `json.dumps(fields, sort_keys=True, separators=(",", ":"))`, or
/// "" for `null` / `{}`. Errors: `Config` for invalid JSON, non-objects, or
/// values Python could not round-trip.
pub fn fingerprint(config_json: &str) -> Result<String> {
    let c = options::cstring("config JSON", config_json)?;
    let mut buf = [0 as c_char; FINGERPRINT_LEN + 1];
    // SAFETY: buf holds FINGERPRINT_LEN + 1 bytes; c is NUL-terminated.
    error::check(unsafe { sys::kvx_config_fingerprint(buf.as_mut_ptr(), c.as_ptr()) })?;
    Ok(transport::fixed_cstr(&buf))
}

// Compile-time checks of the auto traits promised above.
const _: () = {
    fn send_sync<T: Send + Sync>() {}
    #[allow(dead_code)]
    fn check() {
        send_sync::<Transport<'static>>();
        send_sync::<Transport<'_>>();
        send_sync::<Options>();
        send_sync::<Region>();
        send_sync::<Error>();
        send_sync::<PollResult>();
        send_sync::<TransferResult>();
        send_sync::<PendingPeer<'static, 'static>>();
        send_sync::<Stats>();
        send_sync::<RailStats>();
        send_sync::<PeerState>();
        send_sync::<PeerInfo>();
        send_sync::<LogRecord>();
    }
};
