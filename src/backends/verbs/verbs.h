// verbs backend internals (see README.md in this directory for the design):
//   Device     - the RDMA device, PD and the one MR over the whole region.
//   CmId, CmEvent and friends - rdma_cm plumbing both sides share.
//   VerbsPeer  - the initiator side towards one peer: RC QPs, one CQ, the
//                software queue behind the send queues.
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
    std::string how;          // for the log
};

struct Selection {
    std::string device;  // verbs.device, "" = any
    int port = 0;        // verbs.port, 0 = any
    int gid_index = -1;  // verbs.gid_index, -1 = any
};

// Finds the first ACTIVE port (honouring sel) that has an IP address: from
// its GID table (RoCE: IPv4-mapped GIDs, RoCE v2 first) or from its netdev
// (IB with IPoIB, iWARP). false with *why when there is none.
bool find_placement(const Selection &sel, Placement *out, std::string *why);

// The device and the registration, shared by the backend and its peers: the
// PD lives until the last QP on it is gone, the MR only until backend shutdown.
struct Device {
    ibv_context *ctx = nullptr;  // librdmacm's context: never closed here
    std::string name;
    uint8_t port = 0;
    ibv_device_attr attr{};
    ibv_port_attr port_attr{};
    ibv_pd *pd = nullptr;
    ibv_mr *mr = nullptr;
    uint32_t lkey = 0;
    uint64_t max_msg = 0;   // largest message one WR may carry
    Region region;
    sockaddr_storage addr{};  // our RDMA address (port 0): source of outgoing connections

    Device() = default;
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
    ~Device();
    // Queries port p of ctx; false with *why unless it is ACTIVE.
    bool open(ibv_context *c, uint8_t p, std::string *why);
    // One MR over exactly r, writable by peers, in a PD of its own; false with *why.
    bool register_region(const Region &r, std::string *why);
    void deregister();  // after this nothing can write into the region
};

struct PeerConfig {
    uint32_t qps = 1;
    uint32_t sq_depth = 0;      // WRs per send queue the data path uses
    uint32_t signal_every = 0;  // at least one signalled WR per this many
    // A transfer submitted while at least this many bytes stay in flight
    // behind the next completion waits for it, and is posted with the others
    // that waited as one chain ending in one signalled WR (0: post at once).
    uint64_t post_batch_bytes = 0;
};

PeerConfig peer_config(const Device &dev, const Options &o);

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
constexpr uint64_t kDrainWrId = UINT64_MAX;     // shutdown's marker WR
constexpr uint64_t kRecvWrId = UINT64_MAX - 1;  // a receive kept for the target's liveness probes
enum { kTagCq = 1, kTagCm = 2 };                 // VerbsPeer's loop sources
constexpr int kCqPollBatch = 32;                 // completions per ibv_poll_cq

// Initiator side towards one peer. Created connected (dial), then start()ed.
class VerbsPeer final : public BackendPeer, private EventLoop::Source {
public:
    // Connects and authenticates every QP before pc.deadline; throws Error.
    static std::unique_ptr<VerbsPeer> dial(const BackendContext &ctx, std::shared_ptr<Device> dev,
                                           EventLoop *loop, const PeerConfig &cfg,
                                           const PeerContext &pc);
    ~VerbsPeer() override;

    // Hands CQ and cm events to the event loop; false if it is stopped.
    bool start();

    void submit(Op op) override;
    bool broken() const override { return broken_flag_.load(std::memory_order_acquire); }
    void abort(int status) override;
    void shutdown() override;

private:
    // One QP's connect: what the handshake needs, and until when.
    struct Dial {
        const wire::AgentMetadata &meta;
        const handshake::Fingerprint &ours;
        net::Deadline deadline;
        size_t index;  // which of the peer's QPs, for messages
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
        uint32_t used = 0;          // posted WRs whose slot is not yet known free
        uint32_t since_signal = 0;  // WRs after the last signalled one
        uint32_t since_mark = 0;    // WRs after the last mark
        uint64_t next_seq = 1;
        std::deque<Mark> marks;
        // Bytes posted per signalled WR in flight (from the one before), and
        // after the last one: what stays in flight once the oldest completes.
        std::deque<uint64_t> seg_bytes;
        uint64_t tail_bytes = 0;
        uint64_t inflight_bytes = 0;
        std::deque<QueuedPart> waiting;
        uint64_t waiting_wrs = 0;
        bool dead = false;
    };

