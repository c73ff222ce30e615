package kvxfer_test

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"kvxfer.dev/kvxfer"
)

// Two transports in one process: a writes its block 0 into b's block 3.
func Example() {
	regA, _ := kvxfer.AllocRegion(4, 1024)
	regB, _ := kvxfer.AllocRegion(4, 1024)
	defer regA.Free()
	defer regB.Free()
	opts := []kvxfer.Option{kvxfer.WithBackend("tcp"), kvxfer.WithTCPListen("127.0.0.1:0")}
	a, err := kvxfer.NewTransport(regA, opts...)
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, err := kvxfer.NewTransport(regB, opts...)
	if err != nil {
		panic(err)
	}
	defer b.Close()

	meta, _ := b.AgentMetadata()
	if err := a.AddRemotePeer("b", meta, b.BaseAddr(), b.NumBlocks(), b.BlockLen()); err != nil {
		panic(err)
	}
	copy(regA.Block(0), "hello, kv cache")
	id, err := a.WriteBlocks("b", []uint64{0}, []uint64{3})
	if err != nil {
		panic(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		res, _ := a.Poll("b")
		if len(res.Done) == 1 && res.Done[0] == id {
			break
		}
	}
	fmt.Printf("%s\n", regB.Block(3)[:15])

	_, err = a.WriteBlocks("b", []uint64{0}, []uint64{4})
	fmt.Println(errors.Is(err, kvxfer.ErrOutOfRange))
	// Output:
	// hello, kv cache
	// true
}

func ExampleFingerprint() {
	fp, _ := kvxfer.Fingerprint(`{"model": "interop", "layers": 2}`)
	fmt.Println(fp)
	fp, _ = kvxfer.FingerprintOf(map[string]any{"layers": 2, "model": "interop"})
	fmt.Println(fp)
	// Output:
	// cba5ae8625a9ca0f
	// cba5ae8625a9ca0f
}

// A region over a /dev/shm file: another process mapping the file sees the
// blocks, and a same-host peer's shm backend copies straight into it.
func ExampleMapRegionFile() {
	path := fmt.Sprintf("/dev/shm/kvxfer-example-%d", os.Getpid())
	defer os.Remove(path) // Free keeps the file
	r, err := kvxfer.MapRegionFile(path, 4, 4096)
	if err != nil {
		panic(err)
	}
	t, err := kvxfer.NewTransport(r, kvxfer.WithBackend("shm,tcp"), kvxfer.WithTCPListen("127.0.0.1:0"))
	if err != nil {
		panic(err)
	}
	copy(r.Block(1), "written by the owner")
	t.Close()
	fmt.Println(r.Free())
	data, _ := os.ReadFile(path)
	fmt.Printf("%d bytes, %s\n", len(data), data[4096:4116])
	// Output:
	// <nil>
	// 16384 bytes, written by the owner
}

// Memory mapped by the caller: MAP_SHARED anonymous memory is accepted, a Go
// slice is not (cgo forbids C from keeping Go pointers, and Go 1.19 cannot
// pin them).
func ExampleRegionFromMmap() {
	mem, err := syscall.Mmap(-1, 0, 4*4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	if err != nil {
		panic(err)
	}
	defer syscall.Munmap(mem) // after Free: the memory stays the caller's
	r, err := kvxfer.RegionFromMmap(mem, 4, 4096)
	if err != nil {
		panic(err)
	}
	defer r.Free()
	fmt.Println(r.NumBlocks(), r.BlockLen())

	_, err = kvxfer.RegionFromMmap(make([]byte, 4*4096), 4, 4096)
	fmt.Println(errors.Is(err, kvxfer.ErrInvalid))
	// Output:
	// 4 4096
	// true
}
