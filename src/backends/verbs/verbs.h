// verbs backend internals (see README.md in this directory for the design):
//   Device     - one rail: an RDMA port, its PD and the one MR over the
//                whole region registered on its device.
//   CmId, CmEvent and friends - rdma_cm plumbing both sides share.
//   VerbsPeer  - the initiator side towards one peer: per rail pair a CQ and
//                RC QPs, the software queue behind the send queues, the
//                striping of transfers over rails and their failover.
// The target side (listener, passive QPs) is verbs_listener.h. The
// transport's EventLoop (util/event_loop.h) serves the listener's rdma_cm
// events and every peer's CQ and cm events; the handshake is the engine's
// (handshake/engine.h), the transfer bookkeeping (OpState, Part) from
// backend_api/ops.h.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend_api/backend.h"
#include "backend_api/ops.h"
#include "backends/verbs/verbs_options.h"
#include "handshake/engine.h"
#include "util/event_loop.h"
#include "util/net.h"

namespace kvx::verbs {

// verbs' part of the handshake: it defines no flags.
inline const handshake::DataPathOptions kDataPath{};

// What the address discovery found: where to listen and what to advertise.
struct Placement {
    std::string device;
    uint8_t port = 0;
    int gid_index = -1;
    std::string netdev;
    sockaddr_storage addr{};  // port 0
    uint8_t prefix = 0;       // length of addr's subnet prefix (0: unknown)
    std::string how;          // for the log
};

// Which ports to serve: verbs.devices, or verbs.device/verbs.port (one rail).
struct Selection {
    // (device, port 0 = every ACTIVE port of it); empty: every device
    std::vector<std::pair<std::string, int>> devices;
    int port = 0;        // with devices empty: this port of any device (verbs.port alone)
    bool one = false;    // verbs.device or verbs.port set: the first match only
    int gid_index = -1;  // verbs.gid_index, -1 = any
};

// Every ACTIVE port (honouring sel) that has an IP address: from its GID
// table (RoCE: IPv4-mapped GIDs, RoCE v2 first) or from its netdev (IB with
// IPoIB, iWARP). Empty with *why when there is none.
std::vector<Placement> find_placements(const Selection &sel, std::string *why);
// The subnet prefix length of one of our addresses, from its interface
// (0: not found).
uint8_t prefix_of(const sockaddr_storage &addr);
// Parses verbs.devices ("all" or "mlx5_0,mlx5_2:1"); throws KVX_EINVAL.
std::vector<std::pair<std::string, int>> parse_devices(const std::string &text);

// Most rails a transport serves and advertises.
constexpr size_t kMaxRails = 16;
// Most registrations (slices, verbs.mr_slice_bytes) of the region per rail.
constexpr size_t kMaxSlices = 256;

// The device and the registration, shared by the backend and its peers: the
// PD lives until the last QP on it is gone, the MR only until backend shutdown.
struct Device {
    ibv_context *ctx = nullptr;  // librdmacm's context: never closed here
    std::string name;
    uint8_t port = 0;
    ibv_device_attr attr{};
    ibv_port_attr port_attr{};
    ibv_pd *pd = nullptr;
    // The region's registration: slices of slice_len bytes from its start
    // (the last one shorter), one when the region is not sliced.
    std::vector<ibv_mr *> mrs;
    std::vector<uint32_t> lkeys;  // theirs, kept after deregister(): a late post fails cleanly
    uint64_t slice_len = 0;
    uint64_t max_msg = 0;   // largest message one WR may carry
    Region region;
    sockaddr_storage addr{};  // our RDMA address (port 0): source of outgoing connections
    uint8_t prefix = 0;       // addr's subnet prefix length, for pairing rails (0: unknown)
    size_t index = 0;         // which of the backend's rails
    std::string label;        // "rxe0:1" for logs and telemetry

