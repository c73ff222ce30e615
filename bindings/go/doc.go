// Package kvxfer moves KV-cache blocks between hosts with one-sided writes.
//
// It is the Go binding of libkvxfer (include/kvxfer.h), implementing the
// data-plane contract of vLLM's DataTransport: a Transport owns one local
// Region of NumBlocks x BlockLen bytes, hands out opaque AgentMetadata,
// registers remote peers from theirs (AddRemotePeer), and writes local
// blocks into a peer's blocks (WriteBlocks) without the peer doing anything.
// Finished transfers are collected with Poll, or with PollResults, which
// also says why each failed one failed (Result.Err: nil when done, else an
// *Error with CodeTimeout, CodeConnReset, CodeCanceled or another code).
//
// Quick start (two transports in one process, over TCP loopback):
//
//	regA, _ := kvxfer.AllocRegion(16, 4096)
//	regB, _ := kvxfer.AllocRegion(16, 4096)
//	a, _ := kvxfer.NewTransport(regA, kvxfer.WithBackend("tcp"), kvxfer.WithTCPListen("127.0.0.1:0"))
//	b, _ := kvxfer.NewTransport(regB, kvxfer.WithBackend("tcp"), kvxfer.WithTCPListen("127.0.0.1:0"))
//	meta, _ := b.AgentMetadata()
//	_ = a.AddRemotePeer("b", meta, b.BaseAddr(), b.NumBlocks(), b.BlockLen())
//	id, _ := a.WriteBlocks("b", []uint64{0, 1}, []uint64{5, 6})
//	// Poll until id shows up in Done (or Failed).
//
// Backends: by default (WithBackend("auto")) a transport serves on every
// backend usable here at once, and each peer is given, when it is added, the
// first path in order of preference that both sides offer and that applies:
// shm on the same host, else verbs when both have a usable RDMA device, else
// tcp. WithBackend("shm,tcp") serves on exactly the backends listed.
// PeerBackend says which path a peer got; Backends lists the backends built
// into the library. PeerRails lists the rails (RDMA port pairs) a verbs
// peer's transfers are striped over. PeerState says whether a peer is up,
// or reconnecting in the background after its connection failed (option
// peer_redial_ms), or broken (peer_redial_ms=0: remove and re-add it).
//
// Memory: remote peers write into a Region at any time while its transport
// is open, so it cannot be Go-heap memory (cgo forbids C from keeping such
// pointers, and Go 1.19 has no runtime.Pinner). AllocRegion maps it with
// mmap, MapRegionFile maps a /dev/shm or hugetlbfs file, and RegionFromMmap
// takes memory the caller mapped MAP_SHARED (checked in /proc/self/maps: a
// Go []byte, like any private memory, is refused). NewTransport refuses
// anything else. Close the transports, then Free the region.
//
// Errors are *Error values carrying the C library's Code, Scope and a
// message naming the bad value; test them with errors.Is against the
// sentinels (ErrClosed, ErrUnknownPeer, ErrOutOfRange, ...).
//
// Concurrency: a Transport and a Region are safe for concurrent use by
// multiple goroutines.
//
// Building: the package links libkvxfer through pkg-config (package name
// kvxfer). For a library installed outside the default paths, set
// PKG_CONFIG_PATH to its lib/pkgconfig directory, and make the shared
// library findable at run time (LD_LIBRARY_PATH, or
// CGO_LDFLAGS="-Wl,-rpath,PREFIX/lib").
package kvxfer
