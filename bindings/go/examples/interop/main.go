// The Go side of the cross-language interop test (tests/interop/PROTOCOL.md):
//
//	interop target DIR     serve a zero-filled region, publish DIR/target.json,
//	                       wait for DIR/done, verify the bytes, print "verified"
//	interop initiator DIR  read DIR/target.json, write every block into the
//	                       target, wait for completion, create DIR/done, print "sent"
//
// Both print "fingerprint <16 hex>" of the config first.
package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"kvxfer.dev/kvxfer"
)

const (
	numBlocks = 16
	blockLen  = 4096
	config    = `{"model":"interop","layers":2}`
)

// targetInfo is DIR/target.json.
type targetInfo struct {
	Metadata    string `json:"metadata"`
	BaseAddr    uint64 `json:"base_addr"`
	NumBlocks   uint64 `json:"num_blocks"`
	BlockLen    uint64 `json:"block_len"`
	Fingerprint string `json:"fingerprint"`
}

func pattern(block int) byte { return byte((block*37 + 11) & 0xff) }

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "target" && os.Args[1] != "initiator") {
		fmt.Fprintln(os.Stderr, "usage: interop target|initiator DIR")
		os.Exit(2)
	}
	run := runTarget
	if os.Args[1] == "initiator" {
		run = runInitiator
	}
	if err := run(os.Args[2], os.Stdout, 60*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "interop(go): %v\n", err)
		os.Exit(1)
	}
}

// open creates a transport per the protocol and prints its fingerprint.
func open(out io.Writer) (*kvxfer.Region, *kvxfer.Transport, error) {
	fp, err := kvxfer.Fingerprint(config)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(out, "fingerprint %s\n", fp)
	region, err := kvxfer.AllocRegion(numBlocks, blockLen)
	if err != nil {
		return nil, nil, err
	}
	t, err := kvxfer.NewTransport(region, kvxfer.WithBackend("shm,tcp"),
		kvxfer.WithTCPListen("127.0.0.1:0"), kvxfer.WithConfigJSON(config))
	if err != nil {
		region.Free()
		return nil, nil, err
	}
	if t.ConfigFingerprint() != fp {
		t.Close()
		region.Free()
		return nil, nil, fmt.Errorf("transport fingerprint %s != Fingerprint() %s", t.ConfigFingerprint(), fp)
	}
	return region, t, nil
}

func waitFile(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", path, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func runTarget(dir string, out io.Writer, timeout time.Duration) (err error) {
	region, t, err := open(out)
	if err != nil {
		return err
	}
	defer region.Free()
	defer t.Close()
	meta, err := t.AgentMetadata()
	if err != nil {
		return err
	}
	info, err := json.Marshal(targetInfo{
		Metadata:    hex.EncodeToString(meta),
		BaseAddr:    t.BaseAddr(),
		NumBlocks:   t.NumBlocks(),
		BlockLen:    t.BlockLen(),
		Fingerprint: t.ConfigFingerprint(),
	})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "target.json.tmp")
	if err := os.WriteFile(tmp, append(info, '\n'), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "target.json")); err != nil {
		return err
	}
	if err := waitFile(filepath.Join(dir, "done"), timeout); err != nil {
		return fmt.Errorf("no initiator finished: %w", err)
	}
	// After Close nothing writes into the region any more.
	if err := t.Close(); err != nil {
		return err
	}
	for b := 0; b < numBlocks; b++ {
		for i, c := range region.Block(uint64(b)) {
			if c != pattern(b) {
				return fmt.Errorf("block %d byte %d is %#02x, want %#02x", b, i, c, pattern(b))
			}
		}
	}
	fmt.Fprintln(out, "verified")
	return nil
}

func runInitiator(dir string, out io.Writer, timeout time.Duration) error {
	region, t, err := open(out)
	if err != nil {
		return err
	}
	defer region.Free()
	defer t.Close()
	path := filepath.Join(dir, "target.json")
	if err := waitFile(path, timeout); err != nil {
		return err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var info targetInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	meta, err := hex.DecodeString(info.Metadata)
	if err != nil {
		return fmt.Errorf("%s: metadata: %w", path, err)
	}
	for b := 0; b < numBlocks; b++ {
		blk := region.Block(uint64(b))
		for i := range blk {
			blk[i] = pattern(b)
		}
	}
	if err := t.AddRemotePeer("target", meta, info.BaseAddr, info.NumBlocks, info.BlockLen); err != nil {
		return err
	}
	backend, path, err := t.PeerBackend("target")
	if err != nil {
		return err
	}
	fmt.Printf("path %s %s\n", backend, path)
	idx := make([]uint64, numBlocks)
	for i := range idx {
		idx[i] = uint64(i)
	}
	id, err := t.WriteBlocks("target", idx, idx)
	if err != nil {
		return err
	}
	if err := waitDone(t, "target", id, 30*time.Second); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o600); err != nil {
		return err
	}
	fmt.Fprintln(out, "sent")
	return nil
}

func waitDone(t *kvxfer.Transport, peer string, id uint64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		res, err := t.Poll(peer)
		if err != nil {
			return err
		}
		for _, f := range res.Failed {
			if f == id {
				return fmt.Errorf("transfer %d failed", id)
			}
		}
		for _, d := range res.Done {
			if d == id {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("transfer not done within " + timeout.String())
		}
		time.Sleep(time.Millisecond)
	}
}
