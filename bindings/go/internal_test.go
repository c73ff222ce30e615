package kvxfer

import (
	"errors"
	"strings"
	"testing"

	"kvxfer.dev/kvxfer/internal/capi"
)

// A Go-heap []byte must never back a transport: peers write into the
// region after the C call returned, which cgo forbids for Go memory (and
// the SWIG layer would not notice). The exported API cannot build such a
// Region; this test forges one.
func TestGoHeapRegionRefused(t *testing.T) {
	heap := make([]byte, 4*4096)
	r := &Region{mem: heap, numBlocks: 4, blockLen: 4096}
	tr, err := NewTransport(r, WithBackend("tcp"), WithTCPListen("127.0.0.1:0"))
	if err == nil {
		tr.Close()
		t.Fatal("a Go-heap region was accepted")
	}
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Go-heap []byte") {
		t.Fatalf("unexpected error: %v", err)
	}
	if r.users != 0 {
		t.Fatal("refused region counted as used")
	}
	// Nor a slice of a real mapping with a different geometry.
	real, err := AllocRegion(4, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer real.Free()
	shifted := &Region{mem: real.mem[4096:], numBlocks: 3, blockLen: 4096}
	if _, err := NewTransport(shifted); !errors.Is(err, ErrInvalid) {
		t.Fatalf("sub-slice of a mapping: %v", err)
	}
}

// The Go constants must equal the header's (the SWIG layer reads them from C).
func TestCodesMatchHeader(t *testing.T) {
	pairs := []struct {
		goc Code
		c   capi.Enum_SS_kvx_error
	}{
		{CodeOK, capi.KVX_OK}, {CodePermission, capi.KVX_EPERM}, {CodeUnknownPeer, capi.KVX_ENOENT},
		{CodeNoMemory, capi.KVX_ENOMEM}, {CodeBusy, capi.KVX_EBUSY}, {CodePeerExists, capi.KVX_EEXIST},
		{CodeInvalid, capi.KVX_EINVAL}, {CodeOutOfRange, capi.KVX_ERANGE}, {CodeBufferTooSmall, capi.KVX_ENOBUFS},
		{CodeNotSupported, capi.KVX_ENOTSUP}, {CodeOverflow, capi.KVX_EOVERFLOW},
		{CodeConnRefused, capi.KVX_ECONNREFUSED}, {CodeTimeout, capi.KVX_ETIMEDOUT},
		{CodeConnReset, capi.KVX_ECONNRESET}, {CodeHostUnreachable, capi.KVX_EHOSTUNREACH},
		{errnoLimit, capi.KVX_ERRNO_OFFSET}, {CodeClosed, capi.KVX_ECLOSED}, {CodeBadMetadata, capi.KVX_EBADMETA},
		{CodeVersion, capi.KVX_EVERSION}, {CodeFingerprint, capi.KVX_EFINGERPRINT},
		{CodeGeometry, capi.KVX_EGEOMETRY}, {CodePeerBroken, capi.KVX_EPEERBROKEN}, {CodeAuth, capi.KVX_EAUTH},
		{CodeConfig, capi.KVX_ECONFIG}, {CodeBackend, capi.KVX_EBACKEND}, {CodeInternal, capi.KVX_EINTERNAL},
	}
	for _, p := range pairs {
		if int(p.goc) != int(p.c) {
			t.Errorf("Go code %d (%v) != C %d", p.goc, p.goc, p.c)
		}
	}
	if int(ScopeNone) != int(capi.KVX_SCOPE_NONE) || int(ScopeRequest) != int(capi.KVX_SCOPE_REQUEST) ||
		int(ScopePeer) != int(capi.KVX_SCOPE_PEER) || int(ScopeTransport) != int(capi.KVX_SCOPE_TRANSPORT) {
		t.Error("scopes differ from the header")
	}
	if int(CancelImmediate) != int(capi.KVX_CANCEL_IMMEDIATE) || int(CancelWait) != int(capi.KVX_CANCEL_WAIT) {
		t.Error("cancel modes differ from the header")
	}
	if PeerIDMax != capi.KVX_PEER_ID_MAX || FingerprintLen != capi.KVX_FINGERPRINT_LEN {
		t.Error("limits differ from the header")
	}
	if uint(capi.KVX_VERSION_NUMBER) != capi.Kvx_version_number() {
		t.Errorf("header version %d, library %d", capi.KVX_VERSION_NUMBER, capi.Kvx_version_number())
	}
}

