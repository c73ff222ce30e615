// The one interface between the core and the backends (tcp, verbs, shm).
// The core never includes a backend's headers; a backend never sees the
// core's peer or transfer tables. Dependency direction:
//   capi -> core -> backend/ (this interface, ops, registry) <- backends/{tcp,verbs,...}
// A backend describes itself in a registry entry (registry.h); the core walks
// the registry and never names a backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "handshake/handshake.h"
#include "util/event_loop.h"
#include "util/options.h"
#include "wire/metadata.h"

namespace kvx {

using Clock = std::chrono::steady_clock;

// The caller-owned local region.
struct Region {
    uint8_t *base = nullptr;
    uint64_t num_blocks = 0;
    uint64_t block_len = 0;
    uint64_t size() const { return num_blocks * block_len; }
};

// One run of consecutive blocks: local byte offset -> remote byte offset.
struct Run {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
};

// A transfer as a backend sees it: validated, coalesced runs.
struct Op {
    uint64_t id = 0;
    std::vector<Run> runs;
    uint64_t bytes = 0;
};

// One per peer. Backends report each submitted op exactly once through it,
// from any thread, holding none of their own locks. status is 0 or a KVX_E*
// code. progress() says the peer acknowledged something that completed no
// transfer (part of a large one): the transfer timeout measures a stall, so
// a backend that can see partial progress reports it.
class CompletionSink {
public:
    virtual void complete(uint64_t id, int status) = 0;
    virtual void progress() = 0;

protected:
    ~CompletionSink() = default;
};

// Everything a backend needs from the transport, fixed at creation.
struct BackendContext {
    Region region;
    const Options *options = nullptr;  // the transport's options (every table)
    handshake::Identity identity;      // what our metadata says about us
    EventLoop *loop = nullptr;         // the transport's event loop, running
};

// What the core knows about a peer when it asks a backend to connect.
struct PeerContext {
    std::string peer_id;
    const wire::AgentMetadata *meta = nullptr;  // decoded and checked by the core
    const wire::Section *section = nullptr;     // this backend's section of it (checked)
    Clock::time_point deadline;                 // connect + authenticate before this
    CompletionSink *sink = nullptr;
};

class BackendPeer {
public:
    virtual ~BackendPeer() = default;
    // Queue an op. Never blocks on the network. If the peer is broken or shut
    // down, the op is failed through the sink.
    virtual void submit(Op op) = 0;
    // Remove an op that has not started. true: it was dropped and will never
    // reach the sink; false: it is on the wire (or unknown) and will.
    virtual bool drop_if_not_started(uint64_t id) = 0;
    // True once the connection failed; later submits fail fast.
    virtual bool broken() const = 0;
    // Break the connection without waiting (timeout path); pending ops fail.
    virtual void abort(int status) = 0;
    // Fail what is pending, close connections, release resources. After
    // return the sink is never called again for this peer.
    virtual void shutdown() = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual const char *name() const = 0;
    // This backend's section of the transport's metadata.
    virtual wire::Section describe() const = 0;
    // Connect and authenticate within pc.deadline; throws Error on failure.
    virtual std::unique_ptr<BackendPeer> connect(const PeerContext &pc) = 0;
    // Stop serving: after return no byte lands in the region.
    virtual void shutdown() = 0;
};

}  // namespace kvx
