// The tcp backend's registry entry: options, metadata section, factory.
#include <net/if.h>

#include "registry/registry.h"
#include "backends/tcp/tcp.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx {

namespace tcp {

namespace {


constexpr OptionSpec kOptions[] = {
    {"tcp.listen", OptType::hostport, 0, 0, "0.0.0.0:0",
     "`HOST:PORT` to listen on (IPv4, or `[IPv6]:PORT`); PORT 0 picks a free port. The default listens on every IPv4 "
     "interface; `127.0.0.1:0` keeps a transport on the loopback interface."},
    {"tcp.advertise", OptType::hostports, wire::kMaxEndpoints, 0, "",
     "Comma-separated `HOST:PORT` list put into the agent metadata, in order of preference; PORT 0 means the "
     "listening port. Unset: when `tcp.listen` names an address, that address; when it is a wildcard, every "
     "non-loopback IPv4 address of the host that is up, then 127.0.0.1, in that order: peers on other hosts use the "
     "first reachable one and a peer on the same host falls back to loopback. With several networks (say a management "
     "and a data network) set it to the data network's address. `KVX_LOG=info` logs what was chosen."},
    {"tcp.streams", OptType::uint, 1, 16, "1",
     "TCP connections per peer, and with `tcp.interfaces` per rail; a transfer of 2 MiB or more is split over "
     "them."},
    {"tcp.interfaces", OptType::string, 0, 1024, "",
     "The rails of a writer (since 0.12): `all`, or a comma-separated list of interface names (`eth0,eth1`). Each "
     "interface that is up and has an address in the subnet of one of the target's advertised addresses "
     "(`tcp.advertise`) becomes a rail to that address, with `tcp.streams` connections bound to the interface's "
     "address; transfers are spread over every connection. When a connection fails (a reset, an error, or its "
     "kernel resending into silence while another one is answered) it is taken out and what it owed is sent again "
     "on the others, after the target has closed it: nothing it carried lands afterwards (docs/semantics.md, "
     "\"Rails\"). A rail taken out is dialled again in the background every `peer_redial_ms`. Unset: one path, the "
     "first advertised address that connects, as is also the case when no interface pairs with one. Set it where "
     "the interfaces are data networks: `all` also pairs a management network that shares a subnet with the "
     "target."},
    {"tcp.handshake_timeout_ms", OptType::uint, 10, 60000, "1000",
     "An accepted connection that has not authenticated within this long (milliseconds) is closed."},
    {"tcp.max_handshakes", OptType::uint, 1, 65536, "1024",
     "Unauthenticated connections a target holds at once. Past it the oldest is closed to admit the newest, so idle "
     "connections cannot lock peers out; a peer whose connection is refused, reset or closed during the handshake "
     "retries with a short backoff until `connect_timeout_ms`."},
    {"tcp.max_handshakes_per_source", OptType::uint, 1, 65536, "128",
     "Unauthenticated connections a target holds at once from one source address; more are closed as soon as they "
     "are accepted."},
    {"tcp.max_connections", OptType::uint, 1, 1048576, "4096",
     "Authenticated connections a target keeps at once; more are closed before their handshake completes."},
    {"tcp.protection", OptType::choice, 0, 0, "aead",
     "`aead`: every frame and acknowledgement after the handshake is sealed with AES-128-GCM under keys derived from "
     "that connection's handshake, so bytes forged, replayed, reordered or redirected on the network never land or "
     "complete anything; `none`: cleartext, for trusted networks only. Both sides must agree: `kvx_add_remote_peer()` "
     "to a peer with the other setting fails with KVX_ENOTSUP (docs/security.md).",
     "aead,none"},
    {"tcp.aead_impl", OptType::choice, 0, 0, "auto",
     "The code that seals and opens the records of `tcp.protection=aead`; the cipher and the bytes on the wire are "
     "the same with each, so the two sides need not agree. `auto`: Intel's ipsec-mb where the library was built with "
     "it and it runs its VAES code here (a CPU with AVX-512, VAES, VPCLMULQDQ, GFNI, AVX512-IFMA and SHA-NI, and a "
     "kernel that enables AVX-512; several times OpenSSL's rate per core, docs/performance.md), else OpenSSL; "
     "`openssl`; `ipsec-mb`: its best code for this CPU, which needs at least SSE4.2, AES-NI and PCLMULQDQ (with "
     "`tcp.protection=aead`, `kvx_transport_create()` fails with KVX_ENOTSUP where it cannot run or the library was "
     "built without it). `KVX_LOG=info` names the code in use.",
     "auto,openssl,ipsec-mb"},
};

class TcpBackend final : public Backend {
public:
    explicit TcpBackend(const BackendContext &ctx) : ctx_(ctx), server_(ctx) {}
    const char *name() const override { return "tcp"; }
    wire::Section describe() const override {
        return encode_section(server_.advertised(), kSectionRecords | kSectionFence);
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override { return connect_peer(ctx_, pc); }
    void shutdown() override { server_.shutdown(); }

private:
    BackendContext ctx_;
    TcpServer server_;
};

bool probe(const Options &, std::string *) { return true; }

std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *) {
    interfaces_option(*ctx.options);  // names that exist, or a failed create
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

std::vector<std::string> interfaces_option(const Options &o) {
    const std::string spec = o.str("tcp.interfaces");
    std::vector<std::string> names;
    if (spec.empty()) return names;
    if (spec == "all") return {"all"};
    size_t at = 0;
    for (;;) {
        const size_t comma = spec.find(',', at);
        const std::string name = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (name.empty() || name.size() >= IF_NAMESIZE || if_nametoindex(name.c_str()) == 0)
            fail(KVX_EINVAL, "tcp.interfaces: no network interface '%s' on this host", name.c_str());
        names.push_back(name);
        if (comma == std::string::npos) return names;
        at = comma + 1;
    }
}

handshake::DataPathOptions data_path_options(const Options &o) {
    handshake::DataPathOptions d;
    d.flags = o.str("tcp.protection") == "aead" ? kFlagAead | kFlagAeadRecords : 0;
    d.defined = kFlagAead | kFlagAeadRecords | kFlagFence;
    d.optional = kFlagAeadRecords | kFlagFence;
    d.name = [](uint32_t f) -> std::string { return f & kFlagAead ? "tcp.protection=aead" : "tcp.protection=none"; };
    return d;
}

}  // namespace tcp

}  // namespace kvx

extern "C" const kvx::BackendDesc kvx_backend_tcp = {
    "tcp", kvx::tcp::kSectionId, kvx::tcp::kOptions, kvx::tcp::probe, kvx::tcp::create, kvx::tcp::check_section,
};
