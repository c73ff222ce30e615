// The verbs handshake codec (src/backends/verbs/verbs_wire.h): sizes within
// the RC private-data limit, round trips, rejection of malformed or foreign
// bytes, and proofs that bind secret, challenge, label and every field.
// Needs no RDMA device: runs everywhere.
#include <cstdarg>
#include <cstddef>
#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/verbs/verbs_wire.h"
#include "util/error.h"

// cmocka's fail() macro clashes with kvx::fail: include it last.
extern "C" {
#include <cmocka.h>
}

using namespace kvx;
using namespace kvx::verbs;

namespace {

int decode_code(const std::vector<uint8_t> &b) {
    try {
        decode(b.data(), b.size());
        return 0;
    } catch (const Error &e) {
        return e.code();
    }
}

template <size_t N>
std::vector<uint8_t> vec(const std::array<uint8_t, N> &a) {
    return std::vector<uint8_t>(a.begin(), a.end());
}

Auth sample_auth() {
    Auth a;
    a.instance_id = 0x1122334455667788ull;
    a.challenge_id = 0xdeadbeef;
    a.fingerprint = fingerprint_bytes("0123456789abcdef");
    for (size_t i = 0; i < a.nonce.size(); i++) a.nonce[i] = static_cast<uint8_t>(i * 7 + 1);
    return a;
}

void test_sizes(void **) {
    assert_true(kAuthLen <= 56);
    assert_int_equal(kAuthLen, 56);
    assert_true(kChallengeLen <= 148);  // IB CM REJ private data
    assert_true(kAcceptLen <= 196);     // IB CM REP private data
    assert_true(kHelloLen <= 56);
}

void test_round_trip(void **) {
    Message m = decode(encode(Hello{42}).data(), kHelloLen);
    assert_true(m.kind == Kind::hello);
    assert_int_equal(m.hello.instance_id, 42);

    Auth a = sample_auth();
    a.mac[3] = 9;
    std::vector<uint8_t> padded = vec(encode(a));
    padded.resize(56 + 36, 0);  // transports may pad
    m = decode(padded.data(), padded.size());
    assert_true(m.kind == Kind::auth);
    assert_int_equal(m.auth.instance_id, a.instance_id);
    assert_int_equal(m.auth.challenge_id, a.challenge_id);
    assert_memory_equal(m.auth.fingerprint.data(), a.fingerprint.data(), 8);
    assert_memory_equal(m.auth.nonce.data(), a.nonce.data(), a.nonce.size());
    assert_memory_equal(m.auth.mac.data(), a.mac.data(), kProofLen);

    Challenge c;
    c.challenge_id = 7;
    c.nonce[15] = 0xff;
    m = decode(encode(c).data(), kChallengeLen);
    assert_true(m.kind == Kind::challenge);
    assert_int_equal(m.challenge.challenge_id, 7);
    assert_int_equal(m.challenge.nonce[15], 0xff);

    for (int s : {KVX_EAUTH, KVX_EFINGERPRINT, KVX_ECONNREFUSED, KVX_EVERSION}) {
        m = decode(encode(Refuse{s}).data(), kRefuseLen);
        assert_true(m.kind == Kind::refuse);
        assert_int_equal(m.refuse.status, s);
    }
    Accept acc;
    acc.mac[0] = 1;
    m = decode(encode(acc).data(), kAcceptLen);
    assert_true(m.kind == Kind::accept);
    assert_int_equal(m.accept.mac[0], 1);
}

void test_malformed(void **) {
    assert_int_equal(decode_code({}), KVX_EINVAL);
    std::vector<uint8_t> b = vec(encode(Hello{1}));
    for (size_t n = 0; n < b.size(); n++)
        assert_int_equal(decode_code(std::vector<uint8_t>(b.begin(), b.begin() + n)), KVX_EINVAL);
    std::vector<uint8_t> x = b;
    x[0] ^= 1;  // magic
    assert_int_equal(decode_code(x), KVX_EINVAL);
    x = b;
    x[4] = 2;  // version
    assert_int_equal(decode_code(x), KVX_EVERSION);
    x = b;
    x[5] = 9;  // kind
    assert_int_equal(decode_code(x), KVX_EINVAL);
    x = b;
    x[6] = 1;  // reserved
    assert_int_equal(decode_code(x), KVX_EINVAL);
    std::vector<uint8_t> a = vec(encode(sample_auth()));
    assert_int_equal(decode_code(std::vector<uint8_t>(a.begin(), a.end() - 1)), KVX_EINVAL);
    std::vector<uint8_t> r = vec(encode(Refuse{KVX_EAUTH}));
    r[8] = 0x05;  // status -...? not a refusal code
    r[9] = r[10] = r[11] = 0;
    assert_int_equal(decode_code(r), KVX_EINVAL);
    // all-zero private data (what a non-kvxfer peer's padding looks like)
    assert_int_equal(decode_code(std::vector<uint8_t>(148, 0)), KVX_EINVAL);
}

void test_proofs(void **) {
    std::array<uint8_t, wire::kSecretLen> secret{};
    secret[0] = 1;
    Challenge c;
    c.challenge_id = 5;
    c.nonce[0] = 3;
    Auth a = sample_auth();
    auto cp = client_proof(secret, c, a);
    auto sp = server_proof(secret, c, a);
    assert_memory_not_equal(cp.data(), sp.data(), kProofLen);  // labels differ
    a.mac = cp;  // the mac field itself is not covered
    assert_memory_equal(client_proof(secret, c, a).data(), cp.data(), kProofLen);
    // every input changes the proof
    auto s2 = secret;
    s2[31] ^= 1;
    assert_memory_not_equal(client_proof(s2, c, a).data(), cp.data(), kProofLen);
    Challenge c2 = c;
    c2.nonce[15] ^= 1;
    assert_memory_not_equal(client_proof(secret, c2, a).data(), cp.data(), kProofLen);
    c2 = c;
    c2.challenge_id++;
    assert_memory_not_equal(client_proof(secret, c2, a).data(), cp.data(), kProofLen);
    Auth a2 = a;
    a2.instance_id++;
    assert_memory_not_equal(client_proof(secret, c, a2).data(), cp.data(), kProofLen);
    a2 = a;
    a2.fingerprint[0] ^= 1;
    assert_memory_not_equal(client_proof(secret, c, a2).data(), cp.data(), kProofLen);
    a2 = a;
    a2.nonce[11] ^= 1;
    assert_memory_not_equal(client_proof(secret, c, a2).data(), cp.data(), kProofLen);
    assert_memory_not_equal(server_proof(secret, c, a2).data(), sp.data(), kProofLen);
}

void test_fingerprints(void **) {
    auto none = fingerprint_bytes("");
    auto x = fingerprint_bytes("00000000000000ff");
    auto y = fingerprint_bytes("ff00000000000000");
    assert_int_equal(x[7], 0xff);
    assert_int_equal(y[0], 0xff);
    assert_true(fingerprints_compatible(none, x));
    assert_true(fingerprints_compatible(x, none));
    assert_true(fingerprints_compatible(x, x));
    assert_false(fingerprints_compatible(x, y));
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),     cmocka_unit_test(test_round_trip), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_proofs),    cmocka_unit_test(test_fingerprints),
    };
    return cmocka_run_group_tests_name("verbs_wire", tests, nullptr, nullptr);
}
