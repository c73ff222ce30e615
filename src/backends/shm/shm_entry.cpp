// The shm backend's registry entry: options, metadata section, factory.
#include "registry/registry.h"
#include "backends/shm/shm.h"
#include "util/error.h"

namespace kvx {

namespace shm {

namespace {

constexpr OptionSpec kOptions[] = {
    {"shm.threads", OptType::uint, 1, 16, "2",
     "Threads of the transport that copy shm transfers (until 0.9 the threads calling `kvx_write_blocks()` counted "
     "among them: `shm.threads` - 1 of the transport, and with 1 the calling thread copied everything). A calling "
     "thread copies at most one small transfer (64 KiB or less in at most 16 runs) per call: its own when no copy "
     "thread is awake (watching the queue or copying; so on a transport idle for 50 us a small transfer is still done "
     "when the call returns), or, while 2 MiB or more wait, the next one of the queue if it is small. Everything else "
     "is queued for the copy threads, so the call returns in microseconds whatever the transfer's size and shape "
     "(beyond checking its index lists). Transfers of 1 MiB or more (512 KiB or more into private memory, where the "
     "kernel's copy costs about twice a memcpy) are split among the copy threads, in parts of at most 1 MiB. They "
     "take the queue in batches of several transfers to one peer (into private memory, one `process_vm_writev` per "
     "batch), serving the peers in turn, and within a peer alternate between small transfers and parts of larger "
     "ones. The first copy thread watches the queue for 50 us when it runs out of work before it sleeps: CPU time "
     "traded for the wake-ups a stream of small transfers would cost. The others sleep at once, and are woken for "
     "the parts of a large transfer, or when 4 MiB or more of small ones wait."},
    {"shm.allow_other_users", OptType::uint, 0, 1, "0",
     "Both directions. 0: the shm backend deals only with processes of its own user (`SO_PEERCRED`, across user "
     "namespaces): as a target it refuses a writer of another user when it connects, as a writer it refuses a target "
     "of another user. 1: as a target it admits writers of other users that authenticate (at most 16 of each user "
     "unauthenticated at once), through a staging ring only (never the region's file, never `process_vm_writev`); as "
     "a writer it writes to targets of other users, which then receive the blocks (docs/security.md)."},
    {"shm.private", OptType::choice, 0, 0, "auto",
     "How a same-host peer writes into a region that is not in a shareable mapping (one writable `MAP_SHARED` mapping "
     "of a file: a region of `kvx_region_alloc()`, a file reopened by its path such as /dev/shm's, or a memfd or "
     "deleted file this process holds a read-write descriptor of, as Python's mmap does). `auto`: the kernel's "
     "`process_vm_writev`, or, for a writer the kernel refuses (ptrace rules: Yama ptrace_scope, a target that is not "
     "dumpable), a staging ring: the writer copies into a shared ring of 8 slots of 1 MiB and this transport's thread "
     "copies from it into the region; `staged`: always the ring; `off`: no shm path for such a region (the peer falls "
     "back to the next path).",
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