// PeerRails copies kvx_rail_stats through kvx_go_peer_rails: a name of
// RailNameLen bytes and five numbers per rail.
func TestRailStatsLayout(t *testing.T) {
	if RailNameLen != 96 || capi.KVX_GO_RAIL_FIELDS != 5 {
		t.Fatalf("KVX_RAIL_NAME_LEN %d, KVX_GO_RAIL_FIELDS %d: PeerRails assumes 96 and 5",
			RailNameLen, capi.KVX_GO_RAIL_FIELDS)
	}
	n := []uint64{7}
	if rc := capi.Kvx_go_peer_rails(nil, nil, n, 0, "p", 0); rc != int(capi.KVX_EINVAL) || n[0] != 7 {
		t.Errorf("NULL transport: rc %d, n %d; want KVX_EINVAL, n untouched", rc, n[0])
	}
}

// PeerState copies kvx_peer_state through kvx_go_peer_state: two names of
// KVX_GO_NAME_LEN bytes, a reason of PeerReasonLen bytes and eight numbers;
// Peers the same per peer through kvx_go_list_peers, with an id of
// PeerIDMax+1 bytes.
func TestPeerStateLayout(t *testing.T) {
	if PeerReasonLen != 160 || capi.KVX_GO_PEER_STATE_FIELDS != 8 || PeerIDMax != capi.KVX_PEER_ID_MAX {
		t.Fatalf("KVX_PEER_REASON_LEN %d, KVX_GO_PEER_STATE_FIELDS %d: PeerState assumes 160 and 8",
			PeerReasonLen, capi.KVX_GO_PEER_STATE_FIELDS)
	}
	if int(PeerUp) != int(capi.KVX_PEER_UP) || int(PeerReconnecting) != int(capi.KVX_PEER_RECONNECTING) ||
		int(PeerBroken) != int(capi.KVX_PEER_BROKEN) || int(PeerConnecting) != int(capi.KVX_PEER_CONNECTING) {
		t.Error("peer links differ from the header")
	}
	f := []uint64{7, 7, 7, 7, 7, 7, 7, 7}
	rc := capi.Kvx_go_peer_state(nil, nil, nil, f, 0, "p")
	if rc != int(capi.KVX_EINVAL) || f[0] != 7 {
		t.Errorf("NULL transport: rc %d, fields %v; want KVX_EINVAL, fields untouched", rc, f)
	}
	n := []uint64{7}
	if rc := capi.Kvx_go_list_peers(nil, nil, nil, nil, nil, n, 0, 0); rc != int(capi.KVX_EINVAL) || n[0] != 7 {
		t.Errorf("kvx_go_list_peers, NULL transport: rc %d, n %d; want KVX_EINVAL, n untouched", rc, n[0])
	}
}

// The log levels are the header's.
func TestLogLevels(t *testing.T) {
	if int(LogOff) != int(capi.KVX_LOG_OFF) || int(LogError) != int(capi.KVX_LOG_ERROR) ||
		int(LogWarn) != int(capi.KVX_LOG_WARN) || int(LogInfo) != int(capi.KVX_LOG_INFO) ||
		int(LogDebug) != int(capi.KVX_LOG_DEBUG) {
		t.Error("log levels differ from the header")
	}
}

// Stats maps kvx_stats by position: its layout must be what it assumes.
func TestStatsLayout(t *testing.T) {
	if capi.KVX_GO_STATS_SIZE != int64(8*(statsScalars+LatencyBuckets+statsCauses)) {
		t.Fatalf("sizeof(kvx_stats) %d, Stats assumes %d", capi.KVX_GO_STATS_SIZE,
			8*(statsScalars+LatencyBuckets+statsCauses))
	}
}

// PollResults copies kvx_result through kvx_go_poll_results: an id and a
// status per result, and the count.
func TestPollResultsLayout(t *testing.T) {
	n := []uint64{7}
	if rc := capi.Kvx_go_poll_results(nil, nil, n, 0, "", 0); rc != int(capi.KVX_EINVAL) || n[0] != 7 {
		t.Errorf("NULL transport: rc %d, n %d; want KVX_EINVAL, n untouched", rc, n[0])
	}
	if rc := capi.Kvx_go_poll_results(nil, nil, n, 0, "", 1000); rc != int(capi.KVX_EINVAL) || n[0] != 7 {
		t.Errorf("NULL transport, cap 1000: rc %d, n %d; want KVX_EINVAL, n untouched", rc, n[0])
	}
}
