package kvxfer_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"kvxfer.dev/kvxfer"
)

// logSink collects the records of one peer id.
type logSink struct {
	mu   sync.Mutex
	recs []kvxfer.LogRecord
}

func (s *logSink) handle(r kvxfer.LogRecord) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

func (s *logSink) about(peer string) []kvxfer.LogRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kvxfer.LogRecord
	for _, r := range s.recs {
		if r.PeerID == peer && strings.Contains(r.Message, "refused") {
			out = append(out, r)
		}
	}
	return out
}

// refuse adds a peer of another config: the library refuses it (its
// fingerprint differs) and logs a warning about it; then waits for the
// handler.
func refuse(t *testing.T, peer string) {
	t.Helper()
	a := newTransport(t, 4, 0, kvxfer.WithConfigJSON(`{"model":"a"}`))
	b := newTransport(t, 4, 0, kvxfer.WithConfigJSON(`{"model":"b"}`))
	meta, err := b.AgentMetadata()
	if err != nil {
		t.Fatal(err)
	}
	err = a.AddRemotePeer(peer, meta, b.BaseAddr(), b.NumBlocks(), b.BlockLen())
	if !errors.Is(err, kvxfer.ErrFingerprint) {
		t.Fatalf("AddRemotePeer of another config: %v; want ErrFingerprint", err)
	}
	if err := kvxfer.LogFlush(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// restoreLogs puts the library's default back: stderr, warn.
func restoreLogs(t *testing.T) {
	t.Cleanup(func() {
		if err := kvxfer.SetLogHandler(nil, kvxfer.LogWarn); err != nil {
			t.Error(err)
		}
	})
}

func TestLogHandlerGetsARefusedPeer(t *testing.T) {
	restoreLogs(t)
	var sink logSink
	if err := kvxfer.SetLogHandler(sink.handle, kvxfer.LogWarn); err != nil {
		t.Fatal(err)
	}
	if lv := kvxfer.GetLogLevel(); lv != kvxfer.LogWarn {
		t.Errorf("GetLogLevel() = %v; want warn", lv)
	}
	before := time.Now()
	refuse(t, "X")
	got := sink.about("X")
	if len(got) != 1 {
		t.Fatalf("records about X: %+v; want one", got)
	}
	r := got[0]
	if r.Level != kvxfer.LogWarn || r.Component != "core" ||
		!strings.HasPrefix(r.Message, "peer 'X': refused: its config fingerprint ") {
		t.Errorf("record %+v; want a warning of the core about X's fingerprint", r)
	}
	if r.Time.Before(before.Add(-time.Second)) || r.Time.After(time.Now().Add(time.Second)) || r.ThreadID <= 0 {
		t.Errorf("record time %v (test began %v), thread %d", r.Time, before, r.ThreadID)
	}
	if s := r.String(); !strings.HasPrefix(s, "warn: peer 'X': refused") {
		t.Errorf("String() = %q", s)
	}

	// error: the warning is not delivered (nor built)
	if err := kvxfer.SetLogLevel(kvxfer.LogError); err != nil {
		t.Fatal(err)
	}
	refuse(t, "Y")
	if got := sink.about("Y"); len(got) != 0 {
		t.Errorf("records about Y at level error: %+v", got)
	}
	if err := kvxfer.SetLogLevel(kvxfer.LogWarn); err != nil {
		t.Fatal(err)
	}
	refuse(t, "Y")
	if got := sink.about("Y"); len(got) != 1 {
		t.Errorf("records about Y back at warn: %+v; want one", got)
	}

	// back to stderr: the handler gets nothing more
	if err := kvxfer.SetLogHandler(nil, kvxfer.LogWarn); err != nil {
		t.Fatal(err)
	}
	refuse(t, "Z")
	if got := sink.about("Z"); len(got) != 0 {
		t.Errorf("records about Z after SetLogHandler(nil): %+v", got)
	}

	if err := kvxfer.SetLogLevel(kvxfer.LogLevel(4)); !errors.Is(err, kvxfer.ErrInvalid) {
		t.Errorf("SetLogLevel(4) = %v; want ErrInvalid", err)
	}
	if err := kvxfer.SetLogHandler(sink.handle, kvxfer.LogLevel(-2)); !errors.Is(err, kvxfer.ErrInvalid) {
		t.Errorf("SetLogHandler(h, -2) = %v; want ErrInvalid", err)
	}
}

// A handler may call back into the package: SetLogLevel (which also takes
// the lock SetLogHandler holds while it waits for the handler) and
// LogFlush (ErrBusy: it would wait for itself).
func TestLogHandlerMayCallKvxfer(t *testing.T) {
	restoreLogs(t)
	var mu sync.Mutex
	var errs []error
	h := func(r kvxfer.LogRecord) {
		e1 := kvxfer.SetLogLevel(kvxfer.LogWarn)
		e2 := kvxfer.LogFlush(time.Second)
		mu.Lock()
		errs = append(errs, e1, e2)
		mu.Unlock()
	}
	if err := kvxfer.SetLogHandler(h, kvxfer.LogWarn); err != nil {
		t.Fatal(err)
	}
	refuse(t, "C")
	mu.Lock()
	defer mu.Unlock()
	if len(errs) < 2 || errs[0] != nil || !errors.Is(errs[1], kvxfer.ErrBusy) {
		t.Errorf("from the handler: SetLogLevel, LogFlush = %v; want nil, ErrBusy", errs)
	}
}

func TestStdLogger(t *testing.T) {
	restoreLogs(t)
	var buf bytes.Buffer
	var mu sync.Mutex
	l := log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), "app: ", 0)
	if err := kvxfer.SetLogHandler(kvxfer.StdLogger(l), kvxfer.LogWarn); err != nil {
		t.Fatal(err)
	}
	refuse(t, "S")
	mu.Lock()
	defer mu.Unlock()
	want := `app: kvxfer warn: peer 'S': refused: its config fingerprint `
	if !strings.Contains(buf.String(), want) || !strings.Contains(buf.String(), `[core peer="S"]`+"\n") {
		t.Errorf("StdLogger wrote %q; want a line with %q ... [core peer=\"S\"]", buf.String(), want)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestPeers(t *testing.T) {
	src := newTransport(t, testBlocks, 1)
	b := newTransport(t, testBlocks, canary)
	a := newTransport(t, testBlocks, canary)
	if ps, err := src.Peers(); err != nil || len(ps) != 0 {
		t.Fatalf("Peers() of a new transport = %v, %v", ps, err)
	}
	start := time.Now().UnixNano()
	connect(t, src, "peer-b", b)
	connect(t, src, "peer-a", a)
	ps, err := src.Peers()
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].ID != "peer-a" || ps[1].ID != "peer-b" {
		t.Fatalf("Peers() = %+v; want peer-a, peer-b (by id)", ps)
	}
	for _, p := range ps {
		// the same fields as PeerState (SinceNs: the library converts it to
		// CLOCK_REALTIME at each call, which may differ by a few ns)
		st, err := src.PeerState(p.ID)
		d := p.State.SinceNs - st.SinceNs
		got := p.State
		got.SinceNs = st.SinceNs
		if err != nil || got != st || d > 1e6 || d < -1e6 {
			t.Errorf("Peers()'s %s: %+v; PeerState: %+v, %v", p.ID, p.State, st, err)
		}
		if p.State.Link != kvxfer.PeerUp || p.State.Backend != "tcp" || p.State.SinceNs < start-1e9 ||
			p.State.LastProgressNs != 0 {
			t.Errorf("peer %s: %+v; want up on tcp, no progress yet", p.ID, p.State)
		}
	}
	id, err := src.WriteBlocks("peer-b", []uint64{0}, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, src, "", id)
	if st, _ := src.PeerState("peer-b"); st.LastProgressNs < start {
		t.Errorf("LastProgressNs %d after a transfer; want >= %d", st.LastProgressNs, start)
	}
	if err := src.RemoveRemotePeer("peer-a"); err != nil {
		t.Fatal(err)
	}
	if ps, err := src.Peers(); err != nil || len(ps) != 1 || ps[0].ID != "peer-b" {
		t.Errorf("Peers() after removing peer-a = %+v, %v; want peer-b only", ps, err)
	}
}

func TestPeersConnecting(t *testing.T) {
	meta, peer := silentPeer(t)
	src := newTransport(t, testBlocks, 1, kvxfer.WithConnectTimeout(10*time.Second))
	r, err := src.AddRemotePeerAsync("s", meta, peer.BaseAddr(), peer.NumBlocks(), peer.BlockLen(), false)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := src.Peers()
	if err != nil || len(ps) != 1 || ps[0].ID != "s" || ps[0].State.Link != kvxfer.PeerConnecting ||
		ps[0].State.Link.String() != "connecting" || ps[0].State.SinceNs == 0 {
		t.Errorf("Peers() while s connects = %+v, %v; want s connecting", ps, err)
	}
	r.Cancel()
	if ps, err := src.Peers(); err != nil || len(ps) != 0 {
		t.Errorf("Peers() after the cancel = %+v, %v", ps, err)
	}
	src.Close()
	if _, err := src.Peers(); !errors.Is(err, kvxfer.ErrClosed) {
		t.Errorf("Peers() after Close: %v; want ErrClosed", err)
	}
}

func TestMetricsText(t *testing.T) {
	src := newTransport(t, testBlocks, 1)
	dst := newTransport(t, testBlocks, canary)
	connect(t, src, "dst", dst)
	var ids []uint64
	for i := uint64(0); i < 5; i++ {
		id, err := src.WriteBlocks("dst", []uint64{0, 1, 2}, []uint64{i, i + 1, i + 2})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	waitAll(t, src, "", ids...)
	st, err := src.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	text, err := src.MetricsText()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"# TYPE kvxfer_transfers_total counter",
		fmt.Sprintf(`kvxfer_transfers_total{outcome="done"} %d`, st.TransfersDone),
		fmt.Sprintf(`kvxfer_transfer_bytes_total{outcome="done"} %d`, st.BytesDone),
		fmt.Sprintf(`kvxfer_transfer_latency_seconds_count %d`, st.LatencyCount),
		`kvxfer_peer_info{peer="dst",backend="tcp",path=""} 1`,
		`kvxfer_peer_transfers_total{peer="dst",outcome="done"} 5`,
	} {
		if !strings.Contains(text, "\n"+line+"\n") {
			t.Errorf("metrics text lacks the line %q:\n%s", line, text)
		}
	}
	if st.TransfersDone != 5 || st.BytesDone != 5*3*testLen || st.LatencyNsSum == 0 ||
		st.LatencyNsSum > st.LatencyCount*st.LatencyNsMax {
		t.Errorf("Stats %+v", st)
	}

	srv := httptest.NewServer(kvxfer.MetricsHandler(src))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") ||
		!strings.Contains(string(body), `kvxfer_transfers_total{outcome="done"} 5`) {
		t.Errorf("GET /metrics: %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.MetricsText(); !errors.Is(err, kvxfer.ErrClosed) {
		t.Errorf("MetricsText after Close: %v; want ErrClosed", err)
	}
	resp, err = http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /metrics of a closed transport: %d; want 503", resp.StatusCode)
	}
}
