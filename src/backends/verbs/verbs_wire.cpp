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

// Version 2: u64 slice_len, u32 slices, then each rail's keys of the
// slices after its first, rail by rail (none when one slice).
void decode_slices(Reader &r, unsigned version, const wire::AgentMetadata &m, SectionInfo *v) {
    if (r.remaining() < 12)
        fail(KVX_EBADMETA, "metadata: verbs section version %u has %zu bytes for its slices, expected at least 12",
             version, r.remaining());
    const uint64_t len = r.u64("verbs.slice_len");
    const uint32_t count = r.u32("verbs.slices");
    // A slice as long as the region is one registration: 0.14 writes version
    // 1 then, but a later version that appends must be able to say so.
    if (len == 0 || len % m.block_len != 0)
        fail(KVX_EBADMETA, "metadata: verbs slice length %llu is not a non-zero multiple of the block length %llu",
             (unsigned long long)len, (unsigned long long)m.block_len);
    if (len > v->mr_len)
        fail(KVX_EBADMETA, "metadata: verbs slice length %llu exceeds the region size %llu", (unsigned long long)len,
             (unsigned long long)v->mr_len);
    if (count > kMaxSlices)
        fail(KVX_EBADMETA, "metadata: verbs section lists %u slices, at most %zu allowed", count, kMaxSlices);
    const uint64_t want = v->mr_len / len + (v->mr_len % len != 0);
    if (count != want)
        fail(KVX_EBADMETA, "metadata: verbs section lists %u slices, its slice length %llu makes %llu", count,
             (unsigned long long)len, (unsigned long long)want);
    const size_t keys = v->rails.size() * (count - 1);
    if (version == kSectionVersionSliced ? r.remaining() != keys * 4 : r.remaining() < keys * 4)
        fail(KVX_EBADMETA, "metadata: verbs section has %zu bytes for the keys of %u slices on %zu rails, expected %zu",
             r.remaining(), count, v->rails.size(), keys * 4);
    for (RemoteRail &rr : v->rails)
        for (uint32_t i = 1; i < count; i++) rr.rkeys.push_back(r.u32("verbs.slice.rkey"));
    v->slice_len = len;
}

}  // namespace
}  // namespace verbs

wire::Section verbs::encode_section(const SectionInfo &v) {
    const bool sliced = v.slice_len != 0 && v.slice_len < v.mr_len;
    Writer w;
    wire::put_endpoint(w, v.rails.front().cm);
    w.u64(v.mr_addr);
    w.u64(sliced ? v.slice_len : v.mr_len);  // sliced: the first slice's, which older readers refuse
    w.u32(v.rails.front().rkeys.front());
    w.u32(0);
    w.u32(static_cast<uint32_t>(v.rails.size() - 1));
    for (size_t i = 1; i < v.rails.size(); i++) {
        wire::put_endpoint(w, v.rails[i].cm);
        w.u32(v.rails[i].rkeys.front());
    }
    if (!sliced) return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
    w.u64(v.slice_len);
    w.u32(static_cast<uint32_t>(v.rails.front().rkeys.size()));
    for (const RemoteRail &r : v.rails)
        for (size_t i = 1; i < r.rkeys.size(); i++) w.u32(r.rkeys[i]);
    return wire::Section{kSectionId, kSectionVersionSliced, std::move(w.buf())};
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
    const uint64_t first_len = r.u64("verbs.mr_len");
    v.rails[0].rkeys.push_back(r.u32("verbs.rkey"));
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
            rr.rkeys.push_back(r.u32("verbs.rail.rkey"));
            v.rails.push_back(rr);
        }
    }
    v.mr_len = m.num_blocks * m.block_len;  // the core section checked that it does not overflow
    v.slice_len = v.mr_len;
    if (s.version >= kSectionVersionSliced) decode_slices(r, s.version, m, &v);
    if (first_len != v.slice_len)
        fail(KVX_EBADMETA, "metadata: verbs MR length %llu differs from the %s, %llu", (unsigned long long)first_len,
             v.slice_len < v.mr_len ? "slice length" : "region size", (unsigned long long)v.slice_len);
    if (v.mr_addr > UINT64_MAX - v.mr_len)
        fail(KVX_EBADMETA, "metadata: verbs MR at 0x%llx + %llu bytes wraps around", (unsigned long long)v.mr_addr,
             (unsigned long long)v.mr_len);
    return v;
}

}  // namespace kvx
