//! `Transport`: one local region, its peers and its transfers.
use crate::error::{check, Error, Result};
use crate::options::{cstring, Options};
use crate::peer::{PeerInfo, PeerState};
use crate::region::{Memory, Region};
use crate::registration::PendingPeer;
use crate::stats::{RailStats, Stats};
use kvxfer_sys as sys;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::os::raw::c_char;
use std::os::unix::io::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

/// Transfers that finished since the last poll; each id appears exactly once
/// over all polls ([`Transport::poll`] and [`Transport::poll_results`]), in
/// `done` or in `failed`. [`Transport::poll_results`] also says why each
/// failed one failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollResult {
    /// Transfers whose bytes are in the peer's region.
    pub done: Vec<u64>,
    /// Transfers that failed (no statement about which bytes landed).
    pub failed: Vec<u64>,
}

impl PollResult {
    /// Nothing finished.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.failed.is_empty()
    }
}

/// A finished transfer and how it ended ([`Transport::poll_results`],
/// `kvx_result`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferResult {
    /// The transfer id [`Transport::write_blocks`] returned.
    pub id: u64,
    /// `None`: done, its bytes are in the peer's region. Otherwise why it
    /// failed, an [`Error`] whose [`kind`](Error::kind) is `TimedOut` (its
    /// peer made no progress for `transfer_timeout_ms`, the stall timeout),
    /// `ConnectionReset` (its peer's connection failed), `Canceled` (its peer
    /// was removed or replaced), or another kind for a backend's own failure
    /// (`PermissionDenied`, `Backend`, ...); its message names the transfer.
    pub error: Option<Error>,
}

impl TransferResult {
    /// The transfer is done (no error).
    pub fn is_done(&self) -> bool {
        self.error.is_none()
    }
}

/// How [`Transport::cancel`] treats transfers already on the wire.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum CancelMode {
    /// Forget the ids: they are never reported. Bytes already on the wire may
    /// still land in the peer's region afterwards.
    #[default]
    Immediate,
    /// Release what can be released (not started, or finished but not yet
    /// polled: never reported); ids still on the wire are returned and will
    /// surface in [`Transport::poll`] as done or failed.
    Wait,
}

/// How the transport holds its region.
enum Holding {
    /// A `Vec<u8>` taken apart into its raw parts, rebuilt and freed on drop
    /// after the C transport is destroyed.
    Owned { capacity: usize },
    /// Memory the caller lends for `'r`.
    Borrowed,
    /// A [`Region`] borrowed for `'r`, whose memory this count keeps alive
    /// even if the transport is leaked.
    Region { _memory: Arc<Memory> },
}

/// A kvxfer transport over one local region of `num_blocks x block_len`
/// bytes (`kvx_transport`).
///
/// The region is written by remote peers at any time while the transport is
/// open (one-sided writes) and read by kvxfer's threads while local blocks are
/// being sent, so Rust code cannot hold an ordinary reference to it during
/// that time. Four ways to give the region:
///
/// - [`Transport::with_region`] borrows a [`Region`], which its owner keeps
///   reading and writing through copies ([`Region::write_block`],
///   [`Region::read_block`]) while the transport is open. Safe, and the way
///   to go when the owner fills or reads its own blocks.
/// - [`Transport::new`] takes ownership of a `Vec<u8>` (returned by
///   [`Transport::into_region`]). Safe in every case: leaking the transport
///   (`mem::forget`) leaks the memory too, so kvxfer never writes into freed
///   memory. Touching the blocks meanwhile takes the `unsafe`
///   [`Transport::block`] and [`Transport::block_mut`].
/// - [`Transport::scope`] borrows a `&mut [u8]` for the duration of a
///   closure and destroys the transport before returning (also on panic).
/// - [`Transport::new_borrowed`] (unsafe) borrows a `&'r mut [u8]` for the
///   transport's lifetime. It cannot be safe: `mem::forget` would end the
///   borrow while kvxfer still writes into the memory.
///
/// Dropping the transport closes it (every transfer in flight fails, no byte
/// is written into the region afterwards) and frees it.
///
/// # Threads
/// `Transport` is `Send + Sync`: every method takes `&self` and may run on
/// many threads at once, as `kvxfer.h` allows for every function except
/// `kvx_transport_destroy()`, which only `Drop` calls (`&mut self`: no other
/// reference exists, so it is the last call). The library keeps no thread
/// affinity, so the transport may also move to and be dropped on another
/// thread. Error messages are thread-local in C; each method reads its
/// message on the calling thread right after the failing call.
pub struct Transport<'r> {
    raw: NonNull<sys::kvx_transport>,
    base: NonNull<u8>,
    len: usize,
    region: Holding,
    _borrow: PhantomData<&'r mut [u8]>,
}

