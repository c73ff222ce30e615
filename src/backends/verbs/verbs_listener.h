// The target side of the verbs backend: the rdma_cm listener, the target's
// half of the handshake (handshake/engine.h) carried in connect/reject
// private data, and the passive QPs through which peers write into our
// region, each probed for liveness. All of it runs on the transport's event
// loop; the application never calls anything for data to land.
//   verbs_listener.cpp  listening, connect requests, accepting
//   verbs_liveness.cpp  probes of accepted connections
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend_api/backend.h"
#include "backends/verbs/verbs.h"
#include "handshake/engine.h"
#include "util/event_loop.h"

namespace kvx::verbs {

// Authentications per challenge epoch (connect_timeout_ms); past this, peers
// are challenged again until the next epoch.
constexpr size_t kMaxAuthPerEpoch = 1 << 16;
// Connect requests rdma_cm queues for us before it turns new ones away
// (ucma clamps it to net.rdma_ucm.max_backlog, 1024 by default).
constexpr int kListenBacklog = 1024;
constexpr size_t kDestroyBatch = 64;  // refused ids destroyed together (see on_event)
enum { kTagListener = 0, kTagSweep = 1, kTagProbes = 2 };
constexpr uint64_t kProbeWrId = 1;
constexpr int kProbeTries = 7;  // transmissions of a probe: retry_count 6 (conn_param) + 1

// Where to listen and what to advertise.
struct ListenPlan {
    std::string option;           // verbs.listen as given, "" when unset
    sockaddr_storage bind{};      // what rdma_bind_addr gets
    bool explicit_host = false;   // verbs.listen names one address
    Placement pl;                 // the discovered port, unless explicit_host
};

class VerbsBackend final : public Backend, private EventLoop::Source {
public:
    VerbsBackend(const BackendContext &ctx) : ctx_(ctx) {}
    ~VerbsBackend() override { shutdown(); }

    // false with *why when no usable device; throws for configuration errors.
    bool init(std::string *why);

    const char *name() const override { return "verbs"; }
    wire::Section describe() const override {
        SectionInfo v;
        v.cm = advertised_;
        v.mr_addr = reinterpret_cast<uintptr_t>(dev_->region.base);
        v.mr_len = dev_->region.size();
        v.rkey = rkey_;
        return encode_section(v);
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override;
    void shutdown() override;

private:
    // init, step by step
    bool bind_listener(const ListenPlan &lp, std::string *why);
    bool open_device(const ListenPlan &lp, const Selection &sel, std::string *why);
    void choose_addresses(const ListenPlan &lp);
    void start_listening();
    // the listener's events (loop thread)
    void on_event(int tag, uint32_t events) override;
    // Returns true when the event's id must be destroyed.
    bool on_cm_event(const CmEvent &ev);
    bool on_request(const CmEvent &ev);
    bool accept(rdma_cm_id *id, const handshake::Step &accepted, const char *from);
    static void reject(rdma_cm_id *id, const handshake::Step &st);
    // accepted connections that never became established
    void on_timer(int tag) override;
    void arm_sweep();
    // liveness of established connections (verbs.h, kProbeRecvs)
    struct Conn;
    void probe(Conn &c);
    void on_probe_events();
    void set_probe_timing();
    void close_conn(rdma_cm_id *id);

    BackendContext ctx_;
    std::shared_ptr<Device> dev_;
    EventLoop *loop_ = nullptr;
    PeerConfig peer_cfg_;
    rdma_event_channel *listen_ch_ = nullptr;
    rdma_cm_id *listen_id_ = nullptr;
    // The completion channel of every passive QP's CQ: only probes complete
    // there (RDMA WRITEs complete nothing at the target).
    ibv_comp_channel *probe_ch_ = nullptr;
    uint64_t listen_tok_ = 0, probe_tok_ = 0;
    net::Endpoint advertised_;
    uint32_t rkey_ = 0;

    // An accepted connection: its QP's own CQ (one probe in flight at most)
    // and its probe timer. Loop thread only (or after the listener is detached).
    struct Conn final : EventLoop::Source {
        Conn(VerbsBackend &b, rdma_cm_id *i) : backend(b), id(i) {}
        void on_event(int, uint32_t) override {}
        void on_timer(int) override {
            timer = 0;
            backend.probe(*this);
        }
        VerbsBackend &backend;
        rdma_cm_id *id;
        ibv_cq *cq = nullptr;
        bool established = false;
        Clock::time_point deadline;  // to be established by then, or it goes
        uint64_t timer = 0;          // the next probe
        bool probing = false;        // a probe is in flight
    };
    std::unordered_map<rdma_cm_id *, std::unique_ptr<Conn>> conns_;  // accepted ids
    std::chrono::milliseconds probe_every_{0};
    uint8_t ack_timeout_ = 0;  // of the passive QPs: 4.096 us << this per try
    uint64_t probes_failed_ = 0;  // probes that could not be posted
    std::unique_ptr<handshake::Responder> responder_;
    std::chrono::milliseconds connect_timeout_{0};
    uint64_t sweep_tok_ = 0;

    std::mutex mu_;  // guards closed_
    bool closed_ = false;
    std::once_flag shutdown_once_;
};

}  // namespace kvx::verbs
