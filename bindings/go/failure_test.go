package kvxfer_test

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvxfer.dev/kvxfer"
)

// helperEnv makes the test binary a tcp target instead of running the tests
// (TestMain): it prints "target HEXMETA BASE NUMBLOCKS BLOCKLEN" and serves
// until its stdin closes. The tests stop it with SIGSTOP and kill it.
const helperEnv = "KVXFER_GO_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "target" {
		os.Exit(helperTarget())
	}
	os.Exit(m.Run())
}

func helperTarget() int {
	r, err := kvxfer.AllocRegion(testBlocks, testLen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.Free()
	tr, err := kvxfer.NewTransport(r, tcpOpts()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer tr.Close()
	meta, err := tr.AgentMetadata()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("target %s %d %d %d\n", hex.EncodeToString(meta), tr.BaseAddr(), tr.NumBlocks(), tr.BlockLen())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// targetProcess is the test binary as a tcp target in another process.
type targetProcess struct {
	cmd                          *exec.Cmd
	stdin                        io.WriteCloser
	meta                         []byte
	base, numBlocks, blockLength uint64
}

func startTarget(t *testing.T) *targetProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=target")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &targetProcess{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("target did not start: %v", err)
	}
	var metaHex string
	if _, err := fmt.Sscanf(line, "target %s %d %d %d", &metaHex, &p.base, &p.numBlocks, &p.blockLength); err != nil {
		t.Fatalf("target said %q: %v", line, err)
	}
	if p.meta, err = hex.DecodeString(metaHex); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *targetProcess) add(t *testing.T, tr *kvxfer.Transport, id string) {
	t.Helper()
	if err := tr.AddRemotePeer(id, p.meta, p.base, p.numBlocks, p.blockLength); err != nil {
		t.Fatal(err)
	}
}

// freeze stops the process (SIGSTOP) and waits until it is stopped.
func (p *targetProcess) freeze(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 0 && f[0] == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("target not stopped")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const inFlight = 16

func writeInFlight(t *testing.T, tr *kvxfer.Transport, peer string) []uint64 {
	t.Helper()
	all := make([]uint64, testBlocks)
	for i := range all {
		all[i] = uint64(i)
	}
	ids := make([]uint64, inFlight)
	for i := range ids {
		id, err := tr.WriteBlocks(peer, all, all)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

// pollResults collects the results of ids with PollResults(peer); it fails
// on an id reported twice, one it did not expect, or a timeout.
func pollResults(t *testing.T, tr *kvxfer.Transport, peer string, ids []uint64) map[uint64]error {
	t.Helper()
	want := map[uint64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := map[uint64]error{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(want) {
		res, err := tr.PollResults(peer)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if _, dup := got[r.ID]; dup || !want[r.ID] {
				t.Fatalf("id %d reported twice or unexpected", r.ID)
			}
			got[r.ID] = r.Err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ids reported within 30 s", len(got), len(want))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return got
}

func checkCauses(t *testing.T, s kvxfer.Stats, timeout, connection, removed uint64) {
	t.Helper()
	if s.TransfersFailedTimeout+s.TransfersFailedConnection+s.TransfersFailedRemoved+s.TransfersFailedOther !=
		s.TransfersFailed {
		t.Errorf("failures by cause do not add up to TransfersFailed: %+v", s)
	}
	if s.TransfersFailedTimeout != timeout || s.TransfersFailedConnection != connection ||
		s.TransfersFailedRemoved != removed {
		t.Errorf("failures by cause: timeout %d, connection %d, removed %d; want %d, %d, %d",
			s.TransfersFailedTimeout, s.TransfersFailedConnection, s.TransfersFailedRemoved, timeout, connection,
			removed)
	}
}

func TestPollResultsDone(t *testing.T) {
	a := newTransport(t, testBlocks, 0)
	b := newTransport(t, testBlocks, canary)
	connect(t, a, "b", b)
	var ids []uint64
	for i := uint64(0); i < 8; i++ {
		id, err := a.WriteBlocks("b", []uint64{i}, []uint64{i})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for id, err := range pollResults(t, a, "b", ids) {
		if err != nil {
			t.Errorf("transfer %d: %v, want done", id, err)
		}
	}
	if res, err := a.PollResults("nobody"); err != nil || res != nil {
		t.Fatalf("PollResults(unknown peer) = %v, %v", res, err)
	}
	if _, err := a.PollResults("a\x00b"); !errors.Is(err, kvxfer.ErrInvalid) {
		t.Fatalf("PollResults(id with NUL) = %v", err)
	}
	s, err := a.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	checkCauses(t, s, 0, 0, 0)
	a.Close()
	if _, err := a.PollResults(""); !errors.Is(err, kvxfer.ErrClosed) {
		t.Fatalf("PollResults after Close = %v", err)
	}
}

// Poll and PollResults take from the same queues: no id twice.
func TestPollAndPollResultsShareTheQueues(t *testing.T) {
	a := newTransport(t, testBlocks, 0)
	b := newTransport(t, testBlocks, canary)
	connect(t, a, "b", b)
	want := map[uint64]bool{}
	for i := uint64(0); i < 300; i++ {
		id, err := a.WriteBlocks("b", []uint64{i % testBlocks}, []uint64{i % testBlocks})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	seen := map[uint64]bool{}
	note := func(id uint64) {
		if seen[id] || !want[id] {
			t.Fatalf("id %d reported twice or unexpected", id)
		}
		seen[id] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for k := 0; len(seen) < len(want); k++ {
		if k%2 == 0 {
			res, err := a.Poll("")
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Failed) > 0 {
				t.Fatalf("failed: %v", res.Failed)
			}
			for _, id := range res.Done {
				note(id)
			}
		} else {
			res, err := a.PollResults("b")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil {
					t.Fatalf("transfer %d: %v", r.ID, r.Err)
				}
				note(r.ID)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ids reported within 30 s", len(seen), len(want))
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// A peer removed, then one killed, with transfers in flight (to a target
// process stopped with SIGSTOP, so that none can complete): every failed id
// says CodeCanceled, then CodeConnReset, and the stats count them by cause.
func TestPollResultsRemovedAndKilledPeer(t *testing.T) {
	a := newTransport(t, testBlocks, 0, kvxfer.WithTimeouts(5*time.Second, 60*time.Second),
		kvxfer.WithOption("peer_redial_ms", "0"))
	p := startTarget(t)

	p.add(t, a, "target")
	p.freeze(t)
	ids := writeInFlight(t, a, "target")
	if err := a.RemoveRemotePeer("target"); err != nil {
		t.Fatal(err)
	}
	for id, err := range pollResults(t, a, "", ids) {
		isErr(t, err, kvxfer.ErrCanceled, kvxfer.ScopeRequest, fmt.Sprintf("transfer %d failed", id))
		var ke *kvxfer.Error
		if errors.As(err, &ke); ke.Code != kvxfer.CodeCanceled || ke.Op != "PollResults" {
			t.Fatalf("removed peer: %#v", ke)
		}
		if !errors.Is(err, syscall.ECANCELED) {
			t.Fatalf("%v is not syscall.ECANCELED", err)
		}
	}
	s, err := a.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	checkCauses(t, s, 0, 0, inFlight)

	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.add(t, a, "target")
	p.freeze(t)
	ids = writeInFlight(t, a, "target")
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	for id, err := range pollResults(t, a, "target", ids) {
		isErr(t, err, kvxfer.ErrConnReset, kvxfer.ScopePeer, fmt.Sprintf("transfer %d to peer \"target\" failed", id))
	}
	if st, err := a.PeerState("target"); err != nil || st.Link != kvxfer.PeerBroken {
		t.Fatalf("PeerState after the kill = %+v, %v; want broken (peer_redial_ms=0)", st, err)
	}
	if s, err = a.Stats("target"); err != nil {
		t.Fatal(err)
	}
	checkCauses(t, s, 0, inFlight, 0)
	if s, err = a.Stats(""); err != nil {
		t.Fatal(err)
	}
	checkCauses(t, s, 0, inFlight, inFlight)
	if s.TransfersFailed != 2*inFlight {
		t.Fatalf("TransfersFailed %d, want %d", s.TransfersFailed, 2*inFlight)
	}
}
