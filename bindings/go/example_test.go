package kvxfer_test

import (
	"errors"
	"fmt"
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
