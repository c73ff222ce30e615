// The target side of the verbs backend: the rdma_cm listener, the target's
// half of the handshake (handshake/engine.h) carried in connect/reject
// private data, and the passive QPs through which peers write into our
// region, each probed for liveness. All of it runs on the transport's event
// loop; the application never calls anything for data to land.
//   verbs_listener.cpp  rails, listening, connect requests, accepting
//   verbs_liveness.cpp  probes of accepted connections, port events
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
// Loop tags: rail r's probe channel is kTagProbes0 + r, device watch w's
// async events kTagAsync0 + w.
enum { kTagListener = 0, kTagSweep = 1, kTagProbes0 = 16, kTagAsync0 = 64 };
constexpr uint64_t kProbeWrId = 1;
constexpr int kProbeTries = 7;  // transmissions of a probe: retry_count 6 (conn_param) + 1

// Where to listen and what to advertise.
struct ListenPlan {
    std::string option;            // verbs.listen as given, "" when unset
    sockaddr_storage bind{};       // what rdma_bind_addr gets (with the explicit host)
    uint16_t port = 0;             // the port verbs.listen asks for, 0: any
    bool explicit_host = false;    // verbs.listen names one address: one rail
    std::vector<Placement> pls;    // the discovered ports (rails), unless explicit_host
    uint64_t slice = 0;            // bytes per registration of the region (its size: one)
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
        v.mr_addr = reinterpret_cast<uintptr_t>(ctx_.region.base);
        v.mr_len = ctx_.region.size();
        v.slice_len = rails_.front().dev->slice_len;
        for (const RailListener &r : rails_) {
            RemoteRail rr{r.advertised, {}};
            for (const ibv_mr *mr : r.dev->mrs) rr.rkeys.push_back(mr->rkey);
            v.rails.push_back(std::move(rr));
        }
        return encode_section(v);
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override;
    void shutdown() override;

private:
    // init, step by step
    bool add_rail(const ListenPlan &lp, const Placement *pl, std::string *why);
    bool bind_listener(rdma_cm_id *id, const sockaddr_storage &at, std::string *why);
    std::shared_ptr<Device> open_device(const ListenPlan &lp, const Placement *pl, rdma_cm_id *id, std::string *why);
    void choose_addresses(const Placement *pl, rdma_cm_id *id, Device &dev, net::Endpoint *advertised);
    void start_listening();
    void watch_ports();
    void on_async_events(size_t w);
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
    void on_probe_events(size_t r);
    void set_probe_timing();
    void close_conn(rdma_cm_id *id);

    BackendContext ctx_;
    EventLoop *loop_ = nullptr;
    PeerConfig peer_cfg_;
    rdma_event_channel *listen_ch_ = nullptr;  // every rail's listener's
    uint64_t listen_tok_ = 0;
    // One rail: its device and MR, its listener, and the completion channel
    // of its passive QPs' CQs: only probes complete there (RDMA WRITEs
    // complete nothing at the target).
    struct RailListener {
        std::shared_ptr<Device> dev;
        rdma_cm_id *id = nullptr;
        ibv_comp_channel *probe_ch = nullptr;
        uint64_t probe_tok = 0;
        net::Endpoint advertised;
    };
    std::vector<RailListener> rails_;
    // A device's async events (port up or down), on a context of our own:
    // the kernel gives each open context every port event.
    struct Watch {
        ibv_context *ctx = nullptr;
        std::string device;
        uint64_t tok = 0;
    };
    std::vector<Watch> watches_;
    std::shared_ptr<PeerSet> peers_ = std::make_shared<PeerSet>();

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
        size_t rail = 0;
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
