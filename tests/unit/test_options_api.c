/* Public C API: options objects (set, parse), error codes, scopes, messages, version.
 * Links the shared library only (no internal headers). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvxfer.h"

#define assert_mentions(needle)                                                                   \
    do {                                                                                          \
        const char *m_ = kvx_last_error_message();                                                \
        assert_non_null(m_);                                                                      \
        if (strstr(m_, (needle)) == NULL)                                                         \
            fail_msg("last error message \"%s\" does not mention \"%s\"", m_, (needle));          \
    } while (0)

static int setup_opts(void **state) {
    kvx_options *o = NULL;
    if (kvx_options_create(&o) != 0 || o == NULL) return -1;
    *state = o;
    return 0;
}

static int teardown_opts(void **state) {
    kvx_options_destroy(*state);
    return 0;
}

static void test_create_destroy(void **state) {
    (void)state;
    assert_int_equal(kvx_options_create(NULL), KVX_EINVAL);
    assert_mentions("out");
    kvx_options *o = NULL;
    assert_int_equal(kvx_options_create(&o), 0);
    assert_non_null(o);
    kvx_options_destroy(o);
    kvx_options_destroy(NULL); /* no-op */
}

static void test_set_null_arguments(void **state) {
    kvx_options *o = *state;
    assert_int_equal(kvx_options_set(NULL, "backend", "tcp"), KVX_EINVAL);
    assert_mentions("NULL");
    assert_int_equal(kvx_options_set(o, NULL, "tcp"), KVX_EINVAL);
    assert_mentions("key");
    assert_int_equal(kvx_options_set(o, "backend", NULL), KVX_EINVAL);
    assert_mentions("backend");
}

/* The verbs.* keys exist in builds with the verbs backend (KVX_VERBS=ON);
 * a build without it refuses them as unknown (test_backend_keys). */
#ifdef KVX_TEST_HAVE_VERBS
static const int have_verbs = 1;
#else
static const int have_verbs = 0;
#endif
static int absent(const char *key) { return !have_verbs && strncmp(key, "verbs.", 6) == 0; }

static void test_backend_keys(void **state) {
    kvx_options *o = *state;
    if (have_verbs) {
        assert_int_equal(kvx_options_set(o, "verbs.port", "1"), 0);
    } else {
        assert_int_equal(kvx_options_set(o, "verbs.port", "1"), KVX_EINVAL);
        assert_mentions("unknown option 'verbs.port'");
    }
    assert_int_equal(kvx_options_set(o, "backend", "verbs"), 0); /* names are known either way */
}

static void test_set_unknown_key(void **state) {
    kvx_options *o = *state;
    const char *keys[] = {"", "bogus_key", "Backend", "tcp.nope", "verbs.unknown_thing", "connect_timeout"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        assert_int_equal(kvx_options_set(o, keys[i], "1"), KVX_EINVAL);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", keys[i]);
        assert_mentions(quoted);
    }
}

