// libFuzzer target: the shared connection handshake
// (src/handshake/handshake.cpp and the engine of src/handshake/engine.cpp),
// whose messages come from unauthenticated peers: on a stream or seqpacket
// socket (tcp, shm: read header first, message_len, then decode) and in
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
//    expect_answer() and Initiator::on_answer() report it as that status
//    (KVX_ENOTSUP naming the options via DataPathOptions::name); anything
//    else they do not expect is KVX_EAUTH (KVX_EVERSION for another version);
//    expect_answer() returns a CHALLENGE or ACCEPT as it decoded; an
//    Initiator answers a CHALLENGE to its HELLO with an AUTH naming it,
//    refuses one to its AUTH unless it may be rechallenged, never takes an
//    ACCEPT to its HELLO, and never one to its AUTH without the secret;
//  - HELLO: a Responder (session and on_request) challenges exactly the
//    instance it names and refuses a HELLO naming another instance with
//    KVX_ECONNREFUSED; the Initiator for that instance sends exactly these
//    bytes, and the handshake it starts with a Responder session holding the
//    secret is accepted, with the same keys on both sides;
//  - CHALLENGE: expect_answer() returns it, and the answer() to it passes
//    verify() by a target holding the secret;
//  - AUTH: verify() with a random identity (secret unknown to the input)
//    never accepts it, and refuses before looking at flags or fingerprint;
//    re-signed by answer() with the secret it passes verify() (or is refused
//    for the fingerprint rule alone), the server proof in the ACCEPT differs
//    from the client proof, expect_accept() takes that ACCEPT and refuses it
//    with the client proof reflected or for another secret;
//  - ACCEPT: expect_accept() never accepts it without the secret;
//  - the input as a sequence of messages (split as a stream transport
//    reads them) into a Responder session and, one request each, into
//    Responder::on_request() never accepts without the secret, every reply
//    decodes as the CHALLENGE, ACCEPT or REFUSE{status} its step says, and
//    each step's outcome is the one the protocol prescribes for it.
// Corpus: tests/fuzz/corpus/handshake (gen_seeds.cpp: one well-formed message
// per kind, padded, truncated and other-version variants).
#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "handshake/engine.h"
#include "handshake/handshake.h"
#include "kvxfer.h"
#include "util/error.h"
#include "wire/metadata.h"

using namespace kvx::handshake;

