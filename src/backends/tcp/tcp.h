// tcp backend internals. Every socket lives on the transport's event loop
// (util/event_loop.h), so the thread count does not grow with peers or
// streams: the listener and each accepted connection (TcpServer, TcpConn:
// handshake, then frames read straight into the region) and each outbound
// stream (TcpPeer: frames written from the region, acks read). Only the
// connect and handshake of an outbound stream block, in the thread that adds
// the peer, bounded by its deadline.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend_api/backend.h"
#include "backend_api/ops.h"
#include "backends/tcp/tcp_aead.h"
#include "backends/tcp/tcp_wire.h"
#include "handshake/engine.h"
#include "util/event_loop.h"
#include "util/net.h"

namespace kvx::tcp {

class TcpServer;

// A frame carries the parts of several transfers, each whole, while it stays
// within one chunk of the target's reads; its ack acknowledges all of them.
constexpr uint64_t kMergeBytes = 256 << 10;
constexpr size_t kMergeSegs = 64;

// Where an accepted connection comes from, for the per-source cap: the
// address (an IPv4-mapped form for IPv4), without the port.
using SourceAddr = std::array<uint8_t, 16>;
struct SourceHash {
    size_t operator()(const SourceAddr &a) const noexcept;
};

// Keepalive and TCP_USER_TIMEOUT derived from transfer_timeout_ms
// (kernel_give_up_ms, backend.h): a peer host that vanishes without a FIN
// releases the connection, and an outage shorter than the timeout does not.
void set_liveness(int fd, uint64_t timeout_ms);

// One accepted connection, on the loop thread: the handshake (HELLO ->
// CHALLENGE, AUTH -> ACCEPT, or REFUSE) before a deadline, then frames whose
// header and segment table are validated before their payload is read into
// the region, and the acknowledgements, written without blocking.
class TcpConn final : private EventLoop::Source {
public:
    TcpConn(TcpServer &server, net::Fd fd, const SourceAddr &src);
    // Attaches to the loop and arms the handshake deadline; false when the
    // loop is stopped.
    bool start(Clock::time_point deadline);
    // Never called again once this returns; the socket closes with the object.
    void stop();
    bool authenticated() const { return state_ >= State::frame_head; }
    const SourceAddr &source() const { return src_; }
    int fd() const { return fd_.get(); }
    // The session and stream number it joined (kFrameJoin); session 0: none.
    uint64_t session() const { return joined_; }
    uint32_t stream() const { return stream_; }
    // Its place in the server's queue of unauthenticated connections, oldest first.
    std::list<TcpConn *>::iterator queued;

private:
    enum class State { hello, auth, refused, frame_head, frame_segs, payload, probe, payload_tag };
    enum Timer { kDeadline = 0, kProbe = 1 };  // on_timer's tags
    enum class Next { more, wait, close };  // after one read: read again, wait for the loop, close
    void on_event(int tag, uint32_t events) override;
    void on_timer(int tag) override;
    Next read_turn();
    Next read_handshake();
    Next answer();
    bool on_authenticated(const handshake::Step &accepted);
    Next read_head();
    const uint8_t *open_head();
    Next control(const uint8_t *body);
    Next next_head();
    void start_payload(const uint8_t *segs);
    Next read_payload();
    // Staged records (kFlagAeadRecords): one record is read aside into
    // stage_, opened there, and only then lands, by a kernel copy.
    Next read_record();
    Next land_record();
    Next probe_record();
    Next start_probe();
    ssize_t recv_stamped(iovec *v, size_t n);
    enum class Landing { done, stopped, failed };
    Landing land_kernel(const uint8_t *src, size_t n, Clock::time_point since);
    void start_staging();
    bool decrypt_chunk(const iovec *chunk, size_t n);
    Next payload_landed(size_t r, size_t want);
    Next drained();
    bool waited_since(Clock::time_point since);
    Next stale_landing(const iovec *chunk, size_t cnt);
    void probe_over();
    Next read_tag();
    Next frame_done();
    ssize_t read_small(uint8_t *dst, size_t n);
    Next land_ahead();
    bool reset_before(size_t landing);
    void land_from(const uint8_t *src, size_t n, const iovec *iov);
    size_t ahead() const { return ahead_len_ - ahead_at_; }
    bool flush();
    void compact_out();
    void update_interest();

