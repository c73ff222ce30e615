// The shm backend's registry entry: options, metadata section, factory.
#include "registry/registry.h"
#include "backends/shm/shm.h"
#include "util/error.h"

namespace kvx {

namespace shm {

namespace {

constexpr OptionSpec kOptions[] = {
    {"shm.threads", OptType::uint, 1, 16, "2", "threads copying transfers: the submitting threads and shm.threads - 1 pool threads, which take queued small transfers in batches (split from 1 MiB; private memory from 512 KiB)"},
    {"shm.allow_other_users", OptType::uint, 0, 1, "0",
     "0 = serve only writers of our own user (SO_PEERCRED); 1 = any user that authenticates"},
    {"shm.private", OptType::choice, 0, 0, "auto",
     "a region outside a shareable mapping: auto = writers use process_vm_writev, or a staging ring the target "
     "copies from when the kernel refuses it; staged = always the ring; off = no shm path for it",
     "auto,staged,off"},
};

class ShmBackend final : public Backend {
public:
    explicit ShmBackend(const BackendContext &ctx)
        : ctx_(ctx), pool_(static_cast<unsigned>(ctx.options->uint("shm.threads"))), server_(ctx) {}
    const char *name() const override { return "shm"; }
    wire::Section describe() const override { return encode_section(server_.info()); }
    bool applicable(const PeerContext &pc, std::string *why) const override {
        const SectionInfo theirs = decode_section(*pc.section);
        const SectionInfo ours = server_.info();
        if (theirs.boot_id != ours.boot_id || ours.boot_id == std::array<uint8_t, 16>{}) {
            *why = "the peer is on another host (boot id differs)";
            return false;
        }
        if (theirs.netns != ours.netns) {
            *why = "the peer is in another network namespace (its socket is not reachable)";
            return false;
        }
        if (theirs.mode == Mode::none) {
            *why = "the peer's region is private memory and it set shm.private=off";
            return false;
        }
        return true;
    }
    std::unique_ptr<BackendPeer> connect(const PeerContext &pc) override { return connect_peer(ctx_, pc, pool_); }
    void shutdown() override { server_.shutdown(); }

private:
    BackendContext ctx_;
    CopyPool pool_;
    ShmServer server_;
};

bool probe(const Options &, std::string *why) {
    if (boot_id() == std::array<uint8_t, 16>{}) {
        *why = "no /proc/sys/kernel/random/boot_id";
        return false;
    }
    return true;
}

// A listener that cannot be set up (out of descriptors, say) makes shm not
// usable here: with backend=auto the transport serves on the others (logged),
// with shm named the create fails with KVX_ENOTSUP and this reason.
std::unique_ptr<Backend> create(const BackendContext &ctx, std::string *why) {
    try {
        return std::make_unique<ShmBackend>(ctx);
    } catch (const Error &e) {
        if (e.code() == KVX_ECLOSED || e.code() == KVX_ENOMEM) throw;
        *why = e.what();
        return nullptr;
    }
}

void check_section(const wire::Section &s, const wire::AgentMetadata &) { decode_section(s); }

}  // namespace

}  // namespace shm

}  // namespace kvx

extern "C" const kvx::BackendDesc kvx_backend_shm = {
    "shm", kvx::shm::kSectionId, kvx::shm::kOptions, kvx::shm::probe, kvx::shm::create, kvx::shm::check_section,
};
