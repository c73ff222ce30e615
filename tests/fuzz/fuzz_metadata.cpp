// libFuzzer target: the agent metadata parsers, the parsers of remote bytes
// reachable before any authentication: the container
// (kvx::wire::decode_metadata, src/wire/metadata.cpp) and, for every tcp
// section (type 2) it returns, the tcp backend's section codec
// (kvx::tcp::decode_section, src/backends/tcp/tcp_wire.cpp), for every verbs
// section (type 3) the verbs backend's (kvx::verbs::decode_section,
// src/backends/verbs/verbs_wire.cpp). The verbs codec's header includes
// rdma-core's, so verbs sections are checked only in a build with the verbs
// backend (KVX_FUZZ_VERBS, tests/fuzz/CMakeLists.txt) and stay opaque without.
//
// Each input is decoded twice:
//  1. as is: the checksum makes almost every mutation fail early, which is
//     exactly what a corrupted blob does in production;
//  2. "resealed": total_len set to the input size and the checksum recomputed,
//     so mutations of the sections reach the section and value checks.
// Whatever decodes must satisfy the documented invariants, re-encode to bytes
// that decode to the same value, encode canonically, and re-encode byte for
// byte to the input, except for the bytes the reader ignores (see
// normalized() below). An accepted tcp section must hold 1..16 valid
// endpoints and re-encode (kvx::tcp::encode_section) to its bytes likewise;
// an accepted verbs section 1..16 rails with valid endpoints and one key per
// slice of the region (see check_verbs_section()), and re-encode
// (kvx::verbs::encode_section) to its bytes likewise.
// Failures abort(). Errors other than KVX_EBADMETA / KVX_EVERSION, and any
// exception that is not a kvx::Error, are bugs.
#include <openssl/sha.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "backends/tcp/tcp_wire.h"
#ifdef KVX_FUZZ_VERBS
#include "backends/verbs/verbs.h"
#endif
#include "kvxfer.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/net.h"
#include "wire/metadata.h"

using namespace kvx::wire;
using kvx::net::Endpoint;

namespace {

constexpr uint16_t kSectionTcp = 2;  // the tcp backend's id
constexpr size_t kHeader = 16, kSum = 8, kSecHeader = 8;
constexpr size_t kCoreLen = 88, kCoreReserved = 81;  // docs/wire-format.md, core section

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_metadata: %s\n", what);
    abort();
}

// true: f() threw a documented error; false: it returned. Anything else aborts.
template <typename F>
bool refused(const char *what, F &&f) {
    try {
        f();
        return false;
    } catch (const kvx::Error &e) {
        if (e.code() != KVX_EBADMETA && e.code() != KVX_EVERSION) {
            fprintf(stderr, "fuzz_metadata: %s: unexpected code %d: %s\n", what, e.code(), e.what());
            abort();
        }
        if (e.what()[0] == '\0') die("error without a message");
        return true;
    } catch (...) {
        fprintf(stderr, "fuzz_metadata: %s: exception other than kvx::Error\n", what);
        abort();
    }
}

void seal(std::vector<uint8_t> &b) {
    uint8_t d[SHA256_DIGEST_LENGTH];
    SHA256(b.data(), b.size() - kSum, d);
    memcpy(b.data() + b.size() - kSum, d, kSum);
}

void check_endpoint(const Endpoint &e) {
    if (e.family != 4 && e.family != 6) die("accepted an endpoint family other than 4/6");
    if (e.port == 0) die("accepted port 0");
    if (e.family == 4)
        for (size_t i = 4; i < 16; i++)
            if (e.addr[i]) die("accepted an IPv4 endpoint with address bytes after the 4th");
    (void)e.str();
}

void check_invariants(const AgentMetadata &m) {
    if (m.num_blocks == 0 || m.block_len == 0) die("accepted an empty region");
    if (m.num_blocks > UINT64_MAX / m.block_len) die("accepted an overflowing region size");
    if (!m.fingerprint.empty()) {
        if (m.fingerprint.size() != 16) die("accepted a fingerprint that is not 16 characters");
        for (char c : m.fingerprint)
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) die("accepted a non-hex fingerprint");
    }
    if (m.sections.size() + 1 > kMaxSections) die("accepted more than kMaxSections sections");
    std::set<uint16_t> types;
    for (const Section &s : m.sections) {
        if (s.type == 0 || s.type == kSectionCore) die("returned a backend section of type 0 or 1");
        if (!types.insert(s.type).second) die("returned two sections of one type");
        if (m.find(s.type) != &s) die("find() does not return the section of that type");
        if (s.body.size() > kMetaMaxLen) die("returned a section larger than the metadata limit");
    }
}

