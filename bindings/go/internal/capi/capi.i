/* SWIG interface for the internal Go layer over include/kvxfer.h.
 *
 * Regenerate with ./generate.sh (needs swig 4.1). The output (capi.go,
 * capi_wrap.c) is committed; TestGeneratedFilesUpToDate fails when it is
 * stale. This layer is deliberately raw: every pointer parameter becomes a Go
 * slice that C reads or writes during the call only, every handle a uintptr.
 * The public package kvxfer.dev/kvxfer is the only intended user; it checks
 * lengths, keeps the region out of the Go heap and turns codes into errors.
 */
%module capi

%{
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <kvxfer.h>

/* size_t out-parameters travel as []uint64. */
typedef char kvx_go_size_t_is_64_bit[sizeof(size_t) == sizeof(uint64_t) ? 1 : -1];
%}

typedef unsigned long size_t;
typedef unsigned long uint64_t;

/* Handles are plain uintptr values on the Go side. */
%typemap(gotype) kvx_transport *, const kvx_transport *, kvx_options *, const kvx_options * "uintptr"
%typemap(in) kvx_transport *, const kvx_transport *, kvx_options *, const kvx_options *
%{ $1 = ($1_ltype)$input; %}

/* A Go slice whose backing array C uses during the call only (NULL if empty). */
%define KVX_SLICE(CTYPE, GOTYPE)
%typemap(gotype) CTYPE *KVX_SLICE "[]GOTYPE"
%typemap(in) CTYPE *KVX_SLICE %{ $1 = ($1_ltype)($input.len ? $input.array : NULL); %}
%typemap(argout) CTYPE *KVX_SLICE ""
%typemap(freearg) CTYPE *KVX_SLICE ""
%enddef
KVX_SLICE(uint64_t, uint64)
KVX_SLICE(const uint64_t, uint64)
KVX_SLICE(size_t, uint64)
KVX_SLICE(char, byte)
KVX_SLICE(void, byte)
KVX_SLICE(const void, byte)
KVX_SLICE(kvx_transport *, uintptr)
KVX_SLICE(kvx_options *, uintptr)
KVX_SLICE(int, int32)
/* kvx_stats is all uint64_t: it travels as a []uint64 whose element 0 is the
 * size field (package kvxfer maps the rest by position; KVX_GO_STATS_SIZE
 * lets its tests check the layout). */
KVX_SLICE(kvx_stats, uint64)
%ignore kvx_stats;
%constant size_t KVX_GO_STATS_SIZE = sizeof(kvx_stats);

%apply uint64_t *KVX_SLICE { uint64_t *out, uint64_t *out_id, uint64_t *out_reg, uint64_t *done, uint64_t *failed, uint64_t *inflight };
%apply int *KVX_SLICE { int *out_state, int *out_error, int *out_fd };
%apply kvx_stats *KVX_SLICE { kvx_stats *out };
%apply const uint64_t *KVX_SLICE { const uint64_t *local_idxs, const uint64_t *remote_idxs, const uint64_t *ids };
%apply size_t *KVX_SLICE { size_t *out_len, size_t *out_n_done, size_t *out_n_failed, size_t *out_n_inflight, size_t *out_ready };
%apply char *KVX_SLICE { char *out };
%apply void *KVX_SLICE { void *buf };
%apply char *KVX_SLICE { char *buf };
%apply const void *KVX_SLICE { const void *metadata };
%apply kvx_transport **KVX_SLICE { kvx_transport **out };
%apply kvx_options **KVX_SLICE { kvx_options **out };

/* Strings that may be NULL: the empty Go string becomes NULL. */
%typemap(gotype) const char *KVX_NULLABLE "string"
%typemap(in) const char *KVX_NULLABLE
%{
  $1 = NULL;
  if ($input.n > 0) {
    $1 = ($1_ltype)malloc($input.n + 1);
    if (!$1) {
      _swig_gopanic("kvxfer: out of memory copying a string argument");
    }
    memcpy($1, $input.p, $input.n);
    $1[$input.n] = '\0';
  }
%}
%typemap(freearg) const char *KVX_NULLABLE %{ free($1); %}
%apply const char *KVX_NULLABLE { const char *config_json, const char *peer_id };

/* kvx_peer_backend hands out static C strings, which a raw Go layer cannot
 * read: this wrapper copies them into two caller buffers of
 * KVX_GO_NAME_LEN bytes each (NUL-terminated). Region memory of
 * kvx_region_alloc() travels as an address (region.go makes the slice). */
