package kvxfer_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"kvxfer.dev/kvxfer"
)

// silentPeer is the metadata of a transport whose advertised address
// accepts connections and never answers.
func silentPeer(t *testing.T) (meta []byte, peer *kvxfer.Transport) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	peer = newTransport(t, testBlocks, 0, kvxfer.WithTCPAdvertise(l.Addr().String()))
	meta, err = peer.AgentMetadata()
	if err != nil {
		t.Fatal(err)
	}
	return meta, peer
}

func TestAddRemotePeerAsync(t *testing.T) {
	src := newTransport(t, testBlocks, 1)
	dst := newTransport(t, testBlocks, canary)
	meta, _ := dst.AgentMetadata()
	r, err := src.AddRemotePeerAsync("dst", meta, dst.BaseAddr(), dst.NumBlocks(), dst.BlockLen(), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	id, err := src.WriteBlocks("dst", []uint64{1}, []uint64{2})
	if err != nil {
		t.Fatal(err)
	}
	if failed := waitAll(t, src, "", id); len(failed) != 0 {
		t.Fatal("transfer failed")
	}
	// checked at once
	if _, err := src.AddRemotePeerAsync("dst", meta, dst.BaseAddr(), dst.NumBlocks(), dst.BlockLen(), false); !errors.Is(err, kvxfer.ErrPeerExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := src.AddRemotePeerAsync("x", meta[:10], dst.BaseAddr(), dst.NumBlocks(), dst.BlockLen(), false); !errors.Is(err, kvxfer.ErrBadMetadata) {
		t.Fatalf("bad metadata: %v", err)
	}
	s, err := src.Stats("dst")
	if err != nil {
		t.Fatal(err)
	}
	if s.TransfersDone != 1 || s.BytesDone != testLen || s.Connects != 1 || s.LatencyCount != 1 || s.Peers != 1 {
		t.Fatalf("stats %+v", s)
	}
	var sum uint64
	for _, n := range s.LatencyBuckets {
		sum += n
	}
	if sum != 1 || s.LatencyNsP50 == 0 || s.LatencyNsP50 > s.LatencyNsMax*2 {
		t.Fatalf("histogram: sum %d, p50 %d, max %d", sum, s.LatencyNsP50, s.LatencyNsMax)
	}
	if _, err := src.Stats("nobody"); !errors.Is(err, kvxfer.ErrUnknownPeer) {
		t.Fatalf("stats of an unknown peer: %v", err)
	}
}

func TestAddRemotePeerContextCancelsSilentPeer(t *testing.T) {
	src := newTransport(t, testBlocks, 1)
	meta, peer := silentPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := src.AddRemotePeerContext(ctx, "silent", meta, peer.BaseAddr(), peer.NumBlocks(), peer.BlockLen())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 2*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(t0))
	}
	if _, err := src.WriteBlocks("silent", []uint64{0}, []uint64{0}); !errors.Is(err, kvxfer.ErrUnknownPeer) {
		t.Fatalf("write after cancel: %v", err)
	}
}

func TestAddRemotePeerAsyncSupersededAndRemoved(t *testing.T) {
	src := newTransport(t, testBlocks, 1, kvxfer.WithTimeouts(time.Second, 10*time.Second))
	meta, peer := silentPeer(t)
	dst := newTransport(t, testBlocks, canary)
	good, _ := dst.AgentMetadata()
	slow, err := src.AddRemotePeerAsync("p", meta, peer.BaseAddr(), peer.NumBlocks(), peer.BlockLen(), false)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := src.AddRemotePeerAsync("p", good, dst.BaseAddr(), dst.NumBlocks(), dst.BlockLen(), true)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-slow.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the superseded registration did not end at once")
	}
	if !errors.Is(slow.Err(), kvxfer.ErrCanceled) {
		t.Fatalf("superseded: %v", slow.Err())
	}
	if err := fast.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// remove cancels a pending one
	r, err := src.AddRemotePeerAsync("q", meta, peer.BaseAddr(), peer.NumBlocks(), peer.BlockLen(), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.RemoveRemotePeer("q"); err != nil {
		t.Fatal(err)
	}
	<-r.Done()
	if !errors.Is(r.Err(), kvxfer.ErrCanceled) {
		t.Fatalf("removed: %v", r.Err())
	}
	// close fails one with ErrClosed
	r, err = src.AddRemotePeerAsync("z", meta, peer.BaseAddr(), peer.NumBlocks(), peer.BlockLen(), false)
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	<-r.Done()
	if !errors.Is(r.Err(), kvxfer.ErrClosed) {
		t.Fatalf("closed: %v", r.Err())
	}
}

func TestAddRemotePeerAsyncRefused(t *testing.T) {
	src := newTransport(t, testBlocks, 1)
	gone := newTransport(t, testBlocks, 0)
	meta, _ := gone.AgentMetadata()
	base, nb, bl := gone.BaseAddr(), gone.NumBlocks(), gone.BlockLen()
	gone.Close()
	r, err := src.AddRemotePeerAsync("gone", meta, base, nb, bl, false)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Wait(context.Background())
	var ke *kvxfer.Error
	if !errors.As(err, &ke) || ke.Scope != kvxfer.ScopePeer || ke.Message == "" {
		t.Fatalf("refused: %v", err)
	}
	s, _ := src.Stats("")
	if s.ConnectFailures != 1 {
		t.Fatalf("connect failures %d", s.ConnectFailures)
	}
}

func TestLatencyBucketBounds(t *testing.T) {
	for i := 0; i+1 < kvxfer.LatencyBuckets; i++ {
		lo, hi := kvxfer.LatencyBucketBounds(i)
		lo2, _ := kvxfer.LatencyBucketBounds(i + 1)
		if lo >= hi || hi != lo2 {
			t.Fatalf("bucket %d: [%d, %d), next from %d", i, lo, hi, lo2)
		}
	}
	if _, hi := kvxfer.LatencyBucketBounds(kvxfer.LatencyBuckets - 1); hi != 0 {
		t.Fatal("last bucket has an upper bound")
	}
	if lo, hi := kvxfer.LatencyBucketBounds(17); lo != 18 || hi != 20 {
		t.Fatalf("bucket 17: [%d, %d), want [18, 20)", lo, hi)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("LatencyBucketBounds(LatencyBuckets) did not panic")
		}
	}()
	kvxfer.LatencyBucketBounds(kvxfer.LatencyBuckets)
}