static void test_set_bad_values(void **state) {
    kvx_options *o = *state;
    struct {
        const char *key, *value;
    } bad[] = {
        {"connect_timeout_ms", ""},
        {"connect_timeout_ms", "-1"},
        {"connect_timeout_ms", "12abc"},
        {"connect_timeout_ms", "0"},
        {"connect_timeout_ms", "3600001"},
        {"connect_timeout_ms", "99999999999999999999"},
        {"transfer_timeout_ms", " 10"},
        {"transfer_timeout_ms", "0x10"},
        {"tcp.streams", "0"},
        {"tcp.streams", "17"},
        {"tcp.streams", "+1"},
        {"verbs.port", "256"},
        {"verbs.gid_index", "65536"},
        {"verbs.qps_per_peer", "1.5"},
        {"backend", "rdma"},
        {"backend", ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (absent(bad[i].key)) continue;
        int rc = kvx_options_set(o, bad[i].key, bad[i].value);
        if (rc != KVX_EINVAL)
            fail_msg("%s='%s': expected KVX_EINVAL, got %d", bad[i].key, bad[i].value, rc);
        assert_mentions(bad[i].key);
        assert_mentions(bad[i].value);
    }
    char longv[1100];
    memset(longv, 'h', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    assert_int_equal(kvx_options_set(o, "tcp.advertise", longv), KVX_EINVAL);
    assert_mentions("tcp.advertise");
}

static void test_set_good_values(void **state) {
    kvx_options *o = *state;
    struct {
        const char *key, *value;
    } good[] = {
        {"backend", "auto"},          {"backend", "tcp"},
        {"backend", "verbs"},         {"backend", "shm"},
        {"connect_timeout_ms", "1"},  {"connect_timeout_ms", "3600000"},
        {"transfer_timeout_ms", "5"}, {"tcp.listen", "127.0.0.1:0"},
        {"tcp.listen", "[::1]:0"},    {"tcp.advertise", "10.1.2.3:0,127.0.0.1:7"},
        {"tcp.streams", "16"},        {"verbs.device", "rxe0"},
        {"verbs.port", "1"},          {"verbs.gid_index", "0"},
        {"verbs.qps_per_peer", "2"},  {"verbs.listen", "0.0.0.0:0"},
        {"tcp.streams", "2"}, /* setting a key again replaces it */
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (absent(good[i].key)) continue;
        int rc = kvx_options_set(o, good[i].key, good[i].value);
        if (rc != 0) fail_msg("%s='%s' refused: %d %s", good[i].key, good[i].value, rc, kvx_last_error_message());
    }
}

/* kvx_options_parse: the same checks as kvx_options_set, all or nothing. */
static void test_parse(void **state) {
    kvx_options *o = *state;
    assert_int_equal(kvx_options_parse(NULL, "tcp.streams=2"), KVX_EINVAL);
    assert_mentions("NULL");
    assert_int_equal(kvx_options_parse(o, NULL), KVX_EINVAL);
    assert_mentions("NULL");
    assert_int_equal(kvx_options_parse(o, ""), 0);
    assert_int_equal(kvx_options_parse(o, " \t\n"), 0);
    assert_int_equal(kvx_options_parse(o, "backend=shm,tcp tcp.advertise=10.0.0.1:0,127.0.0.1:7\ttcp.streams=2\n"
                                          "tcp.streams=3"), 0);

    struct {
        const char *text, *mention1, *mention2;
    } bad[] = {
        {"tcp.streams", "'tcp.streams'", "KEY=VALUE"},
        {"tcp.streams=2 =4", "'=4'", "KEY=VALUE"},
        {"tcp.streams=2 nope=1", "'nope'", "unknown option"},
        {"tcp.streams=2 tcp.streams=17", "tcp.streams", "17"},
        {"connect_timeout_ms=12abc", "connect_timeout_ms", "12abc"},
        {"backend=rdma", "backend", "rdma"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = kvx_options_parse(o, bad[i].text);
        if (rc != KVX_EINVAL) fail_msg("'%s': expected KVX_EINVAL, got %d", bad[i].text, rc);
        assert_mentions(bad[i].mention1);
        assert_mentions(bad[i].mention2);
    }
}

/* A failed parse leaves the object as it was: a transport created from it
 * after a failure gets what the successful calls set. */
static void test_parse_all_or_nothing(void **state) {
    kvx_options *o = *state;
    assert_int_equal(kvx_options_parse(o, "backend=tcp tcp.listen=127.0.0.1:0"), 0);
    assert_int_equal(kvx_options_parse(o, "backend=shm tcp.streams=99"), KVX_EINVAL);
    static uint8_t region[4096];
    kvx_transport *t = NULL;
    int rc = kvx_transport_create(&t, region, 1, sizeof region, NULL, o);
    if (rc != 0) fail_msg("create: %d %s", rc, kvx_last_error_message());
    assert_string_equal(kvx_transport_backend(t), "tcp");
    kvx_transport_destroy(t);
}

static void test_message_survives_success(void **state) {
    kvx_options *o = *state;
    assert_int_equal(kvx_options_set(o, "tcp.streams", "999"), KVX_EINVAL);
    assert_mentions("999");
    assert_int_equal(kvx_options_set(o, "tcp.streams", "3"), 0);
    assert_mentions("999"); /* successful calls do not clear it */
}

static void *other_thread(void *arg) {
    const char **out = arg;
    /* a fresh thread has no message yet, whatever other threads did */
    out[0] = strcmp(kvx_last_error_message(), "") == 0 ? "empty" : "not empty";
    kvx_options_set(NULL, "x", "y");
    out[1] = strstr(kvx_last_error_message(), "NULL") ? "own" : "foreign";
    return NULL;
}

static void test_message_thread_local(void **state) {
    kvx_options *o = *state;
    assert_int_equal(kvx_options_set(o, "mine_only", "1"), KVX_EINVAL);
    const char *res[2] = {NULL, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, res), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_string_equal(res[0], "empty");
    assert_string_equal(res[1], "own");
    assert_mentions("mine_only");
}

static void test_strerror(void **state) {
    (void)state;
    for (int code = -2000; code <= 10; code++) {
        const char *s = kvx_strerror(code);
        if (s == NULL || s[0] == '\0') fail_msg("kvx_strerror(%d) is NULL or empty", code);
    }
    const char *unknown = kvx_strerror(-999);
    const int known[] = {KVX_OK,           KVX_EPERM,       KVX_ENOENT,      KVX_ENOMEM,       KVX_EBUSY,
                         KVX_EEXIST,       KVX_EINVAL,      KVX_ERANGE,      KVX_ENOBUFS,      KVX_ENOTSUP,
                         KVX_EOVERFLOW,    KVX_ECONNREFUSED, KVX_ETIMEDOUT,  KVX_ECONNRESET,   KVX_EHOSTUNREACH,
                         KVX_ECLOSED,      KVX_EBADMETA,    KVX_EVERSION,    KVX_EFINGERPRINT, KVX_EGEOMETRY,
                         KVX_EPEERBROKEN,  KVX_EAUTH,       KVX_ECONFIG,     KVX_EBACKEND,     KVX_EINTERNAL};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(kvx_strerror(known[i]), unknown) == 0)
            fail_msg("kvx_strerror(%d) is the unknown-code text", known[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(kvx_strerror(known[i]), kvx_strerror(known[j])) == 0)
                fail_msg("codes %d and %d share the text \"%s\"", known[i], known[j], kvx_strerror(known[i]));
    }
    assert_non_null(kvx_strerror(-2147483647 - 1));
    assert_non_null(kvx_strerror(2147483647));
    assert_non_null(kvx_strerror(KVX_ERRNO_OFFSET));
}

static void test_error_scope(void **state) {
    (void)state;
    struct {
        int code;
        kvx_error_scope scope;
    } tab[] = {
        {KVX_OK, KVX_SCOPE_NONE},
        {KVX_EPERM, KVX_SCOPE_TRANSPORT},
        {KVX_ENOENT, KVX_SCOPE_REQUEST},
        {KVX_ENOMEM, KVX_SCOPE_TRANSPORT},
        {KVX_EBUSY, KVX_SCOPE_REQUEST},
        {KVX_EEXIST, KVX_SCOPE_REQUEST},
        {KVX_EINVAL, KVX_SCOPE_REQUEST},
        {KVX_ERANGE, KVX_SCOPE_REQUEST},
        {KVX_ENOBUFS, KVX_SCOPE_REQUEST},
        {KVX_ENOTSUP, KVX_SCOPE_REQUEST},
        {KVX_EOVERFLOW, KVX_SCOPE_REQUEST},
        {KVX_ECONNREFUSED, KVX_SCOPE_PEER},
        {KVX_ETIMEDOUT, KVX_SCOPE_PEER},
        {KVX_ECONNRESET, KVX_SCOPE_PEER},
        {KVX_EHOSTUNREACH, KVX_SCOPE_PEER},
        {KVX_ECLOSED, KVX_SCOPE_TRANSPORT},
        {KVX_EBADMETA, KVX_SCOPE_REQUEST},
        {KVX_EVERSION, KVX_SCOPE_REQUEST},
        {KVX_EFINGERPRINT, KVX_SCOPE_REQUEST},
        {KVX_EGEOMETRY, KVX_SCOPE_REQUEST},
        {KVX_EPEERBROKEN, KVX_SCOPE_PEER},
        {KVX_EAUTH, KVX_SCOPE_PEER},
        {KVX_ECONFIG, KVX_SCOPE_REQUEST},
        {KVX_EBACKEND, KVX_SCOPE_TRANSPORT},
        {KVX_EINTERNAL, KVX_SCOPE_TRANSPORT},
        /* codes this version does not know */
        {KVX_ERRNO_OFFSET, KVX_SCOPE_TRANSPORT},
        {-999, KVX_SCOPE_TRANSPORT},
        {-1011, KVX_SCOPE_TRANSPORT},
        {-5, KVX_SCOPE_TRANSPORT},
        {1, KVX_SCOPE_TRANSPORT},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        kvx_error_scope s = kvx_error_scope_of(tab[i].code);
        if (s != tab[i].scope) fail_msg("kvx_error_scope_of(%d) = %d, expected %d", tab[i].code, s, tab[i].scope);
    }
}

static void test_version(void **state) {
    (void)state;
    assert_int_equal(kvx_version_number(), KVX_VERSION_NUMBER);
    assert_int_equal(KVX_VERSION_NUMBER, KVX_VERSION_MAJOR * 10000 + KVX_VERSION_MINOR * 100 + KVX_VERSION_PATCH);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KVX_VERSION_MAJOR, KVX_VERSION_MINOR, KVX_VERSION_PATCH);
    assert_non_null(kvx_version_string());
    assert_string_equal(kvx_version_string(), want);
    assert_ptr_equal(kvx_version_string(), kvx_version_string()); /* static storage */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_destroy),
        cmocka_unit_test_setup_teardown(test_set_null_arguments, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_set_unknown_key, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_backend_keys, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_set_bad_values, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_set_good_values, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_parse, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_parse_all_or_nothing, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_message_survives_success, setup_opts, teardown_opts),
        cmocka_unit_test_setup_teardown(test_message_thread_local, setup_opts, teardown_opts),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_error_scope),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
