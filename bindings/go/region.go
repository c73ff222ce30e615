package kvxfer

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"syscall"
	"unsafe"

	"kvxfer.dev/kvxfer/internal/capi"
)

// Region is the local block memory a Transport shares with its peers:
// NumBlocks blocks of BlockLen bytes each, contiguous.
//
// Remote peers write into a region at any time while a transport over it is
// open, long after any call into the C library has returned. cgo forbids C
// from keeping pointers into Go-managed memory (the garbage collector does
// not know about them, and Go 1.19 has no runtime.Pinner to pin a slice), so
// a Region is never Go-heap memory. It comes from one of:
//
//   - AllocRegion: kvx_region_alloc, a sealed memory file mapped shared,
//     which a same-host peer's shm backend maps and copies into directly;
//   - MapRegionFile: a file (on /dev/shm or hugetlbfs) mapped shared by
//     this package, which a same-host peer maps as well;
//   - RegionFromMmap: memory the caller mapped itself (syscall.Mmap of a
//     file, or anonymous memory with MAP_SHARED), checked against
//     /proc/self/maps: it must lie in writable shared mappings, which the Go
//     heap never is.
//
// NewTransport refuses any other memory.
//
// The Bytes and Block slices stay valid until Free. Reading them while a
// transfer into the region may be in flight races with the network (the Go
// race detector does not see those writes); read a block after the writer
// reported the transfer done, as with any one-sided transport.
//
// A Region is not freed by the garbage collector (slices from Bytes may
// outlive the *Region): call Free when no transport uses it any more.
// The methods of a Region are safe for concurrent use.
type Region struct {
	mu        sync.Mutex
	mem       []byte // nil once freed (or for a zero Region)
	numBlocks uint64
	blockLen  uint64
	users     int // open transports over this region
	kind      regionKind
	mapping   []byte // kindFile: the whole mapping, for Munmap
	fd        int    // kindFile: the file, open until Free
}

// regionKind says who made a region's memory, so Free knows how to let go.
type regionKind int

const (
	kindAlloc    regionKind = iota // AllocRegion: kvx_region_free
	kindFile                       // MapRegionFile: munmap, close the file
	kindBorrowed                   // RegionFromMmap: the caller's mapping, left alone
)

// mappings records every live region by base address, so that NewTransport
// accepts exactly the memory this package mapped or checked.
var mappings sync.Map // uintptr -> *Region

// AllocRegion allocates a zero-filled region of numBlocks x blockLen bytes
// outside the Go heap (kvx_region_alloc). Both must be >= 1.
func AllocRegion(numBlocks, blockLen uint64) (*Region, error) {
	const op = "AllocRegion"
	size, err := regionSize(op, numBlocks, blockLen)
	if err != nil {
		return nil, err
	}
	addr := []uint64{0}
	if err := call(op, func() int { return capi.Kvx_go_region_alloc(addr, size, 0) }); err != nil {
		return nil, err
	}
	// C's memory, kept until Free and never moved: its address is read back
	// as a pointer (the word C wrote), not converted from an integer.
	mem := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr[0]))), size)
	r := &Region{mem: mem, numBlocks: numBlocks, blockLen: blockLen, kind: kindAlloc}
	mappings.Store(sliceAddr(mem), r)
	return r, nil
}

// regionSize checks a geometry and returns its size in bytes.
func regionSize(op string, numBlocks, blockLen uint64) (uint64, error) {
	if numBlocks == 0 || blockLen == 0 {
		return 0, newError(op, CodeInvalid, fmt.Sprintf("region of %d x %d bytes is empty", numBlocks, blockLen))
	}
	hi, size := bits.Mul64(numBlocks, blockLen)
	if hi != 0 || size > math.MaxInt {
		return 0, newError(op, CodeOverflow, fmt.Sprintf("region of %d x %d bytes is too large", numBlocks, blockLen))
	}
	return size, nil
}

func sliceAddr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

// NumBlocks returns the number of blocks.
func (r *Region) NumBlocks() uint64 { return r.numBlocks }

// BlockLen returns the bytes per block.
func (r *Region) BlockLen() uint64 { return r.blockLen }

// Len returns the region's size in bytes, NumBlocks()*BlockLen().
func (r *Region) Len() uint64 { return r.numBlocks * r.blockLen }

// Bytes returns the whole region, or nil once freed.
func (r *Region) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mem
}

// Block returns block i (BlockLen bytes, capacity limited to the block), or
// nil once freed. It panics if i >= NumBlocks(), like an index expression.
func (r *Region) Block(i uint64) []byte {
	if i >= r.numBlocks {
		panic(fmt.Sprintf("kvxfer: block index %d out of range [0, %d)", i, r.numBlocks))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return nil
	}
	off := i * r.blockLen
	return r.mem[off : off+r.blockLen : off+r.blockLen]
}

// Addr returns the base address of the region (what Transport.BaseAddr
// reports), or 0 once freed.
func (r *Region) Addr() uintptr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sliceAddr(r.mem)
}

// Free releases the region: AllocRegion's memory is freed
// (kvx_region_free), MapRegionFile's mapping is unmapped and its file closed
// (the file stays), and RegionFromMmap's memory is only forgotten (unmap it
// yourself, after Free). It fails with ErrBusy while a transport over it is
// open (close the transport first: after Close nothing writes into the
// region any more). Freeing twice is a no-op. Slices obtained from Bytes or
// Block must not be used afterwards.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return nil
	}
	if r.users > 0 {
		return newError("Region.Free", CodeBusy, fmt.Sprintf("region is used by %d open transport(s); close them first", r.users))
	}
	mappings.Delete(sliceAddr(r.mem))
	switch r.kind {
	case kindAlloc:
		capi.Kvx_go_region_free(uint64(sliceAddr(r.mem)))
	case kindFile:
		// Neither fails: the slice is the one syscall.Mmap returned, the fd ours.
		_ = syscall.Munmap(r.mapping)
		_ = syscall.Close(r.fd)
		r.mapping = nil
	}
	r.mem = nil
	return nil
}

// acquire registers a transport over r and returns the region's base
// address. It refuses memory that no constructor made (a zero Region, a
// freed one, or one whose slice points into the Go heap).
func (r *Region) acquire(op string) (uintptr, error) {
	if r == nil {
		return 0, newError(op, CodeInvalid, "nil region: allocate one with AllocRegion")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return 0, newError(op, CodeInvalid, "region is freed or was not made by AllocRegion, MapRegionFile or RegionFromMmap")
	}
	addr := sliceAddr(r.mem)
	owner, ok := mappings.Load(addr)
	if !ok || owner.(*Region) != r || uint64(len(r.mem)) != r.numBlocks*r.blockLen {
		return 0, newError(op, CodeInvalid, "region memory was not made by AllocRegion, MapRegionFile or RegionFromMmap: "+
			"a Go-heap []byte cannot back a transport (peers write into it after the call returns, "+
			"which cgo forbids and the garbage collector does not see)")
	}
	r.users++
	return addr, nil
}

// release undoes acquire once the transport is destroyed.
func (r *Region) release() {
	r.mu.Lock()
	r.users--
	r.mu.Unlock()
}