    TcpServer &server_;
    const BackendContext &ctx_;
    net::Fd fd_;
    SourceAddr src_;
    uint64_t token_ = 0, deadline_ = 0;
    uint32_t events_ = 0;
    State state_ = State::hello;
    bool fence_ = false;  // kFlagFence agreed: control frames are valid
    uint64_t joined_ = 0;  // the session it joined (kFrameJoin), 0 before
    uint32_t stream_ = 0;
    size_t have_ = 0, need_ = 0;  // of the handshake message or frame head being read
    handshake::Bytes msg_{};
    handshake::Responder::Session session_;
    std::vector<uint8_t> head_;  // frame header + segment table
    FrameHeader frame_;
    std::vector<iovec> iov_;  // the frame's payload in the region
    size_t iov_at_ = 0;
    std::vector<uint8_t> out_;  // handshake answers, acks: not yet sent
    size_t out_at_ = 0;
    // tcp.protection=aead: frames arrive as records (rx_), acks leave as records (tx_).
    std::unique_ptr<Aead> rx_, tx_;
    std::vector<uint8_t> plain_;  // the opened frame head
    std::array<uint8_t, kTagLen> tag_{};
    Clock::time_point last_landed_{};  // of the last chunk of payload (staged: the look before the last record landed)
    size_t unchecked_ = 0;             // payload landed since the last look for a reset
    size_t payload_left_ = 0;          // of the frame being read
    uint64_t acked_unsent_ = 0;        // payload of the frames whose acks wait in out_
    // Read ahead: the readv that ends a payload also takes the bytes expected
    // next (its tag, the next head as large as this one's), so a stream of
    // frames costs one read each. Bytes past a shorter head are the next
    // payload's first (at most a block): they land from here. Consumed in
    // the same turn they were read in.
    std::vector<uint8_t> ahead_;
    size_t ahead_at_ = 0, ahead_len_ = 0;
    size_t tail_ = 0;  // bytes to read ahead at the end of this payload
    // Stale payload read aside (State::probe): it lands, at probe_timer_,
    // where probe_iov_ says unless the connection was reset meanwhile.
    std::vector<uint8_t> aside_;
    size_t aside_len_ = 0, probe_want_ = 0;
    std::array<iovec, 64> probe_iov_{};  // a chunk's iovecs (at most kChunkIovs)
    uint64_t probe_timer_ = 0;
    Clock::time_point probe_due_{};  // when the probe's wait ends (probe_over: later than that, it says nothing)
    int lowat_ = 1;  // SO_RCVLOWAT: wake for a payload only once this much has arrived
    // Staged records: the record being read (its ciphertext and tag), then
    // its plaintext until it lands; the pipe the landing goes through.
    bool staged_ = false;
    struct FreeAligned {
        void operator()(uint8_t *p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, FreeAligned> stage_;  // page-aligned: its pages are spliced whole
    size_t stage_have_ = 0, record_len_ = 0;
    size_t record_at_ = 0;  // of the opened record, bytes landed
    // When the bytes read last arrived (CLOCK_REALTIME ns, the kernel's
    // receive timestamp): a record lands at once only while they are fresh.
    int64_t arrived_ns_ = 0;
    net::Fd pipe_r_, pipe_w_;
    void wake_at(size_t bytes);
};

// The listener: accepts on the loop thread and admits connections to the
// handshake so that no flood of unauthenticated connections locks peers out:
// each has tcp.handshake_timeout_ms to authenticate; a source address holds
// at most tcp.max_handshakes_per_source of them (more are closed at once);
// past tcp.max_handshakes in all, the oldest is shed for the newest, so an
// idle flood cannot starve a peer that completes its handshake promptly.
// Authenticated connections are at most tcp.max_connections.
class TcpServer final : private EventLoop::Source {
public:
    explicit TcpServer(const BackendContext &ctx);
    ~TcpServer();
    const std::vector<net::Endpoint> &advertised() const { return advertised_; }
    // After return no byte lands in the region.
    void shutdown();

