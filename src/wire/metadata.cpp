#include "wire/metadata.h"

#include <arpa/inet.h>
#include <openssl/sha.h>

#include "util/error.h"
#include "wire/bytes.h"

namespace kvx::wire {

namespace {

enum SectionType : uint16_t { kSecCore = 1, kSecTcp = 2, kSecVerbs = 3 };
constexpr uint16_t kSecCritical = 1;  // flag: a reader that does not know the type must refuse
constexpr size_t kHeaderLen = 16;
constexpr size_t kChecksumLen = 8;
constexpr size_t kCoreLen = 8 * 4 + kSecretLen + 1 + 16 + 1 + 6;
constexpr size_t kEndpointLen = 20;

void checksum(const uint8_t *p, size_t n, uint8_t out[kChecksumLen]) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(p, n, d);
    memcpy(out, d, kChecksumLen);
}

void put_endpoint(Writer &w, const Endpoint &e) {
    w.u8(e.family);
    w.u8(0);
    w.u16(e.port);
    w.bytes(e.addr.data(), e.addr.size());
}

Endpoint get_endpoint(Reader &r) {
    Endpoint e;
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

void check_section_len(uint16_t type, size_t got, size_t want, bool newer_minor) {
    if (got == want || (newer_minor && got > want)) return;
    fail(KVX_EBADMETA, "metadata: section %u is %zu bytes, expected %zu", type, got, want);
}

}  // namespace

const char *backend_kind_name(BackendKind k) {
    switch (k) {
    case BackendKind::tcp: return "tcp";
    case BackendKind::verbs: return "verbs";
    case BackendKind::shm: return "shm";
    }
    return "?";
}

std::string Endpoint::str() const {
    char buf[INET6_ADDRSTRLEN] = "?";
    inet_ntop(family == 6 ? AF_INET6 : AF_INET, addr.data(), buf, sizeof buf);
    return family == 6 ? strfmt("[%s]:%u", buf, port) : strfmt("%s:%u", buf, port);
}

std::vector<uint8_t> encode_metadata(const AgentMetadata &m) {
    Writer w;
    w.u32(kMetaMagic);
    w.u16(kMetaMajor);
    w.u16(kMetaMinor);
    w.u32(0);  // total length, patched below
    uint32_t nsec = 1 + (m.tcp.empty() ? 0 : 1) + (m.verbs ? 1 : 0);
    w.u32(nsec);

    w.u16(kSecCore);
    w.u16(kSecCritical);
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
    w.u8(static_cast<uint8_t>(m.backend));
    for (int i = 0; i < 6; i++) w.u8(0);

    if (!m.tcp.empty()) {
        w.u16(kSecTcp);
        w.u16(0);
        w.u32(static_cast<uint32_t>(4 + kEndpointLen * m.tcp.size()));
        w.u16(static_cast<uint16_t>(m.tcp.size()));
        w.u16(0);
        for (const auto &e : m.tcp) put_endpoint(w, e);
    }
    if (m.verbs) {
        w.u16(kSecVerbs);
        w.u16(0);
        w.u32(kEndpointLen + 24);
        put_endpoint(w, m.verbs->cm);
        w.u64(m.verbs->mr_addr);
        w.u64(m.verbs->mr_len);
        w.u32(m.verbs->rkey);
        w.u32(0);
    }
    w.patch_u32(8, static_cast<uint32_t>(w.size() + kChecksumLen));
    uint8_t sum[kChecksumLen];
    checksum(w.buf().data(), w.size(), sum);
    w.bytes(sum, sizeof sum);
    return std::move(w.buf());
}

AgentMetadata decode_metadata(const uint8_t *p, size_t n) {
    if (p == nullptr || n == 0) fail(KVX_EBADMETA, "metadata is empty");
    if (n < kHeaderLen + kChecksumLen)
        fail(KVX_EBADMETA, "metadata truncated: %zu bytes, the header alone needs %zu", n, kHeaderLen + kChecksumLen);
    Reader hr(p, kHeaderLen, KVX_EBADMETA, "metadata");
    uint32_t magic = hr.u32("magic");
    if (magic != kMetaMagic) fail(KVX_EBADMETA, "metadata: bad magic 0x%08x (not kvxfer agent metadata)", magic);
    uint16_t major = hr.u16("major");
    uint16_t minor = hr.u16("minor");
    if (major != kMetaMajor)
        fail(KVX_EVERSION, "metadata version %u.%u is not supported (this kvxfer reads major %u)", major, minor, kMetaMajor);
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
    if (nsec == 0 || nsec > 64) fail(KVX_EBADMETA, "metadata: section count %u out of range 1..64", nsec);

    const bool newer = minor > kMetaMinor;
    Reader r(p + kHeaderLen, total - kHeaderLen - kChecksumLen, KVX_EBADMETA, "metadata");
    AgentMetadata m;
    bool have_core = false, have_tcp = false;
    for (uint32_t s = 0; s < nsec; s++) {
        uint16_t type = r.u16("section.type");
        uint16_t flags = r.u16("section.flags");
        uint32_t len = r.u32("section.len");
        Reader sr(r.bytes(len, "section body"), len, KVX_EBADMETA, "metadata section");
        switch (type) {
        case kSecCore: {
            if (have_core) fail(KVX_EBADMETA, "metadata: duplicate core section");
            check_section_len(type, len, kCoreLen, newer);
            have_core = true;
            m.base_addr = sr.u64("base_addr");
            m.num_blocks = sr.u64("num_blocks");
            m.block_len = sr.u64("block_len");
            m.instance_id = sr.u64("instance_id");
            memcpy(m.secret.data(), sr.bytes(kSecretLen, "secret"), kSecretLen);
            uint8_t fplen = sr.u8("fingerprint_len");
            const uint8_t *fp = sr.bytes(16, "fingerprint");
            uint8_t backend = sr.u8("backend");
            sr.bytes(6, "reserved");
            if (fplen != 0 && fplen != 16) fail(KVX_EBADMETA, "metadata: fingerprint length %u is not 0 or 16", fplen);
            for (size_t i = 0; i < 16; i++) {
                bool hex = (fp[i] >= '0' && fp[i] <= '9') || (fp[i] >= 'a' && fp[i] <= 'f');
                if (i < fplen ? !hex : fp[i] != 0)
                    fail(KVX_EBADMETA, "metadata: fingerprint byte %zu (0x%02x) is invalid", i, fp[i]);
            }
            m.fingerprint.assign(reinterpret_cast<const char *>(fp), fplen);
            if (backend < 1 || backend > 3) fail(KVX_EBADMETA, "metadata: unknown backend kind %u", backend);
            m.backend = static_cast<BackendKind>(backend);
            if (m.num_blocks == 0) fail(KVX_EBADMETA, "metadata: num_blocks is 0");
            if (m.block_len == 0) fail(KVX_EBADMETA, "metadata: block_len is 0");
            if (m.num_blocks > UINT64_MAX / m.block_len)
                fail(KVX_EBADMETA, "metadata: num_blocks %llu x block_len %llu overflows",
                     (unsigned long long)m.num_blocks, (unsigned long long)m.block_len);
            break;
        }
        case kSecTcp: {
            if (have_tcp) fail(KVX_EBADMETA, "metadata: duplicate tcp section");
            have_tcp = true;
            uint16_t cnt = sr.u16("tcp.count");
            sr.u16("tcp.reserved");
            if (cnt == 0 || cnt > kMaxEndpoints)
                fail(KVX_EBADMETA, "metadata: tcp endpoint count %u out of range 1..%zu", cnt, kMaxEndpoints);
            check_section_len(type, len, 4 + kEndpointLen * cnt, newer);
            for (uint16_t i = 0; i < cnt; i++) m.tcp.push_back(get_endpoint(sr));
            break;
        }
        case kSecVerbs: {
            if (m.verbs) fail(KVX_EBADMETA, "metadata: duplicate verbs section");
            check_section_len(type, len, kEndpointLen + 24, newer);
            VerbsInfo v;
            v.cm = get_endpoint(sr);
            v.mr_addr = sr.u64("verbs.mr_addr");
            v.mr_len = sr.u64("verbs.mr_len");
            v.rkey = sr.u32("verbs.rkey");
            sr.u32("verbs.reserved");
            m.verbs = v;
            break;
        }
        default:
            if (flags & kSecCritical)
                fail(KVX_EVERSION, "metadata: unknown critical section type %u (written by a newer kvxfer)", type);
            break;  // optional section of a newer minor version: skip
        }
    }
    if (r.remaining() != 0) fail(KVX_EBADMETA, "metadata: %zu bytes after the last section", r.remaining());
    if (!have_core) fail(KVX_EBADMETA, "metadata: core section missing");
    if (m.verbs && m.verbs->mr_len != m.num_blocks * m.block_len)
        fail(KVX_EBADMETA, "metadata: verbs MR length %llu differs from the region size", (unsigned long long)m.verbs->mr_len);
    if (m.backend == BackendKind::tcp && m.tcp.empty()) fail(KVX_EBADMETA, "metadata: tcp backend without endpoints");
    if (m.backend == BackendKind::verbs && !m.verbs) fail(KVX_EBADMETA, "metadata: verbs backend without verbs section");
    return m;
}

}  // namespace kvx::wire