// SAFETY: see "Threads" above. The region pointer is only dereferenced by the
// C library (thread-safe) or by the caller through the unsafe block accessors
// under their own contract; an owned Vec<u8> is Send, a &mut [u8] is Send+Sync,
// a Region's Memory is Send+Sync.
unsafe impl Send for Transport<'_> {}
unsafe impl Sync for Transport<'_> {}

fn expected_len(num_blocks: u64, block_len: u64) -> Result<u64> {
    num_blocks.checked_mul(block_len).ok_or_else(|| {
        Error::new(
            sys::KVX_EOVERFLOW,
            format!(
                "num_blocks {} x block_len {} overflows",
                num_blocks, block_len
            ),
        )
    })
}

fn check_region(len: usize, num_blocks: u64, block_len: u64) -> Result<()> {
    let want = expected_len(num_blocks, block_len)?;
    if len as u64 != want {
        return Err(Error::new(
            sys::KVX_EINVAL,
            format!(
                "region has {} bytes, num_blocks {} x block_len {} needs {}",
                len, num_blocks, block_len, want
            ),
        ));
    }
    Ok(())
}

impl Transport<'static> {
    /// Create a transport that owns `region`, which must hold exactly
    /// `num_blocks * block_len` bytes (its capacity is never touched).
    ///
    /// `config_json` is the model config as a JSON object text (its
    /// fingerprint must match the peers'), or `None` for no fingerprint.
    /// On failure the region is dropped.
    pub fn new(
        region: Vec<u8>,
        num_blocks: u64,
        block_len: u64,
        config_json: Option<&str>,
        opts: &Options,
    ) -> Result<Transport<'static>> {
        check_region(region.len(), num_blocks, block_len)?;
        let mut region = ManuallyDrop::new(region);
        let (base, len, capacity) = (region.as_mut_ptr(), region.len(), region.capacity());
        match Transport::create(base, num_blocks, block_len, config_json, opts) {
            Ok(raw) => Ok(Transport {
                raw,
                // SAFETY: Vec::as_mut_ptr is never NULL.
                base: unsafe { NonNull::new_unchecked(base) },
                len,
                region: Holding::Owned { capacity },
                _borrow: PhantomData,
            }),
            Err(e) => {
                ManuallyDrop::into_inner(region);
                Err(e)
            }
        }
    }
}

