// The handshake's messages and primitives (src/handshake/handshake.h):
// sizes within the RC private-data limit, round trips, rejection of
// malformed or foreign bytes, the target's verdicts (instance, proof, flags,
// fingerprint), the initiator's checks of the answers, the keys, and the
// challenge table of connectionless carriers. The engine that drives them:
// test_handshake_engine.cpp.
#include "handshake_test_util.h"

using namespace handshake_test;

namespace {

// ------------------------------------------------------------------ messages and primitives

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
    Challenge c = challenge_with(7);
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
    Accept acc;
    acc.flags = kAead;
    acc.proof[3] = 0x5a;
    m = decode(bytes_of(acc).data(), kAcceptLen);
    assert_true(m.kind == Kind::accept && m.accept.flags == kAead && m.accept.proof == acc.proof);
    Auth flagged = answer(c, id.instance_id, id.secret, id.fingerprint, kAead);
    assert_int_equal(decode(bytes_of(flagged).data(), kAuthLen).auth.flags, kAead);
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

    // is_message: what decodes (padded too), nothing else
    assert_true(is_message(h.data(), h.size()));
    std::vector<uint8_t> padded = h;
    padded.resize(148, 0);
    assert_true(is_message(padded.data(), padded.size()));
    assert_false(is_message(h.data(), h.size() - 1));
    std::vector<uint8_t> zeros(148, 0);  // a REJECT of the remote CM
    assert_false(is_message(zeros.data(), zeros.size()));
    assert_false(is_message(nullptr, 0));
}

void test_verify(void **) {
    Identity id = target_identity();
    const DataPathOptions opts = verbs_opts();
    Challenge c = challenge_with(1);
    Accept acc;
    std::string why;

    Auth good = answer(c, id.instance_id, id.secret, id.fingerprint);
    assert_int_equal(verify(id, opts, c, good, &acc, &why), 0);
    Auth unset_fp = answer(c, id.instance_id, id.secret, Fingerprint{});
    assert_int_equal(verify(id, opts, c, unset_fp, &acc, &why), 0);  // unset on one side: compatible
    Identity unset_me = id;
    unset_me.fingerprint = Fingerprint{};
    assert_int_equal(verify(unset_me, opts, c, good, &acc, &why), 0);  // unset on the other

    wire::Secret other = id.secret;
    other[31] ^= 0x80;
    why.clear();
    assert_int_equal(verify(id, opts, c, answer(c, id.instance_id, other, id.fingerprint), &acc, &why), KVX_EAUTH);
    assert_false(why.empty());
    assert_int_equal(verify(id, opts, c, answer(c, id.instance_id + 1, id.secret, id.fingerprint), &acc, &why),
                     KVX_EAUTH);
    Challenge c2 = challenge_with(2);
    assert_int_equal(verify(id, opts, c2, good, &acc, &why), KVX_EAUTH);  // answer to another challenge
    Challenge same_id = c;
    same_id.nonce[0] ^= 1;
    assert_int_equal(verify(id, opts, same_id, good, &acc, &why), KVX_EAUTH);  // same id, another nonce
    why.clear();
    assert_int_equal(verify(id, opts, c, answer(c, id.instance_id, id.secret, fingerprint_bytes("fedcba9876543210")),
                            &acc, &why),
                     KVX_EFINGERPRINT);
    assert_false(why.empty());
    for (size_t field = 0; field < 6; field++) {  // every field is under the proof
        Auth t = good;
        if (field == 0) t.nonce[0] ^= 1;
        if (field == 1) t.fingerprint = Fingerprint{};
        if (field == 2) t.flags = 1;
        if (field == 3) t.proof[15] ^= 1;
        if (field == 4) t.instance_id ^= 1;
        if (field == 5) t.challenge_id ^= 1;
        why.clear();
        assert_int_equal(verify(id, opts, c, t, &acc, &why), KVX_EAUTH);
        assert_false(why.empty());
        // and under the proof before the flags or the fingerprint count
        assert_int_equal(verify(id, tcp_opts(kAead), c, t, &acc, &why), KVX_EAUTH);
    }
}

