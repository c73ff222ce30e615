"""Regions that same-host peers map directly (the Python side of
kvx_region_alloc(): the same kind of memory, made with the standard library
so that Python's own buffer rules keep it alive while anything uses it)."""
import fcntl
import mmap
import os

from ._errors import ArgumentError, ErrorCode, RequestError


def alloc_region(nbytes, *, huge_pages=False):
    """Allocate nbytes of zeroed memory that a same-host peer's shm backend
    copies into directly ("mapped" in Transport.peer_backend()): an anonymous
    memory file (memfd) whose size is sealed, so a peer that maps it never
    faults past its end, mapped MAP_SHARED. Plain memory (a bytearray) works
    with every backend too; this only makes the same-host path direct.

    Returns an mmap.mmap: pass memoryview(m).cast("B", (num_blocks,
    block_len)) to Transport. It stays mapped until m.close(), which raises
    BufferError while a memoryview of it (a Transport's region) is alive.
    huge_pages: back it with the system's default huge pages (nbytes must be
    a multiple of their size, and enough must be free).
    Raises ArgumentError (ValueError) for a bad size, RequestError (ENOTSUP)
    when huge pages are not available, MemoryError when the memory cannot be
    had, OSError for anything else the kernel refuses."""
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ArgumentError(ErrorCode.EINVAL, "alloc_region: nbytes=%r is not a positive int" % (nbytes,))
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | (os.MFD_HUGETLB if huge_pages else 0)
    try:
        fd = os.memfd_create("kvxfer-region", flags)
    except OSError as e:
        if huge_pages and e.errno == 22:
            raise RequestError(ErrorCode.ENOTSUP, "alloc_region: huge pages are not available: %s" % e)
        raise
    try:
        try:
            os.ftruncate(fd, nbytes)
        except OSError as e:
            if e.errno == 22:
                raise ArgumentError(ErrorCode.EINVAL, "alloc_region: nbytes=%d: %s (with huge pages it must be "
                                    "a multiple of their size)" % (nbytes, e))
            raise
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        try:
            return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            if e.errno == 12:
                raise MemoryError("alloc_region: cannot map %d bytes: %s" % (nbytes, e))
            raise
    finally:
        os.close(fd)
