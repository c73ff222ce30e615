// The handshake engine every backend drives (src/handshake/engine.h): the
// Responder's sessions (connection carriers) and requests (connectionless
// carriers), the Initiator, initiate() over a carrier, decline(), and the
// rate-limited log of refusals.
#include "handshake_test_util.h"

using namespace handshake_test;

namespace {

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
