// The shared connection handshake (src/handshake): sizes within the RC
// private-data limit, round trips, rejection of malformed or foreign bytes,
// the target's verdicts (instance, proof, flags, fingerprint), the
// initiator's checks of the answers, and the challenge table of
// connectionless carriers. Project headers first: cmocka.h defines a fail()
// macro that would clash with kvx::fail().
#include "handshake/handshake.h"
#include "kvxfer.h"
#include "util/error.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "unit_util.h"

using namespace kvx;
using namespace kvx::handshake;
using namespace kvx::testing;

namespace {

Identity target_identity() {
    Identity id;
    id.instance_id = 0x1122334455667788ull;
    for (size_t i = 0; i < id.secret.size(); i++) id.secret[i] = static_cast<uint8_t>(i * 13 + 5);
    id.fingerprint = fingerprint_bytes("0123456789abcdef");
    return id;
}

template <class M>
std::vector<uint8_t> bytes_of(const M &m) {
    Bytes b{};
    size_t n = encode(m, b.data());
    return std::vector<uint8_t>(b.begin(), b.begin() + static_cast<long>(n));
}

int decode_code(const std::vector<uint8_t> &b) {
    return code_of([&] { decode(b.data(), b.size()); });
}

void test_sizes(void **) {
    assert_int_equal(kAuthLen, 56);     // RC connect request through rdma_cm on IB/RoCE
    assert_true(kChallengeLen <= 148);  // IB CM REJ private data
    assert_true(kAcceptLen <= 196);     // IB CM REP private data
    assert_true(kRefuseLen <= 148);
    for (const auto &b : {bytes_of(Hello{1}), bytes_of(Challenge{}), bytes_of(Auth{}), bytes_of(Refuse{KVX_EAUTH}),
                          bytes_of(Accept{})})
        assert_int_equal(message_len(b.data()), b.size());
}

void test_round_trip(void **) {
    uint32_t next = 7;
    Challenge c = new_challenge(&next);
    assert_int_equal(next, 8);
    Message m = decode(bytes_of(c).data(), kChallengeLen);
    assert_true(m.kind == Kind::challenge && m.challenge.challenge_id == 7 && m.challenge.nonce == c.nonce);
    Identity id = target_identity();
    Auth a = answer(c, id.instance_id, id.secret, id.fingerprint);
    std::vector<uint8_t> ab = bytes_of(a);
    ab.resize(92, 0);  // IB CM pads private data with zeros
    m = decode(ab.data(), ab.size());
    assert_true(m.kind == Kind::auth);
    assert_true(m.auth.instance_id == a.instance_id && m.auth.challenge_id == 7 && m.auth.fingerprint == a.fingerprint &&
                m.auth.nonce == a.nonce && m.auth.proof == a.proof && m.auth.flags == 0);
    assert_int_equal(decode(bytes_of(Hello{42}).data(), kHelloLen).hello.instance_id, 42);
    assert_int_equal(decode(bytes_of(Refuse{KVX_EFINGERPRINT}).data(), kRefuseLen).refuse.status, KVX_EFINGERPRINT);
}

void test_malformed(void **) {
    std::vector<uint8_t> h = bytes_of(Hello{1});
    assert_int_equal(decode_code({}), KVX_EINVAL);
    assert_int_equal(decode_code(std::vector<uint8_t>(h.begin(), h.begin() + 7)), KVX_EINVAL);
    assert_int_equal(decode_code(std::vector<uint8_t>(h.begin(), h.end() - 1)), KVX_EINVAL);  // truncated body
    std::vector<uint8_t> b = h;
    b[0] ^= 1;  // magic
    assert_int_equal(decode_code(b), KVX_EINVAL);
    b = h;
    b[4] = 2;  // version
    assert_int_equal(decode_code(b), KVX_EVERSION);
    b = h;
    b[5] = 9;  // kind
    assert_int_equal(decode_code(b), KVX_EINVAL);
    b = h;
    b[6] = 1;  // reserved
    assert_int_equal(decode_code(b), KVX_EINVAL);
    for (int st : {0, 1, int(KVX_EINTERNAL), int(KVX_ENOMEM), int(KVX_ETIMEDOUT)}) {  // refusals carry only the protocol's codes
        std::vector<uint8_t> r = bytes_of(Refuse{KVX_EAUTH});
        memcpy(r.data() + 8, &st, 4);
        assert_int_equal(decode_code(r), KVX_EINVAL);
    }
    assert_int_equal(failure_code(KVX_EVERSION), KVX_EVERSION);
    assert_int_equal(failure_code(KVX_EINVAL), KVX_EAUTH);
}

void test_verify(void **) {
    Identity id = target_identity();
    uint32_t next = 1;
    Challenge c = new_challenge(&next);
    Accept acc;
    assert_int_equal(on_hello(id, Hello{id.instance_id}), 0);
    assert_int_equal(on_hello(id, Hello{id.instance_id + 1}), KVX_ECONNREFUSED);

    Auth good = answer(c, id.instance_id, id.secret, id.fingerprint);
    assert_int_equal(verify(id, c, good, &acc, "test"), 0);
    Auth unset_fp = answer(c, id.instance_id, id.secret, Fingerprint{});
    assert_int_equal(verify(id, c, unset_fp, &acc, "test"), 0);  // unset on one side: compatible

    wire::Secret other = id.secret;
    other[31] ^= 0x80;
    assert_int_equal(verify(id, c, answer(c, id.instance_id, other, id.fingerprint), &acc, "test"), KVX_EAUTH);
    assert_int_equal(verify(id, c, answer(c, id.instance_id + 1, id.secret, id.fingerprint), &acc, "test"), KVX_EAUTH);
    Challenge c2 = new_challenge(&next);
    assert_int_equal(verify(id, c2, good, &acc, "test"), KVX_EAUTH);  // answer to another challenge
    assert_int_equal(verify(id, c, answer(c, id.instance_id, id.secret, fingerprint_bytes("fedcba9876543210")), &acc,
                            "test"),
                     KVX_EFINGERPRINT);
    for (size_t field = 0; field < 4; field++) {  // every field is under the proof
        Auth t = good;
        if (field == 0) t.nonce[0] ^= 1;
        if (field == 1) t.fingerprint = Fingerprint{};
        if (field == 2) t.flags = 1;
        if (field == 3) t.proof[15] ^= 1;
        assert_int_equal(verify(id, c, t, &acc, "test"), KVX_EAUTH);
    }
}

void test_initiator_checks(void **) {
    Identity id = target_identity();
    uint32_t next = 1;
    Challenge c = new_challenge(&next);
    Auth a = answer(c, id.instance_id, id.secret, id.fingerprint);
    Accept acc;
    assert_int_equal(verify(id, c, a, &acc, "test"), 0);
    std::vector<uint8_t> ok = bytes_of(acc);
    assert_int_equal(code_of([&] { expect_accept(ok.data(), ok.size(), c, a, id.secret, "p"); }), kNoError);

    std::string msg;
    std::vector<uint8_t> forged = ok;
    forged[20] ^= 1;
    assert_int_equal(code_of([&] { expect_accept(forged.data(), forged.size(), c, a, id.secret, "peer 'x'"); }, &msg),
                     KVX_EAUTH);
    assert_contains(msg, "peer 'x'");
    // the client's own proof replayed as the server's does not pass
    Accept mirror;
    mirror.proof = a.proof;
    std::vector<uint8_t> mb = bytes_of(mirror);
    assert_int_equal(code_of([&] { expect_accept(mb.data(), mb.size(), c, a, id.secret, "p"); }), KVX_EAUTH);
    // an accept with another challenge's proof
    Challenge c2 = new_challenge(&next);
    assert_int_equal(code_of([&] { expect_accept(ok.data(), ok.size(), c2, a, id.secret, "p"); }), KVX_EAUTH);
    // refusals surface as their code; a challenge where an accept belongs is an authentication failure
    for (int st : {int(KVX_EAUTH), int(KVX_EFINGERPRINT), int(KVX_ECONNREFUSED), int(KVX_EVERSION)}) {
        std::vector<uint8_t> r = bytes_of(Refuse{st});
        assert_int_equal(code_of([&] { expect_accept(r.data(), r.size(), c, a, id.secret, "p"); }), st);
        assert_int_equal(code_of([&] { expect_challenge(r.data(), r.size(), "p"); }), st);
    }
    std::vector<uint8_t> cb = bytes_of(c);
    assert_int_equal(code_of([&] { expect_accept(cb.data(), cb.size(), c, a, id.secret, "p"); }), KVX_EAUTH);
    assert_int_equal(code_of([&] { expect_challenge(ok.data(), ok.size(), "p"); }), KVX_EAUTH);
    std::vector<uint8_t> junk(20, 0);
    assert_int_equal(code_of([&] { expect_challenge(junk.data(), junk.size(), "p"); }), KVX_EAUTH);
}

// Protection flags: the target requires exactly its own; unknown bits are a
// version problem; the initiator takes only the flags it offered.
void test_flags(void **) {
    Identity id = target_identity();
    uint32_t next = 1;
    Challenge c = new_challenge(&next);
    Accept acc;
    Auth none = answer(c, id.instance_id, id.secret, id.fingerprint, 0);
    Auth aead = answer(c, id.instance_id, id.secret, id.fingerprint, kFlagTcpAead);
    assert_int_equal(verify(id, c, aead, &acc, "test"), KVX_ENOTSUP);  // verbs and tcp.protection=none
    assert_int_equal(verify(id, c, none, &acc, "test"), 0);
    assert_int_equal(acc.flags, 0);
    id.flags = kFlagTcpAead;
    assert_int_equal(verify(id, c, none, &acc, "test"), KVX_ENOTSUP);
    assert_int_equal(verify(id, c, answer(c, id.instance_id, id.secret, id.fingerprint, 0x80), &acc, "t"), KVX_EVERSION);
    assert_int_equal(verify(id, c, aead, &acc, "test"), 0);
    assert_int_equal(acc.flags, kFlagTcpAead);
    std::vector<uint8_t> ok = bytes_of(acc);
    assert_int_equal(code_of([&] { expect_accept(ok.data(), ok.size(), c, aead, id.secret, "p"); }), kNoError);
    // an accept choosing other flags than offered, even with a valid proof
    id.flags = 0;
    Accept acc0;
    assert_int_equal(verify(id, c, none, &acc0, "test"), 0);
    std::vector<uint8_t> b0 = bytes_of(acc0);
    assert_int_equal(code_of([&] { expect_accept(b0.data(), b0.size(), c, aead, id.secret, "p"); }), KVX_EVERSION);
    std::string msg;
    std::vector<uint8_t> r = bytes_of(Refuse{KVX_ENOTSUP});
    assert_int_equal(code_of([&] { expect_accept(r.data(), r.size(), c, aead, id.secret, "peer 'q'"); }, &msg),
                     KVX_ENOTSUP);
    assert_contains(msg, "tcp.protection");
}

// Keys: both sides derive the same pair, the directions differ, and every
// input (secret, challenge nonce and id, client nonce, flags) changes them.
void test_derive_keys(void **) {
    Identity id = target_identity();
    id.flags = kFlagTcpAead;
    uint32_t next = 1;
    Challenge c = new_challenge(&next);
    Auth a = answer(c, id.instance_id, id.secret, id.fingerprint, kFlagTcpAead);
    Accept acc;
    assert_int_equal(verify(id, c, a, &acc, "test"), 0);
    Keys k = derive_keys(id.secret, c, a, acc);
    Keys again = derive_keys(id.secret, c, a, acc);
    assert_true(k.to_target == again.to_target && k.to_initiator == again.to_initiator);
    assert_true(k.to_target != k.to_initiator);
    const std::array<uint8_t, kKeyLen> zero{};
    assert_true(k.to_target != zero);
    std::vector<Keys> variants;
    wire::Secret s2 = id.secret;
    s2[0] ^= 1;
    variants.push_back(derive_keys(s2, c, a, acc));
    Challenge c2 = c;
    c2.nonce[3] ^= 1;
    variants.push_back(derive_keys(id.secret, c2, a, acc));
    c2 = c;
    c2.challenge_id++;
    variants.push_back(derive_keys(id.secret, c2, a, acc));
    Auth a2 = a;
    a2.nonce[0] ^= 1;
    variants.push_back(derive_keys(id.secret, c, a2, acc));
    Accept acc2 = acc;
    acc2.flags = 0;
    variants.push_back(derive_keys(id.secret, c, a, acc2));
    for (const Keys &v : variants) {
        assert_true(v.to_target != k.to_target);
        assert_true(v.to_initiator != k.to_initiator);
    }
}

void test_challenge_cookies(void **) {
    ChallengeCookies t(std::chrono::seconds(60), 3);
    Challenge a = t.issue(), b = t.issue();
    assert_true(a.challenge_id != b.challenge_id && a.nonce != b.nonce);
    Challenge got;
    assert_true(t.find(a.challenge_id, &got));
    assert_true(got.nonce == a.nonce);
    assert_true(t.use(a.challenge_id));
    assert_false(t.find(a.challenge_id, &got));  // single use
    assert_false(t.use(a.challenge_id));
    for (int i = 0; i < 100000; i++) t.issue();  // a flood of HELLOs evicts nothing
    assert_true(t.find(b.challenge_id, &got));
    assert_true(got.nonce == b.nonce);
    Challenge c = t.issue(), d = t.issue();
    assert_true(t.use(b.challenge_id) && t.use(c.challenge_id));
    assert_false(t.use(d.challenge_id));  // max_used per epoch
    ChallengeCookies s(std::chrono::milliseconds(100), 3);
    Challenge e = s.issue();
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
    assert_true(s.find(e.challenge_id, &got));  // live for at least ttl
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    assert_false(s.find(e.challenge_id, &got));  // expired: past 2 x ttl
    assert_false(s.find(e.challenge_id ^ 0x5a000000u, &got));  // an epoch never seen
}

void test_fingerprint_bytes(void **) {
    Fingerprint f = fingerprint_bytes("00ff10a0b1c2d3e4");
    assert_int_equal(f[0], 0x00);
    assert_int_equal(f[1], 0xff);
    assert_int_equal(f[7], 0xe4);
    assert_true(fingerprint_bytes("") == Fingerprint{});
    assert_int_equal(code_of([] { fingerprint_bytes("00FF10A0B1C2D3E4"); }), KVX_EINTERNAL);
    assert_int_equal(code_of([] { fingerprint_bytes("abc"); }), KVX_EINTERNAL);
    assert_true(fingerprints_compatible(f, f));
    assert_true(fingerprints_compatible(f, Fingerprint{}));
    assert_false(fingerprints_compatible(f, fingerprint_bytes("00ff10a0b1c2d3e5")));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),          cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),      cmocka_unit_test(test_verify),
        cmocka_unit_test(test_initiator_checks), cmocka_unit_test(test_challenge_cookies),
        cmocka_unit_test(test_fingerprint_bytes), cmocka_unit_test(test_flags), cmocka_unit_test(test_derive_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
