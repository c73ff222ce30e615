#include "backend/ops.h"

#include <algorithm>

namespace kvx {

std::vector<Part> split_op(Op &&op, uint64_t max_parts, uint64_t min_part, uint64_t block_len) {
    OpRef st = std::move(op.state);
    std::vector<Part> parts;
    uint64_t nparts = std::min<uint64_t>(max_parts, std::max<uint64_t>(1, op.bytes / std::max<uint64_t>(1, min_part)));
    if (nparts <= 1) {
        parts.push_back(Part{st, std::move(op.runs), op.bytes});
    } else {
        const uint64_t target = (op.bytes / nparts + block_len - 1) / block_len * block_len;
        Part cur{st, {}, 0};
        for (Run r : op.runs) {
            while (r.len > 0) {
                uint64_t take = std::min(r.len, target - cur.bytes);
                cur.runs.push_back(Run{r.local_off, r.remote_off, take});
                r.local_off += take;
                r.remote_off += take;
                r.len -= take;
                cur.bytes += take;
                if (cur.bytes == target) {
                    parts.push_back(std::move(cur));
                    cur = Part{st, {}, 0};
                }
            }
        }
        if (!cur.runs.empty()) parts.push_back(std::move(cur));
    }
    st->parts_left.store(static_cast<uint32_t>(parts.size()));
    return parts;
}

void CompletionBatch::deliver(CompletionSink &sink) {
    for (const auto &[id, status] : out_) sink.complete(id, status);
    out_.clear();
}

}  // namespace kvx
