// tcp backend internals: the listener that lets peers write into our region
// (TcpServer) and the outbound side that writes into a peer's (TcpPeer).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <sys/uio.h>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "util/net.h"

namespace kvx::tcp {

// Accepts connections, authenticates them, then receives frames straight into
// the region on one thread per connection.
class TcpServer {
public:
    explicit TcpServer(const BackendContext &ctx);
    ~TcpServer();
    const std::vector<net::Endpoint> &advertised() const { return advertised_; }
    void shutdown();

private:
    struct Conn {
        net::Fd fd;
        std::thread thread;
        std::atomic<bool> finished{false};
    };
    void accept_loop();
    void serve(Conn *c);
    bool handshake(int fd);
    void reap(bool all);

    BackendContext ctx_;
    net::Fd listen_fd_;
    int wake_[2] = {-1, -1};
    std::vector<net::Endpoint> advertised_;
    std::thread acceptor_;
    std::mutex mu_;
    std::list<std::unique_ptr<Conn>> conns_;
    bool stopping_ = false;
    std::atomic<size_t> handshaking_{0};
};

// A part sent on a stream, waiting for its acknowledgement.
struct Awaiting {
    OpRef op;
    uint64_t seq = 0;
};

class TcpPeer final : public BackendPeer {
public:
    TcpPeer(const BackendContext &ctx, const PeerContext &pc, std::vector<net::Fd> fds);
    ~TcpPeer() override;
    void submit(Op op) override;
    bool drop_if_not_started(uint64_t id) override;
    bool broken() const override { return broken_.load(); }
    void abort(int status) override;
    void shutdown() override;

private:
    struct Stream {
        net::Fd fd;
        std::thread sender, acker;
        std::mutex mu;  // guards awaiting
        std::deque<Awaiting> awaiting;
        std::vector<uint8_t> head;  // frame headers + segment tables of one sendmsg, reused
        std::vector<iovec> iov;     // sender thread only
    };
    void send_loop(Stream *s);
    void ack_loop(Stream *s);
    int send_parts(Stream *s, const std::vector<Part> &parts, const std::vector<uint64_t> &seqs);
    void fail_all(int status);
    bool stop_flag_seen();

    Region region_;
    std::string peer_id_;
    CompletionSink *sink_;
    std::vector<std::unique_ptr<Stream>> streams_;
    std::mutex mu_;  // guards queue_, stop_
    std::condition_variable cv_;
    std::deque<Part> queue_;
    bool stop_ = false;
    std::atomic<bool> broken_{false};
    std::atomic<int> break_status_{0};
    std::atomic<uint64_t> next_seq_{1};
    std::once_flag shutdown_once_;
};

// Opens and authenticates the streams to a peer; throws Error.
std::unique_ptr<BackendPeer> connect_peer(const BackendContext &ctx, const PeerContext &pc);

// The tcp section of the metadata: the endpoints to connect to, in order of preference.
wire::Section encode_section(const std::vector<net::Endpoint> &eps);
// Throws Error(KVX_EBADMETA) naming the defect.
std::vector<net::Endpoint> decode_section(const wire::Section &s);

}  // namespace kvx::tcp
