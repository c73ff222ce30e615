package kvxfer_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"kvxfer.dev/kvxfer"
)

// shmPath returns a path under /dev/shm that does not exist yet and is
// removed when the test ends.
func shmPath(t *testing.T) string {
	t.Helper()
	p := fmt.Sprintf("/dev/shm/kvxfer-go-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	os.Remove(p)
	t.Cleanup(func() { os.Remove(p) })
	return p
}

// exchange creates a transport over r (testBlocks x testLen) and a peer over
// AllocRegion memory, fills r's blocks after the transport exists, moves
// r's blocks 0..3 into the peer's 4..7 and the peer's 8..9 into r's 10..11,
// and checks every byte. It closes the owner's transport before returning
// and reports the path the peer took into r.
func exchange(t *testing.T, r *kvxfer.Region, opts ...kvxfer.Option) (backend, path string) {
	t.Helper()
	owner, err := kvxfer.NewTransport(r, tcpOpts(opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	peer := newTransport(t, testBlocks, canary, opts...)
	for i := uint64(0); i < r.NumBlocks(); i++ {
		fillBlock(r.Block(i), i, 0x11)
	}
	fillBlock(peer.Region().Block(8), 8, 0x22)
	fillBlock(peer.Region().Block(9), 9, 0x22)
	connect(t, owner, "peer", peer)
	connect(t, peer, "owner", owner)

	id, err := owner.WriteBlocks("peer", []uint64{0, 1, 2, 3}, []uint64{4, 5, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	if failed := waitAll(t, owner, "peer", id); len(failed) > 0 {
		t.Fatalf("owner -> peer failed: %v", failed)
	}
	for i := uint64(0); i < 4; i++ {
		checkBlock(t, fmt.Sprintf("peer block %d", 4+i), peer.Region().Block(4+i), i, 0x11)
	}
	checkCanary(t, "peer block 3", peer.Region().Block(3))

	id, err = peer.WriteBlocks("owner", []uint64{8, 9}, []uint64{10, 11})
	if err != nil {
		t.Fatal(err)
	}
	if failed := waitAll(t, peer, "owner", id); len(failed) > 0 {
		t.Fatalf("peer -> owner failed: %v", failed)
	}
	checkBlock(t, "owner block 10", r.Block(10), 8, 0x22)
	checkBlock(t, "owner block 11", r.Block(11), 9, 0x22)
	checkBlock(t, "owner block 9", r.Block(9), 9, 0x11)

	if err := r.Free(); !errors.Is(err, kvxfer.ErrBusy) {
		t.Errorf("Free of a region in use: %v, want ErrBusy", err)
	}
	backend, path, err = peer.PeerBackend("owner")
	if err != nil {
		t.Fatal(err)
	}
	return backend, path
}

func TestMapRegionFile(t *testing.T) {
	path := shmPath(t)
	r, err := kvxfer.MapRegionFile(path, testBlocks, testLen)
	if err != nil {
		t.Fatal(err)
	}
	if r.NumBlocks() != testBlocks || r.BlockLen() != testLen || len(r.Bytes()) != testBlocks*testLen {
		t.Fatalf("geometry %d x %d, %d bytes", r.NumBlocks(), r.BlockLen(), len(r.Bytes()))
	}
	// A second mapping of the file, as another process would make: the
	// same bytes.
	other, err := kvxfer.MapRegionFile(path, testBlocks, testLen)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Free()
	if other.Addr() == r.Addr() {
		t.Fatal("two mappings at one address")
	}
	// The same-host writer reopens the file by its path and copies into it.
	backend, via := exchange(t, r, kvxfer.WithBackend("shm"))
	if backend != "shm" || via != "mapped" {
		t.Errorf("peer writes into a /dev/shm file region via %q %q, want shm mapped", backend, via)
	}
	checkBlock(t, "other mapping, block 10", other.Block(10), 8, 0x22)
	checkBlock(t, "other mapping, block 0", other.Block(0), 0, 0x11)
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(); err != nil || r.Bytes() != nil {
		t.Fatalf("second Free: %v", err)
	}
	// The file keeps the blocks: mapped again, it shows them.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != testBlocks*testLen {
		t.Fatalf("file has %d bytes, want %d", len(data), testBlocks*testLen)
	}
	checkBlock(t, "file block 11", data[11*testLen:12*testLen], 9, 0x22)
	again, err := kvxfer.MapRegionFile(path, 4, testLen) // a shorter view of the same file
	if err != nil {
		t.Fatal(err)
	}
	checkBlock(t, "remapped block 3", again.Block(3), 3, 0x11)
	again.Free()

	_, err = kvxfer.MapRegionFile(path, 0, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "empty")
	_, err = kvxfer.MapRegionFile(filepath.Join(path+".missing", "x"), 1, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "no such file")
	_, err = kvxfer.MapRegionFile("/dev/shm", 1, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "/dev/shm")
}

// hugetlbfsMount returns a hugetlbfs mount point from KVX_TEST_HUGETLBFS or
// /proc/mounts, or "".
func hugetlbfsMount() string {
	if dir := os.Getenv("KVX_TEST_HUGETLBFS"); dir != "" {
		return dir
	}
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) >= 3 && fields[2] == "hugetlbfs" {
			if syscall.Access(fields[1], 2 /* W_OK */) == nil {
				return fields[1]
			}
		}
	}
	return ""
}

func TestMapRegionFileHugetlbfs(t *testing.T) {
	dir := hugetlbfsMount()
	if dir == "" {
		t.Skip("no writable hugetlbfs mount (mount one, or set KVX_TEST_HUGETLBFS)")
	}
	path := filepath.Join(dir, fmt.Sprintf("kvxfer-go-%d", os.Getpid()))
	defer os.Remove(path)
	r, err := kvxfer.MapRegionFile(path, testBlocks, testLen) // 64 KiB: one huge page
	if errors.Is(err, kvxfer.ErrNoMemory) {
		t.Skipf("no free huge page: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	backend, via := exchange(t, r, kvxfer.WithBackend("shm"))
	if backend != "shm" || via != "mapped" {
		t.Errorf("peer writes into a hugetlbfs region via %q %q, want shm mapped", backend, via)
	}
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
}

func mmap(t *testing.T, fd, size, prot, flags int) []byte {
	t.Helper()
	b, err := syscall.Mmap(fd, 0, size, prot, flags)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const rw = syscall.PROT_READ | syscall.PROT_WRITE

func TestRegionFromMmap(t *testing.T) {
	t.Run("anonymous", func(t *testing.T) {
		mem := mmap(t, -1, testBlocks*testLen, rw, syscall.MAP_SHARED|syscall.MAP_ANON)
		defer syscall.Munmap(mem)
		for _, backend := range []string{"tcp", "shm"} {
			r, err := kvxfer.RegionFromMmap(mem, testBlocks, testLen)
			if err != nil {
				t.Fatal(err)
			}
			if r.Addr() != addr(mem) || len(r.Bytes()) != len(mem) {
				t.Fatal("the region is not the mapping")
			}
			// No file to map: the same-host writer copies another way.
			got, via := exchange(t, r, kvxfer.WithBackend(backend))
			if got != backend || (backend == "shm" && via == "mapped") {
				t.Errorf("peer writes into anonymous memory via %q %q", got, via)
			}
			t.Logf("backend %s: the peer writes via %q %q", backend, got, via)
			if err := r.Free(); err != nil {
				t.Fatal(err)
			}
		}
		checkBlock(t, "mapping, block 11", mem[11*testLen:12*testLen], 9, 0x22) // Free left it mapped
	})
	t.Run("file", func(t *testing.T) {
		path := shmPath(t)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(testBlocks*testLen + 8192); err != nil {
			t.Fatal(err)
		}
		mem := mmap(t, int(f.Fd()), testBlocks*testLen+8192, rw, syscall.MAP_SHARED)
		defer syscall.Munmap(mem)
		r, err := kvxfer.RegionFromMmap(mem, testBlocks, testLen) // longer memory: its first bytes
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Bytes()) != testBlocks*testLen {
			t.Fatalf("region of %d bytes", len(r.Bytes()))
		}
		if backend, via := exchange(t, r, kvxfer.WithBackend("shm")); backend != "shm" || via != "mapped" {
			t.Errorf("peer writes into a /dev/shm file via %q %q, want shm mapped", backend, via)
		}
		if err := r.Free(); err != nil {
			t.Fatal(err)
		}
	})
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// A Go []byte (and any memory that looks like one) never backs a region.
func TestRegionFromMmapRefused(t *testing.T) {
	heap := make([]byte, testBlocks*testLen)
	_, err := kvxfer.RegionFromMmap(heap, testBlocks, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "Go-heap memory")

	private := mmap(t, -1, testLen, rw, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	defer syscall.Munmap(private)
	_, err = kvxfer.RegionFromMmap(private, 1, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "private mapping")

	readOnly := mmap(t, -1, testLen, syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_ANON)
	defer syscall.Munmap(readOnly)
	_, err = kvxfer.RegionFromMmap(readOnly, 1, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "read-only")

	// Shared memory whose second page is private: every page is checked.
	mixed := mmap(t, -1, 2*testLen, rw, syscall.MAP_SHARED|syscall.MAP_ANON)
	defer syscall.Munmap(mixed)
	_, _, e := syscall.Syscall6(syscall.SYS_MMAP, addr(mixed)+testLen, testLen, rw,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_FIXED, ^uintptr(0), 0)
	if e != 0 {
		t.Fatal(e)
	}
	_, err = kvxfer.RegionFromMmap(mixed, 2, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, fmt.Sprintf("memory at %#x is in a private", addr(mixed)+testLen))
	first, err := kvxfer.RegionFromMmap(mixed, 1, testLen)
	if err != nil {
		t.Fatal("its shared first page:", err)
	}
	first.Free()

	shared := mmap(t, -1, testLen, rw, syscall.MAP_SHARED|syscall.MAP_ANON)
	defer syscall.Munmap(shared)
	_, err = kvxfer.RegionFromMmap(shared, 2, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "shorter")
	_, err = kvxfer.RegionFromMmap(shared, 0, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "empty")
	_, err = kvxfer.RegionFromMmap(nil, 1, testLen)
	isErr(t, err, kvxfer.ErrInvalid, kvxfer.ScopeRequest, "shorter")

	// One Region per base address: a second one would let Free pull the
	// memory from under the first one's transport.
	r, err := kvxfer.RegionFromMmap(shared, 1, testLen)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kvxfer.RegionFromMmap(shared, 1, testLen)
	isErr(t, err, kvxfer.ErrBusy, kvxfer.ScopeRequest, "backs a Region already")
	r.Free()
	alloc, err := kvxfer.AllocRegion(1, testLen)
	if err != nil {
		t.Fatal(err)
	}
	defer alloc.Free()
	_, err = kvxfer.RegionFromMmap(alloc.Bytes(), 1, testLen)
	isErr(t, err, kvxfer.ErrBusy, kvxfer.ScopeRequest, "backs a Region already")
	if !bytes.Equal(alloc.Bytes(), make([]byte, testLen)) {
		t.Error("refusals touched the memory")
	}
}