void test_initiator_checks(void **) {
    Identity id = target_identity();
    Challenge c = challenge_with(1);
    Auth a = answer(c, id.instance_id, id.secret, id.fingerprint);
    Accept acc;
    std::string why;
    assert_int_equal(verify(id, verbs_opts(), c, a, &acc, &why), 0);
    assert_true(acc.proof != a.proof);
    std::vector<uint8_t> ok = bytes_of(acc);
    assert_int_equal(accept_code(ok, c, a, id.secret), kNoError);
    assert_int_equal(code_of([&] { expect_accept(acc, c, a, id.secret, "p"); }), kNoError);

    std::string msg;
    std::vector<uint8_t> forged = ok;
    forged[20] ^= 1;  // in the proof
    assert_int_equal(accept_code(forged, c, a, id.secret, "peer 'x'", &msg), KVX_EAUTH);
    assert_contains(msg, "peer 'x'");
    // the client's own proof replayed as the server's does not pass
    Accept mirror;
    mirror.proof = a.proof;
    assert_int_equal(accept_code(bytes_of(mirror), c, a, id.secret), KVX_EAUTH);
    // an accept with another challenge's proof
    Challenge c2 = challenge_with(2);
    assert_int_equal(accept_code(ok, c2, a, id.secret), KVX_EAUTH);
    // an accept for another AUTH to the same challenge (another client nonce)
    Auth a2 = answer(c, id.instance_id, id.secret, id.fingerprint);
    assert_int_equal(code_of([&] { expect_accept(acc, c, a2, id.secret, "p"); }), KVX_EAUTH);
    // proved with another secret
    wire::Secret s2 = id.secret;
    s2[0] ^= 1;
    assert_int_equal(accept_code(ok, c, a, s2), KVX_EAUTH);

    // refusals surface as their code; a CHALLENGE or ACCEPT is returned as
    // decoded (the Initiator decides which one it takes); anything else the
    // target cannot answer is an authentication failure
    for (int st : {int(KVX_EAUTH), int(KVX_EFINGERPRINT), int(KVX_ECONNREFUSED), int(KVX_EVERSION), int(KVX_ENOTSUP)}) {
        std::vector<uint8_t> r = bytes_of(Refuse{st});
        assert_int_equal(answer_code(r, verbs_opts(), &msg, "peer 'r'"), st);
        assert_contains(msg, "peer 'r'");
    }
    std::vector<uint8_t> cb = bytes_of(c);
    Message m = expect_answer(cb.data(), cb.size(), verbs_opts(), "p", "HELLO");
    assert_true(m.kind == Kind::challenge && m.challenge.challenge_id == c.challenge_id);
    assert_true(m.challenge.nonce == c.nonce);
    m = expect_answer(ok.data(), ok.size(), verbs_opts(), "p", "AUTH");
    assert_true(m.kind == Kind::accept && m.accept.proof == acc.proof);
    assert_int_equal(answer_code(bytes_of(Hello{id.instance_id})), KVX_EAUTH);
    assert_int_equal(answer_code(bytes_of(a)), KVX_EAUTH);
    std::vector<uint8_t> junk(20, 0);
    assert_int_equal(answer_code(junk, verbs_opts(), &msg, "peer 'j'"), KVX_EAUTH);
    assert_contains(msg, "peer 'j'");
    std::vector<uint8_t> v2 = cb;
    v2[4] = kVersion + 1;
    assert_int_equal(answer_code(v2), KVX_EVERSION);
    assert_int_equal(answer_code(std::vector<uint8_t>(ok.begin(), ok.end() - 1)), KVX_EAUTH);  // truncated
    // a challenge where an accept belongs: the Initiator refuses it (test_initiator)
}

