// Quickstart: two transports in one process over TCP loopback. Transport a
// writes three of its blocks into b's region; the program waits for the
// transfer and checks the bytes.
package main

import (
	"bytes"
	"fmt"
	"log"
	"time"

	"kvxfer.dev/kvxfer"
)

func main() {
	log.SetFlags(0)
	const numBlocks, blockLen = 8, 4096
	config := kvxfer.WithConfig(map[string]any{"model": "quickstart", "layers": 2, "rope_theta": 10000.0})

	// Regions live outside the Go heap: peers write into them at any time.
	regA, err := kvxfer.AllocRegion(numBlocks, blockLen)
	check(err)
	defer regA.Free()
	regB, err := kvxfer.AllocRegion(numBlocks, blockLen)
	check(err)
	defer regB.Free()

	a, err := kvxfer.NewTransport(regA, kvxfer.WithBackend("tcp"), kvxfer.WithTCPListen("127.0.0.1:0"), config)
	check(err)
	defer a.Close() // deferred calls run last-in first-out: Close before Free
	b, err := kvxfer.NewTransport(regB, kvxfer.WithBackend("tcp"), kvxfer.WithTCPListen("127.0.0.1:0"), config)
	check(err)
	defer b.Close()
	fmt.Println("fingerprint", a.ConfigFingerprint(), "backend", a.Backend())

	// The control plane (here: a function call) carries b's metadata and
	// geometry to a.
	meta, err := b.AgentMetadata()
	check(err)
	check(a.AddRemotePeer("b", meta, b.BaseAddr(), b.NumBlocks(), b.BlockLen()))

	for i := uint64(0); i < numBlocks; i++ {
		copy(regA.Block(i), bytes.Repeat([]byte{byte('A' + i)}, blockLen))
	}
	id, err := a.WriteBlocks("b", []uint64{0, 1, 5}, []uint64{2, 3, 7})
	check(err)

	deadline := time.Now().Add(10 * time.Second)
	for done := false; !done; {
		res, err := a.Poll("b")
		check(err)
		for _, f := range res.Failed {
			if f == id {
				log.Fatalf("transfer %d failed", id)
			}
		}
		for _, d := range res.Done {
			done = done || d == id
		}
		if time.Now().After(deadline) {
			log.Fatalf("transfer %d not done after 10 s", id)
		}
		time.Sleep(time.Millisecond)
	}

	for src, dst := range map[uint64]uint64{0: 2, 1: 3, 5: 7} {
		if !bytes.Equal(regB.Block(dst), regA.Block(src)) {
			log.Fatalf("b's block %d differs from a's block %d", dst, src)
		}
	}
	if regB.Block(0)[0] != 0 {
		log.Fatal("b's block 0 was written")
	}
	fmt.Printf("transfer %d done: b's blocks 2,3,7 hold %q,%q,%q\n", id, regB.Block(2)[0], regB.Block(3)[0], regB.Block(7)[0])
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
