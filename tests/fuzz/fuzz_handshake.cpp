// libFuzzer target: the shared connection handshake
// (src/handshake/handshake.cpp), whose messages come from unauthenticated
// peers: on a tcp stream (read header first: message_len, then decode) and in
// rdma_cm private data (REQ on the target; REJECT/ACCEPT on the initiator).
// Input: the received bytes, any length (IB CM pads private data with zeros).
//
// Checks beyond "no crash":
//  - only kvx::Error with KVX_EINVAL or KVX_EVERSION escapes decode(), and
//    message_len() agrees with it (same error for a bad header; the length
//    decode() needs and re-encodes to);
//  - an accepted message re-encodes to exactly the bytes it was decoded from
//    (nothing ignored, nothing invented); padding after it is allowed;
//  - a refusal carries only a status the protocol allows, and the initiator's
//    expect_challenge()/expect_accept() report it as that status; anything
//    else they do not expect is KVX_EAUTH (KVX_EVERSION for another version);
//  - HELLO: on_hello() takes exactly the instance it names;
//  - CHALLENGE: expect_challenge() returns it, and the answer() to it passes
//    verify() by a target holding the secret;
//  - AUTH: verify() with a random identity (secret unknown to the input)
//    never accepts it, and refuses before looking at flags or fingerprint;
//    re-signed by answer() with the secret it passes verify() (or is refused
//    for the fingerprint rule alone), the server proof in the ACCEPT differs
//    from the client proof, expect_accept() takes that ACCEPT and refuses it
//    with the client proof reflected or for another secret;
//  - ACCEPT: expect_accept() never accepts it without the secret.
// Corpus: tests/fuzz/corpus/handshake (gen_seeds.cpp: one well-formed message
// per kind, padded, truncated and other-version variants).
#include <openssl/rand.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "handshake/handshake.h"
#include "kvxfer.h"
#include "util/error.h"

using namespace kvx::handshake;

namespace {

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_handshake: %s\n", what);
    abort();
}

// The code f() threw as kvx::Error (0: it returned). Any other exception aborts.
template <typename F>
int error_of(F &&f) {
    try {
        f();
        return 0;
    } catch (const kvx::Error &e) {
        if (e.code() == 0) die("kvx::Error with code 0");
        if (e.what()[0] == '\0') die("error without a message");
        return e.code();
    } catch (...) {
        die("exception other than kvx::Error");
    }
}

// A secret the input cannot know: random per process.
const kvx::wire::Secret &random_secret() {
    static const kvx::wire::Secret s = [] {
        kvx::wire::Secret r{};
        if (RAND_bytes(r.data(), static_cast<int>(r.size())) != 1) die("RAND_bytes failed");
        return r;
    }();
    return s;
}

// A secret derived from the input (any value works for answer + verify).
kvx::wire::Secret secret_from(const uint8_t *p, size_t n) {
    kvx::wire::Secret s{};
    for (size_t i = 0; i < s.size(); i++) s[i] = static_cast<uint8_t>(p[i % n] + i);
    return s;
}

bool allowed_refusal(int s) {
    return s == KVX_EAUTH || s == KVX_EFINGERPRINT || s == KVX_ECONNREFUSED || s == KVX_EVERSION || s == KVX_ENOTSUP;
}

size_t encode_message(const Message &m, uint8_t *out) {
    switch (m.kind) {
    case Kind::hello: return encode(m.hello, out);
    case Kind::auth: return encode(m.auth, out);
    case Kind::challenge: return encode(m.challenge, out);
    case Kind::refuse: return encode(m.refuse, out);
    case Kind::accept: return encode(m.accept, out);
    }
    die("decode returned an unknown kind");
}

// What expect_challenge/expect_accept must throw for bytes whose decode
// failed with decode_error (0: decoded) into m.
int expected_reply_error(int decode_error, const Message &m, Kind wanted) {
    if (decode_error) return failure_code(decode_error);
    if (m.kind == Kind::refuse) return m.refuse.status;
    if (m.kind != wanted) return KVX_EAUTH;
    return 0;  // depends on the message
}

// A target that holds secret and the given fingerprint verifies the AUTH
// answer() makes for challenge c; the ACCEPT passes expect_accept() on the
// initiator, a forged one does not.
void round_trip(const Challenge &c, uint64_t instance_id, const kvx::wire::Secret &secret, const Fingerprint &ours,
                const Fingerprint &theirs) {
    Auth a = answer(c, instance_id, secret, ours);
    if (a.instance_id != instance_id || a.challenge_id != c.challenge_id || a.fingerprint != ours || a.flags != 0)
        die("answer() does not carry what it was given");
    Identity me;
    me.instance_id = instance_id;
    me.secret = secret;
    me.fingerprint = theirs;
    Accept acc;
    const int want = fingerprints_compatible(theirs, ours) ? 0 : KVX_EFINGERPRINT;
    const int rc = verify(me, c, a, &acc, "fuzz");
    if (rc != want) die("verify() of a correct AUTH does not follow the fingerprint rule");
    if (rc != 0) return;
    if (acc.flags != 0) die("verify() accepted with flags");
    if (acc.proof == a.proof) die("client and server proofs agree");

    uint8_t buf[kMaxMessageLen];
    size_t len = encode(acc, buf);
    Accept got;
    if (error_of([&] { got = expect_accept(buf, len, c, a, secret, "fuzz"); }) != 0)
        die("expect_accept() refused the ACCEPT of verify()");
    if (got.proof != acc.proof || got.flags != acc.flags) die("expect_accept() changed the ACCEPT");
    if (error_of([&] { expect_accept(buf, len, c, a, random_secret(), "fuzz"); }) != KVX_EAUTH)
        die("expect_accept() took an ACCEPT proved with another secret");
    Accept reflected;
    reflected.proof = a.proof;
    len = encode(reflected, buf);
    if (error_of([&] { expect_accept(buf, len, c, a, secret, "fuzz"); }) != KVX_EAUTH)
        die("expect_accept() took the client's own proof reflected as the server's");
}