    // For TcpConn, on the loop thread.
    const BackendContext &ctx() const { return ctx_; }
    handshake::Responder &responder() { return responder_; }
    // A connection proved itself; false (close it) when tcp.max_connections are open.
    bool authenticated(TcpConn &c);
    void close(TcpConn &c);  // frees c
    // c is stream `stream` of `session` (kFrameJoin); false when that stream
    // is open already or was fenced: close c.
    bool join(TcpConn &c, uint64_t session, uint32_t stream);
    // Closes stream `stream` of `session` (kFrameFence, from another stream
    // of the session), or bars it from joining later; false when the session
    // holds kMaxFenced bars already (close the fencing connection).
    bool fence(uint64_t session, uint32_t stream);
    static constexpr size_t kMaxFenced = 1024;  // bars per session; an initiator numbers at most this many streams

private:
    void on_event(int tag, uint32_t events) override;
    void on_timer(int tag) override;
    void admit(net::Fd fd, const SourceAddr &src);
    void forget_handshake(TcpConn &c);
    void pause_accepting();

    BackendContext ctx_;
    handshake::Responder responder_;
    net::Fd listen_fd_;
    std::vector<net::Endpoint> advertised_;
    uint64_t listen_tok_ = 0, resume_timer_ = 0;
    // The loop thread's.
    std::unordered_map<TcpConn *, std::unique_ptr<TcpConn>> conns_;
    std::list<TcpConn *> handshaking_;  // unauthenticated connections, oldest first
    std::unordered_map<SourceAddr, size_t, SourceHash> per_source_;  // of them, by source address
    // Streams that joined a session, by (session, stream); null: fenced
    // before it joined (it may not join). Bars go with the session's last stream.
    std::map<std::pair<uint64_t, uint32_t>, TcpConn *> streams_;
    size_t bars_ = 0;  // of streams_, the null ones
    static constexpr size_t kMaxBars = 65536;  // in all sessions: a bound on what authenticated peers can pin

    size_t authenticated_ = 0;
    const size_t max_handshakes_, max_per_source_, max_connections_;
    const std::chrono::milliseconds handshake_timeout_;
    uint64_t shed_ = 0, refused_ = 0;  // counted for the log
    bool stopped_ = false;
};

// The frames of a batch of parts, written to a non-blocking socket over as
// many sendmsg calls as it takes. A part's frames are consecutive; its last
// frame asks for the acknowledgement, under its sequence number. Small parts
// share frames (kMergeBytes, kMergeSegs, no overlap): one frame, one readv
// and one ack for several transfers (docs/wire-format.md). Each frame's
// header and segment table are contiguous and travel in one iovec before the
// frame's data.
class FrameWriter {
public:
    explicit FrameWriter(const Region &r) : region_(r) {}
    // From now on every frame leaves as sealed records (tcp.protection=aead);
    // staged: payload records of at most kSealedRecordMax (kFlagAeadRecords).
    void protect(const std::array<uint8_t, handshake::kKeyLen> &key, AeadImpl impl, bool staged);
    bool idle() const { return parts_.empty() && pre_.empty(); }
    // Adds a part to the next batch (only while idle, before write()).
    void add(Part p, uint64_t seq);
    // A control frame (kFlagFence agreed) that leaves before the parts of the
    // next batch (only while idle, before add()).
    void control(const Control &c);
    // 1: the batch is out; 0: the socket would block (call again when it is
    // writable); -errno: the socket failed.
    int write(int fd);
    void clear();

private:
    void fill();
    bool merges(const Part &q, size_t nseg, uint64_t total) const;
    void next_part();
    int write_sealed(int fd);
    int write_pre(int fd);
    bool seal_more();
    void seal_head();

