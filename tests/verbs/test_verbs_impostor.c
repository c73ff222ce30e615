/* An impostor at a verbs target's address (it took the address over, or sits
 * on the path of the connect): it answers the HELLO with a challenge, takes
 * the AUTH, accepts with a proof it cannot make (it lacks the target's
 * secret), and from the moment it accepted writes into the initiator's own
 * region through the new connection, with the address and rkey the
 * initiator's metadata shows (an attacker who learned or guessed them).
 *
 * The initiator must refuse the connection (KVX_EAUTH), none of the
 * impostor's writes may complete, and not one byte of the initiator's region
 * may change. Its outbound QP never has remote access and reaches RTR only
 * after the accept's proof verified. (When rdma_cm moved that QP itself, it
 * went to RTR with remote write access as soon as the REP arrived, before
 * the proof was checked: a write the impostor kept retransmitting landed in
 * that window.) Skips (77) without RDMA. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vtest.h"

#define NB 8
#define BL 4096
#define WRITE_MS 2000 /* how long the impostor keeps writing after it accepted */
#define SQ 128        /* its writes in flight at most */
#define MAX_IDS 16

typedef struct impostor {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *listen;
    uint16_t port;
    uint64_t addr; /* the initiator's region, from its metadata */
    uint32_t rkey;
    struct rdma_cm_id *refused[MAX_IDS]; /* destroyed at the end, after their REJ left */
    int nrefused;
    /* what happened */
    int hellos, auths, accepted, rtu, rejected;
    long posted, wc_ok, wc_err;
    int first_err;     /* status of the first failed write */
    const char *setup; /* what failed on the impostor's side (asserts belong to the main thread) */
} impostor;

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* docs/wire-format.md, "Handshake": "KVXS", version 1, kind, reserved. */
static void header(uint8_t *p, int kind) {
    memcpy(p, "KVXS", 4);
    p[4] = 1;
    p[5] = (uint8_t)kind;
    p[6] = p[7] = 0;
}

static int next_event(impostor *im, int ms, struct rdma_cm_event **ev) {
    struct pollfd pfd = {im->ch->fd, POLLIN, 0};
    if (poll(&pfd, 1, ms) <= 0) return 0;
    return rdma_get_cm_event(im->ch, ev) == 0;
}

static void refuse(impostor *im, struct rdma_cm_id *id, const uint8_t *pdata, uint8_t len) {
    rdma_reject(id, pdata, len);
    if (im->nrefused < MAX_IDS) im->refused[im->nrefused++] = id;
    else rdma_destroy_id(id);
}

/* Side events while writing: the initiator's RTU (it established the
 * connection) or its REJ / a disconnect. */
static void side_events(impostor *im) {
    struct rdma_cm_event *ev;
    while (next_event(im, 0, &ev)) {
        if (ev->event == RDMA_CM_EVENT_ESTABLISHED) im->rtu++;
        else if (ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_DISCONNECTED ||
                 ev->event == RDMA_CM_EVENT_CONNECT_ERROR || ev->event == RDMA_CM_EVENT_UNREACHABLE)
            im->rejected++;
        struct rdma_cm_id *id = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : NULL;
        rdma_ack_cm_event(ev);
        if (id) refuse(im, id, NULL, 0); /* one connection at a time */
    }
}

/* Accepts the AUTH on id with a forged ACCEPT, then writes into the
 * initiator's region through the connection for WRITE_MS: one 64-byte RDMA
 * WRITE after the other, each signalled, until one fails. */
static void accept_and_write(impostor *im, struct rdma_cm_id *id) {
    struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
    uint8_t *buf = aligned_alloc(4096, 4096);
    struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, memset(buf, 0xEE, 4096), 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
    struct ibv_cq *cq = ibv_create_cq(id->verbs, 2 * SQ, NULL, NULL, 0);
    struct ibv_qp_init_attr qa = {0};
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = SQ;
    qa.cap.max_recv_wr = 1;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    if (!mr || !cq || rdma_create_qp(id, pd, &qa) != 0) {
        im->setup = "PD, MR, CQ or QP";
        rdma_reject(id, NULL, 0);
        goto out;
    }

    uint8_t acc[28]; /* ACCEPT: flags 0, a proof made up */
    header(acc, 5);
    put_le(acc + 8, 0, 4);
    RAND_bytes(acc + 12, 16);
    struct rdma_conn_param cp = {0};
    cp.private_data = acc;
    cp.private_data_len = sizeof acc;
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    if (rdma_accept(id, &cp) != 0) {
        im->setup = "rdma_accept";
    } else {
        im->accepted++;
        long outstanding = 0;
        int dead = 0;
        uint64_t end = now_ms() + WRITE_MS;
        while (now_ms() < end) {
            struct ibv_wc wc[16];
            int n = ibv_poll_cq(cq, 16, wc);
            for (int i = 0; i < n; i++) {
                outstanding--;
                if (wc[i].status == IBV_WC_SUCCESS) {
                    im->wc_ok++;
                } else {
                    if (!im->wc_err++) im->first_err = wc[i].status;
                    dead = 1; /* the QP is in ERR: the rest flushes */
                }
            }
            if (!dead && outstanding < SQ) {
                struct ibv_sge sg = {(uintptr_t)buf, 64, mr->lkey};
                struct ibv_send_wr w = {0}, *bad = NULL;
                w.wr_id = (uint64_t)im->posted;
                w.sg_list = &sg;
                w.num_sge = 1;
                w.opcode = IBV_WR_RDMA_WRITE;
                w.send_flags = IBV_SEND_SIGNALED;
                w.wr.rdma.remote_addr = im->addr + (uint64_t)(im->posted % (NB * BL / 64)) * 64;
                w.wr.rdma.rkey = im->rkey;
                if (ibv_post_send(id->qp, &w, &bad) == 0) {
                    im->posted++;
                    outstanding++;
                }
            }
            side_events(im);
            usleep(20);
        }
    }
    rdma_disconnect(id);
    rdma_destroy_qp(id);
out:
    rdma_destroy_id(id);
    if (cq) ibv_destroy_cq(cq);
    if (mr) ibv_dereg_mr(mr);
    if (pd) ibv_dealloc_pd(pd);
    free(buf);
}

