// What the library tells about itself without a transport, for the bench and
// the bindings: kvx_stats_bucket_lower_ns() is the histogram the core records
// with (every bound is the first latency of its bucket and the one before it
// the last of the previous bucket; widths at most 12.5 %; UINT64_MAX past the
// end), and kvx_backends() is the registry, in its order, and a value the
// backend option accepts.
#include <cstring>
#include <string>

#include "registry/registry.h"
#include "core/telemetry.h"
#include "kvxfer.h"

#include "unit_util.h"

using namespace kvx;

namespace {

void test_bucket_bounds(void **) {
    using H = LatencyHistogram;
    static_assert(H::kBuckets == KVX_STATS_LATENCY_BUCKETS);
    for (size_t i = 0; i < KVX_STATS_LATENCY_BUCKETS; i++) {
        const uint64_t lo = kvx_stats_bucket_lower_ns(i);
        assert_int_equal(lo, H::lower_bound(i));
        assert_int_equal(H::bucket_of(lo), i);
        if (i > 0) assert_int_equal(H::bucket_of(lo - 1), i - 1);
        if (i + 1 == KVX_STATS_LATENCY_BUCKETS) continue;
        const uint64_t hi = kvx_stats_bucket_lower_ns(i + 1);
        assert_true(hi > lo);
        if (i >= 8) assert_true((hi - lo) * 8 <= lo);  // at most 12.5 % wide
    }
    for (uint64_t i = 0; i <= 8; i++) assert_int_equal(kvx_stats_bucket_lower_ns(i), i);
    assert_int_equal(kvx_stats_bucket_lower_ns(17), 18);
    assert_int_equal(kvx_stats_bucket_lower_ns(303), 15ull << 36);  // about 17 minutes
    // the last bucket is open: everything from its bound up lands there
    assert_int_equal(H::bucket_of(UINT64_MAX), KVX_STATS_LATENCY_BUCKETS - 1);
    assert_int_equal(kvx_stats_bucket_lower_ns(KVX_STATS_LATENCY_BUCKETS), UINT64_MAX);
    assert_int_equal(kvx_stats_bucket_lower_ns(SIZE_MAX), UINT64_MAX);
}

void test_backends(void **) {
    const char *list = kvx_backends();
    assert_non_null(list);
    assert_ptr_equal(list, kvx_backends());  // static, built once
    std::string want;
    for (const BackendDesc *b : backend_registry()) {
        if (!want.empty()) want += ',';
        want += b->name;
    }
    assert_string_equal(list, want.c_str());
    assert_non_null(strstr(list, "tcp"));
    assert_null(strchr(list, ' '));
    // the list is a value of the backend option (creation would still want each usable)
    kvx_options *o = nullptr;
    assert_int_equal(kvx_options_create(&o), KVX_OK);
    assert_int_equal(kvx_options_set(o, "backend", list), KVX_OK);
    kvx_options_destroy(o);
}

}  // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_bounds),
        cmocka_unit_test(test_backends),
    };
    return cmocka_run_group_tests_name("library_info", tests, nullptr, nullptr);
}
