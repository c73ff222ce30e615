// The hostile-handshake cases, the same against every backend: a live
// target (its transport created through the public API) meets a client that
// speaks the handshake through the backend's own carrier (tcp: a stream;
// shm: a SOCK_SEQPACKET socket; verbs: rdma_cm private data, one connect
// request per message) and sends what an attacker would. Every answer is the
// one docs/wire-format.md ("Handshake") promises, the same on every backend;
// the target's region stays untouched; an honest peer still connects and
// writes afterwards.
//
//   handshake_hostile tcp|shm|verbs   (verbs: exit 77 without a device)
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/shm/shm.h"
#include "backends/tcp/tcp.h"
#include "core/options.h"
#include "handshake/engine.h"
#include "util/error.h"
#include "util/net.h"
#include "wire/metadata.h"
#ifdef KVX_TEST_VERBS
#include <rdma/rdma_cma.h>

#include "backends/verbs/verbs.h"
#endif

// cmocka's macros clash with C++ headers: include it last.
extern "C" {
#include "harness.h"
}

namespace hs = kvx::handshake;

namespace {

constexpr uint64_t kNB = 8, kBL = 4096;
constexpr int kChallenged = 1;  // answer(): a CHALLENGE came back
constexpr int kAccepted = 0;    // answer(): an ACCEPT came back
const char *g_backend = "tcp";

using Msg = std::vector<uint8_t>;

// One client of the target through the backend's carrier. send() sends one
// message and returns the target's answer (empty: none, the carrier closed).
// On a connection carrier the messages of one Carrier share a connection; on
// verbs each one rides a connect request of its own.
class RawCarrier {
public:
    virtual ~RawCarrier() = default;
    virtual Msg send(const Msg &m) = 0;
};

class StreamCarrier final : public RawCarrier {
public:
    explicit StreamCarrier(const kvx::net::Endpoint &ep) {
        auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
        assert_int_equal(kvx::net::connect_by(ep, deadline, &fd_), 0);
    }
    Msg send(const Msg &m) override {
        auto deadline = kvx::net::Clock::now() + std::chrono::seconds(5);
        if (kvx::net::write_full_by(fd_.get(), m.data(), m.size(), deadline) != 0) return {};
        Msg b(hs::kHeaderLen);
        if (kvx::net::read_full_by(fd_.get(), b.data(), b.size(), deadline) != 0) return {};
        size_t len = 0;
        try {
            len = hs::message_len(b.data());
        } catch (const kvx::Error &) {
            return b;  // not a handshake message: answer() says -1
        }
        b.resize(len);
        if (kvx::net::read_full_by(fd_.get(), b.data() + hs::kHeaderLen, len - hs::kHeaderLen, deadline) != 0) return {};
        return b;
    }

private:
    kvx::net::Fd fd_;
};

class SeqpacketCarrier final : public RawCarrier {
public:
    explicit SeqpacketCarrier(const std::string &name) {
        fd_ = kvx::net::Fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        memcpy(a.sun_path + 1, name.data(), name.size());
        const socklen_t alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
        assert_int_equal(connect(fd_.get(), reinterpret_cast<sockaddr *>(&a), alen), 0);
        timeval tv{5, 0};
        setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    // A target may refuse before it reads (shm: a writer of another user is
    // refused when accepted): its REFUSE is read even if the send failed.
    Msg send(const Msg &m) override {
        (void)::send(fd_.get(), m.data(), m.size(), MSG_NOSIGNAL);
        Msg b(256);
        ssize_t n = recv(fd_.get(), b.data(), b.size(), 0);
        b.resize(n > 0 ? static_cast<size_t>(n) : 0);
        return b;
    }

private:
    kvx::net::Fd fd_;
};

#ifdef KVX_TEST_VERBS
// Each message is the private data of a connect request (a random QP number,
// no QP); the answer is the private data of the reject or the accept.
class CmCarrier final : public RawCarrier {
public:
    explicit CmCarrier(const kvx::net::Endpoint &ep) : ep_(ep) {}
    Msg send(const Msg &m) override {
        Msg out;
        for (int i = 0; i < 5 && out.empty(); i++) out = request(m);  // a stale-connection reject: again
        return out;
    }

private:
    Msg request(const Msg &m) {
        rdma_event_channel *ch = rdma_create_event_channel();
        assert_non_null(ch);
        rdma_cm_id *id = nullptr;
        assert_int_equal(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
        socklen_t len = 0;
        sockaddr_storage dst = kvx::net::from_endpoint(ep_, &len);
        Msg out;
        if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 2000) == 0 &&
            next(ch) == RDMA_CM_EVENT_ADDR_RESOLVED && rdma_resolve_route(id, 2000) == 0 &&
            next(ch) == RDMA_CM_EVENT_ROUTE_RESOLVED) {
            rdma_conn_param cp{};
            cp.private_data = m.data();
            cp.private_data_len = static_cast<uint8_t>(m.size());
            cp.responder_resources = cp.initiator_depth = 1;
            cp.retry_count = 6;
            cp.qp_num = 2 + static_cast<uint32_t>(gen_() % 0xfffffdu);
            if (rdma_connect(id, &cp) == 0) {
                rdma_cm_event *e = nullptr;
                if (readable(ch) && rdma_get_cm_event(ch, &e) == 0) {
                    if (e->event == RDMA_CM_EVENT_REJECTED || e->event == RDMA_CM_EVENT_CONNECT_RESPONSE) {
                        const auto *p = static_cast<const uint8_t *>(e->param.conn.private_data);
                        if (p) out.assign(p, p + e->param.conn.private_data_len);
                        // the target's CM took it for a stale connection: no kvxfer message, again
                        if (!hs::is_message(out.data(), out.size())) out.clear();
                    }
                    rdma_ack_cm_event(e);
                }
            }
        }
        rdma_destroy_id(id);  // an accepted request: rejects the REP
        rdma_destroy_event_channel(ch);
        return out;
    }

