// libFuzzer target: the verbs backend's handshake parser
// (src/backends/verbs/verbs_wire.cpp), which reads rdma_cm private data sent
// by an unauthenticated peer (REQ on the target; REJECT/ACCEPT on the
// initiator). Input: the private data bytes, any length (IB CM pads them).
//
// Checks beyond "no crash": only kvx::Error with KVX_EINVAL or KVX_EVERSION
// may escape; an accepted message re-encodes to exactly the bytes it was
// decoded from (nothing ignored, nothing invented); a refusal carries only a
// status the protocol allows; the proofs compute on any accepted AUTH.
// Corpus: tests/fuzz/corpus/verbs (one well-formed message per kind, padded,
// truncated and other-version variants).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/verbs/verbs_wire.h"
#include "kvxfer.h"
#include "util/error.h"

using namespace kvx::verbs;

namespace {

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_verbs: %s\n", what);
    abort();
}

template <typename A>
void same_prefix(const A &enc, const uint8_t *d, size_t n) {
    if (n < enc.size() || memcmp(enc.data(), d, enc.size()) != 0) die("accepted message does not re-encode to its bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    Message m;
    try {
        m = decode(d, n);
    } catch (const kvx::Error &e) {
        if (e.code() != KVX_EINVAL && e.code() != KVX_EVERSION) die("unexpected error code");
        if (e.what()[0] == '\0') die("error without a message");
        return 0;
    } catch (...) {
        die("exception other than kvx::Error");
    }
    switch (m.kind) {
    case Kind::hello:
        same_prefix(encode(m.hello), d, n);
        break;
    case Kind::auth: {
        same_prefix(encode(m.auth), d, n);
        std::array<uint8_t, kvx::wire::kSecretLen> secret{};
        Challenge c;
        c.challenge_id = m.auth.challenge_id;
        if (client_proof(secret, c, m.auth) == server_proof(secret, c, m.auth)) die("client and server proofs agree");
        break;
    }
    case Kind::challenge:
        same_prefix(encode(m.challenge), d, n);
        break;
    case Kind::refuse: {
        int s = m.refuse.status;
        if (s != KVX_EAUTH && s != KVX_EFINGERPRINT && s != KVX_ECONNREFUSED && s != KVX_EVERSION)
            die("refusal with a status outside the protocol");
        same_prefix(encode(m.refuse), d, n);
        break;
    }
    case Kind::accept:
        same_prefix(encode(m.accept), d, n);
        break;
    default:
        die("decode returned an unknown kind");
    }
    return 0;
}
