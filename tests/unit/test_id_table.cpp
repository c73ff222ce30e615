// The core's table of transfers in flight (src/core/id_table): against a
// std::map reference under random inserts and erases (ids from a counter,
// erased in random order, with long-lived stragglers, through growth and
// shrinking); find of absent ids; every slot's count of references right
// (an OpRef dropped by the table frees its state once nobody else holds it).
#include "core/id_table.h"

#include <map>
#include <random>
#include <vector>

#include "unit_util.h"

using namespace kvx;

namespace {

void check_same(const IdTable &t, const std::map<uint64_t, OpRef> &ref, uint64_t next_id) {
    assert_int_equal(t.size(), ref.size());
    for (const auto &[id, op] : ref) assert_ptr_equal(t.find(id), op.get());
    size_t seen = 0;
    t.for_each([&](const OpState &s) {
        assert_true(ref.count(s.id) == 1);
        seen++;
    });
    assert_int_equal(seen, ref.size());
    assert_null(t.find(0));
    assert_null(t.find(next_id));
    assert_null(t.find(next_id + 12345));
}

void test_random_against_reference(void **) {
    std::mt19937_64 rng(42);
    IdTable t;
    std::map<uint64_t, OpRef> ref;
    uint64_t next = 1;
    for (int round = 0; round < 40; round++) {
        // a burst in (up to 50k), then most of it out in random order
        const size_t in = rng() % 50000;
        for (size_t k = 0; k < in; k++) {
            OpRef op = OpRef::make();
            op->id = next++;
            ref.emplace(op->id, op);
            t.insert(op);
        }
        std::vector<uint64_t> ids;
        for (const auto &[id, op] : ref) ids.push_back(id);
        std::shuffle(ids.begin(), ids.end(), rng);
        const size_t out = ids.size() - ids.size() / 10;  // a tenth stays: stragglers
        for (size_t k = 0; k < out; k++) {
            assert_true(t.erase(ids[k]));
            assert_false(t.erase(ids[k]));
            ref.erase(ids[k]);
        }
        check_same(t, ref, next);
    }
    for (const auto &[id, op] : ref) assert_true(t.erase(id));
    ref.clear();
    check_same(t, ref, next);
}

void test_references(void **) {
    IdTable t;
    OpRef a = OpRef::make();
    a->id = 7;
    t.insert(a);
    assert_int_equal(a->refs.load(), 2);
    OpState *raw = a.get();
    assert_true(t.erase(7));
    assert_int_equal(raw->refs.load(), 1);  // ours only
    t.insert(a);
    t.clear();
    assert_int_equal(a->refs.load(), 1);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_references),
    };
    return cmocka_run_group_tests_name("id_table", tests, nullptr, nullptr);
}
