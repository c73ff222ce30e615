// The tcp backend's registry entry: options, metadata section, factory.
#include "registry/registry.h"
#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx {

namespace tcp {

namespace {


constexpr OptionSpec kOptions[] = {
    {"tcp.listen", OptType::hostport, 0, 0, "0.0.0.0:0",
     "HOST:PORT to listen on (IPv4, or [IPv6]:PORT); 0.0.0.0:0 = all IPv4 interfaces, any port"},
    {"tcp.advertise", OptType::hostports, wire::kMaxEndpoints, 0, "",
     "comma-separated HOST:PORT list put in the metadata, in order of preference; PORT 0 = the listening port"},
    {"tcp.streams", OptType::uint, 1, 16, "1", "TCP connections per peer; a transfer of 2 MiB or more is split over them"},
    {"tcp.handshake_timeout_ms", OptType::uint, 10, 60000, "1000",
     "an accepted connection that has not authenticated within this long is closed"},
    {"tcp.max_handshakes", OptType::uint, 1, 65536, "1024",
     "unauthenticated connections at once; past it the oldest is closed to admit the newest"},
    {"tcp.max_handshakes_per_source", OptType::uint, 1, 65536, "128",
     "unauthenticated connections at once from one source address; more are closed at once"},
    {"tcp.max_connections", OptType::uint, 1, 1048576, "4096",
     "authenticated connections the target keeps at once; more are closed before their ACCEPT"},
    {"tcp.protection", OptType::choice, 0, 0, "aead",
     "aead = every frame and ack after the handshake is AES-128-GCM sealed (docs/security.md); none = cleartext, "
     "for trusted networks only; both sides must agree", "aead,none"},
    {"tcp.aead_impl", OptType::choice, 0, 0, "auto",
     "AES-GCM code of tcp.protection=aead (the same cipher, byte for byte): auto = ipsec-mb where the library was "
     "built with it and it runs its VAES code on this CPU, else OpenSSL; openssl; ipsec-mb", "auto,openssl,ipsec-mb"},
};

class TcpBackend final : public Backend {
public:
    explicit TcpBackend(const BackendContext &ctx) : ctx_(ctx), server_(ctx) {}
    const char *name() const override { return "tcp"; }
    wire::Section describe() const override { return encode_section(server_.advertised()); }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override { return connect_peer(ctx_, pc); }
    void shutdown() override { server_.shutdown(); }

private:
    BackendContext ctx_;
    TcpServer server_;
};

bool probe(const Options &, std::string *) { return true; }

// Our side offers and requires exactly the protection of tcp.protection.
std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *) {
    if (data_path_options(*ctx.options).flags != 0) {
        // A block travels as one frame when larger than a frame's usual
        // bound, and a frame's payload is one record.
        if (ctx.region.block_len > kMaxRecordBytes)
            fail(KVX_EINVAL,
                 "block_len %llu: with tcp.protection=aead a block is sealed as one AES-GCM record, at most %llu "
                 "bytes; use smaller blocks, or tcp.protection=none on a trusted network",
                 (unsigned long long)ctx.region.block_len, (unsigned long long)kMaxRecordBytes);
        const AeadImpl impl = aead_impl(*ctx.options);  // a code that cannot run here fails the create
        KVX_LOG(info, "tcp: records sealed with AES-128-GCM by %s", aead_impl_name(impl));
    }
    return std::make_unique<TcpBackend>(ctx);
}

void check_section(const wire::Section &s, const wire::AgentMetadata &) { decode_section(s); }

}  // namespace

handshake::DataPathOptions data_path_options(const Options &o) {
    handshake::DataPathOptions d;
    d.flags = o.str("tcp.protection") == "aead" ? kFlagAead : 0;
    d.defined = kFlagAead;
    d.name = [](uint32_t f) -> std::string { return f & kFlagAead ? "tcp.protection=aead" : "tcp.protection=none"; };
    return d;
}

}  // namespace tcp

}  // namespace kvx

extern "C" const kvx::BackendDesc kvx_backend_tcp = {
    "tcp", kvx::tcp::kSectionId, kvx::tcp::kOptions, kvx::tcp::probe, kvx::tcp::create, kvx::tcp::check_section,
};