// The tcp section: bounded, documented errors only; what it accepts is 1..16
// valid endpoints that re-encode to the section's bytes (a newer section
// version may append bytes; the reserved u16 is not read).
void check_tcp_section(const Section &s) {
    std::vector<Endpoint> eps;
    if (refused("tcp section", [&] { eps = kvx::tcp::decode_section(s); })) return;
    if (eps.empty() || eps.size() > kMaxEndpoints) die("accepted a tcp section with 0 or more than 16 endpoints");
    for (const Endpoint &e : eps) check_endpoint(e);

    Section enc = kvx::tcp::encode_section(eps);
    if (enc.type != kSectionTcp || enc.version != 0) die("tcp section encodes with another type or version");
    std::vector<uint8_t> want = s.body;
    want[2] = want[3] = 0;  // reserved
    if (s.version == 0 ? enc.body != want
                       : enc.body.size() > want.size() || !std::equal(enc.body.begin(), enc.body.end(), want.begin()))
        die("tcp section does not re-encode to its bytes");
    std::vector<Endpoint> again;
    if (refused("re-encoded tcp section", [&] { again = kvx::tcp::decode_section(enc); }))
        die("re-encoded tcp section refused");
    if (again != eps) die("tcp decode_section(encode_section(e)) != e");
}

#ifdef KVX_FUZZ_VERBS
namespace verbs = kvx::verbs;

constexpr size_t kVerbsReserved = 40;  // the u32 after the first rail's rkey, not read

bool same(const verbs::SectionInfo &a, const verbs::SectionInfo &b) {
    if (a.mr_addr != b.mr_addr || a.mr_len != b.mr_len || a.slice_len != b.slice_len) return false;
    if (a.rails.size() != b.rails.size()) return false;
    for (size_t i = 0; i < a.rails.size(); i++)
        if (!(a.rails[i].cm == b.rails[i].cm) || a.rails[i].rkeys != b.rails[i].rkeys) return false;
    return true;
}

// The verbs section: bounded, documented errors only. What it accepts is what
// the initiator then writes with: 1..16 rails with valid endpoints, each with
// one key per slice (slice_len: whole blocks, mr_len when not sliced), over
// exactly the metadata's region, which must not wrap around. It re-encodes to
// the section's bytes: version 0 as version 1 with no further rail (the u32
// it appends), versions 1 and 2 exactly, a later version as its version 2
// prefix (it may append); the reserved u32 is not read. One slice is one
// registration, which the encoder writes as version 1: a version 2 or later
// section of one slice re-encodes to the bytes before its slice fields.
void check_verbs_section(const Section &s, const AgentMetadata &m) {
    verbs::SectionInfo v;
    if (refused("verbs section", [&] { v = verbs::decode_section(s, m); })) return;
    if (v.rails.empty() || v.rails.size() > verbs::kMaxRails)
        die("accepted a verbs section with 0 or more than 16 rails");
    if (v.mr_len != m.num_blocks * m.block_len) die("accepted a verbs region of another size than the metadata's");
    if (v.mr_addr > UINT64_MAX - v.mr_len) die("accepted a verbs region that wraps around");
    if (v.slice_len == 0 || v.slice_len % m.block_len != 0 || v.slice_len > v.mr_len)
        die("accepted a verbs slice length that is not whole blocks of the region");
    const uint64_t slices = v.mr_len / v.slice_len + (v.mr_len % v.slice_len != 0);
    if (slices > verbs::kMaxSlices) die("accepted more than kMaxSlices verbs slices");
    for (const verbs::RemoteRail &r : v.rails) {
        check_endpoint(r.cm);
        if (r.rkeys.size() != slices) die("accepted a verbs rail without exactly one key per slice");
    }

    const Section enc = verbs::encode_section(v);
    const uint8_t version = slices > 1 ? verbs::kSectionVersionSliced : verbs::kSectionVersion;
    if (enc.type != verbs::kSectionId || enc.version != version)
        die("verbs section encodes with another type or version");
    std::vector<uint8_t> want = s.body, got = enc.body;
    std::fill(want.begin() + kVerbsReserved, want.begin() + kVerbsReserved + 4, 0);
    if (s.version == 0) want.resize(want.size() + 4, 0);  // more_rails
    if (s.version >= verbs::kSectionVersionSliced && slices == 1) {  // the slice fields version 1 leaves out
        got.resize(got.size() + 12);
        kvx::put_le(got.data() + got.size() - 12, v.slice_len, 8);
        kvx::put_le(got.data() + got.size() - 4, 1, 4);
    }
    if (s.version <= verbs::kSectionVersionSliced
            ? got != want
            : got.size() > want.size() || !std::equal(got.begin(), got.end(), want.begin()))
        die("verbs section does not re-encode to its bytes");
    verbs::SectionInfo again;
    if (refused("re-encoded verbs section", [&] { again = verbs::decode_section(enc, m); }))
        die("re-encoded verbs section refused");
    if (!same(again, v)) die("verbs decode_section(encode_section(v)) != v");
    if (verbs::encode_section(again) != enc) die("verbs section encoding is not canonical");
}
#endif

