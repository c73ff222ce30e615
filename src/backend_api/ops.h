// Data-path bookkeeping every backend shares: a transfer split into parts
// (one per stream or queue pair), exactly-once completion of the transfer
// from its parts, and the batch in which completions leave a backend's locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend_api/backend.h"

namespace kvx {

// The share of a transfer one stream or queue pair carries.
struct Part {
    OpRef op;
    Runs runs;
    uint64_t bytes() const {
        uint64_t n = 0;
        for (const Run &r : runs) n += r.len;
        return n;
    }
};

// Splits op into at most max_parts parts of whole blocks and about the same
// bytes, so that no part is below min_part bytes (one part when op is small).
std::vector<Part> split_op(Op &&op, uint64_t max_parts, uint64_t min_part, uint64_t block_len);
// Splits op into parts of about shares[i] / sum(shares) of its bytes each,
// in whole blocks (the last takes the rest); a share that rounds to no block
// gets no part. *which[k] is the share index of part k.
std::vector<Part> split_shares(Op &&op, const std::vector<double> &shares, uint64_t block_len,
                               std::vector<size_t> *which);

// Completions collected under a backend's lock and delivered after it is
// released (the sink must never be called with a backend lock held).
class CompletionBatch {
public:
    // A part ended: records the transfer if it is to be reported now.
    void part_done(OpState &op, int status) {
        if (op.finish_part(status)) out_.emplace_back(op.id, status);
    }
    // Fails the transfer at once (a broken link: all its parts are lost).
    void fail(OpState &op, int status) {
        if (op.report()) out_.emplace_back(op.id, status);
    }
    // Reports an id the backend never tracked (e.g. refused at submit).
    void add(uint64_t id, int status) { out_.emplace_back(id, status); }
    bool empty() const { return out_.empty(); }
    size_t size() const { return out_.size(); }
    void deliver(CompletionSink &sink);

private:
    std::vector<std::pair<uint64_t, int>> out_;
};

}  // namespace kvx
