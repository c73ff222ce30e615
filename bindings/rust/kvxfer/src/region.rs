//! Regions: `Region`, block memory its owner keeps reading and writing
//! (safely) while transports borrow it, and `SharedRegion`, memory a
//! same-host peer maps and copies into directly, lent as a `&mut [u8]`.

use std::ops::{Deref, DerefMut};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::{Arc, RwLock};

use crate::error::{check, Error, Result};
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
///
/// To keep reading and writing blocks while a transport is open, without
/// `unsafe`, use a [`Region`] instead.
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
        Ok(SharedRegion {
            base: region_alloc(len as u64, huge_pages)?,
            len,
        })
    }
}

/// `kvx_region_alloc()`: `size` zeroed bytes, optionally on huge pages.
fn region_alloc(size: u64, huge_pages: bool) -> Result<NonNull<u8>> {
    let mut p: *mut c_void = ptr::null_mut();
    let flags = if huge_pages {
        sys::KVX_REGION_HUGE_PAGES
    } else {
        0
    };
    // SAFETY: p is a valid out pointer; the library validates size and flags.
    check(unsafe { sys::kvx_region_alloc(&mut p, size, flags) })?;
    Ok(NonNull::new(p.cast::<u8>()).expect("kvx_region_alloc succeeded with NULL"))
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

/// Blocks that share one lock of a [`Region`] (block `i` takes lock
/// `i % STRIPES`): enough for threads writing different blocks to rarely
/// wait on each other, and a fixed cost per region.
const STRIPES: u64 = 64;

/// Block memory that its owner keeps reading and writing, without `unsafe`,
/// while transports over it are open: `num_blocks x block_len` bytes,
/// allocated by the library ([`Region::new`], `kvx_region_alloc()`: a
/// same-host peer's shm backend maps it and copies straight into it) or taken
/// from a `Vec<u8>` ([`Region::from_vec`]).
///
/// [`Transport::with_region`](crate::Transport::with_region) borrows it for
/// the transport's lifetime: the borrow checker refuses to drop or move the
/// region while the transport lives, and the owner goes on using `&Region`
/// meanwhile ([`write_block`](Region::write_block),
/// [`read_block`](Region::read_block)). Several transports may borrow one
/// region.
///
/// # Copies, never references
/// Remote peers write into the region at any time while a transport over it
/// is open (one-sided: the owner is not told), and kvxfer's threads read the
/// blocks being sent. A `&[u8]` into that memory would promise Rust that the
/// bytes do not change while it lives, a `&mut [u8]` that nothing else
/// touches them; neither holds, and the compiler may rely on both. So a
/// `Region` never hands out a reference into its memory: every access is a
/// copy through raw pointers (`ptr::copy`) between the region and a buffer
/// of yours, which you then use as you like. (This is how VMMs treat guest
/// memory that the guest changes behind their back, e.g. rust-vmm's
/// `vm-memory`.)
///
/// Copies of one block by threads of yours are serialized by a lock (readers
/// share it), so they never race each other. What a copy can race with is
/// the network, and that is the application's protocol to rule out, as with
/// any one-sided transport:
/// - read a block once its writer has told you (out of band: its poll
///   reported the transfer done) that the bytes are in; a read that races a
///   peer's write returns a mix of old and new bytes;
/// - write a block before calling `write_blocks` for a transfer that sends
///   it, and not again until poll reported that transfer; a write that races
///   it may send a mix.
///
/// # Lifetime
/// A transport borrows its region, so the region cannot be dropped (or
/// moved) while the transport lives; this does not compile:
///
/// ```compile_fail,E0505
/// use kvxfer::{Options, Region, Transport};
/// let region = Region::new(4, 64).unwrap();
/// let opts = Options::new().backend("tcp").set("tcp.listen", "127.0.0.1:0");
/// let t = Transport::with_region(&region, None, &opts).unwrap();
/// drop(region); // error[E0505]: cannot move out of `region` because it is borrowed
/// t.close().unwrap();
/// ```
///
/// The memory is freed when the `Region` and every transport over it are
/// gone: a transport also holds a count of it, so one leaked with
/// `mem::forget` (which ends the borrow) leaks the memory instead of letting
/// kvxfer write into freed memory. That is what makes
/// [`Transport::with_region`](crate::Transport::with_region) safe where
/// [`Transport::new_borrowed`](crate::Transport::new_borrowed) of a plain
/// slice cannot be. The same steps in the right order:
///
/// ```
/// use kvxfer::{Options, Region, Transport};
/// # fn main() -> kvxfer::Result<()> {
/// let region = Region::new(4, 64)?;
/// let opts = Options::new().backend("tcp").set("tcp.listen", "127.0.0.1:0");
/// let t = Transport::with_region(&region, None, &opts)?;
/// region.write_block(2, &[7u8; 64])?; // while the transport is open
/// let mut buf = [0u8; 64];
/// region.read_block(2, &mut buf)?;
/// assert_eq!(buf, [7u8; 64]);
/// drop(t);
/// drop(region); // only after the transport: see Transport::with_region
/// # Ok(()) }
/// ```
pub struct Region {
    mem: Arc<Memory>,
    num_blocks: u64,
    block_len: u64,
    locks: Box<[RwLock<()>]>,
}

/// The bytes of a [`Region`], counted by the region and by each transport
/// over it, and freed with the last count.
pub(crate) struct Memory {
    base: NonNull<u8>,
    len: usize,
    origin: Origin,
}

enum Origin {
    /// `kvx_region_alloc()`, freed with `kvx_region_free()`.
    Library,
    /// A `Vec<u8>` taken apart, rebuilt to be freed.
    Vec { capacity: usize },
}

// SAFETY: plain memory with no thread affinity; it is only accessed through
// raw pointers, by Region's locked copies and by the C library.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Memory {
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self.origin {
            // SAFETY: base came from kvx_region_alloc and is freed once; no
            // transport is left (each held a count).
            Origin::Library => unsafe { sys::kvx_region_free(self.base.as_ptr().cast()) },
            // SAFETY: the raw parts of the Vec taken apart in from_vec.
            Origin::Vec { capacity } => {
                drop(unsafe { Vec::from_raw_parts(self.base.as_ptr(), self.len, capacity) })
            }
        }
    }
}