static void *impostor_main(void *arg) {
    impostor *im = arg;
    uint64_t deadline = now_ms() + 30000;
    while (now_ms() < deadline && !im->accepted && !im->setup) {
        struct rdma_cm_event *ev;
        if (!next_event(im, 100, &ev)) continue;
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
            rdma_ack_cm_event(ev);
            continue;
        }
        const uint8_t *p = ev->param.conn.private_data;
        const size_t n = ev->param.conn.private_data_len;
        const int kind = p && n >= 8 && memcmp(p, "KVXS", 4) == 0 ? p[5] : 0;
        struct rdma_cm_id *id = ev->id;
        rdma_ack_cm_event(ev);
        if (kind == 1) { /* HELLO: a CHALLENGE (id and nonce random) in the reject */
            im->hellos++;
            uint8_t ch[28];
            header(ch, 3);
            RAND_bytes(ch + 8, 20);
            refuse(im, id, ch, sizeof ch);
        } else if (kind == 2) { /* AUTH with the initiator's QP */
            im->auths++;
            accept_and_write(im, id);
        } else {
            refuse(im, id, NULL, 0);
        }
    }
    return NULL;
}

static void listen_on(impostor *im, const uint8_t ip[4]) {
    im->ch = rdma_create_event_channel();
    assert_non_null(im->ch);
    assert_int_equal(rdma_create_id(im->ch, &im->listen, im, RDMA_PS_TCP), 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    memcpy(&sa.sin_addr, ip, 4);
    assert_int_equal(rdma_bind_addr(im->listen, (struct sockaddr *)&sa), 0);
    assert_int_equal(rdma_listen(im->listen, 16), 0);
    im->port = ntohs(rdma_get_src_port(im->listen));
}

static void impostor_close(impostor *im) {
    for (int i = 0; i < im->nrefused; i++) rdma_destroy_id(im->refused[i]);
    rdma_destroy_id(im->listen);
    rdma_destroy_event_channel(im->ch);
}

static void test_impostor_cannot_write(void **state) {
    (void)state;
    region ri = region_new(NB, BL, 0x33), rt = region_new(NB, BL, 0x44);
    kvx_transport *ti = vt_transport(&ri, NULL, NULL), *tt = vt_transport(&rt, NULL, NULL);
    metablob mi, mt;
    get_meta(ti, &mi);
    get_meta(tt, &mt);

    impostor im = {0};
    vt_meta_mr(&mi, &im.addr, &im.rkey);
    uint8_t ip[4];
    uint16_t tport = 0;
    vt_meta_endpoint(&mt, ip, &tport);
    listen_on(&im, ip);
    metablob m = mt; /* the target's metadata, its address now the impostor's */
    vt_meta_set_port(&m, im.port);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, impostor_main, &im), 0);
    int rc = vt_add(ti, "t", &m);
    printf("add through the impostor: %d (%s) %s\n", rc, kvx_strerror(rc), kvx_last_error_message());
    pthread_join(th, NULL);
    printf("impostor: %d HELLO, %d AUTH, accepted %d, RTU %d, reject/disconnect %d; writes posted %ld, "
           "done %ld, failed %ld (first: %s)\n",
           im.hellos, im.auths, im.accepted, im.rtu, im.rejected, im.posted, im.wc_ok, im.wc_err,
           im.wc_err ? ibv_wc_status_str((enum ibv_wc_status)im.first_err) : "-");
    impostor_close(&im);

    if (im.setup) fail_msg("impostor: %s failed", im.setup);
    VT_ERR(rc, KVX_EAUTH);
    assert_int_equal(im.accepted, 1);
    assert_true(im.posted > 0);
    assert_int_equal(im.rtu, 0); /* the initiator never established the connection */
    assert_int_equal(im.wc_ok, 0);
    for (uint64_t i = 0; i < NB; i++)
        if (!block_is(ri.base + i * BL, BL, 0x33)) fail_msg("the impostor wrote into block %llu", (unsigned long long)i);
    assert_true(region_guards_ok(&ri));

    /* The honest target still works for this initiator. */
    CHECK_OK(vt_add(ti, "t", &mt));
    fill_block(ri.base, BL, 0, 9);
    uint64_t z = 0, id;
    CHECK_OK(kvx_write_blocks(&id, ti, "t", &z, &z, 1));
    size_t nf = 9;
    assert_int_equal(wait_ids(ti, "t", &id, 1, 20000, &nf, NULL), 1);
    assert_int_equal(nf, 0);
    assert_true(block_matches(rt.base, BL, 0, 9));

    kvx_transport_destroy(ti);
    kvx_transport_destroy(tt);
    assert_true(region_guards_ok(&rt));
    region_free(&ri);
    region_free(&rt);
}

int main(void) {
    vt_require_verbs();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_impostor_cannot_write)};
    return cmocka_run_group_tests_name("verbs_impostor", tests, NULL, NULL);
}