    Device() = default;
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
    ~Device();
    // Queries port p of ctx; false with *why unless it is ACTIVE.
    bool open(ibv_context *c, uint8_t p, std::string *why);
    // Whether the device says the port is not ACTIVE now (false when it
    // cannot say).
    bool port_down() const;
    // Whether addr is still a GID of the port (RoCE: its IPv4-mapped or
    // IPv6 GID; true for InfiniBand, whose GIDs do not follow addresses, and
    // when the table cannot be read): after a GID change an address that
    // left the port cannot carry this rail's connections.
    bool has_addr_gid() const;
    // MRs over exactly r, slice bytes each (whole blocks; r.size() or more:
    // one), writable by peers, in a PD of their own; false with *why.
    bool register_region(const Region &r, uint64_t slice, std::string *why);
    uint32_t lkey_at(uint64_t off) const { return lkeys[off / slice_len]; }
    void deregister();  // after this nothing can write into the region
};

// One entry of verbs.rail_map: a peer's rails whose address lies in
// addr/prefix go with our rail(s) of device (and port, 0: any).
struct RailMapEntry {
    std::string device;
    int port = 0;
    net::Endpoint addr;
    unsigned prefix = 0;
};
// Parses verbs.rail_map ("" -> none); throws Error(KVX_EINVAL) naming the
// bad entry.
std::vector<RailMapEntry> parse_rail_map(const std::string &text);

struct PeerConfig {
    std::vector<RailMapEntry> rail_map;  // verbs.rail_map; empty: pair by subnet
    uint32_t qps = 1;
    uint32_t sq_depth = 0;      // WRs per send queue the data path uses
    uint32_t signal_every = 0;  // at least one signalled WR per this many
    // A transfer submitted while at least this many bytes stay in flight
    // behind the next completion waits for it, and is posted with the others
    // that waited as one chain ending in one signalled WR (0: post at once).
    uint64_t post_batch_bytes = 0;
    // A rail that is down is dialled again this long after it went down,
    // then at doubling intervals up to 8 times this (peer_redial_ms; 0: never).
    uint64_t redial_ms = 0;
    uint64_t connect_timeout_ms = 0;  // one such attempt's connect and handshake
};

// What every rail's device allows (the smallest queue of them).
PeerConfig peer_config(const std::vector<std::shared_ptr<Device>> &rails, const Options &o);

// The device, port and GID the verbs.* options ask for.
Selection selection(const Options &o);

// ---- rdma_cm helpers both sides use (verbs_cm.cpp)

// Destroys a cm_id and its QP, if it has one.
void destroy_cm_id(rdma_cm_id *id);
struct CmIdDeleter {
    void operator()(rdma_cm_id *id) const { destroy_cm_id(id); }
};
using CmId = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
// A QP of ours not yet handed to its cm_id.
struct QpDeleter {
    void operator()(ibv_qp *qp) const { ibv_destroy_qp(qp); }
};
using OwnedQp = std::unique_ptr<ibv_qp, QpDeleter>;

// A CM event, copied out of the channel and acknowledged.
struct CmEvent {
    rdma_cm_id *id = nullptr;
    rdma_cm_event_type type{};
    int status = 0;
    std::vector<uint8_t> pdata;  // private data of a connection event
};
// The next event of a non-blocking channel; false when there is none (errno says why).
bool next_cm_event(rdma_event_channel *ch, CmEvent *out);
// DISCONNECTED and the other events after which a connection is gone.
bool ends_connection(rdma_cm_event_type t);
// Maps a CM event that ended a connect attempt to a KVX_E* code.
int connect_failure_code(rdma_cm_event_type type, int status);

// Connect/accept parameters of the write-only protocol carrying one handshake
// message: no RDMA READ/atomic resources either way.
rdma_conn_param conn_param(const void *pdata, size_t len);
// An RC QP with send_wr send-queue and recv_wr receive-queue slots of one
// SGE, both queues on cq.
ibv_qp_init_attr rc_qp_attr(ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr);

// Liveness of a connection whose initiator host may vanish without a DREQ:
// the target sends a zero-length SEND on each established passive QP every
// half transfer_timeout_ms (one at a time), and closes the connection when
// the send fails (the initiator's NIC stopped acknowledging: retries
// exhausted). The initiator keeps kProbeRecvs zero-length receives posted
// on each QP for them, so a probe completes at once. An initiator without
// receives (before 0.4.2) answers with RNR NAKs, retried forever (rnr_retry
// 7): alive too, just slower to confirm.
constexpr uint32_t kProbeRecvs = 2;

// Work request ids and event tags the initiator's files share.
constexpr uint64_t kDrainWrId = UINT64_MAX;     // a rail's or shutdown's drain marker WR
constexpr uint64_t kRecvWrId = UINT64_MAX - 1;  // a receive kept for the target's liveness probes
enum { kTagCm = 0, kTagCq0 = 1 };                // VerbsPeer's loop sources: rail r's CQ is kTagCq0 + r
constexpr int kCqPollBatch = 32;                 // completions per ibv_poll_cq

// One rail as a peer's metadata advertises it.
struct RemoteRail {
    net::Endpoint cm;  // its rdma_cm listener
    // Of the region's registration on that rail's device: one per slice
    // (SectionInfo::slice_len), one when the region is not sliced.
    std::vector<uint32_t> rkeys;
};

// Which local rail carries which of the peer's rails: every remote rail
// goes with the least used local rail whose subnet holds its address; a
// remote rail no local one shares a subnet with is left out (*notes says
// which). When no rail pairs so and route is set, local rail 0 goes with
// remote rail 0 and rdma_cm's routing decides (a routed fabric): a pair it
// would reach through another device is refused at connect. (local,
// remote) indexes.
std::vector<std::pair<size_t, size_t>> pair_rails(const std::vector<std::shared_ptr<Device>> &local,
                                                  const std::vector<RemoteRail> &remote, std::string *notes,
                                                  const std::vector<RailMapEntry> &map = {}, bool route = true);

class VerbsPeer;
// The backend's peers, so that a port event reaches those using the port.
// Loop thread only: peers join in start() and leave in shutdown(), both
// through EventLoop::call.
struct PeerSet {
    std::vector<VerbsPeer *> peers;
};

// Initiator side towards one peer. Created connected (dial), then start()ed.
// Its transfers are striped over every rail pair that connected; a rail that
// fails is taken out, drained, and what it owed is posted again on the
// others (README.md, "Rails").
class VerbsPeer final : public BackendPeer, private EventLoop::Source {
public:
    // Connects and authenticates every rail pair's QPs before pc.deadline;
    // throws Error when none connects (or on an authentication failure).
    static std::unique_ptr<VerbsPeer> dial(const BackendContext &ctx, const std::vector<std::shared_ptr<Device>> &rails,
                                           EventLoop *loop, const PeerConfig &cfg, const PeerContext &pc,
                                           std::shared_ptr<PeerSet> set);
    ~VerbsPeer() override;