fn invalid(message: String) -> Error {
    Error::new(sys::KVX_EINVAL, message)
}

impl Region {
    /// Allocate `num_blocks x block_len` zeroed bytes (both >= 1) with
    /// `kvx_region_alloc()`: a memory file mapped shared, which a same-host
    /// peer's shm backend maps and copies into directly
    /// ([`Transport::peer_backend`](crate::Transport::peer_backend) says
    /// `("shm", "mapped")` on the writer's side). Errors (by
    /// [`ErrorKind`](crate::ErrorKind)): `InvalidArgument` (a zero),
    /// `Overflow` (too large), `OutOfMemory`, `NotSupported` (no memfd).
    pub fn new(num_blocks: u64, block_len: u64) -> Result<Region> {
        Region::alloc(num_blocks, block_len, false)
    }

    /// As [`Region::new`], on the system's default huge pages (the size is
    /// rounded up to theirs). `OutOfMemory` when too few are free.
    pub fn with_huge_pages(num_blocks: u64, block_len: u64) -> Result<Region> {
        Region::alloc(num_blocks, block_len, true)
    }

    fn alloc(num_blocks: u64, block_len: u64, huge_pages: bool) -> Result<Region> {
        let len = region_len(num_blocks, block_len)?;
        let base = region_alloc(len as u64, huge_pages)?;
        let mem = Memory {
            base,
            len,
            origin: Origin::Library,
        };
        Ok(Region::wrap(mem, num_blocks, block_len))
    }

    /// Take `vec` (exactly `num_blocks x block_len` bytes, both >= 1; its
    /// capacity is never touched) as the region's memory. Process-private
    /// memory: a same-host peer writes into it with `process_vm_writev` or
    /// through a staging ring (option `shm.private`), not by mapping it.
    /// Errors: `InvalidArgument` (a zero, a length that is not the
    /// geometry's; `vec` is dropped), `Overflow`.
    pub fn from_vec(vec: Vec<u8>, num_blocks: u64, block_len: u64) -> Result<Region> {
        let len = region_len(num_blocks, block_len)?;
        if vec.len() != len {
            return Err(invalid(format!(
                "vec has {} bytes, num_blocks {} x block_len {} needs {}",
                vec.len(),
                num_blocks,
                block_len,
                len
            )));
        }
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let mem = Memory {
            // A non-empty Vec's pointer is never NULL.
            base: NonNull::new(vec.as_mut_ptr()).expect("Vec pointer is NULL"),
            len,
            origin: Origin::Vec {
                capacity: vec.capacity(),
            },
        };
        Ok(Region::wrap(mem, num_blocks, block_len))
    }

