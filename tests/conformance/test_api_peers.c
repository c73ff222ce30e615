/* Conformance, what an operator reads: kvx_list_peers() (every state,
 * order, a short array) and kvx_metrics_text() (values that match
 * kvx_get_stats(), escaped labels, the buffer protocol). Part of the
 * conformance_api program (test_api.c has main()). The text's syntax is
 * checked with the Prometheus client's own parser in
 * bindings/python/tests/test_metrics.py. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "test_api.h"

static int64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void write_and_wait(kvx_transport *t, const char *peer, int n) {
    uint64_t ids[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        uint64_t l = (uint64_t)i, r = (uint64_t)i;
        CHECK_OK(kvx_write_blocks(&ids[i], t, peer, &l, &r, 1));
    }
    size_t nf = 1;
    assert_int_equal(wait_ids(t, peer, ids, (size_t)n, 30000, &nf, NULL), (size_t)n);
    assert_int_equal(nf, 0);
}

/* Up, reconnecting and connecting peers, listed in id order with their
 * state; a short array gets the first ones and the full count. */
void test_list_peers(void **state) {
    (void)state;
    child_target frozen;
    child_start(&frozen, NB, BL, CFG); /* before a opens anything (verbs: see harness.h) */
    region ra = region_new(NB, BL, 1), rb = region_new(NB, BL, 2), rc = region_new(NB, BL, 3);
    kvx_transport *a = transport_new(&ra, CFG, test_options("peer_redial_ms=60000", NULL));
    kvx_transport *b = transport_new(&rb, CFG, NULL), *c = transport_new(&rc, CFG, NULL);
    size_t n = 99;
    CHECK_OK(kvx_list_peers(&n, a, NULL, 0));
    assert_int_equal(n, 0);
    metablob mb, mc;
    get_meta(b, &mb);
    get_meta(c, &mc);
    add_peer(a, "p-up", &mb);
    add_peer(a, "p-down", &mc);
    const int64_t t0 = realtime_ns();
    write_and_wait(a, "p-up", 2);
    const int64_t t1 = realtime_ns();
    kvx_transport_destroy(c); /* p-down's target goes away: reconnecting */
    assert_true(wait_peer_link(a, "p-down", KVX_PEER_RECONNECTING, 30000, NULL) >= 0);
    child_freeze(&frozen); /* answers nothing: its add stays connecting */
    uint64_t reg = 0;
    CHECK_OK(kvx_add_remote_peer_async(&reg, a, "p-connecting", frozen.meta.bytes, frozen.meta.len, frozen.meta.base,
                                       frozen.meta.nb, frozen.meta.bl, 0));

    kvx_peer_info info[4];
    memset(info, 0x5A, sizeof info);
    CHECK_OK(kvx_list_peers(&n, a, info, 1));
    assert_int_equal(n, 3);
    assert_string_equal(info[0].peer_id, "p-connecting");
    assert_true((unsigned char)info[1].peer_id[0] == 0x5A); /* beyond cap: untouched */
    CHECK_OK(kvx_list_peers(&n, a, info, 4));
    assert_int_equal(n, 3);
    assert_string_equal(info[0].peer_id, "p-connecting");
    assert_string_equal(info[1].peer_id, "p-down");
    assert_string_equal(info[2].peer_id, "p-up");
    assert_int_equal(info[0].state.link, KVX_PEER_CONNECTING);
    assert_true(info[0].state.since_ns > 0 && info[0].state.since_ns <= realtime_ns());
    assert_string_equal(info[0].state.backend, "");
    assert_int_equal(info[0].state.in_flight, 0);
    assert_int_equal(info[1].state.link, KVX_PEER_RECONNECTING);
    assert_int_not_equal(info[1].state.error, 0);
    assert_int_equal(info[2].state.link, KVX_PEER_UP);
    assert_string_equal(info[2].state.backend, test_backend());
    /* The last progress: when the last of its transfers ended. */
    assert_true(info[2].state.last_progress_ns >= t0 && info[2].state.last_progress_ns <= t1);
    /* The same as kvx_get_peer_state() says. */
    kvx_peer_state st;
    CHECK_OK(kvx_get_peer_state(a, "p-up", &st));
    assert_int_equal(st.link, info[2].state.link);
    /* Both convert the monotonic clock to CLOCK_REALTIME at their call:
     * equal to a few ns (the two clocks are read one after the other). */
    assert_true(llabs(st.last_progress_ns - info[2].state.last_progress_ns) < 1000000);
    assert_int_equal(kvx_get_peer_state(a, "p-connecting", &st), KVX_ENOENT);

    /* A removed peer leaves the list; so does a cancelled registration. */
    CHECK_OK(kvx_remove_remote_peer(a, "p-down"));
    CHECK_OK(kvx_remove_remote_peer(a, "p-connecting"));
    CHECK_OK(kvx_list_peers(&n, a, info, 4));
    assert_int_equal(n, 1);
    assert_string_equal(info[0].peer_id, "p-up");

    assert_int_equal(kvx_list_peers(NULL, a, info, 4), KVX_EINVAL);
    assert_int_equal(kvx_list_peers(&n, a, NULL, 4), KVX_EINVAL);
    assert_non_null(strstr(kvx_last_error_message(), "cap 4"));
    CHECK_OK(kvx_transport_close(a));
    assert_int_equal(kvx_list_peers(&n, a, info, 4), KVX_ECLOSED);
    kvx_transport_destroy(a);
    kvx_transport_destroy(b);
    kill(frozen.pid, SIGCONT);
    child_kill(&frozen);
    region_free(&ra);
    region_free(&rb);
    region_free(&rc);
}

