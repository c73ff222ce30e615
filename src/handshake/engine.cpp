#include "handshake/engine.h"

#include "util/error.h"
#include "util/log.h"

namespace kvx::handshake {

bool is_message(const void *p, size_t n) {
    try {
        decode(p, n);
        return true;
    } catch (const Error &) {
        return false;
    }
}

// ------------------------------------------------------------------ responder

Responder::Responder(const Identity &me, const DataPathOptions &opts, const char *backend,
                     std::chrono::milliseconds challenge_ttl, size_t max_used)
    : me_(me), opts_(opts), backend_(backend), challenges_(challenge_ttl, max_used) {}

Step Responder::challenge(Challenge c) {
    Step s;
    s.outcome = Step::Outcome::challenged;
    s.challenge = c;
    s.reply_len = encode(c, s.reply.data());
    return s;
}

// A refusal costs no log line each: one a second at most, with the count.
Step Responder::refuse(int status, const std::string &why, const char *from) {
    Step s;
    s.outcome = Step::Outcome::refused;
    s.status = status;
    s.reply_len = encode(Refuse{status}, s.reply.data());
    refused_++;
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_log_) {
        KVX_LOG(warn, "%s: refused %llu connection(s) that did not authenticate; latest: %s from %s (%s)",
                backend_.c_str(), (unsigned long long)refused_, why.c_str(), from, error_name(status));
        refused_ = 0;
        next_log_ = now + std::chrono::seconds(1);
    }
    return s;
}

Step Responder::decline(int status, const std::string &why, const char *from) {
    if (!refusable(status))
        fail(KVX_EINTERNAL, "handshake: a refusal with status %d, which no REFUSE may carry", status);
    std::lock_guard lk(mu_);
    return refuse(status, why, from);
}

Step Responder::on_auth(const Challenge &issued, const Message &m, const char *from) {
    Step s;
    std::string why;
    if (int rc = verify(me_, opts_, issued, m.auth, &s.accept, &why)) return refuse(rc, why, from);
    s.outcome = Step::Outcome::accepted;
    s.challenge = issued;
    s.auth = m.auth;
    s.reply_len = encode(s.accept, s.reply.data());
    return s;
}

Step Responder::on_message(Session &ss, const void *p, size_t n, const char *from) {
    std::lock_guard lk(mu_);
    const Session::State was = ss.state;
    ss.state = Session::State::over;  // unless a challenge goes out below
    Message m;
    try {
        m = decode(p, n);
    } catch (const Error &e) {
        return refuse(failure_code(e.code()), e.what(), from);
    }
    if (was == Session::State::hello && m.kind == Kind::hello) {
        if (m.hello.instance_id != me_.instance_id)
            return refuse(KVX_ECONNREFUSED, "a HELLO meant for another transport", from);
        ss.issued = challenges_.issue_random();
        ss.state = Session::State::auth;
        return challenge(ss.issued);
    }
    if (was == Session::State::auth && m.kind == Kind::auth) return on_auth(ss.issued, m, from);
    return refuse(KVX_EAUTH, was == Session::State::over ? "a message after the handshake ended"
                                                         : "a message out of turn",
                  from);
}

Step Responder::on_request(const void *p, size_t n, const char *from) {
    std::lock_guard lk(mu_);
    Message m;
    try {
        m = decode(p, n);
    } catch (const Error &e) {
        return refuse(failure_code(e.code()), e.what(), from);
    }
    if (m.kind == Kind::hello) {
        if (m.hello.instance_id != me_.instance_id)
            return refuse(KVX_ECONNREFUSED, "a HELLO meant for another transport", from);
        return challenge(challenges_.issue());
    }
    if (m.kind != Kind::auth) return refuse(KVX_EAUTH, "a message that is neither HELLO nor AUTH", from);
    if (m.auth.instance_id != me_.instance_id) return refuse(KVX_EAUTH, "an AUTH meant for another transport", from);
    Challenge issued;
    if (!challenges_.find(m.auth.challenge_id, &issued)) {
        KVX_LOG(debug, "%s: AUTH from %s names an unknown, expired or used challenge: challenged again",
                backend_.c_str(), from);
        return challenge(challenges_.issue());
    }
    Step s = on_auth(issued, m, from);
    // Used up only once it verified; an epoch out of room challenges again.
    if (s.outcome == Step::Outcome::accepted && !challenges_.use(m.auth.challenge_id))
        return challenge(challenges_.issue());
    return s;
}

Keys Responder::keys(const Step &a) const { return derive_keys(me_.secret, a.challenge, a.auth, a.accept); }

// ------------------------------------------------------------------ initiator

Initiator::Initiator(const wire::AgentMetadata &target, const Fingerprint &ours, const DataPathOptions &opts,
                     std::string where, bool rechallenge)
    : target_(target), ours_(ours), opts_(opts), where_(std::move(where)), rechallenge_(rechallenge) {}

size_t Initiator::hello(uint8_t *out) const { return encode(Hello{target_.instance_id}, out); }

size_t Initiator::auth(uint8_t *out) const { return encode(auth_, out); }

bool Initiator::on_answer(const void *p, size_t n, uint8_t *out, size_t *out_len) {
    const char *to = state_ == State::hello ? "HELLO" : "AUTH";
    Message m = expect_answer(p, n, opts_, where_.c_str(), to);
    const bool challenge_ok = state_ == State::hello || (state_ == State::auth && rechallenge_);
    if (m.kind == Kind::challenge && challenge_ok) {
        challenge_ = m.challenge;
        auth_ = answer(challenge_, target_.instance_id, target_.secret, ours_, opts_.flags);
        state_ = State::auth;
        *out_len = auth(out);
        return false;
    }
    if (m.kind == Kind::accept && state_ == State::auth) {
        expect_accept(m.accept, challenge_, auth_, target_.secret, where_.c_str());
        accept_ = m.accept;
        state_ = State::accepted;
        return true;
    }
    fail(KVX_EAUTH, "%s answered %s with an unexpected message", where_.c_str(), to);
}

Keys Initiator::keys() const {
    if (state_ != State::accepted) fail(KVX_EINTERNAL, "handshake: keys before the target accepted");
    return derive_keys(target_.secret, challenge_, auth_, accept_);
}

int initiate(Initiator &in, Carrier &c) {
    Bytes buf;
    Bytes out;
    size_t len = in.hello(out.data());
    for (;;) {
        if (int rc = c.send(out.data(), len)) return rc;
        size_t n = 0;
        if (int rc = c.receive(buf, &n)) return rc;
        if (in.on_answer(buf.data(), n, out.data(), &len)) return 0;
    }
}

}  // namespace kvx::handshake