    fn wrap(mem: Memory, num_blocks: u64, block_len: u64) -> Region {
        let locks = (0..num_blocks.min(STRIPES))
            .map(|_| RwLock::new(()))
            .collect();
        Region {
            mem: Arc::new(mem),
            num_blocks,
            block_len,
            locks,
        }
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    /// Bytes per block.
    pub fn block_len(&self) -> u64 {
        self.block_len
    }

    /// Size in bytes, `num_blocks * block_len`.
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Start of the memory (what a transport over it reports as
    /// `base_addr`). Dereferencing it is `unsafe` and subject to the rules
    /// above: prefer the copying methods.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.base.as_ptr()
    }

    pub(crate) fn memory(&self) -> Arc<Memory> {
        Arc::clone(&self.mem)
    }

    /// The start of bytes `[offset, offset + len)` of block `idx`, and the
    /// block's lock; `OutOfRange` for a block past the end, `InvalidArgument`
    /// for bytes past the block's end.
    fn locate(&self, idx: u64, offset: usize, len: usize) -> Result<(*mut u8, &RwLock<()>)> {
        if idx >= self.num_blocks {
            return Err(Error::new(
                sys::KVX_ERANGE,
                format!("block index {} >= {} blocks", idx, self.num_blocks),
            ));
        }
        if offset as u64 > self.block_len || len as u64 > self.block_len - offset as u64 {
            return Err(invalid(format!(
                "bytes {}..{} are past the end of a block of {} bytes",
                offset,
                offset as u128 + len as u128,
                self.block_len
            )));
        }
        let start = (idx * self.block_len) as usize + offset;
        let lock = &self.locks[(idx % self.locks.len() as u64) as usize];
        // SAFETY: start + len <= self.mem.len (checked above), in the allocation.
        Ok((unsafe { self.mem.base.as_ptr().add(start) }, lock))
    }

    /// Copy `data` (exactly `block_len` bytes) into block `idx`. Errors:
    /// `OutOfRange` (`idx >= num_blocks`), `InvalidArgument` (wrong length).
    pub fn write_block(&self, idx: u64, data: &[u8]) -> Result<()> {
        self.check_whole(data.len())?;
        self.write_block_at(idx, 0, data)
    }

    /// Copy `data` into block `idx` from byte `offset` of the block on.
    /// Errors: `OutOfRange`, `InvalidArgument` (bytes past the block's end).
    pub fn write_block_at(&self, idx: u64, offset: usize, data: &[u8]) -> Result<()> {
        let (dst, lock) = self.locate(idx, offset, data.len())?;
        let _held = lock
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: dst has data.len() bytes in the region (locate); no
        // reference into the region exists, and no copy of ours runs on the
        // block at once (the lock).
        unsafe { ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copy block `idx` into `buf` (exactly `block_len` bytes). Errors:
    /// `OutOfRange`, `InvalidArgument` (wrong length).
    pub fn read_block(&self, idx: u64, buf: &mut [u8]) -> Result<()> {
        self.check_whole(buf.len())?;
        self.read_block_at(idx, 0, buf)
    }

    /// Copy `buf.len()` bytes of block `idx` from byte `offset` of the block
    /// on into `buf`. Errors: `OutOfRange`, `InvalidArgument`.
    pub fn read_block_at(&self, idx: u64, offset: usize, buf: &mut [u8]) -> Result<()> {
        let (src, lock) = self.locate(idx, offset, buf.len())?;
        let _held = lock
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: as in write_block_at; readers only read.
        unsafe { ptr::copy(src, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// A copy of block `idx`. Errors: `OutOfRange`.
    pub fn block_to_vec(&self, idx: u64) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.block_len as usize];
        self.read_block(idx, &mut v)?;
        Ok(v)
    }

    /// A copy of the whole region, block by block.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        for (idx, block) in v.chunks_mut(self.block_len as usize).enumerate() {
            self.read_block(idx as u64, block)
                .expect("every block of the region is in range");
        }
        v
    }

    fn check_whole(&self, len: usize) -> Result<()> {
        if len as u64 != self.block_len {
            return Err(invalid(format!(
                "buffer has {} bytes, a block {}",
                len, self.block_len
            )));
        }
        Ok(())
    }
}

/// Checks a geometry: both >= 1, the product addressable.
fn region_len(num_blocks: u64, block_len: u64) -> Result<usize> {
    if num_blocks == 0 || block_len == 0 {
        return Err(invalid(format!(
            "region of {} x {} bytes is empty",
            num_blocks, block_len
        )));
    }
    num_blocks
        .checked_mul(block_len)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::new(
                sys::KVX_EOVERFLOW,
                format!(
                    "region of {} x {} bytes is too large",
                    num_blocks, block_len
                ),
            )
        })
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("base", &self.mem.base)
            .field("num_blocks", &self.num_blocks)
            .field("block_len", &self.block_len)
            .field(
                "memory",
                &match self.mem.origin {
                    Origin::Library => "kvx_region_alloc",
                    Origin::Vec { .. } => "Vec",
                },
            )
            .finish()
    }
}
