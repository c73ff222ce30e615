/*
 * Unit tests of kvx_config_fingerprint(): the config fingerprint must equal
 * vLLM's Python
 *     sha256(json.dumps(json.loads(text), sort_keys=True,
 *                       separators=(",", ":")).encode()).hexdigest()[:16]
 * ("" for null / {}). Every expected value below was produced by CPython 3.11
 * running exactly that expression on the same text. The broad randomized
 * comparison is tests/fingerprint/check_corpus.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvxfer.h"

#define FP_BUF (KVX_FINGERPRINT_LEN + 1)

struct fp_case {
    const char *json;
    const char *expect; /* Python's hexdigest()[:16] */
};

/* The comment above each case is Python's canonical text. */
static const struct fp_case cases[] = {
    /* {"a":1} */
    {"{\"a\":1}", "015abd7f5cc57a2d"},
    /* {"a":2,"b":1} */
    {"{\"b\":1,\"a\":2}", "d3626ac30a87e6f7"},
    /* {"a":2,"b":1} */
    {"{\"a\":2,\"b\":1}", "d3626ac30a87e6f7"},
    /* {"a":2,"b":1} */
    {" {\t\"b\" : 1 ,\n \"a\" : 2 }\r\n", "d3626ac30a87e6f7"},
    /* {"block_size":16,"dtype":"bfloat16","model":"meta-llama/Llama-3.1-8B","tensor_parallel_... */
    {"{\"model\":\"meta-llama/Llama-3.1-8B\",\"dtype\":\"bfloat16\",\"tensor_parallel_size\":2,\"block_size\":16}", "86862ec53c9fa5b8"},
    /* {"a":[],"z":{"x":false,"y":[1,{"a":true,"b":null}]}} */
    {"{\"z\":{\"y\":[1,{\"b\":null,\"a\":true}],\"x\":false},\"a\":[]}", "03a0822448fd1cf4"},
    /* {"e":{},"l":[],"n":[[[]],[{}]]} */
    {"{\"e\":{},\"l\":[],\"n\":[[[]],[{}]]}", "b0c747471c0ea16c"},
    /* {"a":2} */
    {"{\"a\":1,\"a\":2}", "7e8059f495589fcd"},
    /* {"a":"last","b":0} */
    {"{\"a\":{\"deep\":1},\"b\":0,\"a\":\"last\"}", "7db9b2a0075b30da"},
    /* {"a":2} */
    {"{\"a\":1,\"\\u0061\":2}", "7e8059f495589fcd"},
    /* {"s":"caf\u00e9"} */
    {"{\"s\":\"caf\\u00e9\"}", "339df16d5c73b968"},
    /* {"s":"caf\u00e9"} */
    {"{\"s\":\"caf\303\251\"}", "339df16d5c73b968"},
    /* {"s":"\ud83d\ude00"} */
    {"{\"s\":\"\\ud83d\\ude00\"}", "11d71e3fb7ffcf52"},
    /* {"s":"\ud83d\ude00"} */
    {"{\"s\":\"\360\237\230\200\"}", "11d71e3fb7ffcf52"},
    /* {"s":"\u4e2d\u6587 \u4e2d\u6587"} */
    {"{\"s\":\"\\u4e2d\\u6587 \344\270\255\346\226\207\"}", "50cec7b6796a43f7"},
    /* {"s":"\"\\/\b\f\n\r\t"} */
    {"{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}", "5f0ed3aa99584ece"},
    /* {"s":"\u0000\u0001\u001f\u007f\u0080\u009f\u00ff"} */
    {"{\"s\":\"\\u0000\\u0001\\u001f\\u007f\\u0080\\u009f\\u00ff\"}", "ee85e825e21f178e"},
    /* {"s":"\u2028\u2029\ufeff\uffff"} */
    {"{\"s\":\"\\u2028\\u2029\\ufeff\\uffff\"}", "a52e7d2538d458e3"},
    /* {"\ue000":3,"\uffff":1,"\ud800\udc00":2} */
    {"{\"\\uffff\":1,\"\\ud800\\udc00\":2,\"\\ue000\":3}", "d08d88a6c57f6be2"},
    /* {"":0,"A":2,"_":3,"a":1} */
    {"{\"\":0,\"a\":1,\"A\":2,\"_\":3}", "591016eae3d22f89"},
    /* {"i":[0,0,1,-1,9223372036854775807,9223372036854775808,-9223372036854775808,-9223372036... */
    {"{\"i\":[0,-0,1,-1,9223372036854775807,9223372036854775808,-9223372036854775808,-9223372036854775809,18446744073709551615,18446744073709551616]}", "744b5adb5642bde7"},
    /* {"big":123456789012345678901234567890123456789012345678901234567890} */
    {"{\"big\":123456789012345678901234567890123456789012345678901234567890}", "bb7b93935ab382b7"},
    /* {"big":-98765432109876543210987654321098765432109876543210} */
    {"{\"big\":-98765432109876543210987654321098765432109876543210}", "1408875236c9d30c"},
    /* {"f":0.1} */
    {"{\"f\":0.1}", "59e0492137bd5891"},
    /* {"f":1e+16} */
    {"{\"f\":1e16}", "cc7920f9ef023e5d"},
    /* {"f":1e-05} */
    {"{\"f\":1e-5}", "3e65591fab34fcc6"},
    /* {"f":-0.0} */
    {"{\"f\":-0.0}", "cbe63677919c1944"},
    /* {"f":1.0} */
    {"{\"f\":1.0}", "3fd3fc1b51eda523"},
    /* {"f":Infinity} */
    {"{\"f\":1e400}", "788d869ed91e93d2"},
    /* {"f":-Infinity} */
    {"{\"f\":-1e400}", "9c9f4b28d6c8e935"},
    /* {"f":0.0} */
    {"{\"f\":1e-400}", "2ab5840d7fa130d1"},
    /* {"f":-0.0} */
    {"{\"f\":-1e-400}", "cbe63677919c1944"},
    /* {"f":100000.0} */
    {"{\"f\":1E5}", "c5861adc3e198b5e"},
    /* {"f":0.0001} */
    {"{\"f\":0.0001}", "b85597701e8d9e72"},
    /* {"f":1000000000000000.0} */
    {"{\"f\":1e15}", "ee5e73b497950369"},
    /* {"f":5e-324} */
    {"{\"f\":5e-324}", "d915e9f2306d1791"},
    /* {"f":1.5e+300} */
    {"{\"f\":1.5e300}", "7ca2d3dfa99b606d"},
    /* {"f":1e+22} */
    {"{\"f\":1e22}", "4aac839cf9d6865a"},
    /* {"f":1e+23} */
    {"{\"f\":1e23}", "e7feeabe52ee8592"},
    /* {"f":0.30000000000000004} */
    {"{\"f\":0.30000000000000004}", "8660d965eaa7d869"},
    /* {"f":1.2345678901234568e+17} */
    {"{\"f\":123456789012345678.0}", "0d491a89885f0ea9"},
    /* {"f":1.7976931348623157e+308} */
    {"{\"f\":1.7976931348623157e308}", "b0207bbe8a3de638"},
    /* {"f":5e-324} */
    {"{\"f\":2.5e-324}", "d915e9f2306d1791"},
    /* {"f":100} */
    {"{\"f\":100}", "8655a949d1bd33af"},
    /* {"f":100.0} */
    {"{\"f\":100.0}", "900d90f9132be757"},
    /* {"f":100.0} */
    {"{\"f\":1e2}", "900d90f9132be757"},
    /* {"b":[true,false,null]} */
    {"{\"b\":[true,false,null]}", "e56819f5beafdd19"},
};

