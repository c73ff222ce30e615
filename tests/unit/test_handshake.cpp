// The shared connection handshake (src/handshake): sizes within the RC
// private-data limit, round trips, rejection of malformed or foreign bytes,
// the target's verdicts (instance, proof, flags, fingerprint), the
// initiator's checks of the answers, the challenge table of connectionless
// carriers, and the engine (handshake/engine.h) that every backend drives:
// the Responder's sessions (connection carriers) and requests
// (connectionless carriers), the Initiator, and initiate() over a carrier.
// Project headers first: cmocka.h defines a fail() macro that would clash
// with kvx::fail().
#include "handshake/engine.h"
#include "handshake/handshake.h"
#include "kvxfer.h"
#include "util/error.h"
#include "wire/metadata.h"

#include <unistd.h>

#include <cerrno>
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

constexpr uint32_t kAead = 1;  // tcp: tcp.protection=aead

std::string tcp_name(uint32_t f) { return f == kAead ? "tcp.protection=aead" : f == 0 ? "tcp.protection=none" : "?"; }

// The data path options of tcp (bit 0 defined) and of verbs (none defined).
DataPathOptions tcp_opts(uint32_t flags) { return DataPathOptions{flags, kAead, tcp_name}; }
DataPathOptions verbs_opts() { return DataPathOptions{}; }

const char *const kFingerprint = "0123456789abcdef";

Identity target_identity() {
    Identity id;
    id.instance_id = 0x1122334455667788ull;
    for (size_t i = 0; i < id.secret.size(); i++) id.secret[i] = static_cast<uint8_t>(i * 13 + 5);
    id.fingerprint = fingerprint_bytes(kFingerprint);
    return id;
}

// The metadata an initiator holds for the target of target_identity().
wire::AgentMetadata target_metadata() {
    Identity id = target_identity();
    wire::AgentMetadata m;
    m.instance_id = id.instance_id;
    m.secret = id.secret;
    m.fingerprint = kFingerprint;
    return m;
}