%ignore kvx_peer_backend;
%ignore kvx_region_alloc;
%ignore kvx_region_free;
%apply uint64_t *KVX_SLICE { uint64_t *out_addr };
%apply char *KVX_SLICE { char *out_backend, char *out_path };
%constant size_t KVX_GO_NAME_LEN = 32;
%inline %{
int kvx_go_peer_backend(char *out_backend, char *out_path, kvx_transport *t, const char *peer_id) {
    const char *b = "", *p = "";
    int rc = kvx_peer_backend(&b, &p, t, peer_id);
    if (rc == 0) {
        snprintf(out_backend, 32, "%s", b);
        snprintf(out_path, 32, "%s", p);
    }
    return rc;
}
int kvx_go_region_alloc(uint64_t *out_addr, uint64_t size, unsigned flags) {
    void *p = NULL;
    int rc = kvx_region_alloc(&p, size, flags);
    out_addr[0] = (uint64_t)(uintptr_t)p;
    return rc;
}
void kvx_go_region_free(uint64_t addr) { kvx_region_free((void *)(uintptr_t)addr); }
%}

/* kvx_peer_rails fills kvx_rail_stats structs (a char array among integers
 * of two widths): this wrapper copies, for cap rails at most, each one's name
 * into out_names (KVX_RAIL_NAME_LEN bytes per rail, NUL-terminated) and its
 * numbers into out_fields (KVX_GO_RAIL_FIELDS uint64 per rail: up, bytes,
 * parts, failures, changed_ns as int64 bits), and the number of rails into
 * out_n[0], also when it exceeds cap. The caller sizes the slices for cap. */
%ignore kvx_peer_rails;
%ignore kvx_rail_stats;
%apply char *KVX_SLICE { char *out_names };
%apply uint64_t *KVX_SLICE { uint64_t *out_fields, uint64_t *out_n };
%constant size_t KVX_GO_RAIL_FIELDS = 5;
%inline %{
int kvx_go_peer_rails(char *out_names, uint64_t *out_fields, uint64_t *out_n, kvx_transport *t,
                      const char *peer_id, size_t cap) {
    kvx_rail_stats *rails = NULL;
    size_t n = 0, i;
    int rc;
    if (cap > 0 && !(rails = (kvx_rail_stats *)calloc(cap, sizeof *rails))) return KVX_ENOMEM;
    rc = kvx_peer_rails(t, peer_id, rails, cap, &n);
    if (rc == 0) {
        out_n[0] = n;
        for (i = 0; i < n && i < cap; i++) {
            uint64_t *f = out_fields + i * 5;
            memcpy(out_names + i * KVX_RAIL_NAME_LEN, rails[i].name, KVX_RAIL_NAME_LEN);
            out_names[i * KVX_RAIL_NAME_LEN + KVX_RAIL_NAME_LEN - 1] = '\0';
            f[0] = rails[i].up;
            f[1] = rails[i].bytes;
            f[2] = rails[i].parts;
            f[3] = rails[i].failures;
            f[4] = (uint64_t)rails[i].changed_ns;
        }
    }
    free(rails);
    return rc;
}
%}

/* kvx_get_peer_state fills a kvx_peer_state (two static C strings, a char
 * array, integers of three widths): this wrapper copies its backend and path
 * into out_backend and out_path (KVX_GO_NAME_LEN bytes each), its reason into
 * out_reason (KVX_PEER_REASON_LEN bytes), all NUL-terminated, and its numbers
 * into out_fields (KVX_GO_PEER_STATE_FIELDS uint64: link, error as int64
 * bits, in_flight, since_ns and next_attempt_ns as int64 bits, reconnects,
 * attempts, last_progress_ns as int64 bits). The caller sizes the slices. */
