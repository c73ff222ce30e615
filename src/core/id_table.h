// The transfers in flight, by id: an open-addressing table of OpRefs (8
// bytes a slot, at most half full: 16-32 bytes per transfer, no allocation
// per insert). Ids come from a counter, so id & mask spreads them perfectly;
// Robin Hood linear probing keeps every probe short even so (live ids are
// one long run of occupied slots, which plain linear probing would walk on
// every removal), and removal shifts back (no tombstones).
// Not thread-safe: the transport's lock guards it.
#pragma once

#include <cstdint>
#include <cstddef>
#include <vector>

#include "backend_api/backend.h"

namespace kvx {

class IdTable {
public:
    IdTable() : slots_(kMinSlots) {}
    size_t size() const { return size_; }
    // nullptr when id is not here.
    OpState *find(uint64_t id) const {
        size_t i = at(id);
        return i == npos ? nullptr : slots_[i].get();
    }
    // id (op->id) must not be here yet.
    void insert(OpRef op) {
        if (2 * (size_ + 1) > slots_.size()) rehash(slots_.size() * 2);
        place(std::move(op));
        size_++;
    }
    // Removes id; false when it was not here.
    bool erase(uint64_t id);
    template <class F>
    void for_each(F &&f) const {
        for (const OpRef &s : slots_)
            if (s) f(*s);
    }
    void clear() {
        slots_.assign(kMinSlots, OpRef());
        size_ = 0;
    }

private:
    static constexpr size_t kMinSlots = 1024;
    size_t mask() const { return slots_.size() - 1; }
    static constexpr size_t npos = SIZE_MAX;
    // How far the entry in slot i is from its home slot.
    size_t dist(size_t i) const { return (i - (slots_[i]->id & mask())) & mask(); }
    size_t at(uint64_t id) const;
    void place(OpRef op);
    void rehash(size_t n);

    std::vector<OpRef> slots_;  // a power of two of them
    size_t size_ = 0;
};

}  // namespace kvx
