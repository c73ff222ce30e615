package kvxfer

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// hugetlbfsMagic is HUGETLBFS_MAGIC of <linux/magic.h> (statfs f_type).
const hugetlbfsMagic = 0x958458f6

// MapRegionFile maps the file at path as a region of numBlocks x blockLen
// bytes (both >= 1), shared (MAP_SHARED), so that another process that maps
// the same file sees the same bytes, and a same-host peer's shm backend
// reopens the file by its path and copies straight into it (PeerBackend
// says "shm", "mapped" on the writer's side).
//
// The file is created (mode 0600) if it does not exist and grown to the
// mapped size if it is shorter: the region's size rounded up to the page
// size, or to the huge page size on hugetlbfs. Existing bytes are kept, so
// a file another process prepared keeps its blocks; a new file reads as
// zeros. Use a file on /dev/shm (tmpfs) or on a hugetlbfs mount: on a disk
// file the same-host peer does not map it (page faults there could wait on
// the disk) and writes go through the page cache.
//
// The file stays open until Free, which unmaps it; the file itself stays
// (remove it yourself). Errors: ErrInvalid (empty geometry, open, stat or
// truncate failed: the message names the path and the system's error),
// ErrOverflow (too large), ErrNoMemory (mmap failed for lack of memory,
// e.g. no free huge pages).
func MapRegionFile(path string, numBlocks, blockLen uint64) (*Region, error) {
	const op = "MapRegionFile"
	size, err := regionSize(op, numBlocks, blockLen)
	if err != nil {
		return nil, err
	}
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, osError(op, "open "+path, err)
	}
	mapping, err := mapFile(op, path, fd, size)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	r := &Region{mem: mapping[:size:size], numBlocks: numBlocks, blockLen: blockLen,
		kind: kindFile, mapping: mapping, fd: fd}
	mappings.Store(sliceAddr(r.mem), r)
	return r, nil
}

// mapFile grows fd's file to size rounded up to its page size and maps it.
func mapFile(op, path string, fd int, size uint64) ([]byte, error) {
	var fs syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &fs); err != nil {
		return nil, osError(op, "statfs "+path, err)
	}
	page := uint64(os.Getpagesize())
	if uint64(fs.Type) == hugetlbfsMagic {
		page = uint64(fs.Bsize) // the mount's huge page size
	}
	if size > math.MaxInt-page {
		return nil, newError(op, CodeOverflow, fmt.Sprintf("region of %d bytes is too large", size))
	}
	mapped := (size + page - 1) / page * page
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, osError(op, "stat "+path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, newError(op, CodeInvalid, path+" is not a regular file")
	}
	if uint64(st.Size) < mapped {
		if err := syscall.Ftruncate(fd, int64(mapped)); err != nil {
			return nil, osError(op, fmt.Sprintf("grow %s to %d bytes", path, mapped), err)
		}
	}
	mapping, err := syscall.Mmap(fd, 0, int(mapped), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, osError(op, fmt.Sprintf("mmap %d bytes of %s", mapped, path), err)
	}
	return mapping, nil
}

// osError turns a system call's failure into an *Error: ErrNoMemory when
// memory ran out, ErrInvalid (the caller's path or file) otherwise.
func osError(op, what string, err error) *Error {
	code := CodeInvalid
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == syscall.ENOMEM || errno == syscall.ENOSPC) {
		code = CodeNoMemory
	}
	return newError(op, code, what+": "+err.Error())
}

