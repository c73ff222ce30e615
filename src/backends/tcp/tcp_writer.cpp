// FrameWriter: a batch of parts as frames, written without blocking and
// resumed where the socket stopped taking bytes.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/tcp/tcp.h"
#include "util/bytes.h"

namespace kvx::tcp {

namespace {

constexpr size_t kSendMaxSegs = kFrameMaxSegs - 1;  // + the header iovec <= IOV_MAX
constexpr size_t kSendIovMax = kFrameMaxSegs;       // iovecs per sendmsg (IOV_MAX)
constexpr size_t kSendHeadBytes = 32 << 10;         // frame headers + segment tables per sendmsg
constexpr size_t kStageBytes = 512 << 10;           // sealed mode: records encrypted per chunk
constexpr size_t kMaxHeadRecord = 4 + kFrameHeaderLen + kFrameMaxSegs * kSegLen + kTagLen;

// Remote ranges that overlap: a sealed payload is decrypted in place after it
// lands, so one frame never writes the same bytes twice.
bool overlaps(const Runs &a, const std::vector<std::pair<uint64_t, uint64_t>> &b) {
    for (const Run &r : a)
        for (const auto &[off, len] : b)
            if (r.remote_off < off + len && off < r.remote_off + r.len) return true;
    return false;
}

}  // namespace

void FrameWriter::add(Part p, uint64_t seq) {
    if (parts_.empty()) run_ = p.runs.front();  // the core never submits an empty transfer
    parts_.push_back(std::move(p));
    seqs_.push_back(seq);
}

void FrameWriter::protect(const std::array<uint8_t, handshake::kKeyLen> &key, AeadImpl impl, bool staged) {
    tx_ = std::make_unique<Aead>(key, true, impl);
    staged_ = staged;
    stage_ = std::make_unique_for_overwrite<uint8_t[]>(kStageBytes + kMaxHeadRecord + kTagLen);
}

void FrameWriter::control(const Control &c) {
    uint8_t frame[kFrameHeaderLen + kControlLen];
    encode_control(c, frame);
    const size_t at = pre_.size();
    if (!tx_) {
        pre_.insert(pre_.end(), frame, frame + sizeof frame);
        return;
    }
    // A head record of its own, with no payload record after it.
    uint8_t aad[5] = {kRecordHead};
    put_le(aad + 1, sizeof frame, 4);
    pre_.resize(at + 4 + sizeof frame + kTagLen);
    memcpy(pre_.data() + at, aad + 1, 4);
    tx_->seal(aad, sizeof aad, frame, sizeof frame, pre_.data() + at + 4);
}

// The control frames first: 1 once they are out, else as write().
int FrameWriter::write_pre(int fd) {
    while (pre_at_ < pre_.size()) {
        ssize_t r = ::send(fd, pre_.data() + pre_at_, pre_.size() - pre_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        }
        pre_at_ += static_cast<size_t>(r);
    }
    pre_.clear();
    pre_at_ = 0;
    return 1;
}

void FrameWriter::clear() {
    pre_.clear();
    pre_at_ = 0;
    stage_len_ = stage_at_ = next_head_ = 0;
    in_payload_ = false;
    parts_.clear();
    seqs_.clear();
    head_.clear();
    iov_.clear();
    heads_.clear();
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
        const Part *p = &parts_[pi_];
        const size_t hpos = head_.size();
        ranges_.clear();
        heads_.emplace_back(iov_.size(), hpos);
        iov_.push_back(iovec{});
        head_.resize(hpos + kFrameHeaderLen);
        size_t nseg = 0;
        uint64_t total = 0;
        bool last = false;
        for (;;) {
            if (run_.len == 0 && ri_ + 1 >= p->runs.size()) {
                if (pi_ + 1 < parts_.size() && merges(parts_[pi_ + 1], nseg, total)) {
                    next_part();
                    p = &parts_[pi_];
                    continue;
                }
                last = true;
                break;
            }
            if (run_.len == 0) {
                run_ = p->runs[++ri_];
                continue;
            }
            if (nseg == kSendMaxSegs || total == maxp || head_.size() + kSegLen > kSendHeadBytes ||
                iov_.size() + 1 > kSendIovMax)
                break;
            const uint64_t take = std::min(run_.len, maxp - total);
            ranges_.emplace_back(run_.remote_off, take);
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

// Consecutive small parts share a frame (and its ack) while the frame stays
// within what the target lands with one readv (kMergeBytes, kMergeSegs) and
// no two of its segments overlap.
bool FrameWriter::merges(const Part &q, size_t nseg, uint64_t total) const {
    const size_t segs = q.runs.size();
    return nseg + segs <= kMergeSegs && total + q.bytes() <= kMergeBytes &&
           head_.size() + segs * kSegLen <= kSendHeadBytes && iov_.size() + segs <= kSendIovMax &&
           !overlaps(q.runs, ranges_);
}

int FrameWriter::write(int fd) {
    if (!pre_.empty())
        if (int rc = write_pre(fd); rc <= 0) return rc;
    if (tx_) return write_sealed(fd);
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

namespace kvx::tcp {

// A frame head as one record: its cleartext length (also authenticated), the
// sealed header and segment table, the tag. Then the payload record opens.
void FrameWriter::seal_head() {
    const iovec &h = iov_[iov_at_];
    uint8_t aad[5] = {kRecordHead};
    put_le(aad + 1, h.iov_len, 4);
    uint8_t *out = stage_.get() + stage_len_;
    memcpy(out, aad + 1, 4);
    tx_->seal(aad, sizeof aad, static_cast<const uint8_t *>(h.iov_base), h.iov_len, out + 4);
    stage_len_ += 4 + h.iov_len + kTagLen;
    iov_at_++;
    next_head_++;
    const uint8_t paad[1] = {kRecordPayload};
    tx_->begin(paad, sizeof paad);
    in_payload_ = true;
    record_bytes_ = 0;
}

// Encrypts the next chunk of records into stage_: false when every frame is out.
bool FrameWriter::seal_more() {
    stage_len_ = stage_at_ = 0;
    while (stage_len_ < kStageBytes) {
        const bool at_head = next_head_ < heads_.size() && heads_[next_head_].first == iov_at_;
        const bool frame_end = at_head || iov_at_ == iov_.size();
        if (in_payload_ && (frame_end || (staged_ && record_bytes_ == kSealedRecordMax))) {
            tx_->finish_seal(stage_.get() + stage_len_);
            stage_len_ += kTagLen;
            in_payload_ = false;
            if (!frame_end) {  // staged: the frame's payload goes on in a new record
                const uint8_t paad[1] = {kRecordPayload};
                tx_->begin(paad, sizeof paad);
                in_payload_ = true;
                record_bytes_ = 0;
            }
        } else if (at_head) {
            seal_head();
        } else if (iov_at_ < iov_.size()) {
            iovec &v = iov_[iov_at_];
            size_t take = std::min(v.iov_len, kStageBytes - stage_len_);
            if (staged_) take = std::min(take, kSealedRecordMax - record_bytes_);
            tx_->update(static_cast<const uint8_t *>(v.iov_base), stage_.get() + stage_len_, take);
            stage_len_ += take;
            record_bytes_ += take;
            v.iov_base = static_cast<uint8_t *>(v.iov_base) + take;
            if ((v.iov_len -= take) == 0) iov_at_++;
        } else if (pi_ < parts_.size()) {
            fill();
            next_head_ = 0;
        } else {
            break;
        }
    }
    return stage_len_ > 0;
}

int FrameWriter::write_sealed(int fd) {
    for (;;) {
        if (stage_at_ == stage_len_ && !seal_more()) {
            clear();
            return 1;
        }
        ssize_t r = ::send(fd, stage_.get() + stage_at_, stage_len_ - stage_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        }
        stage_at_ += static_cast<size_t>(r);
        if (stage_at_ < stage_len_) return 0;  // a short write: the socket buffer is full
    }
}

}  // namespace kvx::tcp
