#include "wire/metadata.h"

#include <openssl/sha.h>

#include "util/error.h"

namespace kvx::wire {

namespace {

constexpr uint16_t kFlagCritical = 1;  // a reader that does not know the type must refuse
                                       // (bits 1..7: reserved, ignored by readers)
constexpr unsigned kVersionShift = 8;  // flags bits 8..15: the section's version
constexpr size_t kHeaderLen = 16;
constexpr size_t kChecksumLen = 8;
constexpr size_t kCoreLen = 8 * 4 + kSecretLen + 1 + 16 + 7;

void checksum(const uint8_t *p, size_t n, uint8_t out[kChecksumLen]) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(p, n, d);
    memcpy(out, d, kChecksumLen);
}

void put_core(Writer &w, const AgentMetadata &m) {
    w.u16(kSectionCore);
    w.u16(kFlagCritical);
    w.u32(kCoreLen);
    w.u64(m.base_addr);
    w.u64(m.num_blocks);
    w.u64(m.block_len);
    w.u64(m.instance_id);
    w.bytes(m.secret.data(), m.secret.size());
    w.u8(static_cast<uint8_t>(m.fingerprint.size()));
    uint8_t fp[16] = {};
    memcpy(fp, m.fingerprint.data(), std::min<size_t>(16, m.fingerprint.size()));
    w.bytes(fp, 16);
    for (int i = 0; i < 7; i++) w.u8(0);
}

void check_fingerprint(uint8_t fplen, const uint8_t *fp) {
    if (fplen != 0 && fplen != 16) fail(KVX_EBADMETA, "metadata: fingerprint length %u is not 0 or 16", fplen);
    for (size_t i = 0; i < 16; i++) {
        bool hex = (fp[i] >= '0' && fp[i] <= '9') || (fp[i] >= 'a' && fp[i] <= 'f');
        if (i < fplen ? !hex : fp[i] != 0)
            fail(KVX_EBADMETA, "metadata: fingerprint byte %zu (0x%02x) is invalid", i, fp[i]);
    }
}

void get_core(Reader &sr, size_t len, bool newer_minor, AgentMetadata &m) {
    if (len != kCoreLen && !(newer_minor && len > kCoreLen))
        fail(KVX_EBADMETA, "metadata: core section is %zu bytes, expected %zu", len, kCoreLen);
    m.base_addr = sr.u64("base_addr");
    m.num_blocks = sr.u64("num_blocks");
    m.block_len = sr.u64("block_len");
    m.instance_id = sr.u64("instance_id");
    memcpy(m.secret.data(), sr.bytes(kSecretLen, "secret"), kSecretLen);
    uint8_t fplen = sr.u8("fingerprint_len");
    const uint8_t *fp = sr.bytes(16, "fingerprint");
    sr.bytes(7, "reserved");
    check_fingerprint(fplen, fp);
    m.fingerprint.assign(reinterpret_cast<const char *>(fp), fplen);
    if (m.num_blocks == 0) fail(KVX_EBADMETA, "metadata: num_blocks is 0");
    if (m.block_len == 0) fail(KVX_EBADMETA, "metadata: block_len is 0");
    if (m.num_blocks > UINT64_MAX / m.block_len)
        fail(KVX_EBADMETA, "metadata: num_blocks %llu x block_len %llu overflows", (unsigned long long)m.num_blocks,
             (unsigned long long)m.block_len);
}

// Header fields after magic and version checks; returns total_len, section count.
std::pair<uint32_t, uint32_t> check_header(const uint8_t *p, size_t n, uint16_t *minor) {
    if (p == nullptr || n == 0) fail(KVX_EBADMETA, "metadata is empty");
    if (n < kHeaderLen + kChecksumLen)
        fail(KVX_EBADMETA, "metadata truncated: %zu bytes, the header alone needs %zu", n, kHeaderLen + kChecksumLen);
    Reader hr(p, kHeaderLen, KVX_EBADMETA, "metadata");
    uint32_t magic = hr.u32("magic");
    if (magic != kMetaMagic) fail(KVX_EBADMETA, "metadata: bad magic 0x%08x (not kvxfer agent metadata)", magic);
    uint16_t major = hr.u16("major");
    *minor = hr.u16("minor");
    if (major != kMetaMajor)
        fail(KVX_EVERSION, "metadata version %u.%u is not supported (this kvxfer reads major %u)", major, *minor,
             kMetaMajor);
    uint32_t total = hr.u32("total_len");
    uint32_t nsec = hr.u32("section_count");
    if (total > kMetaMaxLen) fail(KVX_EBADMETA, "metadata: total_len %u exceeds the %zu byte limit", total, kMetaMaxLen);
    if (n < total) fail(KVX_EBADMETA, "metadata truncated: %zu bytes of %u", n, total);
    if (n > total) fail(KVX_EBADMETA, "metadata has %zu trailing bytes after its %u byte length", n - total, total);
    if (total < kHeaderLen + kChecksumLen) fail(KVX_EBADMETA, "metadata: total_len %u is below the minimum", total);
    uint8_t sum[kChecksumLen];
    checksum(p, total - kChecksumLen, sum);
    if (memcmp(sum, p + total - kChecksumLen, kChecksumLen) != 0)
        fail(KVX_EBADMETA, "metadata checksum mismatch (corrupted in transit?)");
    if (nsec == 0 || nsec > kMaxSections)
        fail(KVX_EBADMETA, "metadata: section count %u out of range 1..%zu", nsec, kMaxSections);
    return {total, nsec};
}

}  // namespace