/* Texts Python cannot load, plus the ones kvxfer documents as rejected
 * (non-object top level, NaN/Infinity, lone surrogates, BOM). */
static const char *const invalid[] = {
    "",
    "   ",
    "{",
    "}",
    "nul",
    "[]",
    "[1,2]",
    "\"str\"",
    "0",
    "1.5",
    "true",
    "false",
    "12345678901234567890123",
    "NaN",
    "{\"a\":NaN}",
    "{\"a\":Infinity}",
    "{\"a\":-Infinity}",
    "{\"a\":[1,-Infinity]}",
    "{\"a\":\"\\ud800\"}",
    "{\"a\":\"\\udc00\"}",
    "{\"a\":\"\\ud800x\"}",
    "{\"a\":\"\\udc00\\ud800\"}",
    "{\"\\ud800\":1}",
    "{\"a\":\"\\ud800\",\"a\":1}", /* Python hashes {"a":1}; rejected, documented */
    "{\"a\":\"\377\"}",             /* invalid UTF-8 */
    "{\"a\":\"\355\240\200\"}",     /* UTF-8 encoded surrogate */
    "{\"a\":\"\300\257\"}",         /* overlong */
    "{\"a\":\"\303\"}",             /* truncated sequence */
    "\357\273\277{\"a\":1}",        /* UTF-8 BOM: Python rejects str with BOM */
    "{\"a\":\"x\001y\"}",           /* raw control character */
    "{\"a\":\"x\ty\"}",
    "{\"a\":1} x",
    "{}{}",
    "{\"a\":1,}",
    "{,}",
    "{\"a\"}",
    "{\"a\":}",
    "{'a':1}",
    "{a:1}",
    "{\"a\":True}",
    "{\"a\":01}",
    "{\"a\":-01}",
    "{\"a\":1.}",
    "{\"a\":.5}",
    "{\"a\":+1}",
    "{\"a\":1e}",
    "{\"a\":1e+}",
    "{\"a\":-}",
    "{\"a\":0x10}",
    "{\"a\":1 2}",
    "{\"a\":1-2}",
    "{\"a\":[1-2]}",
    "{\"a\":\"\\x41\"}",
    "{\"a\":\"\\u12\"}",
    "// c\n{\"a\":1}",
    "{\"a\":1}/* c */",
};

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    return p;
}

