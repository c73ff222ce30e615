// Unit tests of option validation and parsing (src/core/options).
// Project headers first: cmocka.h defines a fail() macro that would clash
// with kvx::fail() in util/error.h.
#include "core/options.h"
#include "kvxfer.h"
#include "util/error.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "unit_util.h"

using namespace kvx;
using namespace kvx::testing;

namespace {

// ------------------------------------------------------------------ options

void expect_option_rejected(const char *key, const char *value, const char *mention_value) {
    std::string msg;
    int rc = code_of([&] { validate_option(key, value); }, &msg);
    if (rc != KVX_EINVAL) fail_msg("option %s='%s': expected KVX_EINVAL, got %d (%s)", key, value, rc, msg.c_str());
    assert_contains(msg, key);
    if (mention_value) assert_contains(msg, mention_value);
}

void test_options_unknown_key(void **) {
    for (const char *k : {"", "nope", "Backend", "backend ", "tcp", "tcp.", "tcp.listen.x", "verbs.unknown",
                          "connect_timeout", "shm.path"}) {
        std::string msg;
        assert_int_equal(code_of([&] { validate_option(k, "1"); }, &msg), KVX_EINVAL);
        assert_contains(msg, "unknown option");
        assert_contains(msg, (std::string("'") + k + "'").c_str());
    }
}

void test_options_bad_integers(void **) {
    for (const char *key : {"connect_timeout_ms", "transfer_timeout_ms", "tcp.streams", "verbs.port",
                            "verbs.gid_index", "verbs.qps_per_peer"}) {
        expect_option_rejected(key, "", nullptr);
        expect_option_rejected(key, "-1", "'-1'");
        expect_option_rejected(key, "12abc", "'12abc'");
        expect_option_rejected(key, "+5", "'+5'");
        expect_option_rejected(key, " 5", "' 5'");
        expect_option_rejected(key, "5 ", "'5 '");
        expect_option_rejected(key, "0x10", "'0x10'");
        expect_option_rejected(key, "1e3", "'1e3'");
        expect_option_rejected(key, "99999999999999999999", "99999999999999999999");
        expect_option_rejected(key, "18446744073709551616", "18446744073709551616");
        expect_option_rejected(key, "18446744073709551615", "18446744073709551615");
        expect_option_rejected(key, "3600001", "3600001");
    }
    // just outside each range
    expect_option_rejected("connect_timeout_ms", "0", "0");
    expect_option_rejected("transfer_timeout_ms", "0", "0");
    expect_option_rejected("tcp.streams", "0", "0");
    expect_option_rejected("tcp.streams", "17", "17");
    expect_option_rejected("verbs.port", "256", "256");
    expect_option_rejected("verbs.port", "0", "0");
    expect_option_rejected("verbs.gid_index", "65536", "65536");
    expect_option_rejected("verbs.qps_per_peer", "17", "17");
    // string options
    expect_option_rejected("backend", "rdma", "'rdma'");
    expect_option_rejected("backend", "", "''");
    expect_option_rejected("backend", "TCP", "'TCP'");
    std::string longv(1025, 'x');
    for (const char *key : {"tcp.listen", "tcp.advertise", "verbs.device", "verbs.listen"})
        expect_option_rejected(key, longv.c_str(), "1025");
}

void test_options_good_values(void **) {
    struct KV {
        const char *k, *v;
    };
    for (const KV &kv : std::initializer_list<KV>{
             {"backend", "auto"}, {"backend", "tcp"}, {"backend", "verbs"}, {"backend", "shm"},
             {"connect_timeout_ms", "1"}, {"connect_timeout_ms", "3600000"}, {"connect_timeout_ms", "007"},
             {"transfer_timeout_ms", "30000"}, {"tcp.listen", "127.0.0.1:0"}, {"tcp.listen", "[::1]:5000"},
             {"tcp.listen", ""}, {"tcp.advertise", "10.0.0.1:1,10.0.0.2:0"}, {"tcp.streams", "1"},
             {"tcp.streams", "16"}, {"verbs.device", "rxe0"}, {"verbs.port", "1"}, {"verbs.port", "255"},
             {"verbs.gid_index", "0"}, {"verbs.gid_index", "65535"}, {"verbs.qps_per_peer", "16"},
             {"verbs.listen", "0.0.0.0:0"}}) {
        std::string msg;
        int rc = code_of([&] { validate_option(kv.k, kv.v); }, &msg);
        if (rc != kNoError) fail_msg("option %s='%s' refused: %s", kv.k, kv.v, msg.c_str());
    }
    std::string maxv(1024, 'x');
    assert_int_equal(code_of([&] { validate_option("tcp.advertise", maxv); }), kNoError);
}

void test_options_parse_uint(void **) {
    assert_int_equal(parse_uint_option("k", "0", 0, 10), 0);
    assert_int_equal(parse_uint_option("k", "10", 0, 10), 10);
    assert_true(parse_uint_option("k", "18446744073709551615", 0, UINT64_MAX) == UINT64_MAX);
    std::string msg;
    assert_int_equal(code_of([&] { parse_uint_option("k", "18446744073709551616", 0, UINT64_MAX); }, &msg), KVX_EINVAL);
    assert_contains(msg, "option k");
    assert_int_equal(code_of([&] { parse_uint_option("k", "11", 0, 10); }, &msg), KVX_EINVAL);
    assert_contains(msg, "11");
    assert_contains(msg, "0..10");
    assert_int_equal(code_of([&] { parse_uint_option("k", "4", 5, 10); }), KVX_EINVAL);
}

void test_options_from_bag(void **) {
    Options d = Options::from(nullptr);
    assert_string_equal(d.backend.c_str(), "auto");
    assert_int_equal(d.connect_timeout_ms, 5000);
    assert_int_equal(d.transfer_timeout_ms, 30000);
    assert_int_equal(d.tcp_streams, 1);
    assert_string_equal(d.tcp_listen.c_str(), "0.0.0.0:0");

    OptionBag bag;
    bag.kv = {{"backend", "tcp"},       {"connect_timeout_ms", "250"}, {"transfer_timeout_ms", "3600000"},
              {"tcp.listen", "[::]:0"}, {"tcp.advertise", "h:1"},      {"tcp.streams", "4"},
              {"verbs.port", "2"}};
    Options o = Options::from(&bag);
    assert_string_equal(o.backend.c_str(), "tcp");
    assert_int_equal(o.connect_timeout_ms, 250);
    assert_int_equal(o.transfer_timeout_ms, 3600000);
    assert_string_equal(o.tcp_listen.c_str(), "[::]:0");
    assert_string_equal(o.tcp_advertise.c_str(), "h:1");
    assert_int_equal(o.tcp_streams, 4);
    assert_string_equal(o.backend_specific.at("verbs.port").c_str(), "2");

    bag.kv["tcp.streams"] = "99";
    std::string msg;
    assert_int_equal(code_of([&] { Options::from(&bag); }, &msg), KVX_EINVAL);
    assert_contains(msg, "tcp.streams");
    bag.kv.erase("tcp.streams");
    bag.kv["bogus"] = "1";
    assert_int_equal(code_of([&] { Options::from(&bag); }, &msg), KVX_EINVAL);
    assert_contains(msg, "bogus");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_unknown_key),
        cmocka_unit_test(test_options_bad_integers),
        cmocka_unit_test(test_options_good_values),
        cmocka_unit_test(test_options_parse_uint),
        cmocka_unit_test(test_options_from_bag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