const Section *AgentMetadata::find(uint16_t type) const {
    for (const Section &s : sections)
        if (s.type == type) return &s;
    return nullptr;
}

std::vector<uint8_t> encode_metadata(const AgentMetadata &m) {
    Writer w;
    w.u32(kMetaMagic);
    w.u16(kMetaMajor);
    w.u16(kMetaMinor);
    w.u32(0);  // total length, patched below
    w.u32(static_cast<uint32_t>(1 + m.sections.size()));
    put_core(w, m);
    for (const Section &s : m.sections) {
        w.u16(s.type);
        w.u16(static_cast<uint16_t>(s.version << kVersionShift));
        w.u32(static_cast<uint32_t>(s.body.size()));
        w.bytes(s.body.data(), s.body.size());
    }
    w.patch_u32(8, static_cast<uint32_t>(w.size() + kChecksumLen));
    uint8_t sum[kChecksumLen];
    checksum(w.buf().data(), w.size(), sum);
    w.bytes(sum, sizeof sum);
    return std::move(w.buf());
}

AgentMetadata decode_metadata(const uint8_t *p, size_t n) {
    uint16_t minor = 0;
    auto [total, nsec] = check_header(p, n, &minor);
    Reader r(p + kHeaderLen, total - kHeaderLen - kChecksumLen, KVX_EBADMETA, "metadata");
    AgentMetadata m;
    bool have_core = false;
    for (uint32_t i = 0; i < nsec; i++) {
        uint16_t type = r.u16("section.type");
        uint16_t flags = r.u16("section.flags");
        uint32_t len = r.u32("section.len");
        const uint8_t *body = r.bytes(len, "section body");
        Reader sr(body, len, KVX_EBADMETA, "metadata section");
        if (type == kSectionCore) {
            if (have_core) fail(KVX_EBADMETA, "metadata: duplicate core section");
            if (!(flags & kFlagCritical))
                fail(KVX_EBADMETA, "metadata: core section not flagged critical (flags 0x%04x)", flags);
            if ((flags >> kVersionShift) != 0 && minor <= kMetaMinor)
                fail(KVX_EBADMETA, "metadata: core section version %u at minor version %u (only 0 exists)",
                     flags >> kVersionShift, minor);
            have_core = true;
            get_core(sr, len, minor > kMetaMinor, m);
            continue;
        }
        if (type == 0) fail(KVX_EBADMETA, "metadata: section type 0");
        if (flags & kFlagCritical)
            fail(KVX_EVERSION, "metadata: unknown critical section type %u (written by a newer kvxfer)", type);
        if (m.find(type)) fail(KVX_EBADMETA, "metadata: duplicate section type %u", type);
        Section s;
        s.type = type;
        s.version = static_cast<uint8_t>(flags >> kVersionShift);
        s.body.assign(body, body + len);
        m.sections.push_back(std::move(s));
    }
    if (r.remaining() != 0) fail(KVX_EBADMETA, "metadata: %zu bytes after the last section", r.remaining());
    if (!have_core) fail(KVX_EBADMETA, "metadata: core section missing");
    return m;
}

void put_endpoint(Writer &w, const net::Endpoint &e) {
    w.u8(e.family);
    w.u8(0);
    w.u16(e.port);
    w.bytes(e.addr.data(), e.addr.size());
}

net::Endpoint get_endpoint(Reader &r) {
    net::Endpoint e;
    e.family = r.u8("endpoint.family");
    uint8_t pad = r.u8("endpoint.pad");
    e.port = r.u16("endpoint.port");
    memcpy(e.addr.data(), r.bytes(16, "endpoint.addr"), 16);
    if (e.family != 4 && e.family != 6) fail(KVX_EBADMETA, "metadata: endpoint family %u is not 4 or 6", e.family);
    if (pad != 0) fail(KVX_EBADMETA, "metadata: endpoint padding byte is %u, not 0", pad);
    if (e.port == 0) fail(KVX_EBADMETA, "metadata: endpoint %s has port 0", e.str().c_str());
    if (e.family == 4)
        for (size_t i = 4; i < 16; i++)
            if (e.addr[i]) fail(KVX_EBADMETA, "metadata: IPv4 endpoint has non-zero bytes after the address");
    return e;
}

}  // namespace kvx::wire