    // The channel has an event within 5 s (a lost answer fails the case, not the run).
    static bool readable(rdma_event_channel *ch) {
        pollfd p{ch->fd, POLLIN, 0};
        return poll(&p, 1, 5000) == 1;
    }
    static rdma_cm_event_type next(rdma_event_channel *ch) {
        rdma_cm_event *e = nullptr;
        if (!readable(ch) || rdma_get_cm_event(ch, &e) != 0) return RDMA_CM_EVENT_ADDR_ERROR;
        rdma_cm_event_type t = e->event;
        rdma_ack_cm_event(e);
        return t;
    }
    kvx::net::Endpoint ep_;
    std::minstd_rand gen_{std::random_device{}()};
};
#endif

bool connectionless() { return strcmp(g_backend, "verbs") == 0; }

struct Target {
    region r;
    kvx_transport *t = nullptr;
    metablob m;
    kvx::wire::AgentMetadata meta;
    hs::DataPathOptions opts;  // what an honest initiator of this backend offers
};

kvx_options *options_for(const char *backend, const char *protection) {
    kvx_options *o = nullptr;
    CHECK_OK(kvx_options_create(&o));
    CHECK_OK(kvx_options_set(o, "backend", backend));
    if (protection) CHECK_OK(kvx_options_set(o, "tcp.protection", protection));
    return o;
}

void target_up(Target &tg) {
    tg.r = region_new(kNB, kBL, 0x5a);
    kvx_options *o = options_for(g_backend, nullptr);
    CHECK_OK(kvx_transport_create(&tg.t, tg.r.base, kNB, kBL, "{\"model\":\"m\"}", o));
    kvx_options_destroy(o);
    get_meta(tg.t, &tg.m);
    tg.meta = kvx::wire::decode_metadata(tg.m.bytes, tg.m.len);
    if (strcmp(g_backend, "tcp") == 0) {
        // tcp's defaults (tcp.protection=aead): what an honest tcp initiator offers.
        kvx::OptionBag none;
        tg.opts = kvx::tcp::data_path_options(kvx::Options(&none, kvx::all_option_tables()));
    }
}

std::unique_ptr<RawCarrier> carrier(const Target &tg) {
    if (strcmp(g_backend, "tcp") == 0) {
        const kvx::wire::Section *s = tg.meta.find(kvx::tcp::kSectionId);
        assert_non_null(s);
        return std::make_unique<StreamCarrier>(kvx::tcp::decode_section(*s).back());  // loopback is last
    }
    if (strcmp(g_backend, "shm") == 0) {
        const kvx::wire::Section *s = tg.meta.find(kvx::shm::kSectionId);
        assert_non_null(s);
        return std::make_unique<SeqpacketCarrier>(kvx::shm::decode_section(*s).socket_name);
    }
#ifdef KVX_TEST_VERBS
    const kvx::wire::Section *s = tg.meta.find(kvx::verbs::kSectionId);
    assert_non_null(s);
    return std::make_unique<CmCarrier>(kvx::verbs::decode_section(*s, tg.meta).rails.front().cm);
#else
    fail_msg("backend %s is not built into this test", g_backend);
    return nullptr;
#endif
}

template <class M>
Msg bytes(const M &m) {
    hs::Bytes b{};
    size_t n = hs::encode(m, b.data());
    return Msg(b.begin(), b.begin() + static_cast<long>(n));
}

// kChallenged, kAccepted, or the refusal's status; -1 for no answer or one
// that is no handshake message.
int answer(const Msg &reply) {
    if (reply.empty() || !hs::is_message(reply.data(), reply.size())) return -1;
    hs::Message m = hs::decode(reply.data(), reply.size());
    if (m.kind == hs::Kind::challenge) return kChallenged;
    if (m.kind == hs::Kind::accept) return kAccepted;
    if (m.kind == hs::Kind::refuse) return m.refuse.status;
    return -1;
}

// HELLO on c; the challenge that came back.
hs::Challenge challenge_of(RawCarrier &c, const Target &tg) {
    Msg r = c.send(bytes(hs::Hello{tg.meta.instance_id}));
    assert_int_equal(answer(r), kChallenged);
    return hs::decode(r.data(), r.size()).challenge;
}

hs::Fingerprint our_fingerprint() { return hs::fingerprint_bytes("c1b1b3b1f9a6c5a2"); }

void target_down(Target &tg) {
    kvx_transport_destroy(tg.t);
    assert_true(region_guards_ok(&tg.r) && block_is(tg.r.base, kNB * kBL, 0x5a));  // nothing landed
    region_free(&tg.r);
}

int setup(void **state) {
    auto *tg = new Target;
    target_up(*tg);
    *state = tg;
    return 0;
}

int teardown(void **state) {
    auto *tg = static_cast<Target *>(*state);
    target_down(*tg);
    delete tg;
    return 0;
}

// The honest client through the raw carrier: the carrier works, and the
// engine's initiator and the target agree (the other cases can fail).
void test_honest(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    auto c = carrier(tg);
    hs::Initiator in(tg.meta, hs::Fingerprint{}, tg.opts, "target", connectionless());
    hs::Bytes out;
    size_t n = in.hello(out.data());
    Msg r = c->send(Msg(out.begin(), out.begin() + static_cast<long>(n)));
    assert_int_equal(answer(r), kChallenged);
    assert_false(in.on_answer(r.data(), r.size(), out.data(), &n));
    r = c->send(Msg(out.begin(), out.begin() + static_cast<long>(n)));
    assert_int_equal(answer(r), kAccepted);
    assert_true(in.on_answer(r.data(), r.size(), out.data(), &n));
}

void test_other_instance(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    assert_int_equal(answer(carrier(tg)->send(bytes(hs::Hello{tg.meta.instance_id ^ 1}))), KVX_ECONNREFUSED);
}

void test_garbage(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    Msg junk(hs::kHelloLen, 0xa5);
    assert_int_equal(answer(carrier(tg)->send(junk)), KVX_EAUTH);
    Msg v2 = bytes(hs::Hello{tg.meta.instance_id});
    v2[4] = 2;  // another protocol version
    assert_int_equal(answer(carrier(tg)->send(v2)), KVX_EVERSION);
    Msg refuse = bytes(hs::Refuse{KVX_EAUTH});  // a target's message, sent to a target
    assert_int_equal(answer(carrier(tg)->send(refuse)), KVX_EAUTH);
}

// AUTH first, naming a challenge never issued (of an epoch the target has
// not reached: the top 8 bits of an id name its epoch): a connection refuses
// it; a connectionless target challenges (an honest initiator whose
// challenge expired gets a fresh one), and refuses one of a live epoch.
void test_auth_first(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    hs::Challenge made{};
    made.challenge_id = 0x5a000001;
    Msg a = bytes(hs::answer(made, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, tg.opts.flags));
    assert_int_equal(answer(carrier(tg)->send(a)), connectionless() ? kChallenged : KVX_EAUTH);
    if (!connectionless()) return;
    // Connectionless, an id of the live epoch that was never issued: the
    // target derives its nonce (it keeps no list), and the proof, made for
    // a nonce the initiator guessed, fails.
    auto c = carrier(tg);
    const hs::Challenge live = challenge_of(*c, tg);
    made.challenge_id = (live.challenge_id & 0xff000000u) | ((live.challenge_id + 1000) & 0x00ffffffu);
    a = bytes(hs::answer(made, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, tg.opts.flags));
    assert_int_equal(answer(c->send(a)), KVX_EAUTH);
}

void test_wrong_secret(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    auto c = carrier(tg);
    hs::Challenge ch = challenge_of(*c, tg);
    kvx::wire::Secret guess = tg.meta.secret;
    guess[0] ^= 1;
    assert_int_equal(answer(c->send(bytes(hs::answer(ch, tg.meta.instance_id, guess, hs::Fingerprint{}, tg.opts.flags)))),
                     KVX_EAUTH);
}

void test_fingerprint(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    auto c = carrier(tg);
    hs::Challenge ch = challenge_of(*c, tg);
    Msg a = bytes(hs::answer(ch, tg.meta.instance_id, tg.meta.secret, our_fingerprint(), tg.opts.flags));
    assert_int_equal(answer(c->send(a)), KVX_EFINGERPRINT);
}

// Flags the backend does not define are a version problem; tcp's own flag,
// offered differently from the target's tcp.protection, is refused as such.
void test_flags(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    auto c = carrier(tg);
    hs::Challenge ch = challenge_of(*c, tg);
    Msg a = bytes(hs::answer(ch, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, tg.opts.flags | 0x80));
    assert_int_equal(answer(c->send(a)), KVX_EVERSION);
    if (tg.opts.defined == 0) {  // shm, verbs: tcp's protection flag is no flag of theirs
        c = carrier(tg);
        ch = challenge_of(*c, tg);
        a = bytes(hs::answer(ch, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, 1));
        assert_int_equal(answer(c->send(a)), KVX_EVERSION);
        return;
    }
    c = carrier(tg);
    ch = challenge_of(*c, tg);
    a = bytes(hs::answer(ch, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, tg.opts.flags ^ tg.opts.defined));
    assert_int_equal(answer(c->send(a)), KVX_ENOTSUP);
}

// An AUTH that was accepted once, replayed: on another connection it answers
// the wrong challenge; connectionless, its challenge is used up.
void test_replay(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    auto c = carrier(tg);
    hs::Challenge ch = challenge_of(*c, tg);
    Msg a = bytes(hs::answer(ch, tg.meta.instance_id, tg.meta.secret, hs::Fingerprint{}, tg.opts.flags));
    assert_int_equal(answer(c->send(a)), kAccepted);
    auto again = carrier(tg);
    if (!connectionless()) challenge_of(*again, tg);
    assert_int_equal(answer(again->send(a)), connectionless() ? kChallenged : KVX_EAUTH);
}

// Out of turn on one connection: a second HELLO after the challenge, or a
// message after a refusal, is refused (or finds the connection closed).
void test_out_of_turn(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    if (connectionless()) return;  // every request is a first message there
    auto c = carrier(tg);
    challenge_of(*c, tg);
    assert_int_equal(answer(c->send(bytes(hs::Hello{tg.meta.instance_id}))), KVX_EAUTH);
    // refused: the target closed the connection, nothing more is answered
    assert_int_equal(answer(c->send(bytes(hs::Hello{tg.meta.instance_id}))), -1);
}

// shm: a writer running as another user is refused as soon as it connects,
// unless the target allows other users (shm.allow_other_users=1). Needs root to become
// another user; the case passes vacuously otherwise (and says so).
int other_user_answer(const Target &tg) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int got = -2;
        if (setgid(65534) == 0 && setuid(65534) == 0) got = answer(carrier(tg)->send(bytes(hs::Hello{tg.meta.instance_id})));
        (void)!write(pipefd[1], &got, sizeof got);
        _exit(0);
    }
    close(pipefd[1]);
    int got = -3;
    assert_int_equal(read(pipefd[0], &got, sizeof got), static_cast<ssize_t>(sizeof got));
    close(pipefd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return got;
}