    Region region_;
    std::vector<uint8_t> pre_;  // control frames, encoded (and sealed): out before the parts
    size_t pre_at_ = 0;
    std::vector<Part> parts_;
    std::vector<uint64_t> seqs_;
    size_t pi_ = 0, ri_ = 0;  // framing cursor: part, run, and what is left of the run
    Run run_{0, 0, 0};
    std::vector<uint8_t> head_;
    std::vector<iovec> iov_;
    std::vector<std::pair<size_t, size_t>> heads_;  // iovec index, offset in head_
    std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // the open frame's segments: remote offset, length
    size_t iov_at_ = 0;
    // Sealed mode: the frames of iov_ become records in stage_, a chunk at a time.
    std::unique_ptr<Aead> tx_;
    std::unique_ptr<uint8_t[]> stage_;  // uninitialised: pages are touched on the first sealed send
    size_t stage_len_ = 0, stage_at_ = 0, next_head_ = 0;
    bool in_payload_ = false;  // a payload record is open
    bool staged_ = false;      // kFlagAeadRecords: records of at most kSealedRecordMax
    size_t record_bytes_ = 0;  // in the open payload record
};

// An authenticated outbound connection and, when protected, its keys.
struct Authenticated {
    net::Fd fd;
    std::optional<handshake::Keys> keys;
    uint32_t flags = 0;  // agreed in the handshake (kFlagAead, kFlagAeadRecords, kFlagFence)
    size_t rail = 0;     // of TcpPeer's rails
};

// A path to a peer: a local interface's address paired with one of the
// peer's (tcp.interfaces), or, without it, the peer's addresses in order.
struct TcpRail {
    std::string name;                   // "eth1 10.0.1.5 -> 10.0.1.7:4000", or "" for the one path
    std::optional<net::Endpoint> from;  // the local address its streams bind to
    std::vector<net::Endpoint> to;      // tried in order
};

// A part sent on a stream, waiting for its acknowledgement. With fencing,
// its runs too: a stream taken out has them sent again on another.
struct Awaiting {
    OpRef op;
    uint64_t seq = 0;
    uint64_t bytes = 0;
    Runs runs;
};

// The streams to one peer. Callers queue parts under mu_ and wake the loop;
// the loop thread alone writes frames and reads acknowledgements, and
// completes transfers with no lock held.
//
// With kFlagFence agreed and more than one stream, a stream that fails (a
// reset, an error, or its kernel resending into silence while another stream
// is answered) is taken out: reset, and its parts queued again at the front.
// Every other stream sends a FENCE naming it before it takes any more parts,
// so the target closes it, dropping what it holds unlanded, before a part it
// owed lands again (docs/semantics.md, "Rails"). Its rail is dialled again in
// the background. Without fencing, or with no stream left, the peer fails.
class TcpPeer final : public BackendPeer {
public:
    TcpPeer(const BackendContext &ctx, const PeerContext &pc, std::vector<TcpRail> rails,
            std::vector<Authenticated> conns);
    ~TcpPeer() override;
    // Puts the streams on the loop; throws Error(KVX_ECLOSED) when it is stopped.
    void start();
    void submit(Op op) override;
    bool broken() const override { return broken_.load(); }
    void abort(int status) override;
    void shutdown() override;
    uint64_t network_silent_rto_us() override;
    void rails(std::vector<RailStats> *out) const override;

private:
    struct Stream final : EventLoop::Source {
        Stream(TcpPeer &p, net::Fd f, const Region &r) : peer(p), fd(std::move(f)), writer(r) {}
        void on_event(int, uint32_t events) override { peer.on_stream(*this, events); }
        TcpPeer &peer;
        net::Fd fd;
        uint64_t token = 0;
        uint32_t events = 0;
        FrameWriter writer;
        std::deque<Awaiting> awaiting;
        std::array<uint8_t, kAckLen + kTagLen> ack_part{};  // an ack cut by a recv
        size_t ack_have = 0;
        std::unique_ptr<Aead> rx;  // tcp.protection=aead: acks arrive sealed
        bool idle = true;  // found the queue empty: takes more only when woken (under mu_)
        uint32_t index = 0;   // its number in the session (kFrameJoin)
        size_t rail = 0;
        size_t fenced = 0;    // of dead_, the streams it has sent a FENCE for
        bool live = true;     // false once taken out (the loop thread's)
        Clock::time_point nudged{};  // its last NOP
    };
    // The loop's periodic look at the streams (TCP_INFO) while fencing.
    struct Watch final : EventLoop::Source {
        explicit Watch(TcpPeer &p) : peer(p) {}
        void on_event(int, uint32_t) override {}
        void on_timer(int) override { peer.watch(); }
        TcpPeer &peer;
        uint64_t timer = 0;
    };
    // Telemetry of a rail, under stats_mu_.
    struct RailState {
        RailStats stats;
        size_t live = 0;  // its streams in use
        bool dialling = false;  // a redial is under way
    };
    void pump();
    void on_stream(Stream &s, uint32_t events);
    void send_more(Stream &s);
    bool take_batch(Stream &s);
    bool read_acks(Stream &s);
    void take_acks(Stream &s, uint8_t *buf, size_t have, size_t *used, CompletionBatch &done);
    void want_writable(Stream &s, bool on);
    uint32_t fail_on_loop(int status, CompletionBatch &victims);
    static void settle(uint32_t us);
    void fail_now(int status);
    // A stream failed (why): taken out when fencing allows, else the peer fails.
    void lose_stream(Stream &s, const std::string &why);
    size_t live_streams() const;
    void add_stream(Authenticated c, bool join);
    void watch();
    void nudge(Stream &s);
    void arm_watch();
    void redial(size_t rail);
    void dial_loop();
    void rail_changed(size_t rail, int delta_live, bool failed);
    static constexpr std::chrono::microseconds kSettleMin{1000}, kSettleMax{200000};

