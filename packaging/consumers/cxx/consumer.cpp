// Install test consumer (C++, built with find_package(kvxfer) and
// kvxfer::kvxfer): two tcp transports in one process, blocks written from one
// into the other, every byte checked. Prints the path of the libkvxfer.so.0 it
// runs with. Exit status 0 on success, 1 on any failure.
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <kvxfer.h>

namespace {

constexpr uint64_t kBlocks = 64;
constexpr uint64_t kBlockLen = 8192;

void check(int rc, const char *what) {
    if (rc != 0)
        throw std::runtime_error(std::string(what) + ": " + kvx_strerror(rc) + ": " + kvx_last_error_message());
}

struct TransportDeleter {
    void operator()(kvx_transport *t) const { kvx_transport_destroy(t); }
};
using Transport = std::unique_ptr<kvx_transport, TransportDeleter>;

struct OptionsDeleter {
    void operator()(kvx_options *o) const { kvx_options_destroy(o); }
};

Transport make_transport(std::vector<uint8_t> &region) {
    kvx_options *raw = nullptr;
    check(kvx_options_create(&raw), "kvx_options_create");
    std::unique_ptr<kvx_options, OptionsDeleter> opts(raw);
    check(kvx_options_set(opts.get(), "backend", "tcp"), "backend=tcp");
    check(kvx_options_set(opts.get(), "tcp.listen", "127.0.0.1:0"), "tcp.listen");
    kvx_transport *t = nullptr;
    check(kvx_transport_create(&t, region.data(), kBlocks, kBlockLen, nullptr, opts.get()), "kvx_transport_create");
    return Transport(t);
}

uint8_t pattern(uint64_t block, size_t off) { return static_cast<uint8_t>(block * 37u + off * 11u + 3u); }

void run() {
    std::vector<uint8_t> src(kBlocks * kBlockLen), dst(kBlocks * kBlockLen, 0x5A);
    for (uint64_t b = 0; b < kBlocks; b++)
        for (size_t i = 0; i < kBlockLen; i++) src[b * kBlockLen + i] = pattern(b, i);

    Transport a = make_transport(src), b = make_transport(dst);

    size_t len = 0;
    check(kvx_get_agent_metadata(&len, b.get(), nullptr, 0), "metadata size");
    std::vector<uint8_t> meta(len);
    check(kvx_get_agent_metadata(&len, b.get(), meta.data(), meta.size()), "kvx_get_agent_metadata");
    uint64_t base = 0, nb = 0, bl = 0;
    check(kvx_transport_base_addr(&base, b.get()), "base_addr");
    check(kvx_transport_num_blocks(&nb, b.get()), "num_blocks");
    check(kvx_transport_block_len(&bl, b.get()), "block_len");
    check(kvx_add_remote_peer(a.get(), "b", meta.data(), meta.size(), base, nb, bl), "kvx_add_remote_peer");

    // Two transfers: a run of 16 consecutive blocks and a scattered set.
    const std::vector<uint64_t> l1{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25};
    const std::vector<uint64_t> r1{40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55};
    const std::vector<uint64_t> l2{63, 0, 7};
    const std::vector<uint64_t> r2{0, 63, 9};
    uint64_t id1 = 0, id2 = 0;
    check(kvx_write_blocks(&id1, a.get(), "b", l1.data(), r1.data(), l1.size()), "kvx_write_blocks 1");
    check(kvx_write_blocks(&id2, a.get(), "b", l2.data(), r2.data(), l2.size()), "kvx_write_blocks 2");

    size_t pending = 2;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pending > 0) {
        uint64_t done[4], failed[4];
        size_t nd = 0, nf = 0;
        check(kvx_poll(&nd, &nf, a.get(), "b", done, 4, failed, 4), "kvx_poll");
        if (nf > 0) throw std::runtime_error("transfer " + std::to_string(failed[0]) + " failed");
        for (size_t i = 0; i < nd; i++)
            if (done[i] != id1 && done[i] != id2) throw std::runtime_error("unexpected id " + std::to_string(done[i]));
        pending -= nd;
        if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("transfers not done after 30 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }

    std::vector<int64_t> from(kBlocks, -1);
    for (size_t i = 0; i < l1.size(); i++) from[r1[i]] = static_cast<int64_t>(l1[i]);
    for (size_t i = 0; i < l2.size(); i++) from[r2[i]] = static_cast<int64_t>(l2[i]);
    for (uint64_t r = 0; r < kBlocks; r++)
        for (size_t i = 0; i < kBlockLen; i++) {
            uint8_t want = from[r] < 0 ? 0x5A : pattern(static_cast<uint64_t>(from[r]), i);
            if (dst[r * kBlockLen + i] != want)
                throw std::runtime_error("block " + std::to_string(r) + " byte " + std::to_string(i) + " differs");
        }
    std::printf("verified: %zu blocks of %llu bytes over %s\n", l1.size() + l2.size(),
                static_cast<unsigned long long>(kBlockLen), kvx_transport_backend(a.get()));
}

}  // namespace

int main() {
    Dl_info info;
    if (dladdr(reinterpret_cast<void *>(&kvx_version_string), &info) && info.dli_fname)
        std::printf("library: %s\n", info.dli_fname);
    std::printf("version: %s\n", kvx_version_string());
    try {
        run();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "consumer-cxx: %s\n", e.what());
        return 1;
    }
    return 0;
}