    VerbsPeer(std::shared_ptr<Device> dev, EventLoop *loop, const PeerConfig &cfg,
              const PeerContext &pc);
    // connect
    void setup_channels();
    void connect_qp(const Dial &d);
    CmEvent wait_cm(rdma_cm_id *id, const Dial &d, const char *what);
    CmId resolve(const Dial &d);
    void hello(const Dial &d, handshake::Initiator &in);
    bool authenticate(const Dial &d, handshake::Initiator &in);
    bool answer(const CmEvent &e, handshake::Initiator &in, const char *what);
    [[noreturn]] void connect_failed(const CmEvent &e, const char *what) const;
    void adopt(CmId id, size_t index);
    void move_qp(rdma_cm_id *id, ibv_qp *qp, ibv_qp_state st) const;
    // data path (mu_ held)
    std::vector<size_t> least_loaded() const;
    uint64_t wrs_for(const Runs &runs) const;
    bool should_wait(const Qp &q) const;
    void post_ready(Qp &q, CompletionBatch &out);
    Chain build_chain(Qp &q, uint32_t room);
    void complete_marks(Qp &q, uint64_t seq, CompletionBatch &out);
    static int post_probe_recv(ibv_qp *qp);
    void handle_wc(const ibv_wc &wc, CompletionBatch &out);
    void fail_waiting(Qp &q, int status, CompletionBatch &out);
    void fail_all_waiting(int status, CompletionBatch &out);
    void fail_inflight(Qp &q, int status, CompletionBatch &out);
    void kill_qp(Qp &q, int status, CompletionBatch &out);
    void break_peer(int status, CompletionBatch &out);
    void drain_and_break(int status, CompletionBatch &out);
    void set_broken(int status);
    void to_error(Qp &q);
    void deliver(std::unique_lock<std::mutex> &lk, CompletionBatch &out);
    // events
    void on_event(int tag, uint32_t events) override;
    void on_cq_event();
    bool poll_cq(CompletionBatch &out);
    void on_cm_event();
    // shutdown
    void drain();
    void teardown();

    std::shared_ptr<Device> dev_;
    EventLoop *loop_;
    PeerConfig cfg_;
    std::string peer_id_;
    std::string where_;  // "peer 'x' at 1.2.3.4:5" for messages
    CompletionSink *sink_;
    net::Endpoint cm_;
    uint64_t remote_addr_ = 0;
    uint32_t rkey_ = 0;

    rdma_event_channel *cm_ch_ = nullptr;
    ibv_comp_channel *comp_ch_ = nullptr;
    ibv_cq *cq_ = nullptr;
    unsigned cq_unacked_ = 0;
    uint64_t tok_cq_ = 0, tok_cm_ = 0;
    std::vector<Qp> qps_;

    std::mutex mu_;  // guards everything below and the Qp queues
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
};

// The verbs section of the metadata: the rdma_cm address and the MR peers write into.
struct SectionInfo {
    net::Endpoint cm;
    uint64_t mr_addr = 0;
    uint64_t mr_len = 0;
    uint32_t rkey = 0;
};
// The verbs section (its registry id, the section's type): verbs_wire.cpp.
constexpr uint16_t kSectionId = 3;
constexpr uint8_t kSectionVersion = 0;
wire::Section encode_section(const SectionInfo &v);
// Throws Error(KVX_EBADMETA) naming the defect; m: the rest of the peer's metadata.
SectionInfo decode_section(const wire::Section &s, const wire::AgentMetadata &m);

}  // namespace kvx::verbs
