// libFuzzer target: the agent metadata parser (kvx::wire::decode_metadata),
// the one parser of remote bytes reachable before any authentication.
//
// Each input is decoded twice:
//  1. as is: the checksum makes almost every mutation fail early, which is
//     exactly what a corrupted blob does in production;
//  2. "resealed": total_len set to the input size and the checksum recomputed,
//     so mutations of the sections reach the section and value checks.
// Whatever decodes must satisfy the documented invariants, re-encode to bytes
// that decode to the same value, and encode canonically. Failures abort().
// Errors other than KVX_EBADMETA / KVX_EVERSION, and any exception that is not
// a kvx::Error, are bugs.
#include <openssl/sha.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kvxfer.h"
#include "util/error.h"
#include "wire/metadata.h"

using namespace kvx::wire;

namespace {

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_metadata: %s\n", what);
    abort();
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
    const auto b = static_cast<uint8_t>(m.backend);
    if (b < 1 || b > 3) die("accepted an unknown backend kind");
    if (m.tcp.size() > kMaxEndpoints) die("accepted more than kMaxEndpoints tcp endpoints");
    for (const auto &e : m.tcp) check_endpoint(e);
    if (m.backend == BackendKind::tcp && m.tcp.empty()) die("accepted a tcp backend without endpoints");
    if (m.backend == BackendKind::verbs && !m.verbs) die("accepted a verbs backend without a verbs section");
    if (m.verbs) {
        check_endpoint(m.verbs->cm);
        if (m.verbs->mr_len != m.num_blocks * m.block_len) die("accepted a verbs MR of the wrong length");
    }
    (void)backend_kind_name(m.backend);
}

void decode_and_check(const uint8_t *p, size_t n) {
    AgentMetadata m;
    try {
        m = decode_metadata(p, n);
    } catch (const kvx::Error &e) {
        if (e.code() != KVX_EBADMETA && e.code() != KVX_EVERSION) {
            fprintf(stderr, "fuzz_metadata: unexpected code %d: %s\n", e.code(), e.what());
            abort();
        }
        if (e.what()[0] == '\0') die("error without a message");
        return;
    }
    check_invariants(m);
    std::vector<uint8_t> enc = encode_metadata(m);
    if (enc.size() > kMetaMaxLen) die("re-encoding exceeds the metadata size limit");
    AgentMetadata again;
    try {
        again = decode_metadata(enc.data(), enc.size());
    } catch (const kvx::Error &e) {
        fprintf(stderr, "fuzz_metadata: re-encoded metadata refused: %s\n", e.what());
        abort();
    }
    if (!(again == m)) die("decode(encode(m)) != m");
    if (encode_metadata(again) != enc) die("encoding is not canonical");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // libFuzzer hands an exact-size heap copy: any overread is an ASan report.
    decode_and_check(size ? data : nullptr, size);

    constexpr size_t kHeader = 16, kSum = 8;
    if (size >= kHeader + kSum && size <= kMetaMaxLen) {
        std::vector<uint8_t> b(data, data + size);
        for (size_t i = 0; i < 4; i++) b[8 + i] = static_cast<uint8_t>(size >> (8 * i));
        uint8_t d[SHA256_DIGEST_LENGTH];
        SHA256(b.data(), size - kSum, d);
        memcpy(b.data() + size - kSum, d, kSum);
        decode_and_check(b.data(), b.size());
    }
    return 0;
}