// The input as encode_metadata() writes what the reader kept. The reader
// ignores (docs/wire-format.md): the minor version and whatever a newer minor
// appended to the core section, the core section's reserved bytes, the
// reserved flag bits 1..7 of every section; and, not written down there, the
// core section's flags (critical, version) and its position among the
// sections. Backend sections are otherwise kept byte for byte, in order.
// Only called on accepted input (the walk needs no bound checks).
std::vector<uint8_t> normalized(const uint8_t *p, size_t n) {
    const uint32_t nsec = static_cast<uint32_t>(kvx::get_le(p + 12, 4));
    std::vector<uint8_t> core, rest;
    size_t off = kHeader;
    for (uint32_t i = 0; i < nsec; i++) {
        const uint16_t type = static_cast<uint16_t>(kvx::get_le(p + off, 2));
        const size_t len = kvx::get_le(p + off + 4, 4);
        const uint8_t *body = p + off + kSecHeader;
        if (type == kSectionCore) {
            uint8_t h[kSecHeader];
            kvx::put_le(h, kSectionCore, 2);
            kvx::put_le(h + 2, 1, 2);  // critical
            kvx::put_le(h + 4, kCoreLen, 4);
            core.assign(h, h + kSecHeader);
            core.insert(core.end(), body, body + kCoreLen);
            std::fill(core.begin() + kSecHeader + kCoreReserved, core.end(), 0);
        } else {
            const size_t at = rest.size();
            rest.insert(rest.end(), p + off, body + len);
            rest[at + 2] &= 0x01;  // flags bits 1..7 (bit 0 stays: a critical one is refused)
        }
        off += kSecHeader + len;
    }
    if (off + kSum != n) die("accepted bytes between the last section and the checksum");
    std::vector<uint8_t> out(p, p + kHeader);
    kvx::put_le(out.data() + 6, kMetaMinor, 2);
    out.insert(out.end(), core.begin(), core.end());
    out.insert(out.end(), rest.begin(), rest.end());
    out.resize(out.size() + kSum);
    kvx::put_le(out.data() + 8, out.size(), 4);
    seal(out);
    return out;
}

void decode_and_check(const uint8_t *p, size_t n) {
    AgentMetadata m;
    if (refused("metadata", [&] { m = decode_metadata(p, n); })) return;
    check_invariants(m);
    for (const Section &s : m.sections) {
        if (s.type == kSectionTcp) check_tcp_section(s);
#ifdef KVX_FUZZ_VERBS
        if (s.type == verbs::kSectionId) check_verbs_section(s, m);
#endif
    }

    std::vector<uint8_t> enc = encode_metadata(m);
    if (enc.size() > kMetaMaxLen) die("re-encoding exceeds the metadata size limit");
    if (enc != normalized(p, n)) die("metadata does not re-encode to its bytes");
    AgentMetadata again;
    if (refused("re-encoded metadata", [&] { again = decode_metadata(enc.data(), enc.size()); }))
        die("re-encoded metadata refused");
    if (!(again == m)) die("decode(encode(m)) != m");
    if (encode_metadata(again) != enc) die("encoding is not canonical");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // libFuzzer hands an exact-size heap copy: any overread is an ASan report.
    decode_and_check(size ? data : nullptr, size);

    if (size >= kHeader + kSum && size <= kMetaMaxLen) {
        std::vector<uint8_t> b(data, data + size);
        kvx::put_le(b.data() + 8, size, 4);
        seal(b);
        decode_and_check(b.data(), b.size());
    }
    return 0;
}
