// The handshake engine: the one initiator and the one responder state
// machine that every backend drives (docs/wire-format.md, "Handshake").
// Neither does I/O. A backend hands in the bytes its carrier received and
// sends the bytes the engine returns: tcp over its stream, shm over a
// SOCK_SEQPACKET socket, verbs in rdma_cm private data (where each message
// rides a connect request of its own, so the responder keeps no state per
// HELLO). What a backend adds is only its DataPathOptions: the AUTH flags it
// defines and how to name them.
//
// Every responder refuses the same way: whatever does not authenticate gets
// a REFUSE with its code (KVX_ECONNREFUSED for another transport, KVX_EAUTH,
// KVX_EVERSION, KVX_ENOTSUP, KVX_EFINGERPRINT), and the backend closes or
// rejects. Refusals are logged at most once a second per responder, with
// their count and the latest reason: a flood never floods the log.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "handshake/handshake.h"

namespace kvx::handshake {

// True when p holds a kvxfer handshake message (verbs tells a REJECT of its
// peer from one of the remote CM, which pads private data with zeros).
bool is_message(const void *p, size_t n);

// What one received message leads to; reply is always a message to send.
struct Step {
    enum class Outcome {
        challenged,  // reply is a CHALLENGE: the initiator answers with AUTH
        accepted,    // reply is the ACCEPT: the connection is authenticated
        refused,     // reply is a REFUSE{status}: close (or reject) after sending it
    };
    Outcome outcome = Outcome::refused;
    int status = 0;  // refused: the code sent
    Bytes reply{};
    size_t reply_len = 0;
    // accepted: what derive_keys() takes
    Challenge challenge;
    Auth auth;
    Accept accept;
};

// The target side, one per backend instance. Thread-safe (one lock; a
// handshake step is a few microseconds of HMAC).
class Responder {
public:
    // challenge_ttl: how long a challenge of a connectionless carrier stays
    // answerable (from ttl to 2 * ttl); max_used: AUTHs per ttl it accepts.
    // Throws Error(KVX_EINTERNAL) when OpenSSL fails.
    Responder(const Identity &me, const DataPathOptions &opts, const char *backend,
              std::chrono::milliseconds challenge_ttl = std::chrono::seconds(5), size_t max_used = 4096);

    // One handshake on a carrier that keeps a connection (tcp, shm): HELLO
    // first, then AUTH answering the challenge issued on this connection.
    struct Session {
        enum class State { hello, auth, over } state = State::hello;
        Challenge issued;
    };
    // The next message of the session's initiator (n bytes as received; a
    // header that does not decode is refused too). from: the source, for the log.
    Step on_message(Session &s, const void *p, size_t n, const char *from);

    // One connect request of a connectionless carrier (verbs): a HELLO gets
    // a challenge; an AUTH is checked against the challenge it names, which
    // must be live and unused: an expired, used or unknown one gets a fresh
    // challenge (so an honest initiator retries), never an ACCEPT.
    Step on_request(const void *p, size_t n, const char *from);

    // A backend's own refusal of a connection (shm: a writer of another
    // user), refused and logged like the engine's own. status: one of the
    // codes a REFUSE may carry; throws Error(KVX_EINTERNAL) for another.
    Step decline(int status, const std::string &why, const char *from);

    // The data path keys of an accepted step.
    Keys keys(const Step &accepted) const;
    const Identity &identity() const { return me_; }

private:
    Step challenge(Challenge c);
    Step accept(const Challenge &c, const Auth &a, const char *from);
    Step refuse(int status, const std::string &why, const char *from);
    Step on_auth(const Challenge &issued, const Message &m, const char *from);

    const Identity me_;
    const DataPathOptions opts_;
    const std::string backend_;
    std::mutex mu_;
    ChallengeCookies challenges_;  // the one source of challenge ids, connections' too
    uint64_t refused_ = 0;         // since the last log line
    std::chrono::steady_clock::time_point next_log_{};
};

// The initiator side of one connection attempt, to the target a metadata
// describes. Not thread-safe (one per attempt).
class Initiator {
public:
    // rechallenge: the carrier is connectionless (verbs), so the target may
    // answer AUTH with a fresh challenge (the first expired or was used).
    // target is kept by reference: it must outlive the Initiator.
    Initiator(const wire::AgentMetadata &target, const Fingerprint &ours, const DataPathOptions &opts,
              std::string where, bool rechallenge = false);
    Initiator(wire::AgentMetadata &&, const Fingerprint &, const DataPathOptions &, std::string, bool = false) = delete;

    // The HELLO to send first.
    size_t hello(uint8_t *out) const;
    // The target's answer to what was sent last. Returns false and fills out
    // with the AUTH to send (*out_len bytes) for a challenge; true for an
    // ACCEPT that proves the target holds the secret. Throws the refusal's
    // code (KVX_ECONNREFUSED: no such transport listens there), or
    // Error(KVX_EAUTH)/(KVX_EVERSION) for anything else, naming where.
    bool on_answer(const void *p, size_t n, uint8_t *out, size_t *out_len);
    // The AUTH for the current challenge again (a carrier retrying it as it was).
    size_t auth(uint8_t *out) const;
    // After on_answer() returned true: the data path keys.
    Keys keys() const;
    const std::string &where() const { return where_; }
    // A challenge came back to HELLO (a refusal after this answers AUTH).
    bool challenged() const { return state_ != State::hello; }

private:
    const wire::AgentMetadata &target_;
    Fingerprint ours_;
    DataPathOptions opts_;
    std::string where_;
    bool rechallenge_;
    enum class State { hello, auth, accepted } state_ = State::hello;
    Challenge challenge_;
    Auth auth_;
    Accept accept_;
};

// A carrier that delivers whole messages in order (a stream or a seqpacket
// socket) and blocks until its own deadline.
class Carrier {
public:
    virtual int send(const uint8_t *p, size_t n) = 0;  // 0 or a -errno
    // One whole message into buf: 0 and *n, or a -errno.
    virtual int receive(Bytes &buf, size_t *n) = 0;

protected:
    ~Carrier() = default;
};

// Runs in over c: 0 once the target accepted, a carrier's -errno, or throws
// like Initiator::on_answer().
int initiate(Initiator &in, Carrier &c);

}  // namespace kvx::handshake
