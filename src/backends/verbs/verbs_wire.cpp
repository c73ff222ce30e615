// The verbs section of the metadata: the region and every rail's rdma_cm
// endpoint and rkey (docs/wire-format.md, "verbs section").
#include "backends/verbs/verbs.h"
#include "util/bytes.h"
#include "util/error.h"

namespace kvx {

namespace verbs {
namespace {
// Version 0, which version 1 begins with: the first rail and the region.
constexpr size_t kSectionLen = wire::kEndpointLen + 24;
constexpr size_t kRailLen = wire::kEndpointLen + 4;  // each further rail (version 1)
}  // namespace
}  // namespace verbs

wire::Section verbs::encode_section(const SectionInfo &v) {
    Writer w;
    wire::put_endpoint(w, v.rails.front().cm);
    w.u64(v.mr_addr);
    w.u64(v.mr_len);
    w.u32(v.rails.front().rkey);
    w.u32(0);
    w.u32(static_cast<uint32_t>(v.rails.size() - 1));
    for (size_t i = 1; i < v.rails.size(); i++) {
        wire::put_endpoint(w, v.rails[i].cm);
        w.u32(v.rails[i].rkey);
    }
    return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
}

verbs::SectionInfo verbs::decode_section(const wire::Section &s, const wire::AgentMetadata &m) {
    const size_t n = s.body.size();
    if (s.version == 0 ? n != kSectionLen : n < kSectionLen + 4)
        fail(KVX_EBADMETA, "metadata: verbs section version %u is %zu bytes, expected %s%zu", s.version, n,
             s.version == 0 ? "" : "at least ", s.version == 0 ? kSectionLen : kSectionLen + 4);
    Reader r(s.body.data(), n, KVX_EBADMETA, "metadata verbs section");
    SectionInfo v;
    v.rails.emplace_back();
    v.rails[0].cm = wire::get_endpoint(r);
    v.mr_addr = r.u64("verbs.mr_addr");
    v.mr_len = r.u64("verbs.mr_len");
    v.rails[0].rkey = r.u32("verbs.rkey");
    r.u32("verbs.reserved");
    if (s.version >= 1) {
        const uint32_t more = r.u32("verbs.more_rails");
        if (more > kMaxRails - 1)
            fail(KVX_EBADMETA, "metadata: verbs section lists %u rails, at most %zu allowed", more + 1, kMaxRails);
        // Version 1 is exactly this long; a later version may append more.
        if (s.version == 1 ? r.remaining() != more * kRailLen : r.remaining() < more * kRailLen)
            fail(KVX_EBADMETA, "metadata: verbs section has %zu bytes for %u more rails, expected %zu", r.remaining(),
                 more, more * kRailLen);
        for (uint32_t i = 0; i < more; i++) {
            RemoteRail rr;
            rr.cm = wire::get_endpoint(r);
            rr.rkey = r.u32("verbs.rail.rkey");
            v.rails.push_back(rr);
        }
    }
    if (v.mr_len != m.num_blocks * m.block_len)
        fail(KVX_EBADMETA, "metadata: verbs MR length %llu differs from the region size", (unsigned long long)v.mr_len);
    if (v.mr_addr > UINT64_MAX - v.mr_len)
        fail(KVX_EBADMETA, "metadata: verbs MR at 0x%llx + %llu bytes wraps around", (unsigned long long)v.mr_addr,
             (unsigned long long)v.mr_len);
    return v;
}

}  // namespace kvx
