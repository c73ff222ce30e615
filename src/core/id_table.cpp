#include "core/id_table.h"

#include <utility>

namespace kvx {

// Robin Hood: a probe for id ends at an empty slot or at an entry closer to
// its home than id would be there.
size_t IdTable::at(uint64_t id) const {
    for (size_t i = id & mask(), d = 0;; i = (i + 1) & mask(), d++) {
        if (!slots_[i] || dist(i) < d) return npos;
        if (slots_[i]->id == id) return i;
    }
}

// An entry farther from home takes the slot of one closer to home, which
// then moves on.
void IdTable::place(OpRef op) {
    for (size_t i = op->id & mask(), d = 0;; i = (i + 1) & mask(), d++) {
        if (!slots_[i]) {
            slots_[i] = std::move(op);
            return;
        }
        const size_t dr = dist(i);
        if (dr < d) {
            std::swap(op, slots_[i]);
            d = dr;
        }
    }
}

bool IdTable::erase(uint64_t id) {
    size_t i = at(id);
    if (i == npos) return false;
    // Back-shift the entries after it that are not at home.
    for (size_t j = (i + 1) & mask(); slots_[j] && dist(j) > 0; j = (j + 1) & mask()) {
        slots_[i] = std::move(slots_[j]);
        i = j;
    }
    slots_[i] = OpRef();
    size_--;
    // After a burst drains, give the memory back (never below the minimum).
    if (slots_.size() > kMinSlots && 8 * size_ < slots_.size()) rehash(slots_.size() / 2);
    return true;
}

void IdTable::rehash(size_t n) {
    std::vector<OpRef> old(n);
    old.swap(slots_);
    for (OpRef &s : old)
        if (s) place(std::move(s));
}

}  // namespace kvx