// RegionFromMmap makes a region of numBlocks x blockLen bytes (both >= 1)
// over the first numBlocks*blockLen bytes of mem, memory the caller mapped
// outside the Go heap: a slice from syscall.Mmap of a /dev/shm or hugetlbfs
// file, or of anonymous memory mapped MAP_SHARED
// (syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE,
// syscall.MAP_SHARED|syscall.MAP_ANON)).
//
// The memory must be one or more writable MAP_SHARED mappings, as
// /proc/self/maps shows them; anything else fails with ErrInvalid. That is
// how a Go []byte is told apart: the Go heap (and every other Go-managed
// memory) is private memory, and C may not keep a pointer to it once a call
// returns, which peers writing into the region need (Go 1.19 has no
// runtime.Pinner to pin it). Private anonymous memory
// (MAP_PRIVATE|MAP_ANON, or C's malloc) is refused too: it looks exactly
// like the Go heap there. Map it MAP_SHARED instead, or use AllocRegion.
//
// The memory stays the caller's: it must stay mapped until Free, which only
// forgets it; unmap it afterwards. A same-host peer's shm backend maps it
// directly when it is a file it can reopen by path (a /dev/shm or hugetlbfs
// file) or a memfd this process holds open; otherwise it copies with
// process_vm_writev or through a staging ring. Errors: ErrInvalid (see
// above; mem shorter than the geometry), ErrOverflow, ErrBusy (a Region over
// memory starting at the same address exists: use that one).
func RegionFromMmap(mem []byte, numBlocks, blockLen uint64) (*Region, error) {
	const op = "RegionFromMmap"
	size, err := regionSize(op, numBlocks, blockLen)
	if err != nil {
		return nil, err
	}
	if uint64(len(mem)) < size {
		return nil, newError(op, CodeInvalid, fmt.Sprintf("memory of %d bytes is shorter than %d x %d bytes",
			len(mem), numBlocks, blockLen))
	}
	addr := sliceAddr(mem)
	if err := checkShared(op, addr, size); err != nil {
		return nil, err
	}
	r := &Region{mem: mem[:size:size], numBlocks: numBlocks, blockLen: blockLen, kind: kindBorrowed}
	if _, taken := mappings.LoadOrStore(addr, r); taken {
		return nil, newError(op, CodeBusy, fmt.Sprintf("memory at %#x backs a Region already: use that one", addr))
	}
	return r, nil
}

// checkShared fails unless every byte of [addr, addr+size) lies in a
// writable MAP_SHARED mapping (perms "rw?s" in /proc/self/maps). The Go
// runtime maps its heap, stacks and data MAP_PRIVATE only.
func checkShared(op string, addr uintptr, size uint64) error {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return newError(op, CodeNotSupported, "cannot read /proc/self/maps to check the memory: "+err.Error())
	}
	lo, hi := uint64(addr), uint64(addr)+size
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		bounds := strings.SplitN(f[0], "-", 2)
		if len(bounds) != 2 || len(f[1]) != 4 {
			continue
		}
		start, err1 := strconv.ParseUint(bounds[0], 16, 64)
		end, err2 := strconv.ParseUint(bounds[1], 16, 64)
		if err1 != nil || err2 != nil || end <= lo {
			continue
		}
		if start > lo {
			break // a hole at lo
		}
		if f[1][1] != 'w' || f[1][3] != 's' {
			return refusal(op, lo, f)
		}
		lo = end
		if lo >= hi {
			return nil
		}
	}
	return newError(op, CodeInvalid, fmt.Sprintf("memory at %#x is not mapped (or not all %d bytes of it)", lo, size))
}

// refusal explains why the mapping of maps line f, holding address at, cannot
// back a region.
func refusal(op string, at uint64, f []string) *Error {
	what := "anonymous"
	if len(f) >= 6 {
		what = strings.Join(f[5:], " ")
	}
	if f[1][3] != 's' {
		return newError(op, CodeInvalid, fmt.Sprintf("memory at %#x is in a private mapping (%s %s): "+
			"it may be Go-heap memory, which is private too and which C may not keep a pointer to after a "+
			"call returns, as peers writing into a region need; map the memory MAP_SHARED (a /dev/shm or "+
			"hugetlbfs file, or MAP_SHARED|MAP_ANON), or use AllocRegion or MapRegionFile", at, f[1], what))
	}
	return newError(op, CodeInvalid, fmt.Sprintf("memory at %#x is in a read-only mapping (%s %s): "+
		"peers write into a region", at, f[1], what))
}