    // Hands CQ and cm events to the event loop, joins the backend's peer
    // set; false if the loop is stopped.
    bool start();

    void submit(Op op) override;
    bool broken() const override { return broken_flag_.load(std::memory_order_acquire); }
    void abort(int status) override;
    void shutdown() override;
    void rails(std::vector<RailStats> *out) const override;
    // The port of a local rail went down (IBV_EVENT_PORT_ERR): the rail
    // pairs on it are taken out. Loop thread.
    void port_down(const Device *dev, const char *why);
    // The port of a local rail is ACTIVE again, or its address is back
    // among its GIDs: the rail pairs on it that are down are dialled again
    // now rather than at their next turn. Loop thread.
    void port_up(const Device *dev);

private:
    struct Qp;
    // One QP's connect: what the handshake needs, and until when. At the
    // add, on the peer's channel and its rail's CQ into qps_; when a rail
    // rejoins, on a channel and CQ of the attempt's own, into *into.
    struct Dial {
        const wire::AgentMetadata &meta;
        const handshake::Fingerprint &ours;
        net::Deadline deadline;
        size_t rail;   // which rail pair
        size_t index;  // which of its QPs, for messages
        rdma_event_channel *ch;
        ibv_cq *cq;
        std::vector<Qp> *into;
    };
    // A part on its way to one QP's send queue: how far it is posted.
    struct QueuedPart {
        Part part;
        size_t run = 0;         // next run to post
        uint64_t off = 0;       // bytes of part.runs[run] already posted
        uint64_t wrs_left = 0;  // WRs not posted yet
    };
    // What build_chain built: n WRs, and when the room ran out inside a part,
    // where that part goes on (its next run and offset).
    struct Chain {
        uint32_t n = 0;
        size_t run = 0;
        uint64_t off = 0;
    };
    // A WR in flight that matters: it is signalled, or a part ends with it,
    // or both. Its slots (wrs: WRs posted since the mark before) free up and
    // op's part is done when a signalled WR at or after it completes (RC
    // completes in order). seq numbers the marks of a QP; a signalled WR
    // carries its mark's seq as wr_id.
    struct Mark {
        uint64_t seq;
        uint32_t wrs;
        bool signalled;
        OpRef op;
    };
    struct Qp {
        CmId id;
        ibv_qp *qp = nullptr;
        size_t rail = 0;
        uint32_t used = 0;          // posted WRs whose slot is not yet known free
        uint32_t since_signal = 0;  // WRs after the last signalled one
        uint32_t since_mark = 0;    // WRs after the last mark
        uint64_t next_seq = 1;
        std::deque<Mark> marks;
        // Parts wholly posted and not yet complete, in posting order (parts
        // of a QP complete in that order: the one behind the next mark with
        // an op). A rail that fails posts them again elsewhere.
        std::deque<Part> posted;
        // Bytes posted per signalled WR in flight (from the one before), and
        // after the last one: what stays in flight once the oldest completes.
        std::deque<uint64_t> seg_bytes;
        uint64_t tail_bytes = 0;
        uint64_t inflight_bytes = 0;
        std::deque<QueuedPart> waiting;
        uint64_t waiting_wrs = 0;
        uint64_t waiting_bytes = 0;  // not posted yet: with inflight_bytes, its load
        size_t turn = 0;             // ties in load go to the lower turn: QP 0 of every rail first
        bool dead = false;
    };
    // A local rail paired with one of the peer's: its own CQ (a CQ belongs
    // to one device) and its share of the QPs.
    struct Rail {
        std::shared_ptr<Device> dev;
        RemoteRail remote;
        std::string name;  // "rxe0:1 -> 198.18.0.1:20049"
        ibv_comp_channel *comp_ch = nullptr;
        ibv_cq *cq = nullptr;
        unsigned cq_unacked = 0;
        uint64_t tok = 0;
        // up: carries parts; draining: taken out, its QPs in ERR, waiting
        // for their drain markers to flush; down: nothing of it can land.
        enum class State : uint8_t { up, draining, down } state = State::up;
        int drains_left = 0;
        uint64_t drain_timer = 0;
        std::vector<Part> orphans;  // what it owed, posted again once drained
        // Its measured rate (bytes per ns while it had bytes in flight),
        // which weighs its share of a striped transfer; 0 before a sample.
        double rate = 0;
        uint64_t win_bytes = 0;
        int64_t win_busy_ns = 0, last_ns = 0;  // last_ns 0: idle
        // telemetry
        uint64_t bytes = 0, parts = 0, failures = 0;
        int64_t changed_ns = 0;  // CLOCK_REALTIME
    };
    // A rail that is down, to be dialled again at due (the dialler's queue).
    struct Redial {
        size_t rail;
        Clock::time_point due;
        int attempt;
    };
    // What a rejoin attempt connected, not yet the peer's.
    struct Fresh {
        const Device *dev = nullptr;
        ibv_comp_channel *comp_ch = nullptr;
        ibv_cq *cq = nullptr;
        rdma_event_channel *ch = nullptr;
        std::vector<Qp> qps;
        ~Fresh();
    };