%ignore kvx_get_peer_state;
%ignore kvx_peer_state;
%apply char *KVX_SLICE { char *out_reason };
%constant size_t KVX_GO_PEER_STATE_FIELDS = 8;
%{
static void kvx_go_copy_peer_state(char *out_backend, char *out_path, char *out_reason, uint64_t *out_fields,
                                   const kvx_peer_state *s) {
    snprintf(out_backend, 32, "%s", s->backend ? s->backend : "");
    snprintf(out_path, 32, "%s", s->path ? s->path : "");
    memcpy(out_reason, s->reason, KVX_PEER_REASON_LEN);
    out_reason[KVX_PEER_REASON_LEN - 1] = '\0';
    out_fields[0] = (uint64_t)(int64_t)s->link;
    out_fields[1] = (uint64_t)(int64_t)s->error;
    out_fields[2] = s->in_flight;
    out_fields[3] = (uint64_t)s->since_ns;
    out_fields[4] = (uint64_t)s->next_attempt_ns;
    out_fields[5] = s->reconnects;
    out_fields[6] = s->attempts;
    out_fields[7] = (uint64_t)s->last_progress_ns;
}
%}
%inline %{
int kvx_go_peer_state(char *out_backend, char *out_path, char *out_reason, uint64_t *out_fields,
                      kvx_transport *t, const char *peer_id) {
    kvx_peer_state s;
    int rc;
    memset(&s, 0, sizeof s);
    rc = kvx_get_peer_state(t, peer_id, &s);
    if (rc == 0) kvx_go_copy_peer_state(out_backend, out_path, out_reason, out_fields, &s);
    return rc;
}
%}

/* kvx_list_peers fills kvx_peer_info structs: this wrapper copies, for cap
 * peers at most, each one's id into out_ids (KVX_PEER_ID_MAX + 1 bytes per
 * peer, NUL-terminated) and its state as kvx_go_peer_state does, into
 * out_backends, out_paths (KVX_GO_NAME_LEN bytes per peer each), out_reasons
 * (KVX_PEER_REASON_LEN bytes per peer) and out_fields
 * (KVX_GO_PEER_STATE_FIELDS uint64 per peer), and the number of peers into
 * out_n[0], also when it exceeds cap. The caller sizes the slices for cap. */
%ignore kvx_list_peers;
%ignore kvx_peer_info;
%apply char *KVX_SLICE { char *out_ids, char *out_backends, char *out_paths, char *out_reasons };
%inline %{
int kvx_go_list_peers(char *out_ids, char *out_backends, char *out_paths, char *out_reasons, uint64_t *out_fields,
                      uint64_t *out_n, kvx_transport *t, size_t cap) {
    kvx_peer_info *peers = NULL;
    size_t n = 0, i;
    int rc;
    if (cap > 0 && !(peers = (kvx_peer_info *)calloc(cap, sizeof *peers))) return KVX_ENOMEM;
    rc = kvx_list_peers(&n, t, peers, cap);
    if (rc == 0) {
        out_n[0] = n;
        for (i = 0; i < n && i < cap; i++) {
            memcpy(out_ids + i * (KVX_PEER_ID_MAX + 1), peers[i].peer_id, KVX_PEER_ID_MAX + 1);
            out_ids[i * (KVX_PEER_ID_MAX + 1) + KVX_PEER_ID_MAX] = '\0';
            kvx_go_copy_peer_state(out_backends + i * 32, out_paths + i * 32, out_reasons + i * KVX_PEER_REASON_LEN,
                                   out_fields + i * 8, &peers[i].state);
        }
    }
    free(peers);
    return rc;
}
%}

/* Logging: the handler is a cgo export (logcb.go, loghandler.go: package
 * capi's hand-written files); kvx_get_log_level and kvx_log_flush are
 * plain. */
%ignore kvx_set_log_handler;
%ignore kvx_log_record;
%ignore kvx_log_fn;

/* kvx_poll_results fills kvx_result structs (integers of two widths): this
 * wrapper copies, for cap results at most, each one's id into out_ids and its
 * status into out_status, in the C array's order, and their number into
 * out_n[0]. The caller sizes both slices for cap. */
%ignore kvx_poll_results;
%ignore kvx_result;
%apply uint64_t *KVX_SLICE { uint64_t *out_ids };
%apply int *KVX_SLICE { int *out_status };
%inline %{
int kvx_go_poll_results(uint64_t *out_ids, int *out_status, uint64_t *out_n, kvx_transport *t,
                        const char *peer_id, size_t cap) {
    kvx_result small[64], *res = small;
    size_t n = 0, i;
    int rc;
    if (cap > sizeof small / sizeof small[0] && !(res = (kvx_result *)calloc(cap, sizeof *res))) return KVX_ENOMEM;
    rc = kvx_poll_results(&n, t, peer_id, cap ? res : NULL, cap);
    if (rc == 0) {
        if (n > cap) n = cap;
        out_n[0] = n;
        for (i = 0; i < n; i++) {
            out_ids[i] = res[i].id;
            out_status[i] = res[i].status;
        }
    }
    if (res != small) free(res);
    return rc;
}
%}

%include "kvxfer.h"
