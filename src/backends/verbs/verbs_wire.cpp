// The verbs section of the metadata: the rdma_cm endpoint and the MR.
#include "backends/verbs/verbs.h"
#include "util/bytes.h"
#include "util/error.h"

namespace kvx {

namespace verbs {
namespace {
constexpr size_t kSectionLen = wire::kEndpointLen + 24;
}  // namespace
}  // namespace verbs

wire::Section verbs::encode_section(const SectionInfo &v) {
    Writer w;
    wire::put_endpoint(w, v.cm);
    w.u64(v.mr_addr);
    w.u64(v.mr_len);
    w.u32(v.rkey);
    w.u32(0);
    return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
}

verbs::SectionInfo verbs::decode_section(const wire::Section &s, const wire::AgentMetadata &m) {
    if (s.body.size() != kSectionLen && !(s.version > kSectionVersion && s.body.size() > kSectionLen))
        fail(KVX_EBADMETA, "metadata: verbs section is %zu bytes, expected %zu", s.body.size(), kSectionLen);
    Reader r(s.body.data(), s.body.size(), KVX_EBADMETA, "metadata verbs section");
    SectionInfo v;
    v.cm = wire::get_endpoint(r);
    v.mr_addr = r.u64("verbs.mr_addr");
    v.mr_len = r.u64("verbs.mr_len");
    v.rkey = r.u32("verbs.rkey");
    r.u32("verbs.reserved");
    if (v.mr_len != m.num_blocks * m.block_len)
        fail(KVX_EBADMETA, "metadata: verbs MR length %llu differs from the region size", (unsigned long long)v.mr_len);
    if (v.mr_addr > UINT64_MAX - v.mr_len)
        fail(KVX_EBADMETA, "metadata: verbs MR at 0x%llx + %llu bytes wraps around", (unsigned long long)v.mr_addr,
             (unsigned long long)v.mr_len);
    return v;
}

}  // namespace kvx