// Data path flags: the target requires exactly its own; bits its backend
// does not define are a version problem; the initiator takes only the flags
// it offered; an ENOTSUP refusal names the options.
void test_flags(void **) {
    Identity id = target_identity();
    Challenge c = challenge_with(1);
    Accept acc;
    std::string why;
    Auth none = answer(c, id.instance_id, id.secret, id.fingerprint, 0);
    Auth aead = answer(c, id.instance_id, id.secret, id.fingerprint, kAead);
    assert_int_equal(verify(id, tcp_opts(0), c, aead, &acc, &why), KVX_ENOTSUP);  // tcp.protection=none
    assert_contains(why, "tcp.protection=aead");
    assert_contains(why, "tcp.protection=none");
    assert_int_equal(verify(id, verbs_opts(), c, aead, &acc, &why), KVX_EVERSION);  // verbs defines no flag
    assert_int_equal(verify(id, tcp_opts(0), c, none, &acc, &why), 0);
    assert_int_equal(acc.flags, 0);
    assert_int_equal(verify(id, verbs_opts(), c, none, &acc, &why), 0);
    assert_int_equal(acc.flags, 0);

    const DataPathOptions on = tcp_opts(kAead);
    assert_int_equal(verify(id, on, c, none, &acc, &why), KVX_ENOTSUP);
    assert_int_equal(verify(id, on, c, answer(c, id.instance_id, id.secret, id.fingerprint, 0x80), &acc, &why),
                     KVX_EVERSION);
    assert_contains(why, "0x80");
    assert_int_equal(verify(id, on, c, answer(c, id.instance_id, id.secret, id.fingerprint, kAead | 0x80), &acc, &why),
                     KVX_EVERSION);
    DataPathOptions unnamed{kAead, kAead, nullptr};  // no name: hex
    assert_int_equal(verify(id, unnamed, c, none, &acc, &why), KVX_ENOTSUP);
    assert_contains(why, "0x1");
    assert_int_equal(verify(id, on, c, aead, &acc, &why), 0);
    assert_int_equal(acc.flags, kAead);
    assert_int_equal(accept_code(bytes_of(acc), c, aead, id.secret), kNoError);

    // an accept choosing other flags than offered: its proof (of another
    // AUTH) fails first, so it is never taken for another version (an
    // initiator of 0.8 would retry without its optional flags on
    // KVX_EVERSION); with a proof of these flags it is KVX_EVERSION
    Accept acc0;
    assert_int_equal(verify(id, tcp_opts(0), c, none, &acc0, &why), 0);
    assert_int_equal(accept_code(bytes_of(acc0), c, aead, id.secret), KVX_EAUTH);
    assert_int_equal(code_of([&] { expect_accept(acc0, c, aead, id.secret, "p"); }), KVX_EAUTH);
    Accept chosen0;
    chosen0.flags = 0;
    chosen0.proof = server_proof(id.secret, c, aead, 0);
    assert_int_equal(code_of([&] { expect_accept(chosen0, c, aead, id.secret, "p"); }), KVX_EVERSION);
    Accept widened = acc;  // flags changed on the way: the proof covers them
    widened.flags = 0;
    assert_int_equal(code_of([&] { expect_accept(widened, c, none, id.secret, "p"); }), KVX_EAUTH);

    // An optional bit (tcp's staged records, 0.8): a target that defines it
    // takes an AUTH with or without it and echoes what was offered; one that
    // does not define it (0.7) refuses it with KVX_EVERSION, so the
    // initiator can tell and try again without it; the required bits still
    // must match.
    constexpr uint32_t kRecords = 2;
    DataPathOptions v8{kAead | kRecords, kAead | kRecords, tcp_name, kRecords};
    Auth both = answer(c, id.instance_id, id.secret, id.fingerprint, kAead | kRecords);
    assert_int_equal(verify(id, v8, c, both, &acc, &why), 0);
    assert_int_equal(acc.flags, kAead | kRecords);
    assert_int_equal(accept_code(bytes_of(acc), c, both, id.secret), kNoError);
    assert_int_equal(verify(id, v8, c, aead, &acc, &why), 0);  // a 0.7 initiator
    assert_int_equal(acc.flags, kAead);
    assert_int_equal(verify(id, on, c, both, &acc, &why), KVX_EVERSION);  // a 0.7 target
    assert_int_equal(verify(id, v8, c, none, &acc, &why), KVX_ENOTSUP);   // aead still required
    assert_int_equal(verify(id, v8, c, answer(c, id.instance_id, id.secret, id.fingerprint, kRecords), &acc, &why),
                     KVX_ENOTSUP);
    DataPathOptions v8none{0, kAead | kRecords, tcp_name, kRecords};  // tcp.protection=none
    assert_int_equal(verify(id, v8none, c, both, &acc, &why), KVX_ENOTSUP);
    assert_int_equal(verify(id, v8none, c, none, &acc, &why), 0);

    std::string msg;
    std::vector<uint8_t> r = bytes_of(Refuse{KVX_ENOTSUP});
    assert_int_equal(answer_code(r, on, &msg, "peer 'q'"), KVX_ENOTSUP);
    assert_contains(msg, "tcp.protection=aead");
    assert_contains(msg, "peer 'q'");
    assert_int_equal(answer_code(r, unnamed, &msg), KVX_ENOTSUP);
    assert_contains(msg, "0x1");
}

// Keys: both sides derive the same pair, the directions differ, and every
// input (secret, challenge nonce and id, client nonce, flags) changes them.
void test_derive_keys(void **) {
    Identity id = target_identity();
    Challenge c = challenge_with(1);
    Auth a = answer(c, id.instance_id, id.secret, id.fingerprint, kAead);
    Accept acc;
    std::string why;
    assert_int_equal(verify(id, tcp_opts(kAead), c, a, &acc, &why), 0);
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
    assert_true(fingerprints_compatible(Fingerprint{}, f));
    assert_false(fingerprints_compatible(f, fingerprint_bytes("00ff10a0b1c2d3e5")));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_verify),
        cmocka_unit_test(test_initiator_checks),
        cmocka_unit_test(test_challenge_cookies),
        cmocka_unit_test(test_fingerprint_bytes),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_derive_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