static void expect_fp(const char *json, const char *expect) {
    char out[FP_BUF];
    memset(out, 'X', sizeof out);
    int rc = kvx_config_fingerprint(out, json);
    if (rc != 0) print_error("input: %s\nerror %d: %s\n", json ? json : "(NULL)", rc,
                             kvx_last_error_message());
    assert_int_equal(rc, 0);
    if (strcmp(out, expect) != 0) print_error("input: %s\n", json ? json : "(NULL)");
    assert_string_equal(out, expect);
}

/* Fails with KVX_ECONFIG, a message, and out untouched. */
static void expect_econfig(const char *json, const char *msg_part) {
    char out[FP_BUF];
    memset(out, 'X', sizeof out);
    int rc = kvx_config_fingerprint(out, json);
    if (rc != KVX_ECONFIG) print_error("input: %.200s\ngot %d, out '%.17s'\n", json, rc, out);
    assert_int_equal(rc, KVX_ECONFIG);
    const char *msg = kvx_last_error_message();
    assert_non_null(msg);
    if (msg == NULL) return; /* not reached; keeps -Wformat-overflow quiet */
    assert_true(strlen(msg) > 0);
    if (msg_part && !strstr(msg, msg_part)) print_error("message '%s' lacks '%s'\n", msg, msg_part);
    if (msg_part) assert_non_null(strstr(msg, msg_part));
    for (size_t i = 0; i < sizeof out; ++i) assert_int_equal(out[i], 'X');
}

static void test_python_values(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) expect_fp(cases[i].json, cases[i].expect);
}

static void test_empty_configs(void **state) {
    (void)state;
    expect_fp(NULL, "");
    expect_fp("null", "");
    expect_fp(" \t\r\n null \n", "");
    expect_fp("{}", "");
    expect_fp(" {\n} ", "");
}

