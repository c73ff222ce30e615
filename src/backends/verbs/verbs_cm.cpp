// rdma_cm plumbing shared by the initiator (verbs_peer.cpp) and the target
// (verbs_listener.cpp): cm_id lifetime, reading events, connection parameters.
#include <cerrno>

#include "backends/verbs/verbs.h"
#include "util/error.h"

namespace kvx::verbs {

void destroy_cm_id(rdma_cm_id *id) {
    if (!id) return;
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_id(id);
}

bool next_cm_event(rdma_event_channel *ch, CmEvent *out) {
    rdma_cm_event *ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) return false;
    out->id = ev->id;
    out->type = ev->event;
    out->status = ev->status;
    out->pdata.clear();
    bool conn = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST || ev->event == RDMA_CM_EVENT_REJECTED ||
                ev->event == RDMA_CM_EVENT_ESTABLISHED || ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE;
    if (conn && ev->param.conn.private_data && ev->param.conn.private_data_len) {
        const auto *b = static_cast<const uint8_t *>(ev->param.conn.private_data);
        out->pdata.assign(b, b + ev->param.conn.private_data_len);
    }
    rdma_ack_cm_event(ev);  // before anyone destroys the id: rdma_destroy_id waits for it
    return true;
}

bool ends_connection(rdma_cm_event_type t) {
    return t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL || t == RDMA_CM_EVENT_CONNECT_ERROR ||
           t == RDMA_CM_EVENT_UNREACHABLE || t == RDMA_CM_EVENT_REJECTED;
}

int connect_failure_code(rdma_cm_event_type type, int status) {
    switch (type) {
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR: return KVX_ECONNREFUSED;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE: return status == -ETIMEDOUT ? KVX_ETIMEDOUT : KVX_EHOSTUNREACH;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return KVX_ECONNRESET;
    default: return KVX_ECONNREFUSED;
    }
}

rdma_conn_param conn_param(const void *pdata, size_t len) {
    rdma_conn_param cp{};
    cp.private_data = pdata;
    cp.private_data_len = static_cast<uint8_t>(len);
    // Write-only: no RDMA READ/atomic resources, so rdma_cm grants the
    // passive QP no remote read access either.
    cp.responder_resources = 0;
    cp.initiator_depth = 0;
    // Transport retries of both QPs (the REQ carries it to the target). Not
    // 7: rxe takes 7 for "retry forever", and the target's liveness probes
    // must fail when the initiator is gone (verbs.h, kProbeRecvs).
    cp.retry_count = 6;
    cp.rnr_retry_count = 7;  // forever: an initiator without receives answers probes with RNR NAKs
    return cp;
}

ibv_qp_init_attr rc_qp_attr(ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr) {
    ibv_qp_init_attr qa{};
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 0;  // selective signalling
    qa.cap.max_send_wr = send_wr;
    qa.cap.max_recv_wr = recv_wr;
    qa.cap.max_send_sge = 1;  // one SGE per WR: a Run is contiguous locally
    qa.cap.max_recv_sge = 1;
    return qa;
}

}  // namespace kvx::verbs