/* The text: whole, NUL-terminated, after a size query; values as
 * kvx_get_stats() gives them; peer ids escaped. */
void test_metrics_text(void **state) {
    (void)state;
    pair p;
    pair_up(&p, NB, NB, CFG);
    const char odd[] = "q\"\\\n\xff";
    add_peer(p.a, odd, &p.mb);
    write_and_wait(p.a, "b", 5);
    write_and_wait(p.a, odd, 2);
    size_t len = 0;
    char small[16];
    memset(small, 0x5A, sizeof small);
    assert_int_equal(kvx_metrics_text(&len, p.a, small, sizeof small), KVX_ENOBUFS);
    assert_true(len > sizeof small);
    assert_true((unsigned char)small[0] == 0x5A);
    assert_non_null(strstr(kvx_last_error_message(), "needs"));
    assert_int_equal(kvx_metrics_text(&len, p.a, NULL, 0), KVX_ENOBUFS);
    char *text = malloc(len + 4096);
    size_t got = 0;
    CHECK_OK(kvx_metrics_text(&got, p.a, text, len + 4096));
    assert_int_equal(strlen(text) + 1, got);

    kvx_stats s = KVX_STATS_INIT, sb = KVX_STATS_INIT;
    CHECK_OK(kvx_get_stats(&s, p.a, NULL));
    CHECK_OK(kvx_get_stats(&sb, p.a, "b"));
    char line[512];
    snprintf(line, sizeof line, "\nkvxfer_transfers_total{outcome=\"done\"} %llu\n",
             (unsigned long long)s.transfers_done);
    assert_non_null(strstr(text, line));
    assert_int_equal(s.transfers_done, 7);
    snprintf(line, sizeof line, "\nkvxfer_transfer_bytes_total{outcome=\"done\"} %llu\n", (unsigned long long)s.bytes_done);
    assert_non_null(strstr(text, line));
    assert_non_null(strstr(text, "\nkvxfer_peer_transfers_total{peer=\"b\",outcome=\"done\"} 5\n"));
    assert_non_null(strstr(text, "\nkvxfer_peer_transfers_total{peer=\"q\\\"\\\\\\n\xEF\xBF\xBD\",outcome=\"done\"} 2\n"));
    assert_non_null(strstr(text, "\nkvxfer_peer_state{peer=\"b\",state=\"up\"} 1\n"));
    assert_non_null(strstr(text, "\nkvxfer_peer_state{peer=\"b\",state=\"broken\"} 0\n"));
    assert_non_null(strstr(text, "\nkvxfer_peers{state=\"up\"} 2\n"));
    snprintf(line, sizeof line, "\nkvxfer_peer_info{peer=\"b\",backend=\"%s\",path=\"", test_backend());
    assert_non_null(strstr(text, line));
    snprintf(line, sizeof line, "\nkvxfer_transfer_latency_seconds_count %llu\n", (unsigned long long)s.latency_count);
    assert_non_null(strstr(text, line));
    assert_non_null(strstr(text, "\nkvxfer_transfer_latency_seconds_bucket{le=\"+Inf\"} 7\n"));
    snprintf(line, sizeof line, "\nkvxfer_transfer_latency_seconds_sum %llu.%09llu\n",
             (unsigned long long)(s.latency_ns_sum / 1000000000), (unsigned long long)(s.latency_ns_sum % 1000000000));
    assert_non_null(strstr(text, line));
    assert_true(s.latency_ns_sum >= s.latency_count && s.latency_ns_sum >= sb.latency_ns_sum);
    assert_non_null(strstr(text, "# TYPE kvxfer_transfer_latency_seconds histogram\n"));
    /* No raw newline or invalid byte from the odd id: every line is a comment or a sample. */
    for (const char *l = text; *l; l = strchr(l, '\n') + 1) {
        assert_true(*l == '#' || strncmp(l, "kvxfer_", 7) == 0);
        assert_non_null(strchr(l, '\n'));
    }
    free(text);
    assert_int_equal(kvx_metrics_text(NULL, p.a, NULL, 0), KVX_EINVAL);
    pair_down(&p);
}
