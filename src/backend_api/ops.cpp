#include "backend_api/ops.h"

#include <algorithm>

namespace kvx {

void Runs::reserve(size_t n) {
    if (n <= 1 || n <= cap_) return;
    Run *p = new Run[n];
    std::copy(begin(), end(), p);
    if (cap_) delete[] heap_;
    heap_ = p;
    cap_ = static_cast<uint32_t>(n);
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

void CompletionBatch::deliver(CompletionSink &sink) {
    for (const auto &[id, status] : out_) sink.complete(id, status);
    out_.clear();
}

}  // namespace kvx