void test_other_user(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    if (strcmp(g_backend, "shm") != 0) return;
    if (geteuid() != 0) {
        printf("test_other_user: not root, cannot become another user\n");
        skip();
    }
    assert_int_equal(other_user_answer(tg), KVX_EAUTH);
    Target open;
    open.r = region_new(kNB, kBL, 0x5a);
    kvx_options *o = options_for("shm", nullptr);
    CHECK_OK(kvx_options_set(o, "shm.allow_other_users", "1"));
    CHECK_OK(kvx_transport_create(&open.t, open.r.base, kNB, kBL, "{\"model\":\"m\"}", o));
    kvx_options_destroy(o);
    get_meta(open.t, &open.m);
    open.meta = kvx::wire::decode_metadata(open.m.bytes, open.m.len);
    assert_int_equal(other_user_answer(open), kChallenged);
    target_down(open);
}

// After all of it, an honest peer of the same backend connects and writes.
void test_still_serves(void **state) {
    const Target &tg = **reinterpret_cast<Target **>(state);
    region src = region_new(kNB, kBL, 0);
    fill_block(src.base, kBL, 0, 7);
    kvx_transport *t = nullptr;
    kvx_options *o = options_for(g_backend, nullptr);
    CHECK_OK(kvx_transport_create(&t, src.base, kNB, kBL, "{\"model\":\"m\"}", o));
    kvx_options_destroy(o);
    add_peer(t, "target", &tg.m);
    uint64_t id = 0, local = 0, remote = kNB - 1;
    CHECK_OK(kvx_write_blocks(&id, t, "target", &local, &remote, 1));
    size_t failed = 0;
    assert_int_equal(wait_ids(t, "target", &id, 1, 20000, &failed, NULL), 1);
    assert_int_equal(failed, 0);
    assert_true(block_matches(tg.r.base + (kNB - 1) * kBL, kBL, 0, 7));
    memset(tg.r.base + (kNB - 1) * kBL, 0x5a, kBL);  // what target_down checks
    kvx_transport_destroy(t);
    region_free(&src);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc > 1) g_backend = argv[1];
    kvx_options *o = options_for(g_backend, nullptr);
    kvx_transport *probe = nullptr;
    static uint8_t buf[4096];
    const int rc = kvx_transport_create(&probe, buf, 1, sizeof buf, NULL, o);
    kvx_options_destroy(o);
    if (rc == KVX_ENOTSUP) {
        printf("SKIP: backend %s is not usable here: %s\n", g_backend, kvx_last_error_message());
        return 77;
    }
    kvx_transport_destroy(probe);
#define T(f) cmocka_unit_test(f)
    const struct CMUnitTest tests[] = {
        T(test_honest), T(test_other_instance), T(test_garbage), T(test_auth_first), T(test_wrong_secret),
        T(test_fingerprint), T(test_flags), T(test_replay), T(test_out_of_turn), T(test_other_user),
        T(test_still_serves),
    };
    // One target for every case, in this order: the last finds it still
    // serving after all the others, and the group's teardown checks its
    // region once more.
    return cmocka_run_group_tests_name(g_backend, tests, setup, teardown);
}
