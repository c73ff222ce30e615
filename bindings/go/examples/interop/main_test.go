package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInteropInProcess runs both roles of the protocol in one process (the
// separate-process and cross-language pairs run from bindings/go/test.sh).
func TestInteropInProcess(t *testing.T) {
	dir := t.TempDir()
	var tout, iout bytes.Buffer
	var terr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		terr = runTarget(dir, &tout, 30*time.Second)
	}()
	if err := runInitiator(dir, &iout, 30*time.Second); err != nil {
		t.Fatal("initiator:", err)
	}
	wg.Wait()
	if terr != nil {
		t.Fatal("target:", terr)
	}
	const fp = "fingerprint cba5ae8625a9ca0f\n"
	if tout.String() != fp+"verified\n" {
		t.Errorf("target printed %q", tout.String())
	}
	if iout.String() != fp+"sent\n" {
		t.Errorf("initiator printed %q", iout.String())
	}
}

func TestTargetTimesOut(t *testing.T) {
	var out bytes.Buffer
	err := runTarget(t.TempDir(), &out, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no initiator finished") {
		t.Fatalf("target without initiator: %v", err)
	}
}