impl<'r> Transport<'r> {
    /// Create a transport over a borrowed region for its whole lifetime.
    ///
    /// # Safety
    /// The transport must be dropped (or [`Transport::into_region`] called)
    /// before the region is used again: do not leak it with `mem::forget`,
    /// `Rc` cycles or `Box::leak` unless the region outlives the process.
    /// Otherwise kvxfer keeps writing into memory Rust considers free.
    pub unsafe fn new_borrowed(
        region: &'r mut [u8],
        num_blocks: u64,
        block_len: u64,
        config_json: Option<&str>,
        opts: &Options,
    ) -> Result<Transport<'r>> {
        check_region(region.len(), num_blocks, block_len)?;
        let len = region.len();
        let base = region.as_mut_ptr();
        let raw = Transport::create(base, num_blocks, block_len, config_json, opts)?;
        Ok(Transport {
            raw,
            // SAFETY: slice pointers are never NULL.
            base: NonNull::new_unchecked(base),
            len,
            region: Holding::Borrowed,
            _borrow: PhantomData,
        })
    }

    /// Create a transport over `region` for the transport's lifetime, with
    /// the region's geometry. The owner keeps using `region` meanwhile
    /// through its copying methods ([`Region::write_block`],
    /// [`Region::read_block`], ...), without `unsafe`; see [`Region`] for
    /// when a copy can race with peers. The borrow keeps the region from
    /// being dropped or moved while the transport lives (see [`Region`]'s
    /// "Lifetime"). It is safe where [`Transport::new_borrowed`] is not: the
    /// transport also holds a count of the region's memory, so leaking it
    /// (`mem::forget`) leaks the memory rather than letting kvxfer write into
    /// freed memory. [`Transport::into_region`] returns `None` for it.
    /// Errors: those of [`Transport::new`].
    pub fn with_region(
        region: &'r Region,
        config_json: Option<&str>,
        opts: &Options,
    ) -> Result<Transport<'r>> {
        let memory = region.memory();
        let base = memory.base();
        let raw = Transport::create(
            base.as_ptr(),
            region.num_blocks(),
            region.block_len(),
            config_json,
            opts,
        )?;
        Ok(Transport {
            raw,
            base,
            len: region.len(),
            region: Holding::Region { _memory: memory },
            _borrow: PhantomData,
        })
    }

    /// Create a transport over `region`, run `f` with it, destroy it, and
    /// return what `f` returned. The transport is destroyed before this
    /// returns, also when `f` panics, so when `scope` returns the region holds
    /// everything peers wrote and nothing writes into it any more.
    pub fn scope<R, F>(
        region: &'r mut [u8],
        num_blocks: u64,
        block_len: u64,
        config_json: Option<&str>,
        opts: &Options,
        f: F,
    ) -> Result<R>
    where
        F: FnOnce(&Transport<'r>) -> R,
    {
        // SAFETY: the transport lives in this frame only and `f` gets a
        // shared reference, so it cannot be leaked; it is dropped on return
        // and on unwind.
        let t =
            unsafe { Transport::new_borrowed(region, num_blocks, block_len, config_json, opts)? };
        Ok(f(&t))
    }

    fn create(
        base: *mut u8,
        num_blocks: u64,
        block_len: u64,
        config_json: Option<&str>,
        opts: &Options,
    ) -> Result<NonNull<sys::kvx_transport>> {
        let config = match config_json {
            Some(c) => Some(cstring("config JSON", c)?),
            None => None,
        };
        let raw_opts = opts.to_raw()?;
        let mut out = ptr::null_mut();
        // SAFETY: base points to num_blocks*block_len writable bytes that stay
        // valid and unmoved until destroy (guaranteed by the constructors).
        check(unsafe {
            sys::kvx_transport_create(
                &mut out,
                base.cast(),
                num_blocks,
                block_len,
                config.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
                raw_opts.as_ptr(),
            )
        })?;
        NonNull::new(out)
            .ok_or_else(|| Error::new(sys::KVX_EINTERNAL, "kvx_transport_create gave NULL"))
    }

    fn ptr(&self) -> *mut sys::kvx_transport {
        self.raw.as_ptr()
    }

    /// The raw handle, for calls through `kvxfer-sys`. It stays owned by this
    /// `Transport`: never destroy it.
    pub fn as_raw(&self) -> *mut sys::kvx_transport {
        self.ptr()
    }

    // ------------------------------------------------------------ properties

    fn prop_u64(&self, f: unsafe extern "C" fn(*mut u64, *const sys::kvx_transport) -> i32) -> u64 {
        let mut v = 0u64;
        // SAFETY: live handle, valid out-pointer. These only fail for NULL.
        let rc = unsafe { f(&mut v, self.ptr()) };
        assert_eq!(rc, 0, "kvxfer property query failed on a live transport");
        v
    }

    /// Base address of the local region (what peers pass to
    /// [`Transport::add_remote_peer`]).
    pub fn base_addr(&self) -> u64 {
        self.prop_u64(sys::kvx_transport_base_addr)
    }

    /// Number of blocks of the local region.
    pub fn num_blocks(&self) -> u64 {
        self.prop_u64(sys::kvx_transport_num_blocks)
    }

    /// Bytes per block.
    pub fn block_len(&self) -> u64 {
        self.prop_u64(sys::kvx_transport_block_len)
    }

    /// The config fingerprint: 16 lowercase hex characters, or "" for none.
    pub fn config_fingerprint(&self) -> String {
        let mut buf = [0 as c_char; sys::KVX_FINGERPRINT_LEN as usize + 1];
        // SAFETY: buf holds KVX_FINGERPRINT_LEN + 1 bytes.
        let rc = unsafe { sys::kvx_transport_config_fingerprint(buf.as_mut_ptr(), self.ptr()) };
        assert_eq!(rc, 0, "kvxfer fingerprint query failed on a live transport");
        fixed_cstr(&buf)
    }

    /// The most preferred backend the transport serves on: `"shm"`,
    /// `"verbs"` or `"tcp"`. It may serve on several;
    /// [`Transport::peer_backend`] says which one a given peer uses.
    pub fn backend(&self) -> &'static str {
        // SAFETY: static storage, never NULL for a live handle.
        unsafe { static_str(sys::kvx_transport_backend(self.ptr())) }
    }

    /// Every backend the transport serves on, in order of preference
    /// (since 0.8), e.g. `["shm", "tcp"]`: what its metadata offers, so the
    /// paths its peers can take. With backend `auto`, every backend usable
    /// on this host.
    pub fn backends(&self) -> Vec<String> {
        // SAFETY: a NUL-terminated string owned by the live transport, never NULL.
        let all = unsafe { std::ffi::CStr::from_ptr(sys::kvx_transport_backends(self.ptr())) };
        all.to_string_lossy()
            .split(',')
            .map(str::to_owned)
            .collect()
    }

    /// The opaque agent metadata a peer passes to its
    /// [`Transport::add_remote_peer`]. It contains the secret that lets a
    /// holder write into this region: hand it only to peers that may.
    pub fn agent_metadata(&self) -> Result<Vec<u8>> {
        let mut need = 0usize;
        // SAFETY: size query: NULL buffer with cap 0.
        let rc = unsafe { sys::kvx_get_agent_metadata(&mut need, self.ptr(), ptr::null_mut(), 0) };
        if rc != 0 && rc != sys::KVX_ENOBUFS {
            return Err(Error::from_last(rc));
        }
        loop {
            let mut buf = vec![0u8; need];
            let mut len = 0usize;
            // SAFETY: buf has buf.len() writable bytes (a dangling non-NULL
            // pointer with cap 0 when need is 0).
            let rc = unsafe {
                sys::kvx_get_agent_metadata(
                    &mut len,
                    self.ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            match rc {
                0 => {
                    buf.truncate(len);
                    return Ok(buf);
                }
                sys::KVX_ENOBUFS if len > need => need = len,
                _ => return Err(Error::from_last(rc)),
            }
        }
    }

    // ------------------------------------------------------------ region

    /// Start of the local region. Dereferencing it is the caller's business:
    /// see [`Transport::block`].
    pub fn region_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Size of the local region in bytes.
    pub fn region_len(&self) -> usize {
        self.len
    }

    fn block_range(&self, idx: u64) -> (usize, usize) {
        let (num_blocks, block_len) = (self.num_blocks(), self.block_len());
        assert!(
            idx < num_blocks,
            "block index {} >= {} blocks",
            idx,
            num_blocks
        );
        ((idx * block_len) as usize, block_len as usize)
    }

    /// Local block `idx` (panics when out of range).
    ///
    /// # Safety
    /// While the slice lives, no peer may write into this block and no
    /// [`Transport::block_mut`] slice may overlap it. Which blocks peers write
    /// is an application-level agreement kvxfer cannot check.
    pub unsafe fn block(&self, idx: u64) -> &[u8] {
        let (off, len) = self.block_range(idx);
        std::slice::from_raw_parts(self.base.as_ptr().add(off), len)
    }

    /// Local block `idx`, writable (panics when out of range).
    ///
    /// # Safety
    /// While the slice lives, no peer may write into this block, no transfer
    /// reading it may be in flight, and no other slice of it may exist.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn block_mut(&self, idx: u64) -> &mut [u8] {
        let (off, len) = self.block_range(idx);
        std::slice::from_raw_parts_mut(self.base.as_ptr().add(off), len)
    }

    // ------------------------------------------------------------ peers

    /// Register a remote peer and connect to it, blocking up to
    /// `connect_timeout_ms`. `metadata`, `base_addr`, `num_blocks` and
    /// `block_len` are the peer's (its [`Transport::agent_metadata`] and
    /// properties); `block_len` must equal ours.
    pub fn add_remote_peer(
        &self,
        peer_id: &str,
        metadata: &[u8],
        base_addr: u64,
        num_blocks: u64,
        block_len: u64,
    ) -> Result<()> {
        let id = cstring("peer id", peer_id)?;
        // SAFETY: live handle; id NUL-terminated; metadata valid for its length.
        check(unsafe {
            sys::kvx_add_remote_peer(
                self.ptr(),
                id.as_ptr(),
                metadata.as_ptr().cast(),
                metadata.len(),
                base_addr,
                num_blocks,
                block_len,
            )
        })
    }

    /// Start registering a remote peer without blocking
    /// (`kvx_add_remote_peer_async`): the arguments and the metadata are
    /// checked now (errors returned at once), the connection is made on a
    /// thread of the library, and the returned [`PendingPeer`] tells the
    /// outcome. With `replace`, a peer registered under `peer_id`, or a
    /// registration of it in progress, is replaced instead of failing with
    /// `PeerExists` (the old peer's transfers in flight fail).
    pub fn add_remote_peer_async(
        &self,
        peer_id: &str,
        metadata: &[u8],
        base_addr: u64,
        num_blocks: u64,
        block_len: u64,
        replace: bool,
    ) -> Result<PendingPeer<'_, 'r>> {
        PendingPeer::start(
            self,
            peer_id,
            metadata,
            (base_addr, num_blocks, block_len),
            replace,
        )
    }

    /// Telemetry of the transport (`None`: every peer it ever had) or of one
    /// peer (since it was first added; removing it forgets them)
    /// (`kvx_get_stats`).
    pub fn stats(&self, peer_id: Option<&str>) -> Result<Stats> {
        crate::stats::get(self, peer_id)
    }

    /// Unregister a peer; its transfers in flight fail (they surface in
    /// [`Transport::poll`]'s `failed`), and a registration of it in progress
    /// ([`Transport::add_remote_peer_async`]) is cancelled. The id may be
    /// added again afterwards.
    pub fn remove_remote_peer(&self, peer_id: &str) -> Result<()> {
        let id = cstring("peer id", peer_id)?;
        // SAFETY: live handle; id NUL-terminated.
        check(unsafe { sys::kvx_remove_remote_peer(self.ptr(), id.as_ptr()) })
    }

    /// Which path a registered peer's transfers take: the backend (`"shm"`,
    /// `"verbs"`, `"tcp"`) and, for shm, how (`"mapped"`: the peer's region
    /// is mapped here and copied into directly; `"process_vm_writev"`: the
    /// kernel copies into the peer's private memory; `"staged"`: through the
    /// peer's staging ring, see option `shm.private`; `""` otherwise).
    /// Errors: `UnknownPeer` (not registered, or still connecting), `Closed`.
    pub fn peer_backend(&self, peer_id: &str) -> Result<(&'static str, &'static str)> {
        let id = cstring("peer id", peer_id)?;
        let mut backend: *const c_char = ptr::null();
        let mut path: *const c_char = ptr::null();
        // SAFETY: live handle; id NUL-terminated; the outputs are static strings.
        check(unsafe { sys::kvx_peer_backend(&mut backend, &mut path, self.ptr(), id.as_ptr()) })?;
        // SAFETY: on success both point to static storage, never NULL.
        Ok(unsafe { (static_str(backend), static_str(path)) })
    }

    /// The rails a registered peer's transfers are striped over, in rail
    /// order (`kvx_peer_rails`): each a local RDMA port paired with one of
    /// the peer's. Only verbs has rails: a peer on tcp or shm has none (an
    /// empty `Vec`). The counters are a snapshot; they never go back while
    /// the peer is registered.
    /// Errors: `UnknownPeer` (not registered, or still connecting), `Closed`.
    pub fn peer_rails(&self, peer_id: &str) -> Result<Vec<RailStats>> {
        crate::stats::rails(self, peer_id)
    }

    /// The state of a registered peer's connection (`kvx_get_peer_state`):
    /// up, or reconnecting in the background after a failure (option
    /// `peer_redial_ms`; `write_blocks` fails with `PeerBroken` meanwhile),
    /// or broken (`peer_redial_ms=0`: remove and re-add it), with the
    /// failure's error and reason, since when, the attempts and the next one,
    /// its transfers in flight and its path. A peer stays registered through
    /// a failure; a reconnection may take another path
    /// ([`peer_backend`](Self::peer_backend)). A snapshot: the state may
    /// change right after.
    /// Errors: `UnknownPeer` (not registered, or still connecting), `Closed`.
    pub fn peer_state(&self, peer_id: &str) -> Result<PeerState> {
        crate::peer::state(self, peer_id)
    }

    /// Every peer of the transport (`kvx_list_peers`), sorted by id (byte
    /// order): the registered ones (up, reconnecting or broken) and those
    /// being added ([`PeerLink::Connecting`](crate::PeerLink::Connecting)).
    /// A removed peer is not listed; a peer being replaced is listed once,
    /// connecting. A snapshot taken at one instant.
    /// Errors: `Closed`.
    pub fn peers(&self) -> Result<Vec<PeerInfo>> {
        crate::peer::list(self)
    }

    /// The transport's counters and peers as Prometheus text (exposition
    /// format 0.0.4, `kvx_metrics_text`; `docs/metrics.md` lists the
    /// families): serve it on a `/metrics` endpoint with content type
    /// `text/plain; version=0.0.4`, or hand it to a Prometheus client.
    /// Errors: `Closed`, `NotSupported` (library built without telemetry).
    pub fn metrics_text(&self) -> Result<String> {
        crate::stats::metrics_text(self)
    }

    // ------------------------------------------------------------ transfers

    /// Submit a WRITE of local block `local[i]` into the peer's block
    /// `remote[i]` for every i. Never blocks on the network. Returns the
    /// transfer id (never 0), reported exactly once by [`Transport::poll`].
    /// Slices of different lengths give an `InvalidArgument` error.
    pub fn write_blocks(&self, peer_id: &str, local: &[u64], remote: &[u64]) -> Result<u64> {
        if local.len() != remote.len() {
            return Err(Error::new(
                sys::KVX_EINVAL,
                format!(
                    "local_idxs has {} entries but remote_idxs has {}",
                    local.len(),
                    remote.len()
                ),
            ));
        }
        let id = cstring("peer id", peer_id)?;
        let mut out = 0u64;
        // SAFETY: live handle; both arrays hold local.len() entries and are
        // only read during the call.
        check(unsafe {
            sys::kvx_write_blocks(
                &mut out,
                self.ptr(),
                id.as_ptr(),
                local.as_ptr(),
                remote.as_ptr(),
                local.len(),
            )
        })?;
        Ok(out)
    }

    /// Collect every finished transfer (of one peer, or of all with `None`).
    /// An unknown peer id yields nothing. Progress does not depend on polling.
    pub fn poll(&self, peer_id: Option<&str>) -> Result<PollResult> {
        const CHUNK: usize = 256;
        let id: Option<CString> = match peer_id {
            Some(p) => Some(cstring("peer id", p)?),
            None => None,
        };
        let id_ptr = id.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let mut res = PollResult::default();
        loop {
            let (nd0, nf0) = (res.done.len(), res.failed.len());
            res.done.resize(nd0 + CHUNK, 0);
            res.failed.resize(nf0 + CHUNK, 0);
            let (mut nd, mut nf) = (0usize, 0usize);
            // SAFETY: live handle; each array has CHUNK free entries at its end.
            let rc = unsafe {
                sys::kvx_poll(
                    &mut nd,
                    &mut nf,
                    self.ptr(),
                    id_ptr,
                    res.done.as_mut_ptr().add(nd0),
                    CHUNK,
                    res.failed.as_mut_ptr().add(nf0),
                    CHUNK,
                )
            };
            if rc != 0 {
                // Ids collected by earlier rounds are lost with this error;
                // only KVX_ECLOSED can happen after a first success, and then
                // the transport reports nothing any more anyway.
                return Err(Error::from_last(rc));
            }
            res.done.truncate(nd0 + nd.min(CHUNK));
            res.failed.truncate(nf0 + nf.min(CHUNK));
            if nd < CHUNK && nf < CHUNK {
                return Ok(res);
            }
        }
    }

    /// Collect every finished transfer, as [`Transport::poll`] does, with the
    /// reason of each failure (`kvx_poll_results`): one [`TransferResult`]
    /// per transfer, its `error` `None` when done, else an [`Error`] of kind
    /// `TimedOut` (the stall timeout), `ConnectionReset` (the peer's
    /// connection failed), `Canceled` (the peer was removed or replaced), or
    /// another kind (a backend's own failure). `poll` and `poll_results` take
    /// from the same queues: each id is reported exactly once, by one of
    /// them. An unknown peer id yields nothing; [`Transport::peer_state`]
    /// tells what a peer went through meanwhile.
    pub fn poll_results(&self, peer_id: Option<&str>) -> Result<Vec<TransferResult>> {
        const CHUNK: usize = 256;
        let id: Option<CString> = match peer_id {
            Some(p) => Some(cstring("peer id", p)?),
            None => None,
        };
        let id_ptr = id.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        let zero = sys::kvx_result {
            id: 0,
            status: 0,
            reserved: 0,
        };
        let mut buf = vec![zero; CHUNK];
        let mut res = Vec::new();
        loop {
            let mut n = 0usize;
            // SAFETY: live handle; buf has CHUNK writable entries; id_ptr is
            // NULL or NUL-terminated.
            let rc = unsafe {
                sys::kvx_poll_results(&mut n, self.ptr(), id_ptr, buf.as_mut_ptr(), CHUNK)
            };
            if rc != 0 {
                // As in poll: only KVX_ECLOSED can follow a first success.
                return Err(Error::from_last(rc));
            }
            let n = n.min(CHUNK);
            res.extend(buf[..n].iter().map(|r| TransferResult {
                id: r.id,
                error: if r.status == 0 {
                    None
                } else {
                    Some(Error::new(
                        r.status,
                        match peer_id {
                            Some(p) => format!("transfer {} to peer '{}' failed", r.id, p),
                            None => format!("transfer {} failed", r.id),
                        },
                    ))
                },
            }));
            if n < CHUNK {
                return Ok(res);
            }
        }
    }

    /// Cancel transfers; unknown or already reported ids are ignored.
    /// Returns the ids still in flight (always empty for
    /// [`CancelMode::Immediate`]); keep polling until they surface.
    pub fn cancel(&self, ids: &[u64], mode: CancelMode) -> Result<Vec<u64>> {
        let (cmode, mut inflight) = match mode {
            CancelMode::Immediate => (sys::KVX_CANCEL_IMMEDIATE, Vec::new()),
            CancelMode::Wait => (sys::KVX_CANCEL_WAIT, vec![0u64; ids.len()]),
        };
        let inflight_ptr = match mode {
            CancelMode::Immediate => ptr::null_mut(),
            CancelMode::Wait => inflight.as_mut_ptr(),
        };
        let mut n = 0usize;
        // SAFETY: live handle; ids holds ids.len() entries; inflight has room
        // for ids.len() ids in Wait mode.
        check(unsafe {
            sys::kvx_cancel(
                &mut n,
                self.ptr(),
                ids.as_ptr(),
                ids.len(),
                cmode as i32,
                inflight_ptr,
            )
        })?;
        inflight.truncate(n.min(ids.len()));
        Ok(inflight)
    }

    // ------------------------------------------------------------ waiting

    /// Sleep until [`Transport::poll`] has something to report, or `timeout`
    /// passes (`None`: no limit; zero: only look), and return how many ids a
    /// poll would report now (0: the time ran out). Returns at once when ids
    /// are ready already. Fails with `Closed`, also when another thread calls
    /// [`Transport::close`] meanwhile: close wakes every waiter
    /// (`kvx_wait(3)`).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<usize> {
        let ms: i32 = match timeout {
            None => -1,
            // rounded up, so that a short timeout still sleeps
            Some(d) => i32::try_from((d.as_nanos() + 999_999) / 1_000_000).unwrap_or(i32::MAX),
        };
        let mut ready = 0usize;
        // SAFETY: live handle; ready is a valid out-pointer.
        check(unsafe { sys::kvx_wait(&mut ready, self.ptr(), ms) })?;
        Ok(ready)
    }

    /// A file descriptor that is readable while [`Transport::poll`] has
    /// something to report, for event loops (epoll, mio, tokio's `AsyncFd`):
    /// level-triggered, readable until a poll has taken every ready id, and
    /// readable for good once the transport is closed. The transport owns
    /// it: never read, write or close it; it is closed with the transport
    /// (`kvx_completion_fd(3)`).
    pub fn completion_fd(&self) -> Result<RawFd> {
        let mut fd: i32 = -1;
        // SAFETY: live handle; fd is a valid out-pointer.
        check(unsafe { sys::kvx_completion_fd(&mut fd, self.ptr()) })?;
        Ok(fd)
    }

    // ------------------------------------------------------------ lifecycle

    /// Close the transport: transfers in flight fail silently, peers are
    /// disconnected, and no byte is written into the region after this
    /// returns. Idempotent. Later calls fail with `Closed`; properties stay
    /// readable. Drop closes too; call this to see close's error or to stop
    /// traffic while other threads still hold references.
    pub fn close(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::kvx_transport_close(self.ptr()) })
    }

    /// Destroy the transport and give back an owned region (`Some` for
    /// transports made by [`Transport::new`], `None` for borrowed regions and
    /// [`Region`]s, whose borrow simply ends). The region holds everything
    /// peers wrote.
    pub fn into_region(self) -> Option<Vec<u8>> {
        let mut this = ManuallyDrop::new(self);
        this.destroy()
    }

    /// Destroy the C transport, then take back an owned region.
    fn destroy(&mut self) -> Option<Vec<u8>> {
        // SAFETY: &mut self: no other reference exists, so this is the last
        // call on the handle; it is never used again (callers forget self).
        unsafe { sys::kvx_transport_destroy(self.raw.as_ptr()) };
        // Taken out, so that a Region's count drops here also when called
        // from into_region (which never drops self).
        match std::mem::replace(&mut self.region, Holding::Borrowed) {
            // SAFETY: the raw parts of the Vec taken apart in new().
            Holding::Owned { capacity } => {
                Some(unsafe { Vec::from_raw_parts(self.base.as_ptr(), self.len, capacity) })
            }
            Holding::Borrowed | Holding::Region { .. } => None,
        }
    }
}

impl Drop for Transport<'_> {
    fn drop(&mut self) {
        drop(self.destroy());
    }
}

impl fmt::Debug for Transport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("backend", &self.backend())
            .field("base_addr", &format_args!("{:#x}", self.base_addr()))
            .field("num_blocks", &self.num_blocks())
            .field("block_len", &self.block_len())
            .field("config_fingerprint", &self.config_fingerprint())
            .field(
                "owned_region",
                &matches!(self.region, Holding::Owned { .. }),
            )
            .finish()
    }
}

/// A NUL-terminated fixed buffer as a String.
pub(crate) fn fixed_cstr(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A static C string as &'static str ("" for NULL or non-UTF-8).
pub(crate) unsafe fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    CStr::from_ptr(p).to_str().unwrap_or("")
}
