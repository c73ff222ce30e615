#include "backends/tcp/tcp.h"

namespace kvx {

namespace {

class TcpBackend final : public Backend {
public:
    explicit TcpBackend(const BackendContext &ctx) : ctx_(ctx), server_(ctx) {}
    const char *name() const override { return "tcp"; }
    BackendCaps caps() const override { return BackendCaps{true, false}; }
    void describe(wire::AgentMetadata &m) const override {
        m.backend = wire::BackendKind::tcp;
        m.tcp = server_.advertised();
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override { return tcp::connect_peer(ctx_, pc); }
    void shutdown() override { server_.shutdown(); }

private:
    BackendContext ctx_;
    tcp::TcpServer server_;
};

}  // namespace

std::unique_ptr<Backend> make_tcp_backend(const BackendContext &ctx) { return std::make_unique<TcpBackend>(ctx); }

}  // namespace kvx