    EventLoop *loop_;
    const BackendContext ctx_;
    wire::AgentMetadata meta_;  // with fencing: the peer's, for redials
    wire::Section section_;
    PeerContext pc_;  // for redials (with fencing: pointing at meta_ and section_)
    Region region_;
    std::string peer_id_;
    CompletionSink *sink_;
    std::vector<TcpRail> rail_paths_;
    std::vector<std::unique_ptr<Stream>> streams_;  // the loop thread's once started (dead ones stay, closed)
    std::mutex mu_;  // guards queue_, stop_, idle_streams_, kicked_, alive_, next_seq_
    std::deque<Part> queue_;
    bool stop_ = false;
    size_t idle_streams_ = 0;       // streams a submit must wake
    size_t live_ = 0;               // streams in use (under mu_ for submit's split; the loop thread changes it)
    bool kicked_ = false;           // a pump is posted and has not started yet
    std::shared_ptr<void> alive_;   // a posted pump runs only while this lives
    uint64_t next_seq_ = 1;
    std::atomic<bool> broken_{false};
    std::atomic<int> break_status_{0};
    std::once_flag shutdown_once_;
    int aborting_ = 0;  // abort() calls under way, under mu_; shutdown() waits for them
    std::condition_variable aborted_;
    // Fencing (kFlagFence agreed on every stream, and more than one).
    bool fence_ = false;
    uint64_t session_ = 0;
    uint32_t next_index_ = 0;
    std::vector<uint32_t> dead_;  // streams taken out, in order (the loop thread's)
    Watch watch_{*this};
    // Redials of rails taken out: one thread at a time, joined by shutdown.
    struct Dial {
        size_t rail;
        Clock::time_point due;
        int attempt;
    };
    std::mutex dial_mu_;  // guards dial_queue_, dialler_, dial_stop_ and RailState::dialling
    std::vector<Dial> dial_queue_;
    std::condition_variable dial_cv_;
    std::thread dialler_;
    bool dial_stop_ = false;
    std::atomic<bool> dial_cancel_{false};  // calls off a connect under way
    mutable std::mutex stats_mu_;
    std::vector<RailState> rail_state_;
};

// Opens and authenticates the streams to a peer; throws Error.
std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc);

// tcp.interfaces: none when unset, {"all"}, or the names listed, each of an
// interface of this host; throws Error(KVX_EINVAL) naming one that is not.
std::vector<std::string> interfaces_option(const Options &o);

// tcp's part of the handshake: the protection tcp.protection offers and
// requires (kFlagAead, tcp_wire.h).
handshake::DataPathOptions data_path_options(const Options &o);

}  // namespace kvx::tcp
