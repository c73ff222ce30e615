// A transfer's run list (src/backend_api: Runs): inline and heap storage
// keep every run through growth, copies and moves; large arrays freed are
// kept for reuse within the cache's bounds (issue 30 item 7: a submit of
// 65,536 runs no longer faults in a fresh array each call).
#include "backend_api/backend.h"

#include <bit>
#include <vector>

#include "unit_util.h"

using namespace kvx;

namespace {

Runs make(size_t n, uint64_t salt) {
    Runs r;
    r.reserve(n);
    for (size_t i = 0; i < n; i++) r.push_back(Run{i * 3 + salt, i * 5 + salt, i + 1});
    return r;
}

void check(const Runs &r, size_t n, uint64_t salt) {
    assert_int_equal(r.size(), n);
    size_t i = 0;
    for (const Run &x : r) {
        assert_int_equal(x.local_off, i * 3 + salt);
        assert_int_equal(x.remote_off, i * 5 + salt);
        assert_int_equal(x.len, i + 1);
        i++;
    }
    assert_int_equal(i, n);
}

void test_contents(void **) {
    for (size_t n : {0, 1, 2, 5, 4095, 4096, 4097, 70000}) {
        Runs a;  // grown by push_back alone, from inline to heap
        for (size_t i = 0; i < n; i++) a.push_back(Run{i * 3 + 7, i * 5 + 7, i + 1});
        check(a, n, 7);
        Runs b = make(n, 9);
        check(b, n, 9);
        Runs c(b);
        check(c, n, 9);
        Runs d(std::move(c));
        check(d, n, 9);
        assert_int_equal(c.size(), 0);
        a = std::move(d);
        check(a, n, 9);
        a.reserve(n * 2 + 2);  // growth keeps the runs
        check(a, n, 9);
    }
}

// Empties the cache: takes every array it holds and parks it for the life
// of the process (freeing it would refill the cache).
void drain() {
    static std::vector<Runs> parked;
    while (Runs::cached_bytes() > 0) {
        Runs r;
        r.reserve(Runs::kRecycleRuns);  // the smallest array it holds
        parked.push_back(std::move(r));
    }
}

void test_recycled(void **) {
    drain();
    assert_int_equal(Runs::cached_bytes(), 0);
    const size_t n = 65536;
    const Run *first;
    {
        Runs a = make(n, 1);
        first = a.begin();
    }
    // Freed: kept (rounded to a power of two: 65,536 runs exactly).
    assert_int_equal(Runs::cached_bytes(), n * sizeof(Run));
    {
        Runs b = make(n - 100, 2);  // about as many: the same array
        assert_ptr_equal(b.begin(), first);
        assert_int_equal(Runs::cached_bytes(), 0);
        check(b, n - 100, 2);
    }
    assert_int_equal(Runs::cached_bytes(), n * sizeof(Run));
    {
        Runs c = make(n + 1, 3);  // more than it holds: a new array
        assert_ptr_not_equal(c.begin(), first);
        assert_int_equal(Runs::cached_bytes(), n * sizeof(Run));
        check(c, n + 1, 3);
    }
    // c's array (131,072 runs) joined the first one.
    assert_int_equal(Runs::cached_bytes(), (n + 2 * n) * sizeof(Run));
    {
        Runs d = make(100, 4);  // small: never from the cache
        assert_int_equal(Runs::cached_bytes(), 3 * n * sizeof(Run));
    }
    assert_int_equal(Runs::cached_bytes(), 3 * n * sizeof(Run));
    {
        Runs e = make(n, 5);  // the smallest that fits: the first one
        assert_ptr_equal(e.begin(), first);
    }
    drain();
}

void test_bounded(void **) {
    drain();
    // Larger than the cache's bytes: never kept.
    {
        Runs big = make(Runs::kCacheBytes / sizeof(Run) + 1, 0);
    }
    assert_int_equal(Runs::cached_bytes(), 0);
    // More arrays than slots: kCacheSlots kept.
    {
        std::vector<Runs> many;
        for (size_t i = 0; i < Runs::kCacheSlots + 3; i++) many.push_back(make(Runs::kRecycleRuns, i));
    }
    assert_int_equal(Runs::cached_bytes(), Runs::kCacheSlots * Runs::kRecycleRuns * sizeof(Run));
    drain();
    // Arrays that together exceed the bytes: kept up to the bound only.
    const size_t runs = std::bit_ceil(Runs::kCacheBytes / sizeof(Run) / 4);  // rounded up as allocated
    const size_t fit = Runs::kCacheBytes / (runs * sizeof(Run));
    assert_true(fit >= 1 && fit < 5);
    {
        std::vector<Runs> five;
        for (int i = 0; i < 5; i++) five.push_back(make(runs, i));
    }
    assert_int_equal(Runs::cached_bytes(), fit * runs * sizeof(Run));
    drain();
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contents),
        cmocka_unit_test(test_recycled),
        cmocka_unit_test(test_bounded),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
