//! `SharedRegion`: memory a same-host peer maps and copies into directly.

use std::ops::{Deref, DerefMut};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use crate::error::{check, Result};
use crate::sys;

/// Zeroed, page-aligned memory from `kvx_region_alloc()`: an anonymous
/// memory file (memfd) sealed against shrinking, mapped shared. A transport
/// over it (through [`Transport::scope`](crate::Transport::scope) or
/// [`Transport::new_borrowed`](crate::Transport::new_borrowed), as with any
/// `&mut [u8]`) lets a same-host peer's shm backend map it and copy straight
/// into it: [`Transport::peer_backend`](crate::Transport::peer_backend) says
/// `("shm", "mapped")` on the writer's side. Plain memory (a `Vec<u8>`)
/// works with every backend too; this only makes the same-host path direct.
///
/// Dropping it frees the memory (`kvx_region_free()`); the borrow checker
/// keeps it alive while a transport borrows it.
pub struct SharedRegion {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; no thread affinity.
unsafe impl Send for SharedRegion {}
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Allocate `len` bytes (>= 1). `huge_pages` backs them with the
    /// system's default huge pages (`len` is rounded up to their size).
    /// Errors (by [`ErrorKind`](crate::ErrorKind)): `InvalidArgument` for 0,
    /// `OutOfMemory` (no memory, or no free huge pages), `NotSupported` (no
    /// memfd), `Overflow` (too large).
    pub fn new(len: usize, huge_pages: bool) -> Result<SharedRegion> {
        let mut p: *mut c_void = ptr::null_mut();
        let flags = if huge_pages {
            sys::KVX_REGION_HUGE_PAGES
        } else {
            0
        };
        // SAFETY: p is a valid out pointer; the library validates len and flags.
        check(unsafe { sys::kvx_region_alloc(&mut p, len as u64, flags) })?;
        let base = NonNull::new(p.cast::<u8>()).expect("kvx_region_alloc succeeded with NULL");
        Ok(SharedRegion { base, len })
    }
}

impl Deref for SharedRegion {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: len bytes mapped until drop; the bytes are initialised (zeroed).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl DerefMut for SharedRegion {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: base came from kvx_region_alloc and is freed once; no
        // transport borrows it any more (the borrow checker saw to that).
        unsafe { sys::kvx_region_free(self.base.as_ptr().cast()) }
    }
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}