void check_auth(const Auth &a, const uint8_t *d, size_t n) {
    // The received AUTH, at a target whose secret it cannot know.
    Identity me;
    me.instance_id = a.instance_id;
    me.secret = random_secret();
    me.fingerprint = a.fingerprint;
    Challenge issued;
    issued.challenge_id = a.challenge_id;
    memcpy(issued.nonce.data(), a.proof.data(), kChallengeNonceLen);
    Accept acc;
    int rc = verify(me, issued, a, &acc, "fuzz");
    if (rc == 0) die("verify() accepted an AUTH from a peer without the secret");
    if (rc != KVX_EAUTH) die("verify() refused an unproven AUTH for its flags or fingerprint, not its proof");
    Identity other = me;
    other.instance_id = ~a.instance_id;
    if (verify(other, issued, a, &acc, "fuzz") != KVX_EAUTH) die("verify() took an AUTH meant for another instance");

    // The same request, answered properly by a peer holding the secret; the
    // target's fingerprint comes from the input (compatible or not).
    Fingerprint theirs{};
    memcpy(theirs.data(), a.nonce.data(), theirs.size());
    round_trip(issued, a.instance_id, secret_from(d, n), a.fingerprint, theirs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    Message m;
    const int err = error_of([&] { m = decode(d, n); });
    if (err != 0 && err != KVX_EINVAL && err != KVX_EVERSION) die("decode() refused with an undocumented code");

    // message_len() sees the header a stream transport reads first.
    if (n >= kHeaderLen) {
        size_t len = 0;
        const int lerr = error_of([&] { len = message_len(d); });
        if (lerr != 0) {
            if (lerr != err) die("message_len() and decode() disagree on a bad header");
        } else {
            if (len < kHeaderLen || len > kMaxMessageLen) die("message_len() out of range");
            if (n < len && err != KVX_EINVAL) die("decode() accepted fewer bytes than message_len()");
            if (err == KVX_EVERSION) die("decode() refused a version message_len() accepted");
            if (n >= len && err != 0 && static_cast<Kind>(d[5]) != Kind::refuse)
                die("decode() refused a complete message whose header message_len() accepted");
            if (err == 0) {
                uint8_t re[kMaxMessageLen];
                if (encode_message(m, re) != len) die("message_len() differs from the message's length");
            }
        }
    } else if (err != KVX_EINVAL) {
        die("decode() did not refuse less than a header");
    }

    // The initiator's readers of the target's answers.
    {
        const int want_c = expected_reply_error(err, m, Kind::challenge);
        Challenge c;
        const int got_c = error_of([&] { c = expect_challenge(d, n, "fuzz"); });
        if (got_c != want_c) die("expect_challenge() reports another code than the message means");
        if (got_c == 0 && (c.challenge_id != m.challenge.challenge_id || c.nonce != m.challenge.nonce))
            die("expect_challenge() changed the challenge");

        Challenge any;
        Auth mine;
        const int want_a = expected_reply_error(err, m, Kind::accept);
        const int got_a = error_of([&] { expect_accept(d, n, any, mine, random_secret(), "fuzz"); });
        if (got_a == 0) die("expect_accept() took an ACCEPT from a peer without the secret");
        if (want_a != 0 ? got_a != want_a : got_a != (m.accept.flags ? KVX_EVERSION : KVX_EAUTH))
            die("expect_accept() reports another code than the message means");
    }
    if (err != 0) return 0;

    uint8_t re[kMaxMessageLen];
    const size_t len = encode_message(m, re);
    if (n < len || memcmp(re, d, len) != 0) die("accepted message does not re-encode to its bytes");

    switch (m.kind) {
    case Kind::hello: {
        Identity me;
        me.instance_id = m.hello.instance_id;
        if (on_hello(me, m.hello) != 0) die("on_hello() refused a HELLO meant for us");
        me.instance_id = ~m.hello.instance_id;
        if (on_hello(me, m.hello) != KVX_ECONNREFUSED) die("on_hello() took a HELLO meant for another instance");
        break;
    }
    case Kind::challenge: {
        Fingerprint fp{};
        memcpy(fp.data(), m.challenge.nonce.data(), fp.size());
        round_trip(m.challenge, 0x1234, secret_from(d, n), fp, Fingerprint{});
        break;
    }
    case Kind::auth:
        check_auth(m.auth, d, n);
        break;
    case Kind::refuse:
        if (!allowed_refusal(m.refuse.status)) die("refusal with a status outside the protocol");
        if (refusal_code(m.refuse) != m.refuse.status) die("refusal_code() changed the status");
        break;
    case Kind::accept:
        break;
    }
    return 0;
}
