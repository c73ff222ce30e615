// Unit tests of option validation and parsing (src/util/options, src/core/options).
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

// The verbs.* keys exist in builds with the verbs backend (KVX_VERBS=ON);
// a build without it refuses them as unknown (test_options_backend_keys).
#ifdef KVX_TEST_HAVE_VERBS
constexpr bool kHaveVerbs = true;
#else
constexpr bool kHaveVerbs = false;
#endif
bool absent(const char *key) { return !kHaveVerbs && strncmp(key, "verbs.", 6) == 0; }

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
        if (absent(key)) continue;
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
    if (kHaveVerbs) {
        expect_option_rejected("verbs.port", "256", "256");
        expect_option_rejected("verbs.port", "0", "0");
        expect_option_rejected("verbs.gid_index", "65536", "65536");
        expect_option_rejected("verbs.qps_per_peer", "17", "17");
        expect_option_rejected("verbs.post_batch_bytes", "1073741825", "1073741825");
        expect_option_rejected("verbs.post_batch_bytes", "-1", "'-1'");
        expect_option_rejected("verbs.post_batch_bytes", "1M", "'1M'");
    }
    // string options
    expect_option_rejected("backend", "rdma", "'rdma'");
    expect_option_rejected("backend", "", "''");
    expect_option_rejected("backend", "TCP", "'TCP'");
    std::string longv(1025, 'x');
    for (const char *key : {"tcp.listen", "tcp.advertise", "verbs.device", "verbs.listen"})
        if (!absent(key)) expect_option_rejected(key, longv.c_str(), "1025");
}

void test_options_good_values(void **) {
    struct KV {
        const char *k, *v;
    };
    for (const KV &kv : std::initializer_list<KV>{
             {"backend", "auto"}, {"backend", "tcp"}, {"backend", "verbs"}, {"backend", "shm"},
             {"connect_timeout_ms", "1"}, {"connect_timeout_ms", "3600000"}, {"connect_timeout_ms", "007"},
             {"transfer_timeout_ms", "30000"}, {"tcp.listen", "127.0.0.1:0"}, {"tcp.listen", "[::1]:5000"},
             {"tcp.listen", ":0"}, {"tcp.advertise", "10.0.0.1:1,10.0.0.2:0"}, {"tcp.streams", "1"},
             {"tcp.streams", "16"}, {"verbs.device", "rxe0"}, {"verbs.port", "1"}, {"verbs.port", "255"},
             {"verbs.gid_index", "0"}, {"verbs.gid_index", "65535"}, {"verbs.qps_per_peer", "16"},
             {"verbs.post_batch_bytes", "0"}, {"verbs.post_batch_bytes", "1073741824"},
             {"verbs.listen", "0.0.0.0:0"}}) {
        if (absent(kv.k)) continue;
        std::string msg;
        int rc = code_of([&] { validate_option(kv.k, kv.v); }, &msg);
        if (rc != kNoError) fail_msg("option %s='%s' refused: %s", kv.k, kv.v, msg.c_str());
    }
    std::string maxv(1024 - 2, 'x');
    maxv += ":1";
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
    Options d(nullptr, all_option_tables());
    CoreOptions c = CoreOptions::from(d);
    assert_string_equal(c.backend.c_str(), "auto");
    assert_int_equal(c.connect_timeout_ms, 5000);
    assert_int_equal(c.transfer_timeout_ms, 30000);
    assert_int_equal(d.uint("tcp.streams"), 1);
    assert_string_equal(d.str("tcp.listen").c_str(), "0.0.0.0:0");
    if (kHaveVerbs) assert_false(d.is_set("verbs.port"));

    OptionBag bag;
    bag.kv = {{"backend", "tcp"},       {"connect_timeout_ms", "250"}, {"transfer_timeout_ms", "3600000"},
              {"tcp.listen", "[::]:0"}, {"tcp.advertise", "h:1"},      {"tcp.streams", "4"}};
    if (kHaveVerbs) bag.kv.emplace("verbs.port", "2");
    Options o(&bag, all_option_tables());
    c = CoreOptions::from(o);
    assert_string_equal(c.backend.c_str(), "tcp");
    assert_int_equal(c.connect_timeout_ms, 250);
    assert_int_equal(c.transfer_timeout_ms, 3600000);
    assert_string_equal(o.str("tcp.listen").c_str(), "[::]:0");
    assert_string_equal(o.str("tcp.advertise").c_str(), "h:1");
    assert_int_equal(o.uint("tcp.streams"), 4);
    if (kHaveVerbs) assert_true(o.is_set("verbs.port"));

    std::string msg;
    assert_int_equal(code_of([&] { o.uint("no.such.key"); }, &msg), KVX_EINTERNAL);
    assert_contains(msg, "no.such.key");
}