static void test_invalid(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; ++i) expect_econfig(invalid[i], NULL);
}

static void test_messages(void **state) {
    (void)state;
    expect_econfig("[1]", "object");
    expect_econfig("{\"a\":tru}", "line 1");
    expect_econfig("{\"a\":NaN}", "column");
}

static void test_null_out(void **state) {
    (void)state;
    assert_int_equal(kvx_config_fingerprint(NULL, "{\"a\":1}"), KVX_EINVAL);
    assert_int_equal(kvx_config_fingerprint(NULL, NULL), KVX_EINVAL);
}

/* {"d": [[...]]} with depth levels in total (the top object is level 1). */
static char *deep_text(size_t depth, char open, char close) {
    size_t n = depth - 1;
    char *s = xmalloc(n * 2 + 16);
    char *p = s;
    p += sprintf(p, "{\"d\":");
    for (size_t i = 0; i < n; ++i) *p++ = open;
    for (size_t i = 0; i < n; ++i) *p++ = close;
    strcpy(p, "}");
    return s;
}

static void test_depth(void **state) {
    (void)state;
    char *s = deep_text(256, '[', ']');
    expect_fp(s, "8cacb3febb1a0950"); /* Python: same text */
    free(s);
    s = deep_text(257, '[', ']');
    expect_econfig(s, "256");
    free(s);
    /* Hostile depth: must fail cleanly, not overflow the stack. */
    s = deep_text(1000000, '[', ']');
    expect_econfig(s, "256");
    free(s);
    s = xmalloc(5 * 1000000 + 8);
    char *p = s;
    for (int i = 0; i < 1000000; ++i) p += sprintf(p, "{\"a\":");
    strcpy(p, "1");
    expect_econfig(s, "256");
    free(s);
}

/* {"big": <sign><digits x n>} */
static char *big_int_text(const char *sign, char digit, size_t n) {
    char *s = xmalloc(n + 16);
    int k = sprintf(s, "{\"big\":%s", sign);
    memset(s + k, digit, n);
    strcpy(s + k + n, "}");
    return s;
}

static void test_big_ints(void **state) {
    (void)state;
    /* CPython 3.11 int max str digits: 4300 accepted, 4301 ValueError. */
    char *s = big_int_text("", '9', 4300);
    expect_fp(s, "7f53bb7ba6980db2");
    free(s);
    s = big_int_text("-", '1', 4300);
    expect_fp(s, "8d39c9f8716ac0dc");
    free(s);
    s = big_int_text("", '9', 4301);
    expect_econfig(s, "4300");
    free(s);
    s = big_int_text("-", '1', 4301);
    expect_econfig(s, "4300");
    free(s);
}

/* Same config, different spelling: same fingerprint. */
static void test_spelling_invariance(void **state) {
    (void)state;
    char a[FP_BUF], b[FP_BUF];
    assert_int_equal(kvx_config_fingerprint(a, "{\"x\":[1.0,\"\\u00e9\"],\"y\":100}"), 0);
    assert_int_equal(kvx_config_fingerprint(b, " { \"y\" : 1e2 , \"x\" : [ 1 , \"\303\251\" ] } "), 0);
    /* 1e2 is the float 100.0 and 1 the int 1 in Python: these differ. */
    assert_string_not_equal(a, b);
    assert_int_equal(kvx_config_fingerprint(b, " { \"y\" : 100 , \"x\" : [ 10e-1 , \"\303\251\" ] } "), 0);
    assert_string_equal(a, b);
    assert_int_equal(strlen(a), KVX_FINGERPRINT_LEN);
    for (size_t i = 0; i < KVX_FINGERPRINT_LEN; ++i)
        assert_true((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_values),
        cmocka_unit_test(test_empty_configs),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_null_out),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_big_ints),
        cmocka_unit_test(test_spelling_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
