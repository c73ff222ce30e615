package kvxfer_test

// What the library says about itself and its inputs, with no transfer: its
// version and backends, a transport's properties, the config fingerprint
// (against Python's), option and error handling. Transfers: kvxfer_test.go.

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"kvxfer.dev/kvxfer"
)

func TestVersion(t *testing.T) {
	if v := kvxfer.Version(); v != "0.14.0" {
		t.Errorf("Version() = %q", v)
	}
}

func TestBackends(t *testing.T) {
	names := kvxfer.Backends()
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || seen[n] {
			t.Fatalf("Backends() = %q", names)
		}
		seen[n] = true
	}
	if !seen["tcp"] || !seen["shm"] {
		t.Fatalf("Backends() = %q, want tcp and shm among them", names)
	}
}

func TestProperties(t *testing.T) {
	cfg := `{"model":"interop","layers":2}`
	a := newTransport(t, testBlocks, 0, kvxfer.WithConfigJSON(cfg))
	if got := uintptr(a.BaseAddr()); got != a.Region().Addr() || got == 0 {
		t.Errorf("BaseAddr %#x, region at %#x", got, a.Region().Addr())
	}
	if a.NumBlocks() != testBlocks || a.BlockLen() != testLen {
		t.Errorf("geometry %d x %d", a.NumBlocks(), a.BlockLen())
	}
	if a.ConfigFingerprint() != "cba5ae8625a9ca0f" {
		t.Errorf("ConfigFingerprint %q", a.ConfigFingerprint())
	}
	if a.Backend() != "tcp" {
		t.Errorf("Backend %q", a.Backend())
	}
	m1, err := a.AgentMetadata()
	if err != nil || len(m1) == 0 {
		t.Fatalf("AgentMetadata: %d bytes, %v", len(m1), err)
	}
	m2, _ := a.AgentMetadata()
	if !bytes.Equal(m1, m2) {
		t.Error("AgentMetadata changed between calls")
	}
	b := newTransport(t, testBlocks, 0)
	if b.ConfigFingerprint() != "" {
		t.Errorf("no config: fingerprint %q", b.ConfigFingerprint())
	}
}

// Python: json.dumps(d, sort_keys=True, separators=(",", ":")) -> sha256 hex[:16].
var pythonFingerprints = []struct {
	json, want string
}{
	{`{"model":"interop","layers":2}`, "cba5ae8625a9ca0f"},
	{"{ \"layers\" : 2,\n \"model\" : \"interop\" }", "cba5ae8625a9ca0f"},
	{`{"model_name": "meta-llama/Llama-3-8B", "num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "block_size": 16}`, "ddf8aecc95fc0d08"},
	{`{"rope_theta": 10000.0, "eps": 1e-05, "scale": 0.125, "big": 1e16, "small": 1.5e-7, "mid": 1000000.0}`, "31701ee13cf9a9a5"},
	{`{"b": [1, 2.5, {"c": null, "d": true}], "a": "é<>&\u2603"}`, "758c9bcc1726faed"},
	{`{"big": 12345678901234567890, "neg": -3, "f": 1e300, "z": false}`, "fe47bf6e0f0cdd4f"},
	{`{"a":1}`, "015abd7f5cc57a2d"},
	{`{"a":1.0}`, "c29a44abc114a1d7"},
	{"", ""},
	{"null", ""},
	{"{}", ""},
}

func TestFingerprintMatchesPython(t *testing.T) {
	for _, c := range pythonFingerprints {
		got, err := kvxfer.Fingerprint(c.json)
		if err != nil || got != c.want {
			t.Errorf("Fingerprint(%q) = %q, %v; want %q", c.json, got, err, c.want)
		}
	}
	// The same configs as Go values: floats must stay floats.
	maps := []struct {
		fields map[string]any
		want   string
	}{
		{map[string]any{"model": "interop", "layers": 2}, "cba5ae8625a9ca0f"},
		{map[string]any{"model_name": "meta-llama/Llama-3-8B", "num_layers": 32, "num_kv_heads": 8,
			"head_dim": 128, "dtype": "bfloat16", "block_size": 16}, "ddf8aecc95fc0d08"},
		{map[string]any{"rope_theta": 10000.0, "eps": 1e-05, "scale": 0.125, "big": 1e16,
			"small": 1.5e-7, "mid": 1000000.0}, "31701ee13cf9a9a5"},
		{map[string]any{"b": []any{1, 2.5, map[string]any{"c": nil, "d": true}}, "a": "é<>&\u2603"}, "758c9bcc1726faed"},
		{map[string]any{"big": uint64(12345678901234567890), "neg": -3, "f": 1e300, "z": false}, "fe47bf6e0f0cdd4f"},
		{map[string]any{"a": 1}, "015abd7f5cc57a2d"},
		{map[string]any{"a": 1.0}, "c29a44abc114a1d7"},
		{map[string]any{"a": float32(1)}, "c29a44abc114a1d7"},
		{nil, ""},
		{map[string]any{}, ""},
	}
	for _, c := range maps {
		got, err := kvxfer.FingerprintOf(c.fields)
		if err != nil || got != c.want {
			text, _ := kvxfer.ConfigJSON(c.fields)
			t.Errorf("FingerprintOf(%v) [%s] = %q, %v; want %q", c.fields, text, got, err, c.want)
		}
		r, _ := kvxfer.AllocRegion(1, 64)
		tr, err := kvxfer.NewTransport(r, tcpOpts(kvxfer.WithConfig(c.fields))...)
		if err != nil {
			t.Fatal(err)
		}
		if tr.ConfigFingerprint() != c.want {
			t.Errorf("WithConfig(%v): fingerprint %q, want %q", c.fields, tr.ConfigFingerprint(), c.want)
		}
		tr.Close()
		r.Free()
	}
	if text, _ := kvxfer.ConfigJSON(map[string]any{"x": 10000.0, "y": []float64{1, 0.5}}); text != `{"x":10000.0,"y":[1.0,0.5]}` {
		t.Errorf("ConfigJSON: %s", text)
	}
}

