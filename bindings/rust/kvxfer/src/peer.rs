//! A peer's connection state (`kvx_get_peer_state`) and the list of a
//! transport's peers (`kvx_list_peers`).
use crate::error::{check, Error, Result};
use crate::options::cstring;
use crate::transport::{fixed_cstr, static_str, Transport};
use kvxfer_sys as sys;

/// Most bytes of [`PeerState::reason`] in C, with its NUL
/// (`KVX_PEER_REASON_LEN`).
pub const PEER_REASON_LEN: usize = sys::KVX_PEER_REASON_LEN as usize;

/// Where a registered peer's connection stands (`kvx_peer_link`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PeerLink {
    /// Connected: writes go out on [`Transport::peer_backend`]'s path.
    Up,
    /// Its connection failed; it reconnects in the background (option
    /// `peer_redial_ms`). `write_blocks` fails at once with `PeerBroken`
    /// meanwhile.
    Reconnecting,
    /// Its connection failed and it does not reconnect (`peer_redial_ms=0`):
    /// remove and re-add it.
    Broken,
    /// Being added (`add_remote_peer` or `add_remote_peer_async` under way):
    /// only in [`Transport::peers`] (since 0.10).
    Connecting,
    /// A value this version of the crate does not know (a newer library).
    Other(i32),
}

impl PeerLink {
    /// The link of a raw `kvx_peer_link` value.
    pub fn from_raw(link: i32) -> PeerLink {
        match u32::try_from(link) {
            Ok(sys::KVX_PEER_UP) => PeerLink::Up,
            Ok(sys::KVX_PEER_RECONNECTING) => PeerLink::Reconnecting,
            Ok(sys::KVX_PEER_BROKEN) => PeerLink::Broken,
            Ok(sys::KVX_PEER_CONNECTING) => PeerLink::Connecting,
            _ => PeerLink::Other(link),
        }
    }

    /// `"up"`, `"reconnecting"`, `"broken"`, `"connecting"`, or `"other"`.
    pub fn name(&self) -> &'static str {
        match self {
            PeerLink::Up => "up",
            PeerLink::Reconnecting => "reconnecting",
            PeerLink::Broken => "broken",
            PeerLink::Connecting => "connecting",
            PeerLink::Other(_) => "other",
        }
    }
}

/// A registered peer's state ([`Transport::peer_state`], `kvx_peer_state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// Up, reconnecting or broken.
    pub link: PeerLink,
    /// What took the connection down (kind `TimedOut`: the stall timeout;
    /// `ConnectionReset`: the connection failed), then the last failed
    /// reconnection attempt, with [`reason`](Self::reason) as its message;
    /// `None` while it never failed.
    pub error: Option<Error>,
    /// Its backend, as [`Transport::peer_backend`] says (`"tcp"`).
    pub backend: &'static str,
    /// Its path, as [`Transport::peer_backend`] says (`""` but for shm).
    pub path: &'static str,
    /// Its transfers submitted and not yet reported by `poll`.
    pub in_flight: u64,
    /// When it entered this state, in ns since the epoch
    /// (`CLOCK_REALTIME`).
    pub since_ns: i64,
    /// While reconnecting: when the next attempt starts (ns since the
    /// epoch); 0 while one runs, and in the other states.
    pub next_attempt_ns: i64,
    /// Times it reconnected since it was added.
    pub reconnects: u32,
    /// Failed attempts since it went down (0 when up).
    pub attempts: u32,
    /// Why it is not up (`""` when up): the message of `error` (at most
    /// [`PEER_REASON_LEN`]` - 1` bytes).
    pub reason: String,
    /// When it last made progress (a transfer of it ended, or it got work
    /// while it had none in flight), in ns since the epoch; 0 before its
    /// first transfer. The stall timeout counts from here (since 0.10).
    pub last_progress_ns: i64,
}

/// One peer of [`Transport::peers`] (`kvx_peer_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its id (bytes that are not UTF-8 show as U+FFFD).
    pub peer_id: String,
    /// As [`Transport::peer_state`] gives it, or, while the peer is being
    /// added, link [`PeerLink::Connecting`] with `since_ns` the add's start
    /// and every other field zero or empty.
    pub state: PeerState,
}

pub(crate) fn state(t: &Transport<'_>, peer_id: &str) -> Result<PeerState> {
    let id = cstring("peer id", peer_id)?;
    // SAFETY: kvx_peer_state is integers, a char array and two pointers:
    // all-zero (NULL pointers) is a valid value.
    let mut s: sys::kvx_peer_state = unsafe { std::mem::zeroed() };
    // SAFETY: live handle; id NUL-terminated; s is writable.
    check(unsafe { sys::kvx_get_peer_state(t.as_raw(), id.as_ptr(), &mut s) })?;
    Ok(from_raw(&s))
}

fn from_raw(s: &sys::kvx_peer_state) -> PeerState {
    let reason = fixed_cstr(&s.reason);
    PeerState {
        link: PeerLink::from_raw(s.link),
        error: if s.error == 0 {
            None
        } else {
            Some(Error::new(s.error, reason.clone()))
        },
        // SAFETY: static strings (or NULL, read as "").
        backend: unsafe { static_str(s.backend) },
        // SAFETY: as above.
        path: unsafe { static_str(s.path) },
        in_flight: s.in_flight,
        since_ns: s.since_ns,
        next_attempt_ns: s.next_attempt_ns,
        reconnects: s.reconnects,
        attempts: s.attempts,
        reason,
        last_progress_ns: s.last_progress_ns,
    }
}

pub(crate) fn list(t: &Transport<'_>) -> Result<Vec<PeerInfo>> {
    // SAFETY: kvx_peer_info is a char array, integers and two pointers:
    // all-zero (NULL pointers) is a valid value.
    let zero: sys::kvx_peer_info = unsafe { std::mem::zeroed() };
    let mut out: Vec<sys::kvx_peer_info> = Vec::new();
    loop {
        let mut n = 0usize;
        let out_ptr = if out.is_empty() {
            std::ptr::null_mut()
        } else {
            out.as_mut_ptr()
        };
        // SAFETY: live handle; out_ptr is NULL with cap 0 or points to
        // out.len() writable entries.
        check(unsafe { sys::kvx_list_peers(&mut n, t.as_raw(), out_ptr, out.len()) })?;
        if n <= out.len() {
            out.truncate(n);
            break;
        }
        // Ask again with room for every peer and some more (again if peers
        // were added meanwhile).
        out = vec![zero; n + 16];
    }
    Ok(out
        .iter()
        .map(|p| PeerInfo {
            peer_id: fixed_cstr(&p.peer_id),
            state: from_raw(&p.state),
        })
        .collect())
}