    VerbsPeer(EventLoop *loop, const PeerConfig &cfg, const PeerContext &pc, std::shared_ptr<PeerSet> set);
    // connect
    void choose_rails(const std::vector<std::shared_ptr<Device>> &rails, const std::vector<RemoteRail> &remote,
                      const std::vector<RailMapEntry> &map);
    void setup_cm_channel();
    void make_cq(const Device &dev, ibv_comp_channel **ch, ibv_cq **cq) const;
    void setup_rail(Rail &r);
    void connect_rail(const BackendContext &ctx, const PeerContext &pc, size_t r);
    void fail_rail_at_dial(size_t r, const char *why);
    void connect_qp(const Dial &d);
    CmEvent wait_cm(rdma_cm_id *id, const Dial &d, const char *what);
    CmId resolve(const Dial &d);
    void hello(const Dial &d, handshake::Initiator &in);
    bool authenticate(const Dial &d, handshake::Initiator &in);
    bool answer(const CmEvent &e, handshake::Initiator &in, const char *what);
    [[noreturn]] void connect_failed(const CmEvent &e, const char *what) const;
    void adopt(CmId id, const Dial &d);
    void move_qp(rdma_cm_id *id, ibv_qp *qp, ibv_qp_state st) const;
    // data path (mu_ held)
    bool usable(const Qp &q) const;
    double rate_of(size_t r) const;
    double finish_ns(const Qp &q, uint64_t bytes) const;
    std::vector<size_t> fastest(size_t k, uint64_t bytes) const;
    void place(std::vector<Part> &&parts, const std::vector<size_t> &qps, CompletionBatch &out);
    uint64_t wrs_for(const Runs &runs) const;
    uint64_t wr_len(const Run &r, uint64_t off) const;
    bool should_wait(const Qp &q) const;
    void post_ready(Qp &q, CompletionBatch &out);
    Chain build_chain(Qp &q, uint32_t room);
    void complete_marks(Qp &q, uint64_t seq, CompletionBatch &out);
    void measure(Rail &r, uint64_t bytes);
    void start_clock(Rail &r);
    static int post_probe_recv(ibv_qp *qp);
    void handle_wc(Rail &r, const ibv_wc &wc, CompletionBatch &out);
    void fail_waiting(Qp &q, int status, CompletionBatch &out);
    void fail_all_waiting(int status, CompletionBatch &out);
    void fail_inflight(Qp &q, int status, CompletionBatch &out);
    void kill_qp(Qp &q, int status, CompletionBatch &out);
    void break_peer(int status, CompletionBatch &out);
    void set_broken(int status);
    void to_error(Qp &q);
    void deliver(std::unique_lock<std::mutex> &lk, CompletionBatch &out);
    // rails (mu_ held)
    size_t rails_up() const;
    void fail_rail(size_t r, const std::string &why, bool gone, CompletionBatch &out);
    void fail_orphans(int status, CompletionBatch &out);
    bool post_marker(Qp &q);
    void take_parts(Qp &q, std::vector<Part> *into);
    void rail_drained(size_t r, CompletionBatch &out);
    void set_state(Rail &r, Rail::State s);
    // rejoining (verbs_rejoin.cpp)
    void redial(size_t r);  // mu_ held
    void dial_loop();
    bool can_try(size_t r, std::string *why) const;
    void call_off_attempt(const Device *dev);  // mu_ held
    void connect_fresh(size_t r, Fresh *f);
    bool install(size_t r, Fresh *f);
    void stop_dialler();
    // events
    void on_event(int tag, uint32_t events) override;
    void on_timer(int tag) override;
    void on_cq_event(size_t r);
    bool poll_cq(size_t r, CompletionBatch &out, bool post = true);
    void on_cm_event();
    // shutdown
    void drain();
    void teardown();

