/* Conformance, what an operator reads: kvx_list_peers() (every state,
 * order, a short array). Part of the
 * conformance_api program (test_api.c has main()). */
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