namespace {

[[noreturn]] void die(const char *what) {
    fprintf(stderr, "fuzz_handshake: %s\n", what);
    abort();
}

// The code f() threw as kvx::Error (0: it returned), its message into *msg.
// Any other exception aborts.
template <typename F>
int error_of(F &&f, std::string *msg = nullptr) {
    try {
        f();
        return 0;
    } catch (const kvx::Error &e) {
        if (e.code() == 0) die("kvx::Error with code 0");
        if (e.what()[0] == '\0') die("error without a message");
        if (msg) *msg = e.what();
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

// Data path options as tcp has them (bit 0: tcp.protection=aead), named.
constexpr uint32_t kAead = 1;
std::string tcp_name(uint32_t f) { return f == kAead ? "tcp.protection=aead" : "tcp.protection=none"; }
const DataPathOptions kTcpAead{kAead, kAead, tcp_name};
const DataPathOptions kVerbs{};  // defines no flag

// Challenges of the responders here stay live for the whole input.
constexpr auto kTtl = std::chrono::hours(1);

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

// What expect_answer()/Initiator::on_answer() must throw for bytes whose
// decode failed with decode_error (0: decoded) into m, before looking at
// what a CHALLENGE or ACCEPT means (0: it depends on that).
int expected_answer_error(int decode_error, const Message &m) {
    if (decode_error) return failure_code(decode_error);
    if (m.kind == Kind::refuse) return m.refuse.status;
    if (m.kind != Kind::challenge && m.kind != Kind::accept) return KVX_EAUTH;
    return 0;
}

// A step's reply is the message its outcome says.
void check_reply(const Step &s) {
    if (s.reply_len == 0 || s.reply_len > kMaxMessageLen) die("a step's reply has no valid length");
    Message r;
    if (error_of([&] { r = decode(s.reply.data(), s.reply_len); }) != 0) die("a step's reply does not decode");
    uint8_t re[kMaxMessageLen];
    if (encode_message(r, re) != s.reply_len) die("a step's reply has trailing bytes");
    switch (s.outcome) {
    case Step::Outcome::challenged:
        if (r.kind != Kind::challenge) die("challenged, but the reply is no CHALLENGE");
        if (r.challenge.challenge_id != s.challenge.challenge_id || r.challenge.nonce != s.challenge.nonce)
            die("the CHALLENGE sent is not the step's challenge");
        break;
    case Step::Outcome::accepted:
        if (r.kind != Kind::accept) die("accepted, but the reply is no ACCEPT");
        if (s.status != 0) die("accepted with a status");
        break;
    case Step::Outcome::refused:
        if (r.kind != Kind::refuse) die("refused, but the reply is no REFUSE");
        if (r.refuse.status != s.status) die("the REFUSE sent carries another status than the step");
        if (!allowed_refusal(s.status)) die("refused with a status outside the protocol");
        break;
    default: die("a step with an unknown outcome");
    }
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
    std::string why;
    const int want = fingerprints_compatible(theirs, ours) ? 0 : KVX_EFINGERPRINT;
    const int rc = verify(me, kVerbs, c, a, &acc, &why);
    if (rc != want) die("verify() of a correct AUTH does not follow the fingerprint rule");
    if (rc != 0) {
        if (why.empty()) die("verify() refused without saying why");
        return;
    }
    if (acc.flags != 0) die("verify() accepted with flags");
    if (acc.proof == a.proof) die("client and server proofs agree");

    // through the bytes, as the initiator receives them
    uint8_t buf[kMaxMessageLen];
    size_t len = encode(acc, buf);
    Message got;
    if (error_of([&] { got = expect_answer(buf, len, kVerbs, "fuzz", "AUTH"); }) != 0 || got.kind != Kind::accept)
        die("expect_answer() refused the ACCEPT of verify()");
    if (got.accept.proof != acc.proof || got.accept.flags != acc.flags) die("expect_answer() changed the ACCEPT");
    if (error_of([&] { expect_accept(got.accept, c, a, secret, "fuzz"); }) != 0)
        die("expect_accept() refused the ACCEPT of verify()");
    if (error_of([&] { expect_accept(got.accept, c, a, random_secret(), "fuzz"); }) != KVX_EAUTH)
        die("expect_accept() took an ACCEPT proved with another secret");
    Accept reflected;
    reflected.proof = a.proof;
    if (error_of([&] { expect_accept(reflected, c, a, secret, "fuzz"); }) != KVX_EAUTH)
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
    std::string why;
    // opts that define and require exactly its flags: only the proof can fail
    const DataPathOptions its{a.flags, a.flags, nullptr};
    int rc = verify(me, its, issued, a, &acc, &why);
    if (rc == 0) die("verify() accepted an AUTH from a peer without the secret");
    if (rc != KVX_EAUTH) die("verify() refused an unproven AUTH for its flags or fingerprint, not its proof");
    if (why.empty()) die("verify() refused without saying why");
    for (const DataPathOptions *o : {&kVerbs, &kTcpAead})  // nor for flags it does not define or require
        if (verify(me, *o, issued, a, &acc, &why) != KVX_EAUTH)
            die("verify() refused an unproven AUTH for its flags, not its proof");
    Identity other = me;
    other.instance_id = ~a.instance_id;
    if (verify(other, its, issued, a, &acc, &why) != KVX_EAUTH) die("verify() took an AUTH meant for another instance");

    // The same request, answered properly by a peer holding the secret; the
    // target's fingerprint comes from the input (compatible or not).
    Fingerprint theirs{};
    memcpy(theirs.data(), a.nonce.data(), theirs.size());
    round_trip(issued, a.instance_id, secret_from(d, n), a.fingerprint, theirs);
}

// The input as the target's answer, read by expect_answer() and by
// Initiators (whose secret the input cannot know) after HELLO and after AUTH.
void check_answers(const uint8_t *d, size_t n, int err, const Message &m) {
    const int want = expected_answer_error(err, m);
    for (const DataPathOptions *opts : {&kVerbs, &kTcpAead}) {
        Message got;
        std::string msg;
        const int rc = error_of([&] { got = expect_answer(d, n, *opts, "fuzz", "AUTH"); }, &msg);
        if (rc != want) die("expect_answer() reports another code than the message means");
        if (rc == KVX_ENOTSUP && msg.find(opts->describe(opts->flags)) == std::string::npos)
            die("an ENOTSUP refusal does not name the options");
        if (rc == 0) {
            if (got.kind != m.kind) die("expect_answer() changed the message kind");
            if (got.kind == Kind::challenge &&
                (got.challenge.challenge_id != m.challenge.challenge_id || got.challenge.nonce != m.challenge.nonce))
                die("expect_answer() changed the challenge");
            if (got.kind == Kind::accept && (got.accept.flags != m.accept.flags || got.accept.proof != m.accept.proof))
                die("expect_answer() changed the accept");
        }
    }

    kvx::wire::AgentMetadata target;
    target.instance_id = 0x1234;
    target.secret = random_secret();
    const Fingerprint ours{};

    // after HELLO: a CHALLENGE is answered with an AUTH naming it; nothing else passes
    {
        Initiator in(target, ours, kTcpAead, "fuzz");
        Bytes out{};
        size_t len = 0;
        bool done = false;
        const int rc = error_of([&] { done = in.on_answer(d, n, out.data(), &len); });
        const int expect = want != 0 ? want : m.kind == Kind::accept ? KVX_EAUTH : 0;
        if (rc != expect) die("Initiator::on_answer() to HELLO reports another code than the message means");
        if (rc == 0) {
            if (done) die("Initiator::on_answer() took an ACCEPT in answer to HELLO");
            Message a;
            if (len != kAuthLen || error_of([&] { a = decode(out.data(), len); }) != 0 || a.kind != Kind::auth)
                die("Initiator::on_answer() answered a CHALLENGE with no AUTH");
            if (a.auth.challenge_id != m.challenge.challenge_id || a.auth.instance_id != target.instance_id ||
                a.auth.flags != kTcpAead.flags || a.auth.fingerprint != ours)
                die("the Initiator's AUTH does not answer the challenge");
            Bytes again{};
            if (in.auth(again.data()) != len || again != out) die("Initiator::auth() differs from the AUTH sent");
        } else if (error_of([&] { in.keys(); }) != KVX_EINTERNAL) {
            die("Initiator::keys() without an accept");
        }
    }

    // after AUTH, with and without rechallenge: an ACCEPT never passes without the secret
    for (bool rechallenge : {false, true}) {
        Initiator in(target, ours, kVerbs, "fuzz", rechallenge);
        Challenge c;
        c.challenge_id = 77;
        uint8_t cb[kMaxMessageLen];
        const size_t cn = encode(c, cb);
        Bytes out{};
        size_t len = 0;
        if (error_of([&] { in.on_answer(cb, cn, out.data(), &len); }) != 0) die("Initiator refused a CHALLENGE");
        bool done = false;
        const int rc = error_of([&] { done = in.on_answer(d, n, out.data(), &len); });
        int expect = want;
        // an ACCEPT from a peer without the secret fails its proof, whatever
        // flags it names: never taken for another version (0.8)
        if (want == 0 && m.kind == Kind::accept) expect = KVX_EAUTH;
        if (want == 0 && m.kind == Kind::challenge) expect = rechallenge ? 0 : KVX_EAUTH;
        if (rc != expect) die("Initiator::on_answer() to AUTH reports another code than the message means");
        if (rc == 0 && done) die("Initiator::on_answer() took an ACCEPT from a peer without the secret");
        if (rc == 0) {
            Message a;
            if (len != kAuthLen || error_of([&] { a = decode(out.data(), len); }) != 0 || a.kind != Kind::auth ||
                a.auth.challenge_id != m.challenge.challenge_id)
                die("a rechallenged Initiator does not answer the new challenge");
        }
        if (error_of([&] { in.keys(); }) != KVX_EINTERNAL) die("Initiator::keys() without an accept");
    }

    // the primitive too
    if (err == 0 && m.kind == Kind::accept) {
        Challenge any;
        Auth mine;
        const int rc = error_of([&] { expect_accept(m.accept, any, mine, random_secret(), "fuzz"); });
        if (rc == 0) die("expect_accept() took an ACCEPT from a peer without the secret");
        if (rc != KVX_EAUTH)  // the proof first: flags it names do not matter without it
            die("expect_accept() reports another code than the message means");
    }
}

// The input split as a stream transport reads it: a header, then as much of
// the message as message_len() says (the rest when the header does not
// decode, or when less is left). At most kMaxSteps messages.
constexpr size_t kMaxSteps = 64;
std::vector<std::pair<const uint8_t *, size_t>> split(const uint8_t *d, size_t n) {
    std::vector<std::pair<const uint8_t *, size_t>> out;
    size_t off = 0;
    while (off < n && out.size() < kMaxSteps) {
        size_t len = n - off;
        if (len >= kHeaderLen) {
            size_t want = 0;
            if (error_of([&] { want = message_len(d + off); }) == 0) len = std::min(len, want);
        }
        if (out.size() + 1 == kMaxSteps) len = n - off;
        out.emplace_back(d + off, len);
        off += len;
    }
    return out;
}

// The instance the input means: the first HELLO or AUTH that names one.
uint64_t instance_of(const std::vector<std::pair<const uint8_t *, size_t>> &msgs) {
    for (const auto &one : msgs) {
        const uint8_t *p = one.first;  // (clang captures no structured binding in a lambda)
        const size_t len = one.second;
        Message m;
        if (error_of([&] { m = decode(p, len); }) != 0) continue;
        if (m.kind == Kind::hello) return m.hello.instance_id;
        if (m.kind == Kind::auth) return m.auth.instance_id;
    }
    return 0x1122334455667788ull;
}

// The input as the messages of initiators at a Responder whose secret it
// cannot know: every step is the one the protocol prescribes.
void check_responder(const uint8_t *d, size_t n) {
    const auto msgs = split(d, n);
    Identity me;
    me.instance_id = instance_of(msgs);
    me.secret = random_secret();
    if (!msgs.empty() && msgs[0].second > 0) me.fingerprint[0] = msgs[0].first[0];  // set or not, by the input

    // one connection: a session
    {
        Responder r(me, kTcpAead, "fuzz", kTtl);
        Responder::Session s;
        bool over = false;
        for (const auto &one : msgs) {
            const uint8_t *p = one.first;
            const size_t len = one.second;
            const auto was = s.state;
            Message m;
            const int err = error_of([&] { m = decode(p, len); });
            const Step st = r.on_message(s, p, len, "fuzz");
            check_reply(st);
            if (st.outcome == Step::Outcome::accepted) die("a session accepted an AUTH without the secret");
            Step::Outcome want = Step::Outcome::refused;
            int code = KVX_EAUTH;
            if (err != 0) {
                code = failure_code(err);
            } else if (was == Responder::Session::State::hello && m.kind == Kind::hello) {
                if (m.hello.instance_id == me.instance_id)
                    want = Step::Outcome::challenged;
                else
                    code = KVX_ECONNREFUSED;
            }
            if (over && (want != Step::Outcome::refused || was != Responder::Session::State::over))
                die("a session went on after its handshake ended");
            if (st.outcome != want || (want == Step::Outcome::refused && st.status != code))
                die("a session step is not the one the protocol prescribes");
            if (want == Step::Outcome::challenged) {
                if (s.state != Responder::Session::State::auth) die("a session challenged but expects no AUTH");
                if (s.issued.challenge_id != st.challenge.challenge_id || s.issued.nonce != st.challenge.nonce)
                    die("a session expects an AUTH to another challenge than it sent");
            } else if (s.state != Responder::Session::State::over) {
                die("a refused session is not over");
            }
            over = st.outcome == Step::Outcome::refused;
        }
    }

    // connect requests of a connectionless carrier: each message on its own
    {
        Responder r(me, kVerbs, "fuzz", kTtl);
        for (const auto &one : msgs) {
            const uint8_t *p = one.first;
            const size_t len = one.second;
            Message m;
            const int err = error_of([&] { m = decode(p, len); });
            const Step st = r.on_request(p, len, "fuzz");
            check_reply(st);
            if (st.outcome == Step::Outcome::accepted) die("on_request() accepted an AUTH without the secret");
            Step::Outcome want = Step::Outcome::refused;
            int code = KVX_EAUTH;
            if (err != 0) {
                code = failure_code(err);
            } else if (m.kind == Kind::hello) {
                if (m.hello.instance_id == me.instance_id)
                    want = Step::Outcome::challenged;
                else
                    code = KVX_ECONNREFUSED;
            } else if (m.kind == Kind::auth && m.auth.instance_id == me.instance_id) {
                // the first epoch's challenges are live (tag 0) and never used
                // up here (nothing verifies): others get a fresh challenge
                if ((m.auth.challenge_id >> 24) != 0) want = Step::Outcome::challenged;
            }
            if (st.outcome != want || (want == Step::Outcome::refused && st.status != code))
                die("an on_request() step is not the one the protocol prescribes");
        }
    }
}

// A HELLO at Responders: challenged by the instance it names, refused by
// another; the honest handshake it starts is accepted with equal keys.
void check_hello(const Hello &h, const uint8_t *d, size_t n) {
    Identity me;
    me.instance_id = h.instance_id;
    me.secret = secret_from(d, n);
    memcpy(me.fingerprint.data(), d, std::min(n, me.fingerprint.size()));
    Identity other = me;
    other.instance_id = ~h.instance_id;

    Responder r(me, kTcpAead, "fuzz", kTtl);
    Responder elsewhere(other, kTcpAead, "fuzz", kTtl);
    Responder::Session s, s2;
    const Step st = r.on_message(s, d, n, "fuzz");
    check_reply(st);
    if (st.outcome != Step::Outcome::challenged) die("a session refused a HELLO meant for its instance");
    Step no = elsewhere.on_message(s2, d, n, "fuzz");
    check_reply(no);
    if (no.outcome != Step::Outcome::refused || no.status != KVX_ECONNREFUSED)
        die("a session took a HELLO meant for another instance");
    Step req = r.on_request(d, n, "fuzz");
    check_reply(req);
    if (req.outcome != Step::Outcome::challenged) die("on_request() refused a HELLO meant for its instance");
    req = elsewhere.on_request(d, n, "fuzz");
    check_reply(req);
    if (req.outcome != Step::Outcome::refused || req.status != KVX_ECONNREFUSED)
        die("on_request() took a HELLO meant for another instance");

    // the Initiator for that instance says the same, and completes
    kvx::wire::AgentMetadata target;
    target.instance_id = h.instance_id;
    target.secret = me.secret;
    Initiator in(target, me.fingerprint, kTcpAead, "fuzz");
    Bytes out{};
    size_t len = in.hello(out.data());
    if (len != kHelloLen || memcmp(out.data(), d, len) != 0) die("the Initiator's HELLO differs from the one received");
    if (error_of([&] {
            if (in.on_answer(st.reply.data(), st.reply_len, out.data(), &len)) die("an ACCEPT to HELLO");
            const Step acc = r.on_message(s, out.data(), len, "fuzz");
            check_reply(acc);
            if (acc.outcome != Step::Outcome::accepted) die("a session refused the honest AUTH");
            if (!in.on_answer(acc.reply.data(), acc.reply_len, out.data(), &len))
                die("the Initiator did not take the honest ACCEPT");
            const Keys a = in.keys(), b = r.keys(acc);
            if (a.to_target != b.to_target || a.to_initiator != b.to_initiator) die("the two sides' keys differ");
        }) != 0)
        die("the honest handshake failed");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    Message m;
    const int err = error_of([&] { m = decode(d, n); });
    if (err != 0 && err != KVX_EINVAL && err != KVX_EVERSION) die("decode() refused with an undocumented code");
    if (is_message(d, n) != (err == 0)) die("is_message() and decode() disagree");

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

    // The initiator's readers of the target's answers; the target's engine.
    check_answers(d, n, err, m);
    check_responder(d, n);
    if (err != 0) return 0;

    uint8_t re[kMaxMessageLen];
    const size_t len = encode_message(m, re);
    if (n < len || memcmp(re, d, len) != 0) die("accepted message does not re-encode to its bytes");

    switch (m.kind) {
    case Kind::hello:
        check_hello(m.hello, d, n);
        break;
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