    EventLoop *loop_;
    PeerConfig cfg_;
    std::string peer_id_;
    std::string where_;  // "peer 'x' at 1.2.3.4:5" for messages
    CompletionSink *sink_;
    std::shared_ptr<PeerSet> set_;
    uint64_t remote_addr_ = 0;
    uint64_t local_slice_ = 0;   // our registration's slice length (every rail's)
    uint64_t remote_slice_ = 0;  // the peer's
    bool sliced_ = false;        // either side's region is in slices: WRs end at their boundaries
    uint64_t block_len_ = 0;
    uint64_t max_msg_ = 0;  // of every rail's port, the smallest

    rdma_event_channel *cm_ch_ = nullptr;
    uint64_t tok_cm_ = 0;
    std::vector<Rail> rails_;
    std::vector<Qp> qps_;

    mutable std::mutex mu_;  // guards everything below, the Qp queues and the rails' state
    std::condition_variable cv_;
    int delivering_ = 0;  // threads calling the sink right now
    bool broken_ = false;
    bool stopping_ = false;
    int break_status_ = 0;
    bool progressed_ = false;  // signalled WRs completed since the sink last heard
    std::atomic<bool> broken_flag_{false};
    std::vector<ibv_send_wr> wr_buf_;
    std::vector<ibv_sge> sge_buf_;
    std::once_flag shutdown_once_;

