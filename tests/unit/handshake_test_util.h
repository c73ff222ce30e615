// Helpers of the handshake's unit tests (test_handshake.cpp: messages and
// primitives; test_handshake_engine.cpp: the engine). Project headers first:
// cmocka.h defines a fail() macro that would clash with kvx::fail().
#pragma once

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

namespace handshake_test {

using namespace kvx;
using namespace kvx::handshake;
using namespace kvx::testing;

constexpr uint32_t kAead = 1;  // tcp: tcp.protection=aead

inline std::string tcp_name(uint32_t f) { return f == kAead ? "tcp.protection=aead" : f == 0 ? "tcp.protection=none" : "?"; }

// The data path options of tcp (bit 0 defined) and of verbs (none defined).
inline DataPathOptions tcp_opts(uint32_t flags) { return DataPathOptions{flags, kAead, tcp_name}; }
inline DataPathOptions verbs_opts() { return DataPathOptions{}; }

inline const char *const kFingerprint = "0123456789abcdef";

inline Identity target_identity() {
    Identity id;
    id.instance_id = 0x1122334455667788ull;
    for (size_t i = 0; i < id.secret.size(); i++) id.secret[i] = static_cast<uint8_t>(i * 13 + 5);
    id.fingerprint = fingerprint_bytes(kFingerprint);
    return id;
}

// The metadata an initiator holds for the target of target_identity().
inline wire::AgentMetadata target_metadata() {
    Identity id = target_identity();
    wire::AgentMetadata m;
    m.instance_id = id.instance_id;
    m.secret = id.secret;
    m.fingerprint = kFingerprint;
    return m;
}

// A challenge with a fixed id and a nonce of its own.
inline Challenge challenge_with(uint32_t id) {
    Challenge c;
    c.challenge_id = id;
    for (size_t i = 0; i < c.nonce.size(); i++) c.nonce[i] = static_cast<uint8_t>(id * 31 + i * 7 + 1);
    return c;
}

template <class M>
inline std::vector<uint8_t> bytes_of(const M &m) {
    Bytes b{};
    size_t n = encode(m, b.data());
    return std::vector<uint8_t>(b.begin(), b.begin() + static_cast<long>(n));
}

inline int decode_code(const std::vector<uint8_t> &b) {
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

inline void assert_refuse_reply(const Step &s, int code) {
    assert_true(s.outcome == Step::Outcome::refused);
    assert_int_equal(s.status, code);
    assert_int_equal(s.reply_len, kRefuseLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::refuse);
    assert_int_equal(m.refuse.status, code);
}

inline Challenge assert_challenge_reply(const Step &s) {
    assert_true(s.outcome == Step::Outcome::challenged);
    assert_int_equal(s.reply_len, kChallengeLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::challenge);
    assert_int_equal(m.challenge.challenge_id, s.challenge.challenge_id);
    assert_true(m.challenge.nonce == s.challenge.nonce);
    return m.challenge;
}

inline void assert_accept_reply(const Step &s) {
    assert_true(s.outcome == Step::Outcome::accepted);
    assert_int_equal(s.status, 0);
    assert_int_equal(s.reply_len, kAcceptLen);
    Message m = decode(s.reply.data(), s.reply_len);
    assert_true(m.kind == Kind::accept);
    assert_true(m.accept.proof == s.accept.proof && m.accept.flags == s.accept.flags);
}

inline void assert_same_keys(const Keys &a, const Keys &b) {
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

inline Out hello_of(const Initiator &in) {
    Out o;
    o.n = in.hello(o.b.data());
    return o;
}

// The initiator takes the responder's reply: true for an ACCEPT it checked.
inline bool take(Initiator &in, const Step &s, Out *next) {
    return in.on_answer(s.reply.data(), s.reply_len, next->b.data(), &next->n);
}

inline Step feed(Responder &r, Responder::Session &s, const Out &o) { return r.on_message(s, o.b.data(), o.n, "test"); }
inline Step feed(Responder &r, Responder::Session &s, const std::vector<uint8_t> &b) {
    return r.on_message(s, b.data(), b.size(), "test");
}
inline Step request(Responder &r, const Out &o) { return r.on_request(o.b.data(), o.n, "test"); }
inline Step request(Responder &r, const std::vector<uint8_t> &b) { return r.on_request(b.data(), b.size(), "test"); }

// A whole handshake on a session: the responder's last step.
inline Step session_handshake(Responder &r, Initiator &in) {
    Responder::Session s;
    Step st = feed(r, s, hello_of(in));
    if (st.outcome != Step::Outcome::challenged) return st;
    Out auth;
    assert_false(take(in, st, &auth));
    return feed(r, s, auth);
}

}  // namespace handshake_test
