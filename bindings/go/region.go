package kvxfer

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"unsafe"

	"kvxfer.dev/kvxfer/internal/capi"
)

// Region is the local block memory a Transport shares with its peers:
// NumBlocks blocks of BlockLen bytes each, contiguous.
//
// Remote peers write into a region at any time while a transport over it is
// open, long after any call into the C library has returned. cgo forbids C
// from keeping pointers into Go-managed memory (the garbage collector does
// not know about them), so a Region is never a Go-heap []byte: AllocRegion
// allocates it outside the Go heap (kvx_region_alloc: a sealed memory file
// mapped shared, which a same-host peer's shm backend maps and copies into
// directly), and NewTransport refuses any other memory.
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
}

// mappings records every live AllocRegion mapping by base address, so that
// NewTransport accepts exactly the memory this package mapped.
var mappings sync.Map // uintptr -> *Region

// AllocRegion allocates a zero-filled region of numBlocks x blockLen bytes
// outside the Go heap (kvx_region_alloc). Both must be >= 1.
func AllocRegion(numBlocks, blockLen uint64) (*Region, error) {
	const op = "AllocRegion"
	if numBlocks == 0 || blockLen == 0 {
		return nil, newError(op, CodeInvalid, fmt.Sprintf("region of %d x %d bytes is empty", numBlocks, blockLen))
	}
	hi, size := bits.Mul64(numBlocks, blockLen)
	if hi != 0 || size > math.MaxInt {
		return nil, newError(op, CodeOverflow, fmt.Sprintf("region of %d x %d bytes is too large", numBlocks, blockLen))
	}
	addr := []uint64{0}
	if err := call(op, func() int { return capi.Kvx_go_region_alloc(addr, size, 0) }); err != nil {
		return nil, err
	}
	// C's memory, kept until Free and never moved: its address is read back
	// as a pointer (the word C wrote), not converted from an integer.
	mem := unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr[0]))), size)
	r := &Region{mem: mem, numBlocks: numBlocks, blockLen: blockLen}
	mappings.Store(sliceAddr(mem), r)
	return r, nil
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

// Free releases the region (kvx_region_free). It fails with ErrBusy while a transport over it
// is open (close the transport first: after Close nothing writes into the
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
	capi.Kvx_go_region_free(uint64(sliceAddr(r.mem)))
	r.mem = nil
	return nil
}

// acquire registers a transport over r and returns the region's base
// address. It refuses memory that AllocRegion did not map (a zero Region, a
// freed one, or one whose slice points into the Go heap).
func (r *Region) acquire(op string) (uintptr, error) {
	if r == nil {
		return 0, newError(op, CodeInvalid, "nil region: allocate one with AllocRegion")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return 0, newError(op, CodeInvalid, "region is freed or was not allocated with AllocRegion")
	}
	addr := sliceAddr(r.mem)
	owner, ok := mappings.Load(addr)
	if !ok || owner.(*Region) != r || uint64(len(r.mem)) != r.numBlocks*r.blockLen {
		return 0, newError(op, CodeInvalid, "region memory was not mapped by AllocRegion: "+
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