func TestFingerprintErrors(t *testing.T) {
	for _, bad := range []string{"[1]", "{", `{"a":NaN}`, "\"text\"", "{\"a\":1}\x00"} {
		_, err := kvxfer.Fingerprint(bad)
		isErr(t, err, kvxfer.ErrConfig, kvxfer.ScopeRequest, "Fingerprint")
	}
	_, err := kvxfer.FingerprintOf(map[string]any{"x": make(chan int)})
	isErr(t, err, kvxfer.ErrConfig, kvxfer.ScopeRequest, "chan")
}

func TestOptionErrors(t *testing.T) {
	r, _ := kvxfer.AllocRegion(2, 64)
	defer r.Free()
	cases := []struct {
		opts   []kvxfer.Option
		target error
		msg    string
	}{
		{[]kvxfer.Option{kvxfer.WithOption("no.such.key", "1")}, kvxfer.ErrInvalid, "no.such.key"},
		{[]kvxfer.Option{kvxfer.WithTCPStreams(99)}, kvxfer.ErrInvalid, "tcp.streams"},
		{[]kvxfer.Option{kvxfer.WithConnectTimeout(0)}, kvxfer.ErrInvalid, "positive"},
		{[]kvxfer.Option{kvxfer.WithTransferTimeout(2 * time.Hour)}, kvxfer.ErrInvalid, "transfer_timeout_ms"},
		{[]kvxfer.Option{kvxfer.WithBackend("carrier-pigeon")}, kvxfer.ErrInvalid, "carrier-pigeon"},
		{[]kvxfer.Option{kvxfer.WithConfigJSON("[1,2]")}, kvxfer.ErrConfig, "object"},
		{[]kvxfer.Option{kvxfer.WithConfig(map[string]any{"f": func() {}})}, kvxfer.ErrConfig, "func"},
		{[]kvxfer.Option{kvxfer.WithOption("tcp.listen", "a\x00b")}, kvxfer.ErrInvalid, "NUL"},
	}
	for _, c := range cases {
		tr, err := kvxfer.NewTransport(r, c.opts...)
		if err == nil {
			tr.Close()
			t.Errorf("options accepted, want %v", c.target)
			continue
		}
		isErr(t, err, c.target, kvxfer.ScopeRequest, c.msg)
	}
	// The region is released after each failure: it can be freed.
	tr, err := kvxfer.NewTransport(r, tcpOpts(kvxfer.WithTCPAdvertise("127.0.0.1:0"), kvxfer.WithTCPStreams(2))...)
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
}

func TestErrorType(t *testing.T) {
	if !errors.Is(kvxfer.ErrTimeout, syscall.ETIMEDOUT) || errors.Is(kvxfer.ErrClosed, syscall.Errno(1001)) {
		t.Error("syscall.Errno matching")
	}
	if errors.Is(kvxfer.ErrClosed, kvxfer.ErrUnknownPeer) {
		t.Error("different codes match")
	}
	if kvxfer.ErrPeerBroken.Scope != kvxfer.ScopePeer || kvxfer.ErrConfig.Scope != kvxfer.ScopeRequest ||
		kvxfer.ErrBackend.Scope != kvxfer.ScopeTransport {
		t.Error("sentinel scopes")
	}
	if s := kvxfer.ErrUnknownPeer.Error(); s != "kvxfer: unknown peer" {
		t.Errorf("sentinel text %q", s)
	}
	if kvxfer.Code(-99999).String() == "" || kvxfer.Code(-99999).Scope() != kvxfer.ScopeTransport {
		t.Error("unknown code")
	}
	if kvxfer.ScopePeer.String() != "peer" {
		t.Error("Scope.String")
	}
	wrapped := fmt.Errorf("context: %w", &kvxfer.Error{Op: "X", Code: kvxfer.CodeClosed, Scope: kvxfer.ScopeTransport})
	if !errors.Is(wrapped, kvxfer.ErrClosed) {
		t.Error("wrapped error does not match")
	}
}