// A challenge with a fixed id and a nonce of its own.
Challenge challenge_with(uint32_t id) {
    Challenge c;
    c.challenge_id = id;
    for (size_t i = 0; i < c.nonce.size(); i++) c.nonce[i] = static_cast<uint8_t>(id * 31 + i * 7 + 1);
    return c;
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

// expect_answer() for bytes received in answer to an AUTH.
int answer_code(const std::vector<uint8_t> &b, const DataPathOptions &opts = verbs_opts(), std::string *msg = nullptr,
                const char *where = "p") {
    return code_of([&] { expect_answer(b.data(), b.size(), opts, where, "AUTH"); }, msg);
}

// expect_answer() then expect_accept(): what the initiator does with an ACCEPT.
int accept_code(const std::vector<uint8_t> &b, const Challenge &c, const Auth &a, const wire::Secret &s,
                const char *where = "p", std::string *msg = nullptr) {
    return code_of(
        [&] {
            Message m = expect_answer(b.data(), b.size(), verbs_opts(), where, "AUTH");
            assert_true(m.kind == Kind::accept);
            expect_accept(m.accept, c, a, s, where);
        },
        msg);
}

void assert_refuse_reply(const Step &s, int code) {
    assert_true(s.outcome == Step::Outcome::refused);
    assert_int_equal(s.status, code);
    assert_int_equal(s.reply_len, kRefuseLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::refuse);
    assert_int_equal(m.refuse.status, code);
}

Challenge assert_challenge_reply(const Step &s) {
    assert_true(s.outcome == Step::Outcome::challenged);
    assert_int_equal(s.reply_len, kChallengeLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::challenge);
    assert_int_equal(m.challenge.challenge_id, s.challenge.challenge_id);
    assert_true(m.challenge.nonce == s.challenge.nonce);
    return m.challenge;
}

void assert_accept_reply(const Step &s) {
    assert_true(s.outcome == Step::Outcome::accepted);
    assert_int_equal(s.status, 0);
    assert_int_equal(s.reply_len, kAcceptLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::accept);
    assert_true(m.accept.proof == s.accept.proof && m.accept.flags == s.accept.flags);
}

void assert_same_keys(const Keys &a, const Keys &b) {
    assert_true(a.to_target == b.to_target);
    assert_true(a.to_initiator == b.to_initiator);
    assert_true(a.to_target != a.to_initiator);
}

// One message from the initiator's side: what it sends next.
struct Out {
    Bytes b{};
    size_t n = 0;
    std::vector<uint8_t> vec() const { return std::vector<uint8_t>(b.begin(), b.begin() + static_cast<long>(n)); }
};

Out hello_of(const Initiator &in) {
    Out o;
    o.n = in.hello(o.b.data());
    return o;
}

// The initiator takes the responder's reply: true for an ACCEPT it checked.
bool take(Initiator &in, const Step &s, Out *next) {
    return in.on_answer(s.reply.data(), s.reply_len, next->b.data(), &next->n);
}

Step feed(Responder &r, Responder::Session &s, const Out &o) { return r.on_message(s, o.b.data(), o.n, "test"); }
Step feed(Responder &r, Responder::Session &s, const std::vector<uint8_t> &b) {
    return r.on_message(s, b.data(), b.size(), "test");
}
Step request(Responder &r, const Out &o) { return r.on_request(o.b.data(), o.n, "test"); }
Step request(Responder &r, const std::vector<uint8_t> &b) { return r.on_request(b.data(), b.size(), "test"); }

// A whole handshake on a session: the responder's last step.
Step session_handshake(Responder &r, Initiator &in) {
    Responder::Session s;
    Step st = feed(r, s, hello_of(in));
    if (st.outcome != Step::Outcome::challenged) return st;
    Out auth;
    assert_false(take(in, st, &auth));
    return feed(r, s, auth);
}

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

    // an accept choosing other flags than offered, even with a valid proof
    Accept acc0;
    assert_int_equal(verify(id, tcp_opts(0), c, none, &acc0, &why), 0);
    assert_int_equal(accept_code(bytes_of(acc0), c, aead, id.secret), KVX_EVERSION);
    assert_int_equal(code_of([&] { expect_accept(acc0, c, aead, id.secret, "p"); }), KVX_EVERSION);
    Accept widened = acc;  // flags changed on the way: the proof covers them
    widened.flags = 0;
    assert_int_equal(code_of([&] { expect_accept(widened, c, none, id.secret, "p"); }), KVX_EAUTH);

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

// ------------------------------------------------------------------ engine: Responder sessions

// HELLO -> CHALLENGE, AUTH -> ACCEPT, which the Initiator takes; both sides
// hold the same keys. With and without flags.
void test_session_accepts(void **) {
    for (uint32_t flags : {0u, kAead}) {
        Identity id = target_identity();
        Responder r(id, tcp_opts(flags), "test");
        const wire::AgentMetadata md = target_metadata();
        Initiator in(md, id.fingerprint, tcp_opts(flags), "peer 'a'");
        assert_string_equal(in.where().c_str(), "peer 'a'");
        Responder::Session s;
        Out hello = hello_of(in);
        assert_int_equal(hello.n, kHelloLen);
        assert_int_equal(decode(hello.b.data(), hello.n).hello.instance_id, id.instance_id);
        Step st = feed(r, s, hello);
        Challenge c = assert_challenge_reply(st);
        assert_true(s.state == Responder::Session::State::auth);
        assert_int_equal(s.issued.challenge_id, c.challenge_id);
        Out auth;
        assert_false(take(in, st, &auth));
        assert_int_equal(auth.n, kAuthLen);
        Message am = decode(auth.b.data(), auth.n);
        assert_true(am.kind == Kind::auth && am.auth.challenge_id == c.challenge_id && am.auth.flags == flags &&
                    am.auth.instance_id == id.instance_id && am.auth.fingerprint == id.fingerprint);
        Out again;
        again.n = in.auth(again.b.data());  // the current AUTH, as sent
        assert_true(again.vec() == auth.vec());
        st = feed(r, s, auth);
        assert_accept_reply(st);
        assert_int_equal(st.accept.flags, flags);
        assert_true(s.state == Responder::Session::State::over);
        Out none;
        assert_true(take(in, st, &none));
        assert_same_keys(r.keys(st), in.keys());
        assert_true(r.keys(st).to_target == derive_keys(id.secret, c, am.auth, st.accept).to_target);
    }
}

void test_session_other_instance(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test");
    Responder::Session s;
    Step st = feed(r, s, bytes_of(Hello{id.instance_id + 1}));
    assert_refuse_reply(st, KVX_ECONNREFUSED);
    assert_true(s.state == Responder::Session::State::over);
    // and the initiator that sent it hears KVX_ECONNREFUSED
    wire::AgentMetadata md = target_metadata();
    md.instance_id++;
    Initiator in(md, id.fingerprint, verbs_opts(), "peer 'o'");
    Responder::Session s2;
    st = feed(r, s2, hello_of(in));
    assert_refuse_reply(st, KVX_ECONNREFUSED);
    Out out;
    std::string msg;
    assert_int_equal(code_of([&] { take(in, st, &out); }, &msg), KVX_ECONNREFUSED);
    assert_contains(msg, "peer 'o'");
}

// Messages out of turn, after the end, and bytes that are no message.
void test_session_out_of_turn(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test");
    const wire::AgentMetadata md = target_metadata();
    const Challenge elsewhere = challenge_with(9);
    const std::vector<uint8_t> auth = bytes_of(answer(elsewhere, id.instance_id, id.secret, id.fingerprint));
    const std::vector<uint8_t> hello = bytes_of(Hello{id.instance_id});

    {  // AUTH before HELLO
        Responder::Session s;
        assert_refuse_reply(feed(r, s, auth), KVX_EAUTH);
        assert_refuse_reply(feed(r, s, hello), KVX_EAUTH);  // and nothing after
    }
    {  // a second HELLO after the challenge
        Responder::Session s;
        assert_challenge_reply(feed(r, s, hello));
        assert_refuse_reply(feed(r, s, hello), KVX_EAUTH);
        assert_true(s.state == Responder::Session::State::over);
    }
    for (Kind k : {Kind::challenge, Kind::accept, Kind::refuse}) {  // what only a target sends
        Responder::Session s;
        std::vector<uint8_t> b = k == Kind::challenge ? bytes_of(elsewhere)
                                 : k == Kind::accept  ? bytes_of(Accept{})
                                                      : bytes_of(Refuse{KVX_EAUTH});
        assert_refuse_reply(feed(r, s, b), KVX_EAUTH);
        Responder::Session s2;
        assert_challenge_reply(feed(r, s2, hello));
        assert_refuse_reply(feed(r, s2, b), KVX_EAUTH);
    }
    {  // anything after accepted
        Initiator in(md, id.fingerprint, verbs_opts(), "peer");
        Responder::Session s;
        Step st = feed(r, s, hello_of(in));
        Out a;
        assert_false(take(in, st, &a));
        assert_accept_reply(feed(r, s, a));
        assert_refuse_reply(feed(r, s, a), KVX_EAUTH);  // the AUTH again
        assert_refuse_reply(feed(r, s, hello), KVX_EAUTH);
    }
    {  // anything after refused, even what would have been right
        Initiator in(md, id.fingerprint, verbs_opts(), "peer");
        Responder::Session s;
        assert_refuse_reply(feed(r, s, bytes_of(Hello{id.instance_id + 1})), KVX_ECONNREFUSED);
        assert_refuse_reply(feed(r, s, hello_of(in)), KVX_EAUTH);
        Responder::Session s2;
        Step st = feed(r, s2, hello_of(in));
        Out a;
        assert_false(take(in, st, &a));
        std::vector<uint8_t> bad = a.vec();
        bad[kAuthLen - 1] ^= 1;  // proof
        assert_refuse_reply(feed(r, s2, bad), KVX_EAUTH);
        assert_refuse_reply(feed(r, s2, a), KVX_EAUTH);  // the honest AUTH comes too late
    }
    {  // garbage and other versions, at either turn
        std::vector<uint8_t> junk(kAuthLen, 0xab);
        std::vector<uint8_t> v2 = hello;
        v2[4] = kVersion + 1;
        std::vector<uint8_t> short_hello(hello.begin(), hello.end() - 1);
        Responder::Session s;
        assert_refuse_reply(feed(r, s, junk), KVX_EAUTH);
        Responder::Session s2;
        assert_refuse_reply(feed(r, s2, v2), KVX_EVERSION);
        Responder::Session s3;
        assert_refuse_reply(feed(r, s3, short_hello), KVX_EAUTH);
        Responder::Session s4;
        assert_refuse_reply(r.on_message(s4, nullptr, 0, "test"), KVX_EAUTH);
        Responder::Session s5;
        assert_challenge_reply(feed(r, s5, hello));
        std::vector<uint8_t> av2 = auth;
        av2[4] = 0;
        assert_refuse_reply(feed(r, s5, av2), KVX_EVERSION);
        Responder::Session s6;
        assert_challenge_reply(feed(r, s6, hello));
        assert_refuse_reply(feed(r, s6, junk), KVX_EAUTH);
    }
}

// An AUTH answering the challenge of another session (or of another
// responder) does not pass; the honest one on its own session still does.
void test_session_other_challenge(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test");
    const wire::AgentMetadata md = target_metadata();
    Initiator in1(md, id.fingerprint, verbs_opts(), "peer 1");
    Initiator in2(md, id.fingerprint, verbs_opts(), "peer 2");
    Responder::Session s1, s2;
    Step st1 = feed(r, s1, hello_of(in1));
    Step st2 = feed(r, s2, hello_of(in2));
    assert_true(st1.challenge.challenge_id != st2.challenge.challenge_id);
    Out a1, a2;
    assert_false(take(in1, st1, &a1));
    assert_false(take(in2, st2, &a2));
    assert_refuse_reply(feed(r, s2, a1), KVX_EAUTH);  // s1's AUTH on s2
    Step ok = feed(r, s1, a1);
    assert_accept_reply(ok);
    Out none;
    assert_true(take(in1, ok, &none));

    // another responder of the same identity issued other challenges
    Responder r2(id, verbs_opts(), "test");
    Responder::Session s3;
    assert_challenge_reply(feed(r2, s3, bytes_of(Hello{id.instance_id})));
    assert_refuse_reply(feed(r2, s3, a2), KVX_EAUTH);
}

// The verdicts of verify() as a session hands them out, and the initiator
// hearing them as their codes.
void test_session_verdicts(void **) {
    Identity id = target_identity();
    const wire::AgentMetadata md = target_metadata();
    auto run = [&](const Identity &target, const wire::AgentMetadata &m, const Fingerprint &ours,
                   const DataPathOptions &topts, const DataPathOptions &iopts, int want) {
        Responder r(target, topts, "test");
        Initiator in(m, ours, iopts, "peer 'v'");
        Step st = session_handshake(r, in);
        Out none;
        if (want == 0) {
            assert_accept_reply(st);
            assert_true(take(in, st, &none));
            assert_same_keys(r.keys(st), in.keys());
            return;
        }
        assert_refuse_reply(st, want);
        std::string msg;
        assert_int_equal(code_of([&] { take(in, st, &none); }, &msg), want);
        assert_contains(msg, "peer 'v'");
        assert_int_equal(code_of([&] { in.keys(); }), KVX_EINTERNAL);
    };
    wire::AgentMetadata wrong = md;
    wrong.secret[5] ^= 0x40;
    run(id, wrong, id.fingerprint, verbs_opts(), verbs_opts(), KVX_EAUTH);
    run(id, md, fingerprint_bytes("fedcba9876543210"), verbs_opts(), verbs_opts(), KVX_EFINGERPRINT);
    run(id, md, Fingerprint{}, verbs_opts(), verbs_opts(), 0);  // unset on the initiator
    Identity unset = id;
    unset.fingerprint = Fingerprint{};
    run(unset, md, id.fingerprint, verbs_opts(), verbs_opts(), 0);  // unset on the target
    run(unset, md, Fingerprint{}, verbs_opts(), verbs_opts(), 0);
    run(id, md, id.fingerprint, tcp_opts(0), tcp_opts(kAead), KVX_ENOTSUP);
    run(id, md, id.fingerprint, tcp_opts(kAead), tcp_opts(0), KVX_ENOTSUP);
    run(id, md, id.fingerprint, verbs_opts(), tcp_opts(kAead), KVX_EVERSION);
    // the ENOTSUP the initiator hears names its options
    Responder r(id, tcp_opts(0), "test");
    Initiator in(md, id.fingerprint, tcp_opts(kAead), "peer 'n'");
    Step st = session_handshake(r, in);
    std::string msg;
    Out none;
    assert_int_equal(code_of([&] { take(in, st, &none); }, &msg), KVX_ENOTSUP);
    assert_contains(msg, "tcp.protection=aead");
}

// ------------------------------------------------------------------ engine: connectionless requests

void test_request_accepts_once(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test", std::chrono::seconds(60));
    const wire::AgentMetadata md = target_metadata();
    Initiator in(md, id.fingerprint, verbs_opts(), "peer 'r'", true);
    Step st = request(r, hello_of(in));
    Challenge c = assert_challenge_reply(st);
    Out auth;
    assert_false(take(in, st, &auth));
    Step ok = request(r, auth);
    assert_accept_reply(ok);
    assert_int_equal(ok.challenge.challenge_id, c.challenge_id);
    Out none;
    assert_true(take(in, ok, &none));
    assert_same_keys(r.keys(ok), in.keys());

    // the same AUTH replayed: its challenge is used up, a fresh one comes back
    Step replay = request(r, auth);
    Challenge fresh = assert_challenge_reply(replay);
    assert_true(fresh.challenge_id != c.challenge_id);
    assert_true(request(r, auth).outcome == Step::Outcome::challenged);

    // the other HELLOs: another instance, garbage, another version, what only a target sends
    assert_refuse_reply(request(r, bytes_of(Hello{id.instance_id + 1})), KVX_ECONNREFUSED);
    assert_refuse_reply(request(r, std::vector<uint8_t>(kAuthLen, 0xab)), KVX_EAUTH);
    std::vector<uint8_t> v2 = auth.vec();
    v2[4] = kVersion + 1;
    assert_refuse_reply(request(r, v2), KVX_EVERSION);
    assert_refuse_reply(request(r, bytes_of(c)), KVX_EAUTH);
    assert_refuse_reply(request(r, bytes_of(Accept{})), KVX_EAUTH);
    assert_refuse_reply(request(r, bytes_of(Refuse{KVX_EAUTH})), KVX_EAUTH);
}

void test_request_unknown_and_foreign(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test", std::chrono::seconds(60));
    // a challenge id of an epoch never seen: challenged, not refused
    Auth unknown = answer(challenge_with(0x5a000001u), id.instance_id, id.secret, id.fingerprint);
    assert_challenge_reply(request(r, bytes_of(unknown)));

    Step st = request(r, bytes_of(Hello{id.instance_id}));
    Challenge c = assert_challenge_reply(st);
    // an AUTH for another instance
    assert_refuse_reply(request(r, bytes_of(answer(c, id.instance_id + 1, id.secret, id.fingerprint))), KVX_EAUTH);
    // a live challenge answered without the secret: refused, and not used up by it
    wire::Secret wrong = id.secret;
    wrong[0] ^= 1;
    assert_refuse_reply(request(r, bytes_of(answer(c, id.instance_id, wrong, id.fingerprint))), KVX_EAUTH);
    // a live id with a nonce of the attacker's choosing
    Challenge guessed = c;
    guessed.nonce[0] ^= 1;
    assert_refuse_reply(request(r, bytes_of(answer(guessed, id.instance_id, id.secret, id.fingerprint))), KVX_EAUTH);
    const Fingerprint other_fp = fingerprint_bytes("fedcba9876543210");
    assert_refuse_reply(request(r, bytes_of(answer(c, id.instance_id, id.secret, other_fp))), KVX_EFINGERPRINT);
    // none of these used it up: the honest AUTH passes
    Auth honest = answer(c, id.instance_id, id.secret, id.fingerprint);
    assert_accept_reply(request(r, bytes_of(honest)));
    assert_challenge_reply(request(r, bytes_of(honest)));
}

// max_used = 1: the second honest AUTH of the epoch gets a fresh challenge.
void test_request_max_used(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test", std::chrono::seconds(60), 1);
    const wire::AgentMetadata md = target_metadata();
    Initiator in1(md, id.fingerprint, verbs_opts(), "peer 1", true);
    Initiator in2(md, id.fingerprint, verbs_opts(), "peer 2", true);
    Step st1 = request(r, hello_of(in1));
    Step st2 = request(r, hello_of(in2));
    Out a1, a2;
    assert_false(take(in1, st1, &a1));
    assert_false(take(in2, st2, &a2));
    assert_accept_reply(request(r, a1));
    Step again = request(r, a2);
    Challenge c = assert_challenge_reply(again);
    assert_true(c.challenge_id != st2.challenge.challenge_id);
    Out a3;
    assert_false(take(in2, again, &a3));  // rechallenge: a fresh AUTH
    assert_true(request(r, a3).outcome == Step::Outcome::challenged);  // still full
}

// ------------------------------------------------------------------ engine: Initiator

void test_initiator(void **) {
    Identity id = target_identity();
    const wire::AgentMetadata md = target_metadata();
    Responder r(id, verbs_opts(), "test", std::chrono::seconds(60));
    {  // keys() before the accept
        Initiator in(md, id.fingerprint, verbs_opts(), "peer");
        assert_int_equal(code_of([&] { in.keys(); }), KVX_EINTERNAL);
        Step st = request(r, hello_of(in));
        Out a;
        assert_false(take(in, st, &a));
        assert_int_equal(code_of([&] { in.keys(); }), KVX_EINTERNAL);
    }
    {  // rechallenge = false: a CHALLENGE after AUTH is refused
        Initiator in(md, id.fingerprint, verbs_opts(), "peer 'c'");
        Responder::Session s;
        Step st = feed(r, s, hello_of(in));
        Out a;
        assert_false(take(in, st, &a));
        Step other = request(r, bytes_of(Hello{id.instance_id}));
        std::string msg;
        assert_int_equal(code_of([&] { take(in, other, &a); }, &msg), KVX_EAUTH);
        assert_contains(msg, "peer 'c'");
        assert_int_equal(code_of([&] { take(in, st, &a); }), KVX_EAUTH);  // its own challenge again, too
    }
    {  // rechallenge = true: answered with a fresh AUTH the responder accepts
        Initiator in(md, id.fingerprint, verbs_opts(), "peer", true);
        Step st = request(r, hello_of(in));
        Out a1;
        assert_false(take(in, st, &a1));
        Step fresh = request(r, bytes_of(Hello{id.instance_id}));  // e.g. the first one expired
        Challenge c2 = assert_challenge_reply(fresh);
        Out a2;
        assert_false(take(in, fresh, &a2));
        Message m = decode(a2.b.data(), a2.n);
        assert_true(m.kind == Kind::auth && m.auth.challenge_id == c2.challenge_id);
        assert_true(a2.vec() != a1.vec());
        Out cur;
        cur.n = in.auth(cur.b.data());
        assert_true(cur.vec() == a2.vec());
        Step ok = request(r, a2);
        assert_accept_reply(ok);
        Out none;
        assert_true(take(in, ok, &none));
        assert_same_keys(r.keys(ok), in.keys());
        // and nothing after the accept
        assert_int_equal(code_of([&] { take(in, fresh, &none); }), KVX_EAUTH);
        assert_int_equal(code_of([&] { take(in, ok, &none); }), KVX_EAUTH);
    }
    {  // an ACCEPT in answer to HELLO (even a valid one of another handshake)
        Initiator good(md, id.fingerprint, verbs_opts(), "peer");
        Step ok = session_handshake(r, good);
        assert_accept_reply(ok);
        Initiator in(md, id.fingerprint, verbs_opts(), "peer 'h'");
        Out a;
        std::string msg;
        assert_int_equal(code_of([&] { take(in, ok, &a); }, &msg), KVX_EAUTH);
        assert_contains(msg, "peer 'h'");
    }
    {  // an ACCEPT of another handshake in answer to AUTH
        Initiator good(md, id.fingerprint, verbs_opts(), "peer");
        Step ok = session_handshake(r, good);
        Initiator in(md, id.fingerprint, verbs_opts(), "peer");
        Responder::Session s;
        Out a;
        assert_false(take(in, feed(r, s, hello_of(in)), &a));
        assert_int_equal(code_of([&] { take(in, ok, &a); }), KVX_EAUTH);
    }
    {  // refusals to HELLO surface as their code
        for (int st : {int(KVX_ECONNREFUSED), int(KVX_EAUTH), int(KVX_EVERSION), int(KVX_EFINGERPRINT)}) {
            Initiator in(md, id.fingerprint, verbs_opts(), "peer 'x'");
            Step refused = r.decline(st, "test", "test");
            Out a;
            std::string msg;
            assert_int_equal(code_of([&] { take(in, refused, &a); }, &msg), st);
            assert_contains(msg, "peer 'x'");
        }
        Initiator in(md, id.fingerprint, tcp_opts(kAead), "peer");
        std::string msg;
        Out a;
        assert_int_equal(code_of([&] { take(in, r.decline(KVX_ENOTSUP, "test", "test"), &a); }, &msg), KVX_ENOTSUP);
        assert_contains(msg, "tcp.protection=aead");
    }
    {  // garbage, other versions, what only an initiator sends
        Initiator in(md, id.fingerprint, verbs_opts(), "peer");
        Out a;
        std::vector<uint8_t> junk(kChallengeLen, 0x11);
        assert_int_equal(code_of([&] { in.on_answer(junk.data(), junk.size(), a.b.data(), &a.n); }), KVX_EAUTH);
        std::vector<uint8_t> c = bytes_of(challenge_with(3));
        c[4] = kVersion + 1;
        assert_int_equal(code_of([&] { in.on_answer(c.data(), c.size(), a.b.data(), &a.n); }), KVX_EVERSION);
        std::vector<uint8_t> h = bytes_of(Hello{id.instance_id});
        assert_int_equal(code_of([&] { in.on_answer(h.data(), h.size(), a.b.data(), &a.n); }), KVX_EAUTH);
    }
}

// ------------------------------------------------------------------ engine: initiate() over a carrier

// A carrier whose other end is a Responder session in memory.
class LoopCarrier final : public Carrier {
public:
    explicit LoopCarrier(Responder &r) : r_(r) {}
    int send(const uint8_t *p, size_t n) override {
        sends++;
        if (send_error) return send_error;
        last = r_.on_message(session, p, n, "loop");
        pending = true;
        return 0;
    }
    int receive(Bytes &buf, size_t *n) override {
        if (receive_error) return receive_error;
        if (!pending) return -EIO;
        memcpy(buf.data(), last.reply.data(), last.reply_len);
        *n = last.reply_len;
        pending = false;
        return 0;
    }
    Responder::Session session;
    Step last;
    bool pending = false;
    int send_error = 0;
    int receive_error = 0;
    int sends = 0;

private:
    Responder &r_;
};

void test_initiate(void **) {
    Identity id = target_identity();
    const wire::AgentMetadata md = target_metadata();
    Responder r(id, tcp_opts(kAead), "test");
    {
        LoopCarrier c(r);
        Initiator in(md, id.fingerprint, tcp_opts(kAead), "peer");
        assert_int_equal(initiate(in, c), 0);
        assert_int_equal(c.sends, 2);
        assert_true(c.last.outcome == Step::Outcome::accepted);
        assert_same_keys(r.keys(c.last), in.keys());
    }
    {
        LoopCarrier c(r);
        wire::AgentMetadata wrong = md;
        wrong.secret[0] ^= 1;
        Initiator in(wrong, id.fingerprint, tcp_opts(kAead), "peer 'w'");
        std::string msg;
        assert_int_equal(code_of([&] { initiate(in, c); }, &msg), KVX_EAUTH);
        assert_contains(msg, "peer 'w'");
        assert_int_equal(c.last.status, KVX_EAUTH);
    }
    {
        LoopCarrier c(r);
        Initiator in(md, id.fingerprint, tcp_opts(0), "peer");
        std::string msg;
        assert_int_equal(code_of([&] { initiate(in, c); }, &msg), KVX_ENOTSUP);
        assert_contains(msg, "tcp.protection=none");
    }
    {
        LoopCarrier c(r);
        wire::AgentMetadata other = md;
        other.instance_id++;
        Initiator in(other, id.fingerprint, tcp_opts(kAead), "peer");
        assert_int_equal(code_of([&] { initiate(in, c); }), KVX_ECONNREFUSED);
        assert_int_equal(c.sends, 1);
    }
    {  // the carrier's errors come back as they are
        LoopCarrier c(r);
        c.send_error = -EPIPE;
        Initiator in(md, id.fingerprint, tcp_opts(kAead), "peer");
        int rc = 1;
        assert_int_equal(code_of([&] { rc = initiate(in, c); }), kNoError);
        assert_int_equal(rc, -EPIPE);
        LoopCarrier d(r);
        d.receive_error = -ECONNRESET;
        Initiator in2(md, id.fingerprint, tcp_opts(kAead), "peer");
        assert_int_equal(initiate(in2, d), -ECONNRESET);
        assert_int_equal(d.sends, 1);
    }
}

void test_decline(void **) {
    Identity id = target_identity();
    Responder r(id, verbs_opts(), "test");
    assert_true(r.identity().instance_id == id.instance_id);
    for (int st : {int(KVX_EAUTH), int(KVX_ECONNREFUSED), int(KVX_ENOTSUP), int(KVX_EVERSION), int(KVX_EFINGERPRINT)})
        assert_refuse_reply(r.decline(st, "a writer of another user", "test"), st);
    for (int i = 0; i < 1000; i++) r.decline(KVX_EAUTH, "flood", "test");  // logged at most once a second
    assert_int_equal(code_of([&] { r.decline(KVX_EINTERNAL, "no such refusal", "test"); }), KVX_EINTERNAL);
}

// Refusals are logged at most once a second per responder, with the count
// since the line before, the latest reason and its source (KVX_LOG=warn is
// set in main): a flood of 1,000 is a line per second it lasts, not 1,000,
// and the counts add up.
void test_refusal_log(void **) {
    char path[] = "/tmp/kvx-test-handshake-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    const int saved = dup(2);
    dup2(fd, 2);
    const auto start = std::chrono::steady_clock::now();
    {
        Responder r(target_identity(), verbs_opts(), "test");
        const std::vector<uint8_t> junk(kHelloLen, 0xa5);
        for (int i = 0; i < 1000; i++) {
            Responder::Session s;
            r.on_message(s, junk.data(), junk.size(), "source-a");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the next second
        Responder::Session s;
        r.on_message(s, junk.data(), junk.size(), "source-b");
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string log(65536, '\0');
    const ssize_t n = pread(fd, log.data(), log.size(), 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    log.resize(static_cast<size_t>(n));
    std::vector<std::string> lines;
    unsigned long total = 0;
    for (size_t at = 0, nl; (nl = log.find('\n', at)) != std::string::npos; at = nl + 1) {
        const size_t hit = log.find("test: refused ", at);
        if (hit >= nl) continue;
        lines.push_back(log.substr(at, nl - at));
        total += strtoul(log.c_str() + hit + strlen("test: refused "), nullptr, 10);
    }
    assert_true(lines.size() >= 2);                                         // the first, and the one after the pause
    assert_true(lines.size() <= static_cast<size_t>(seconds.count()) + 1);  // at most one a second
    assert_int_equal(total, 1001);                                          // every refusal counted once
    assert_contains(lines.front(), "refused 1 connection(s)");
    assert_contains(lines.front(), "from source-a");
    assert_contains(lines.back(), "from source-b");
}

}  // namespace

int main(void) {
    setenv("KVX_LOG", "warn", 1);  // read once, at the first log call: test_refusal_log counts lines
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
        cmocka_unit_test(test_session_accepts),
        cmocka_unit_test(test_session_other_instance),
        cmocka_unit_test(test_session_out_of_turn),
        cmocka_unit_test(test_session_other_challenge),
        cmocka_unit_test(test_session_verdicts),
        cmocka_unit_test(test_request_accepts_once),
        cmocka_unit_test(test_request_unknown_and_foreign),
        cmocka_unit_test(test_request_max_used),
        cmocka_unit_test(test_initiator),
        cmocka_unit_test(test_initiate),
        cmocka_unit_test(test_decline),
        cmocka_unit_test(test_refusal_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
