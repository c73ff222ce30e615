//! Peer registration without blocking (`kvx_add_remote_peer_async`) and its
//! handle.
use crate::error::{check, Error, Result};
use crate::options::cstring;
use crate::transport::Transport;
use kvxfer_sys as sys;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// A peer registration in progress, from
/// [`Transport::add_remote_peer_async`]: poll it ([`PendingPeer::poll`],
/// never blocks) or wait for it ([`PendingPeer::wait`],
/// [`PendingPeer::wait_timeout`]).
///
/// The connection is made on a thread of the C library. The registration is
/// cancelled by [`Transport::remove_remote_peer`] of its peer id (or
/// [`PendingPeer::cancel`]), superseded by a later add of the same id with
/// `replace`, and cut short by closing the transport: it then fails with
/// [`ErrorKind::Canceled`](crate::ErrorKind::Canceled)
/// ([`ErrorKind::Closed`](crate::ErrorKind::Closed)) and never registers the
/// peer. Dropping the handle does not cancel anything. `Send + Sync`: any
/// thread may poll or wait.
pub struct PendingPeer<'t, 'r> {
    t: &'t Transport<'r>,
    peer: String,
    reg: u64,
    // The C library reports a final outcome once; it is kept here after that.
    outcome: Mutex<Option<Result<()>>>,
}

impl<'t, 'r> PendingPeer<'t, 'r> {
    pub(crate) fn start(
        t: &'t Transport<'r>,
        peer_id: &str,
        metadata: &[u8],
        geometry: (u64, u64, u64),
        replace: bool,
    ) -> Result<PendingPeer<'t, 'r>> {
        let id = cstring("peer id", peer_id)?;
        let flags = if replace { sys::KVX_PEER_REPLACE } else { 0 };
        let mut reg = 0u64;
        // SAFETY: live handle; id NUL-terminated; metadata valid for its
        // length and copied during the call.
        check(unsafe {
            sys::kvx_add_remote_peer_async(
                &mut reg,
                t.as_raw(),
                id.as_ptr(),
                metadata.as_ptr().cast(),
                metadata.len(),
                geometry.0,
                geometry.1,
                geometry.2,
                flags,
            )
        })?;
        Ok(PendingPeer {
            t,
            peer: peer_id.to_string(),
            reg,
            outcome: Mutex::new(None),
        })
    }

    /// The peer id being registered.
    pub fn peer_id(&self) -> &str {
        &self.peer
    }

    /// `None` while the registration is in progress, else its outcome (the
    /// same every time it is asked). Never blocks.
    pub fn poll(&self) -> Option<Result<()>> {
        match self.outcome.try_lock() {
            Ok(guard) => self.status_locked(guard, 0),
            Err(TryLockError::Poisoned(p)) => self.status_locked(p.into_inner(), 0),
            // Another thread waits for it: pending as far as is known.
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Waits at most `timeout` for the outcome; `None` if it is still
    /// pending then.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<()>> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        self.status(ms)
    }

    /// Waits for the outcome (at most the transport's `connect_timeout_ms`).
    pub fn wait(&self) -> Result<()> {
        loop {
            if let Some(r) = self.status(-1) {
                return r;
            }
        }
    }

    /// Cancels the registration if it is still in progress, by removing its
    /// peer id ([`Transport::remove_remote_peer`]).
    pub fn cancel(&self) -> Result<()> {
        if self.poll().is_some() {
            return Ok(());
        }
        match self.t.remove_remote_peer(&self.peer) {
            Err(e) if e.kind() == crate::ErrorKind::UnknownPeer => Ok(()),
            r => r,
        }
    }

    fn status(&self, timeout_ms: i32) -> Option<Result<()>> {
        self.status_locked(
            self.outcome.lock().unwrap_or_else(|p| p.into_inner()),
            timeout_ms,
        )
    }

    fn status_locked(
        &self,
        mut outcome: MutexGuard<'_, Option<Result<()>>>,
        timeout_ms: i32,
    ) -> Option<Result<()>> {
        if let Some(r) = outcome.as_ref() {
            return Some(r.clone());
        }
        let (mut state, mut err) = (0i32, 0i32);
        // SAFETY: live handle (the borrow of the transport); valid out-pointers.
        let rc = unsafe {
            sys::kvx_registration_status(
                &mut state,
                &mut err,
                self.t.as_raw(),
                self.reg,
                timeout_ms,
            )
        };
        let r = match (rc, state as u32) {
            (0, sys::KVX_REGISTRATION_PENDING) => return None,
            (0, sys::KVX_REGISTRATION_DONE) => Ok(()),
            // The registration's message is the calling thread's now.
            (0, _) => Err(Error::from_last(err)),
            _ => Err(Error::from_last(rc)),
        };
        *outcome = Some(r.clone());
        Some(r)
    }
}

impl std::fmt::Debug for PendingPeer<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingPeer")
            .field("peer_id", &self.peer)
            .field("registration", &self.reg)
            .finish()
    }
}
