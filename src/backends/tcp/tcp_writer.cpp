// FrameWriter: a batch of parts as frames, written without blocking and
// resumed where the socket stopped taking bytes.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "backends/tcp/tcp.h"

namespace kvx::tcp {

namespace {

constexpr size_t kSendMaxSegs = kFrameMaxSegs - 1;  // + the header iovec <= IOV_MAX
constexpr size_t kSendIovMax = kFrameMaxSegs;       // iovecs per sendmsg (IOV_MAX)
constexpr size_t kSendHeadBytes = 32 << 10;         // frame headers + segment tables per sendmsg

}  // namespace

void FrameWriter::add(Part p, uint64_t seq) {
    if (parts_.empty()) run_ = p.runs.front();  // the core never submits an empty transfer
    parts_.push_back(std::move(p));
    seqs_.push_back(seq);
}

void FrameWriter::clear() {
    parts_.clear();
    seqs_.clear();
    head_.clear();
    iov_.clear();
    pi_ = ri_ = iov_at_ = 0;
}

void FrameWriter::next_part() {
    ri_ = 0;
    if (++pi_ < parts_.size()) run_ = parts_[pi_].runs.front();
}

// Frames the parts from the cursor on, until the header or iovec budget of
// one sendmsg is used up or every part is framed.
void FrameWriter::fill() {
    const uint64_t bl = region_.block_len;
    const uint64_t maxp = std::max<uint64_t>(kFrameMaxPayload / bl * bl, bl);
    head_.clear();
    iov_.clear();
    heads_.clear();
    iov_at_ = 0;
    while (pi_ < parts_.size()) {
        // Open a frame: room for its header, one segment and its iovecs.
        if (head_.size() + kFrameHeaderLen + kSegLen > kSendHeadBytes || iov_.size() + 2 > kSendIovMax) break;
        const Part &p = parts_[pi_];
        const size_t hpos = head_.size();
        heads_.emplace_back(iov_.size(), hpos);
        iov_.push_back(iovec{});
        head_.resize(hpos + kFrameHeaderLen);
        size_t nseg = 0;
        uint64_t total = 0;
        bool last = false;
        for (;;) {
            if (run_.len == 0 && ri_ + 1 >= p.runs.size()) {
                last = true;
                break;
            }
            if (run_.len == 0) {
                run_ = p.runs[++ri_];
                continue;
            }
            if (nseg == kSendMaxSegs || total == maxp || head_.size() + kSegLen > kSendHeadBytes ||
                iov_.size() + 1 > kSendIovMax)
                break;
            const uint64_t take = std::min(run_.len, maxp - total);
            head_.resize(head_.size() + kSegLen);
            encode_segment(Segment{run_.remote_off, take}, head_.data() + head_.size() - kSegLen);
            iov_.push_back(iovec{region_.base + run_.local_off, take});
            nseg++;
            total += take;
            run_.local_off += take;
            run_.remote_off += take;
            run_.len -= take;
        }
        FrameHeader h;
        h.flags = last ? kFlagAck : 0;
        h.seq = seqs_[pi_];
        h.nseg = static_cast<uint32_t>(nseg);
        h.total_len = total;
        encode_frame_header(h, head_.data() + hpos);
        iov_[heads_.back().first].iov_len = kFrameHeaderLen + nseg * kSegLen;
        if (last) next_part();
    }
    // head_ may have moved while it grew: point the header iovecs at it now.
    for (const auto &[i, pos] : heads_) iov_[i].iov_base = head_.data() + pos;
}

int FrameWriter::write(int fd) {
    for (;;) {
        if (iov_at_ == iov_.size()) {
            if (pi_ == parts_.size()) {
                clear();
                return 1;
            }
            fill();
        }
        msghdr mh{};
        mh.msg_iov = iov_.data() + iov_at_;
        mh.msg_iovlen = iov_.size() - iov_at_;
        ssize_t r = ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        }
        iovec *iov = mh.msg_iov;
        size_t left = net::advance_iov(iov, mh.msg_iovlen, static_cast<size_t>(r));
        iov_at_ = static_cast<size_t>(iov - iov_.data());
        if (left > 0) return 0;  // a short write: the socket buffer is full
    }
}

}  // namespace kvx::tcp
