#include "backend_api/ops.h"

#include <algorithm>
#include <bit>
#include <new>

namespace kvx {

namespace {

// The freed large run arrays kept for reuse: at most kCacheSlots of them and
// kCacheBytes in all, process-wide. Guarded by a try-lock: a thread that finds it
// taken allocates or frees as if it were empty or full (no waiting, and a
// child forked while another thread held it just never uses it).
class RunCache {
public:
    Run *take(size_t n, uint32_t *cap) {
        if (busy_.test_and_set(std::memory_order_acquire)) return nullptr;
        Run *p = nullptr;
        size_t best = kSlots;
        for (size_t i = 0; i < used_; i++)
            if (slot_[i].cap >= n && (best == kSlots || slot_[i].cap < slot_[best].cap)) best = i;
        if (best != kSlots) {
            p = slot_[best].p;
            *cap = slot_[best].cap;
            bytes_ -= uint64_t{*cap} * sizeof(Run);
            slot_[best] = slot_[--used_];
        }
        busy_.clear(std::memory_order_release);
        return p;
    }
    bool give(Run *p, uint32_t cap) noexcept {
        const uint64_t b = uint64_t{cap} * sizeof(Run);
        if (b > kBytes || busy_.test_and_set(std::memory_order_acquire)) return false;
        const bool kept = used_ < kSlots && bytes_ + b <= kBytes;
        if (kept) {
            slot_[used_++] = Slot{p, cap};
            bytes_ += b;
        }
        busy_.clear(std::memory_order_release);
        return kept;
    }

    size_t bytes() {
        while (busy_.test_and_set(std::memory_order_acquire)) {
        }
        const size_t b = bytes_;
        busy_.clear(std::memory_order_release);
        return b;
    }

private:
    static constexpr size_t kSlots = Runs::kCacheSlots;
    static constexpr uint64_t kBytes = Runs::kCacheBytes;
    struct Slot {
        Run *p;
        uint32_t cap;
    };
    std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
    Slot slot_[kSlots] = {};
    size_t used_ = 0;
    uint64_t bytes_ = 0;
};

RunCache &run_cache() {
    static RunCache *c = new RunCache;  // never destroyed: Runs may be freed after static destructors ran
    return *c;
}

}  // namespace

size_t Runs::cached_bytes() { return run_cache().bytes(); }

// Arrays of kRecycleRuns or more round up to a power of two, so that
// transfers of about the same size reuse each other's.
Run *Runs::acquire(size_t n, uint32_t *cap) {
    if (n < kRecycleRuns) {
        *cap = static_cast<uint32_t>(n);
        return static_cast<Run *>(::operator new(n * sizeof(Run)));
    }
    if (Run *p = run_cache().take(n, cap)) return p;
    const size_t c = std::max(n, std::min<size_t>(std::bit_ceil(n), UINT32_MAX));
    *cap = static_cast<uint32_t>(c);
    return static_cast<Run *>(::operator new(c * sizeof(Run)));
}

void Runs::release(Run *p, uint32_t cap) noexcept {
    if (cap >= kRecycleRuns && run_cache().give(p, cap)) return;
    ::operator delete(p);
}

void Runs::reserve(size_t n) {
    if (n <= 1 || n <= cap_) return;
    uint32_t cap;
    Run *p = acquire(n, &cap);
    std::copy(begin(), end(), p);
    if (cap_) release(heap_, cap_);
    heap_ = p;
    cap_ = cap;
}


std::vector<Part> split_op(Op &&op, uint64_t max_parts, uint64_t min_part, uint64_t block_len) {
    OpRef st = std::move(op.state);
    std::vector<Part> parts;
    const uint64_t nparts = std::min<uint64_t>(std::min<uint64_t>(max_parts, OpState::kMaxParts),
                                               std::max<uint64_t>(1, op.bytes / std::max<uint64_t>(1, min_part)));
    if (nparts <= 1) {
        parts.push_back(Part{st, std::move(op.runs)});
    } else {
        const uint64_t target = (op.bytes / nparts + block_len - 1) / block_len * block_len;
        Part cur{st, {}};
        uint64_t cur_bytes = 0;
        for (Run r : op.runs) {
            while (r.len > 0) {
                uint64_t take = std::min(r.len, target - cur_bytes);
                cur.runs.push_back(Run{r.local_off, r.remote_off, take});
                r.local_off += take;
                r.remote_off += take;
                r.len -= take;
                cur_bytes += take;
                if (cur_bytes == target) {
                    parts.push_back(std::move(cur));
                    cur = Part{st, {}};
                    cur_bytes = 0;
                }
            }
        }
        if (!cur.runs.empty()) parts.push_back(std::move(cur));
    }
    st->parts_left.store(static_cast<uint16_t>(parts.size()));
    return parts;
}

std::vector<Part> split_shares(Op &&op, const std::vector<double> &shares, uint64_t block_len,
                               std::vector<size_t> *which) {
    OpRef st = std::move(op.state);
    const uint64_t blocks = block_len ? op.bytes / block_len : 0;
    double sum = 0;
    for (double w : shares) sum += w;
    std::vector<Part> parts;
    which->clear();
    if (!(sum > 0) || shares.empty()) {
        parts.push_back(Part{st, std::move(op.runs)});
        which->push_back(0);
        st->parts_left.store(1);
        return parts;
    }
    // Blocks per share, by largest remainder, so that they add up exactly.
    std::vector<uint64_t> n(shares.size(), 0);
    uint64_t given = 0;
    std::vector<std::pair<double, size_t>> rest;
    for (size_t i = 0; i < shares.size(); i++) {
        const double exact = static_cast<double>(blocks) * shares[i] / sum;
        n[i] = static_cast<uint64_t>(exact);
        given += n[i];
        rest.emplace_back(exact - static_cast<double>(n[i]), i);
    }
    std::sort(rest.begin(), rest.end(), [](const auto &a, const auto &b) { return a.first > b.first; });
    for (size_t k = 0; given < blocks && k < rest.size(); k++, given++) n[rest[k].second]++;
    if (given < blocks && !n.empty()) n.back() += blocks - given;
    auto runs = op.runs.begin();
    Run cur = runs != op.runs.end() ? *runs : Run{0, 0, 0};
    for (size_t i = 0; i < n.size() && parts.size() < OpState::kMaxParts; i++) {
        uint64_t want = n[i] * block_len;
        if (want == 0) continue;
        Part p{st, {}};
        while (want > 0 && runs != op.runs.end()) {
            const uint64_t take = std::min(want, cur.len);
            p.runs.push_back(Run{cur.local_off, cur.remote_off, take});
            cur.local_off += take;
            cur.remote_off += take;
            cur.len -= take;
            want -= take;
            if (cur.len == 0 && ++runs != op.runs.end()) cur = *runs;
        }
        parts.push_back(std::move(p));
        which->push_back(i);
    }
    // Whatever is left (a partial block, or parts beyond kMaxParts) joins the last part.
    while (runs != op.runs.end() && !parts.empty()) {
        if (cur.len) parts.back().runs.push_back(cur);
        if (++runs != op.runs.end()) cur = *runs;
    }
    if (parts.empty()) {
        parts.push_back(Part{st, std::move(op.runs)});
        which->push_back(0);
    }
    st->parts_left.store(static_cast<uint16_t>(parts.size()));
    return parts;
}

void CompletionBatch::deliver(CompletionSink &sink) {
    for (const auto &[id, status] : out_) sink.complete(id, status);
    out_.clear();
}

}  // namespace kvx