    // Rejoining rails: what a dial needs again, and the dialler thread.
    wire::AgentMetadata meta_;
    handshake::Fingerprint ours_{};
    std::mutex dial_mu_;  // guards the six below; taken after mu_, never before
    std::condition_variable dial_cv_;
    std::vector<Redial> dial_queue_;
    std::vector<bool> dialling_;  // per rail: in dial_queue_ or being dialled, until install()
    std::vector<bool> kicked_;    // per rail: its port came back during its attempt: again at once
    size_t attempt_rail_ = SIZE_MAX;  // the rail being dialled now, if any
    bool dial_stop_ = false;
    std::thread dialler_;
    // Calls off the attempt under way (shutdown, the peer broken, the
    // port of its rail down); cleared as each attempt starts.
    std::atomic<bool> dial_cancel_{false};
};

// The verbs section of the metadata: the region's address and length (the
// same on every rail) and each rail's rdma_cm address and rkey.
struct SectionInfo {
    uint64_t mr_addr = 0;
    uint64_t mr_len = 0;     // the region's size
    uint64_t slice_len = 0;  // bytes per registration, whole blocks (mr_len: one)
    std::vector<RemoteRail> rails;  // at least one, at most kMaxRails
};
// The verbs section (its type, kSectionId, is in verbs_options.h): verbs_wire.cpp.
// Version 1 (0.7) appends the rails after the first to version 0's layout,
// which a reader of version 0 takes whole and alone: a transport before 0.7
// uses the first rail of a newer one, and a newer one the only rail of an
// older one (docs/wire-format.md). Version 2 (0.14), written only for a
// sliced region, appends the slices' keys; its first-rail prefix gives the
// first slice's length as mr_len, which a reader before 0.14 refuses (it
// would write with the first slice's key beyond it).
constexpr uint8_t kSectionVersion = 1;
constexpr uint8_t kSectionVersionSliced = 2;
wire::Section encode_section(const SectionInfo &v);
// Throws Error(KVX_EBADMETA) naming the defect; m: the rest of the peer's metadata.
SectionInfo decode_section(const wire::Section &s, const wire::AgentMetadata &m);

}  // namespace kvx::verbs