// Every key of every table is documented where users look: kvx_options_set(3),
// whose list is generated from the tables (the ctest option_docs proves the
// committed copy current); each doc is one paragraph of real text.
void test_options_documented(void **) {
    std::string man;
    if (FILE *f = fopen(KVX_SOURCE_DIR "/docs/man/kvx_options_set.3", "r")) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) man.append(buf, n);
        fclose(f);
    }
    assert_true(man.size() > 0);
    for (OptionTable t : all_option_tables())
        for (const OptionSpec &s : t) {
            assert_contains(man, (std::string(".B ") + s.key + "\n").c_str());
            if (s.type == OptType::uint) {
                std::string range = std::to_string(s.lo) + ".." + std::to_string(s.hi);
                assert_contains(man, range.c_str());
            }
            assert_true(strlen(s.doc) > 10);
            assert_null(strchr(s.doc, '\n'));
        }
}

// The KEY=VALUE list syntax: whitespace separates, the first '=' splits,
// a value may be empty and hold '=' and commas.
void test_options_split_list(void **) {
    using Pairs = std::vector<std::pair<std::string, std::string>>;
    assert_true(split_option_list("").empty());
    assert_true(split_option_list(" \t\n ").empty());
    assert_true((split_option_list("a=1") == Pairs{{"a", "1"}}));
    assert_true((split_option_list("  backend=shm,tcp\ttcp.advertise=h:1,h:2\n x= y=a=b ") ==
                 Pairs{{"backend", "shm,tcp"}, {"tcp.advertise", "h:1,h:2"}, {"x", ""}, {"y", "a=b"}}));
    for (const char *bad : {"a", "a=1 b", "=1", "a=1 =2", "a=1 , b=2"}) {
        std::string msg;
        assert_int_equal(code_of([&] { split_option_list(bad); }, &msg), KVX_EINVAL);
        assert_contains(msg, "is not KEY=VALUE");
    }
    std::string msg;
    code_of([&] { split_option_list("a=1 oops c=3"); }, &msg);
    assert_contains(msg, "'oops'");
}

// Syntax is checked at set, not first at transport creation.
void test_options_hostport_syntax(void **) {
    for (const char *v : {"garbage", "1.2.3.4", "1.2.3.4:", "1.2.3.4:70000", "[::1", "[::1]5", "a b:1"})
        expect_option_rejected("tcp.listen", v, v);
    for (const char *v : {"garbage", "h:1,", ",h:1", ":1", "h:1,x"}) expect_option_rejected("tcp.advertise", v, nullptr);
    if (kHaveVerbs) expect_option_rejected("verbs.listen", "nope", "nope");
}

// A backend's keys are known exactly when it is built in; backend names are
// known either way (creation then says KVX_ENOTSUP).
void test_options_backend_keys(void **) {
    std::string msg;
    int rc = code_of([&] { validate_option("verbs.port", "1"); }, &msg);
    if (kHaveVerbs) {
        assert_int_equal(rc, kNoError);
    } else {
        assert_int_equal(rc, KVX_EINVAL);
        assert_contains(msg, "unknown option 'verbs.port'");
    }
    assert_int_equal(code_of([&] { validate_option("backend", "verbs"); }), kNoError);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_unknown_key),
        cmocka_unit_test(test_options_bad_integers),
        cmocka_unit_test(test_options_good_values),
        cmocka_unit_test(test_options_parse_uint),
        cmocka_unit_test(test_options_from_bag),
        cmocka_unit_test(test_options_documented),
        cmocka_unit_test(test_options_split_list),
        cmocka_unit_test(test_options_hostport_syntax),
        cmocka_unit_test(test_options_backend_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
