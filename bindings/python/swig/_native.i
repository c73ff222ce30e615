/*
 * kvxfer._native: the SWIG layer over include/kvxfer.h. INTERNAL: the public
 * Python API is the pure-Python package kvxfer (kvxfer/_transport.py), which
 * validates arguments before calling in here. This layer is still memory-safe
 * on its own: every pointer it hands to C comes from a buffer it holds for the
 * duration of the call (or, for the region, until close/dealloc).
 *
 * Conventions of this module (differ from SWIG defaults on purpose):
 *  - Functions returning int return a tuple (rc, out...) when the C function
 *    has out-parameters, else the int rc. On rc < 0 the caller reads
 *    kvx_last_error_message() right away (same OS thread: the wrappers only
 *    release the GIL around the C call itself).
 *  - A transport is a PyCapsule ("kvxfer.transport") owning a kvx_transport
 *    and the Py_buffer of its region. kvxpy_close() closes the transport and
 *    releases the buffer; the capsule's destructor destroys the transport
 *    (and releases the buffer if close was never called). Because every call
 *    holds a reference to the capsule, kvx_transport_destroy() is always the
 *    last call on the handle, as the C contract requires.
 *  - Index arrays are objects exporting a C-contiguous buffer of 8-byte
 *    unsigned items (array.array('Q'), numpy uint64); kvxfer._transport
 *    converts Python sequences to those.
 *  - Built with -threads: the GIL is released around every C call.
 */
%module(package="kvxfer") _native

%{
#define PY_SSIZE_T_CLEAN
#include <string.h>
#include <unistd.h>
#include <kvxfer.h>

#define KVXPY_CAPSULE "kvxfer.transport"

typedef struct kvxpy_handle {
    kvx_transport *t;
    Py_buffer view; /* the region, held (exported) while has_view */
    int has_view;
    pid_t pid;      /* creator: a fork()ed child has the memory but not the backend threads */
} kvxpy_handle;

/* Result tuples: SWIG's AppendOutput builds lists; we want (rc, a, b). */
static PyObject *kvxpy_append(PyObject *result, PyObject *obj) {
    PyObject *t;
    if (!obj) { Py_XDECREF(result); return NULL; }
    if (!result) return obj;
    if (!PyTuple_Check(result)) {
        t = PyTuple_Pack(2, result, obj);
        Py_DECREF(result);
        Py_DECREF(obj);
        return t;
    }
    {
        Py_ssize_t n = PyTuple_GET_SIZE(result), i;
        t = PyTuple_New(n + 1);
        if (!t) { Py_DECREF(result); Py_DECREF(obj); return NULL; }
        for (i = 0; i < n; i++) {
            PyObject *x = PyTuple_GET_ITEM(result, i);
            Py_INCREF(x);
            PyTuple_SET_ITEM(t, i, x);
        }
        PyTuple_SET_ITEM(t, n, obj);
        Py_DECREF(result);
        return t;
    }
}

/* A C-contiguous buffer of 8-byte unsigned integers (1-D or 0 items). */
static int kvxpy_u64_buffer(PyObject *o, Py_buffer *b, int writable, const char *what) {
    const char *f;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) != 0) return -1;
    f = b->format ? b->format : "B";
    while (*f == '@' || *f == '=' || *f == '<') f++;
    if (b->ndim > 1 || b->itemsize != 8 || !((f[0] == 'Q' || f[0] == 'L') && f[1] == '\0')) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected a contiguous buffer of uint64 (format 'Q'), got format '%s', itemsize %zd, ndim %d",
                     what, b->format ? b->format : "B", b->itemsize, b->ndim);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* An index array as uint64: a 1-D C-contiguous buffer of 4- or 8-byte
 * integers (numpy int32/int64/uint64/uint32, array.array, memoryview). 8-byte
 * items are used in place; 4-byte ones are widened into *tmp (PyMem, the
 * caller frees it). 1 (and no Python error) when o is no such buffer or holds
 * a negative value; 0 with *b to release; -1 on a Python error. */
static int kvxpy_idx_buffer(PyObject *o, Py_buffer *b, const uint64_t **out, size_t *n, uint64_t **tmp) {
    const char *f;
    int is_signed;
    size_t i;
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyErr_Clear();
        return 1;
    }
    f = b->format ? b->format : "B";
    while (*f == '@' || *f == '=' || *f == '<') f++;
    is_signed = f[0] == 'q' || f[0] == 'l' || f[0] == 'i';
    if (b->ndim != 1 || f[1] != '\0' || !strchr("qlQLiI", f[0]) || (b->itemsize != 8 && b->itemsize != 4)) {
        PyBuffer_Release(b);
        return 1;
    }
    *n = (size_t)(b->len / b->itemsize);
    if (b->itemsize == 8) {
        const int64_t *v = (const int64_t *)b->buf;
        for (i = 0; is_signed && i < *n; i++)
            if (v[i] < 0) { PyBuffer_Release(b); return 1; }
        *out = (const uint64_t *)b->buf;
        return 0;
    }
    if (!(*tmp = (uint64_t *)PyMem_Malloc(*n ? *n * 8 : 1))) { PyBuffer_Release(b); PyErr_NoMemory(); return -1; }
    for (i = 0; i < *n; i++) {
        int64_t x = is_signed ? (int64_t)((const int32_t *)b->buf)[i] : (int64_t)((const uint32_t *)b->buf)[i];
        if (x < 0) { PyBuffer_Release(b); return 1; }  /* *tmp: freed by the caller */
        (*tmp)[i] = (uint64_t)x;
    }
    *out = *tmp;
    return 0;
}

static void kvxpy_capsule_free(PyObject *capsule) {
    kvxpy_handle *h = (kvxpy_handle *)PyCapsule_GetPointer(capsule, KVXPY_CAPSULE);
    if (!h) { PyErr_Clear(); return; }
    if (h->t && h->pid != getpid()) {
        /* A fork()ed copy: the backend threads and sockets belong to the
         * parent. Destroying would join threads that do not exist here;
         * leave the copied state alone (the process image dies with it). */
        h->t = NULL;
    }
    if (h->t) {
        kvx_transport *t = h->t;
        h->t = NULL;
        Py_BEGIN_ALLOW_THREADS
        kvx_transport_destroy(t); /* joins backend threads: no byte lands afterwards */
        Py_END_ALLOW_THREADS
    }
    if (h->has_view) {
        h->has_view = 0;
        PyBuffer_Release(&h->view);
    }
    PyMem_Free(h);
}

/* any_process: also accept a handle inherited through fork() (close and
 * inspection only; every C call is refused there). */
static kvxpy_handle *kvxpy_from_capsule(PyObject *o, int any_process) {
    kvxpy_handle *h;
    if (!PyCapsule_IsValid(o, KVXPY_CAPSULE)) {
        PyErr_SetString(PyExc_TypeError, "expected a kvxfer transport handle");
        return NULL;
    }
    h = (kvxpy_handle *)PyCapsule_GetPointer(o, KVXPY_CAPSULE);
    if (h && !h->t) {
        PyErr_SetString(PyExc_ValueError, "kvxfer transport handle was destroyed");
        return NULL;
    }
    if (h && !any_process && h->pid != getpid()) {
        PyErr_Format(PyExc_RuntimeError, "kvxfer transport was created by process %ld; it cannot be used in a "
                     "fork()ed child (create a new transport there)", (long)h->pid);
        return NULL;
    }
    return h;
}
%}

%include <stdint.i>

/* ------------------------------------------------------------ typemaps */

/* The transport handle (a capsule) wherever the C API takes a kvx_transport. */
%typemap(in) kvx_transport *, const kvx_transport * {
    kvxpy_handle *h_ = kvxpy_from_capsule($input, 0);
    if (!h_) SWIG_fail;
    $1 = h_->t;
}

/* Out-parameters -> extra tuple items. */
%typemap(in, numinputs=0) uint64_t *out (uint64_t tmp = 0) { $1 = &tmp; }
%typemap(argout) uint64_t *out { $result = kvxpy_append($result, PyLong_FromUnsignedLongLong((unsigned long long)*$1)); if (!$result) SWIG_fail; }
%apply uint64_t *out { uint64_t *out_id, uint64_t *out_reg };

%typemap(in, numinputs=0) int *out_state (int tmp = 0) { $1 = &tmp; }
%typemap(argout) int *out_state { $result = kvxpy_append($result, PyLong_FromLong(*$1)); if (!$result) SWIG_fail; }
%apply int *out_state { int *out_error, int *out_fd };

%typemap(in, numinputs=0) size_t *out_len (size_t tmp = 0) { $1 = &tmp; }
%typemap(argout) size_t *out_len { $result = kvxpy_append($result, PyLong_FromSize_t(*$1)); if (!$result) SWIG_fail; }
%apply size_t *out_len { size_t *out_n_done, size_t *out_n_failed, size_t *out_n_inflight, size_t *out_ready };

%typemap(in, numinputs=0) char *out (char tmp[KVX_FINGERPRINT_LEN + 1]) { tmp[0] = '\0'; $1 = tmp; }
%typemap(argout) char *out { $result = kvxpy_append($result, PyUnicode_FromString($1)); if (!$result) SWIG_fail; }

/* Static strings (kvx_peer_backend): each a str item. */
%typemap(in, numinputs=0) const char **out (const char *tmp = "") { $1 = &tmp; }
%typemap(argout) const char **out { $result = kvxpy_append($result, PyUnicode_FromString(*$1)); if (!$result) SWIG_fail; }
%apply const char **out { const char **out_path };

%typemap(in, numinputs=0) kvx_options **out (kvx_options *tmp = NULL) { $1 = &tmp; }
%typemap(argout) kvx_options **out {
    $result = kvxpy_append($result, *$1 ? SWIG_NewPointerObj(*$1, $*1_descriptor, 0) : (Py_INCREF(Py_None), Py_None));
    if (!$result) SWIG_fail;
}

/* Read-only bytes-like input (agent metadata). */
%typemap(in) (const void *metadata, size_t metadata_len) (Py_buffer view, int have = 0) {
    if (PyObject_GetBuffer($input, &view, PyBUF_SIMPLE) != 0) SWIG_fail;
    have = 1;
    $1 = view.buf;
    $2 = (size_t)view.len;
}
%typemap(freearg) (const void *metadata, size_t metadata_len) { if (have$argnum) PyBuffer_Release(&view$argnum); }

/* Writable byte buffer or None (size query). */
%typemap(in) (void *buf, size_t cap) (Py_buffer view, int have = 0) {
    if ($input == Py_None) {
        $1 = NULL;
        $2 = 0;
    } else {
        if (PyObject_GetBuffer($input, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) SWIG_fail;
        have = 1;
        $1 = view.buf;
        $2 = (size_t)view.len;
    }
}
%typemap(freearg) (void *buf, size_t cap) { if (have$argnum) PyBuffer_Release(&view$argnum); }

/* uint64 index arrays: (pointer, count) from one buffer object. */
%typemap(in) (const uint64_t *IDX_IN, size_t IDX_N) (Py_buffer view, int have = 0) {
    if (kvxpy_u64_buffer($input, &view, 0, "$1_name") != 0) SWIG_fail;
    have = 1;
    $1 = ($1_ltype)view.buf;
    $2 = (size_t)(view.len / 8);
}
%typemap(freearg) (const uint64_t *IDX_IN, size_t IDX_N) { if (have$argnum) PyBuffer_Release(&view$argnum); }

%typemap(in) (uint64_t *IDX_OUT, size_t IDX_CAP) (Py_buffer view, int have = 0) {
    if ($input == Py_None) {
        $1 = NULL;
        $2 = 0;
    } else {
        if (kvxpy_u64_buffer($input, &view, 1, "$1_name") != 0) SWIG_fail;
        have = 1;
        $1 = ($1_ltype)view.buf;
        $2 = (size_t)(view.len / 8);
    }
}
%typemap(freearg) (uint64_t *IDX_OUT, size_t IDX_CAP) { if (have$argnum) PyBuffer_Release(&view$argnum); }

%apply (const uint64_t *IDX_IN, size_t IDX_N) {
    (const uint64_t *local_idxs, size_t n_local),
    (const uint64_t *remote_idxs, size_t n_remote),
    (const uint64_t *ids, size_t n)
};
%apply (uint64_t *IDX_OUT, size_t IDX_CAP) {
    (uint64_t *done, size_t done_cap),
    (uint64_t *failed, size_t failed_cap),
    (uint64_t *inflight, size_t inflight_cap)
};

/* ------------------------------------------------------------ the C API */

/* Replaced below by kvxpy_* functions that keep the region's buffer and check
 * array lengths; kvx_transport_destroy only runs from the capsule destructor. */
%ignore kvx_transport_create;
%ignore kvx_transport_destroy;
%ignore kvx_transport_close;
%ignore kvx_write_blocks;
%ignore kvx_cancel;
/* kvxpy_stats() returns a dict instead of the caller-sized struct. */
%ignore kvx_get_stats;
%ignore kvx_stats;
/* kvxpy_peer_rails() returns a list of dicts instead of the caller's array. */
%ignore kvx_peer_rails;
%ignore kvx_rail_stats;
/* kvxpy_peer_state() returns a dict instead of filling the caller's struct
 * (its backend and path are static C strings). */
%ignore kvx_get_peer_state;
%ignore kvx_peer_state;
/* kvxpy_poll_results() returns two lists (ids, statuses) instead of filling
 * the caller's array of kvx_result. */
%ignore kvx_poll_results;
%ignore kvx_result;
/* kvxpy_list_peers() returns a list of (peer_id, state dict) instead of
 * filling the caller's array; kvxpy_metrics_text() a str. */
%ignore kvx_list_peers;
%ignore kvx_peer_info;
%ignore kvx_metrics_text;
/* kvxpy_set_log_handler() takes a Python callable (kvxfer/_log.py); the
 * library calls it through kvxpy_log_trampoline. */
%ignore kvx_set_log_handler;
%ignore kvx_log_record;
%ignore kvx_log_fn;
/* Raw memory has no safe Python owner here; Python regions are buffers
 * (an mmap of a /dev/shm file takes the shm backend's mapped path). */
%ignore kvx_region_alloc;
%ignore kvx_region_free;

#define KVX_API
%include "kvxfer.h"

/* ------------------------------------------------------------ helpers */

/* These touch Python objects, so SWIG must not release the GIL around them;
 * they release it themselves around the blocking C calls. */
%nothread kvxpy_open;
%nothread kvxpy_close;
%nothread kvxpy_holds_region;
%nothread kvxpy_stats;
%nothread kvxpy_peer_rails;
%nothread kvxpy_peer_state;
%nothread kvxpy_poll_results;
%nothread kvxpy_list_peers;
%nothread kvxpy_metrics_text;
%nothread kvxpy_set_log_handler;
/* Never blocks (it only checks and queues), so the GIL stays with the
 * caller: no hand-off to another thread in the middle of a call that
 * vLLM's scheduler makes on its hot path. */
%nothread kvx_add_remote_peer_async;
%nothread kvxpy_write_blocks_buf;

/* kvxpy_write_blocks_buf's answer "not for me": the wrapper's general path
 * converts the arguments (or explains what is wrong with them). */
%constant int KVXPY_FALLBACK = 1;

%{
/* d[key] = v, stealing v; -1 (and a Python error) on failure. */
static int kvxpy_set_item(PyObject *d, const char *key, PyObject *v) {
    int rc = v ? PyDict_SetItemString(d, key, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* One kvx_rail_stats as a dict: name (str), up (bool), bytes, parts,
 * failures, changed_ns (the reserved fields are left out). */
static PyObject *kvxpy_rail_dict(const kvx_rail_stats *r) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (kvxpy_set_item(d, "name", PyUnicode_DecodeUTF8(r->name, (Py_ssize_t)strnlen(r->name, sizeof r->name),
                                                       "replace")) != 0 ||
        kvxpy_set_item(d, "up", PyBool_FromLong(r->up != 0)) != 0 ||
        kvxpy_set_item(d, "bytes", PyLong_FromUnsignedLongLong(r->bytes)) != 0 ||
        kvxpy_set_item(d, "parts", PyLong_FromUnsignedLongLong(r->parts)) != 0 ||
        kvxpy_set_item(d, "failures", PyLong_FromUnsignedLong(r->failures)) != 0 ||
        kvxpy_set_item(d, "changed_ns", PyLong_FromLongLong(r->changed_ns)) != 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* A kvx_peer_state as a dict: link, error (the KVX_E* code, 0 while it never
 * failed), backend and path (str), in_flight, since_ns, next_attempt_ns,
 * reconnects, attempts, reason (str), last_progress_ns (the reserved fields
 * are left out). */
static PyObject *kvxpy_peer_state_dict(const kvx_peer_state *s) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (kvxpy_set_item(d, "link", PyLong_FromLong(s->link)) != 0 ||
        kvxpy_set_item(d, "error", PyLong_FromLong(s->error)) != 0 ||
        kvxpy_set_item(d, "backend", PyUnicode_FromString(s->backend ? s->backend : "")) != 0 ||
        kvxpy_set_item(d, "path", PyUnicode_FromString(s->path ? s->path : "")) != 0 ||
        kvxpy_set_item(d, "in_flight", PyLong_FromUnsignedLongLong(s->in_flight)) != 0 ||
        kvxpy_set_item(d, "since_ns", PyLong_FromLongLong(s->since_ns)) != 0 ||
        kvxpy_set_item(d, "next_attempt_ns", PyLong_FromLongLong(s->next_attempt_ns)) != 0 ||
        kvxpy_set_item(d, "reconnects", PyLong_FromUnsignedLong(s->reconnects)) != 0 ||
        kvxpy_set_item(d, "attempts", PyLong_FromUnsignedLong(s->attempts)) != 0 ||
        kvxpy_set_item(d, "reason", PyUnicode_DecodeUTF8(s->reason, (Py_ssize_t)strnlen(s->reason, sizeof s->reason),
                                                         "replace")) != 0 ||
        kvxpy_set_item(d, "last_progress_ns", PyLong_FromLongLong(s->last_progress_ns)) != 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
%}

%inline %{
/* Acquire the region's buffer (writable, C-contiguous, held until close) and
 * create a transport over its first num_blocks * block_len bytes.
 * Returns (rc, handle or None); raises BufferError/TypeError/ValueError when
 * the object cannot lend such a buffer or is too small. */
PyObject *kvxpy_open(PyObject *region, uint64_t num_blocks, uint64_t block_len, const char *config_json,
                     const kvx_options *opts) {
    kvxpy_handle *h;
    PyObject *cap;
    int rc;
    h = (kvxpy_handle *)PyMem_Calloc(1, sizeof *h);
    if (!h) return PyErr_NoMemory();
    if (PyObject_GetBuffer(region, &h->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyMem_Free(h);
        return NULL;
    }
    h->has_view = 1;
    h->pid = getpid();
    if (num_blocks == 0 || block_len == 0 || num_blocks > (uint64_t)PY_SSIZE_T_MAX / block_len ||
        (Py_ssize_t)(num_blocks * block_len) > h->view.len) {
        PyErr_Format(PyExc_ValueError, "region of %zd bytes cannot hold %llu blocks of %llu bytes", h->view.len,
                     (unsigned long long)num_blocks, (unsigned long long)block_len);
        PyBuffer_Release(&h->view);
        PyMem_Free(h);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = kvx_transport_create(&h->t, h->view.buf, num_blocks, block_len, config_json, opts);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyBuffer_Release(&h->view);
        PyMem_Free(h);
        return Py_BuildValue("(iO)", rc, Py_None);
    }
    cap = PyCapsule_New(h, KVXPY_CAPSULE, kvxpy_capsule_free);
    if (!cap) {
        Py_BEGIN_ALLOW_THREADS
        kvx_transport_destroy(h->t);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&h->view);
        PyMem_Free(h);
        return NULL;
    }
    return Py_BuildValue("(iN)", 0, cap);
}

/* Close the transport (kvx_transport_close: afterwards kvxfer never touches
 * the region again), then release the region's buffer. Idempotent. The handle
 * stays valid: later calls on it return KVX_ECLOSED. Returns the close rc.
 * In a fork()ed child only the buffer is released (the transport is the
 * parent's). */
PyObject *kvxpy_close(PyObject *handle) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 1);
    kvx_transport *t;
    int rc = 0;
    if (!h) return NULL;
    t = h->t;
    if (h->pid == getpid()) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvx_transport_close(t);
        Py_END_ALLOW_THREADS
    }
    if (rc == 0 && h->has_view) {
        h->has_view = 0;
        PyBuffer_Release(&h->view);
    }
    return PyLong_FromLong(rc);
}

/* True while the handle holds its region's buffer (until close/dealloc). */
PyObject *kvxpy_holds_region(PyObject *handle) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 1);
    if (!h) return NULL;
    return PyBool_FromLong(h->has_view);
}

/* kvx_write_blocks with one (pointer, length) per index array: lengths must
 * agree (else KVX_EINVAL without calling C; the Python layer checks first). */
int kvxpy_write_blocks(uint64_t *out_id, kvx_transport *t, const char *peer_id, const uint64_t *local_idxs,
                       size_t n_local, const uint64_t *remote_idxs, size_t n_remote) {
    if (n_local != n_remote) return KVX_EINVAL;
    return kvx_write_blocks(out_id, t, peer_id, local_idxs, remote_idxs, n_local);
}

/* kvx_write_blocks straight from two index arrays of 4- or 8-byte integers
 * (see kvxpy_idx_buffer): no Python int per index, 8-byte arrays without a
 * copy, the GIL released only around the C call. (rc, id), or
 * (KVXPY_FALLBACK, 0) when an argument is no such array, holds a negative
 * value, or the lengths differ. */
PyObject *kvxpy_write_blocks_buf(PyObject *handle, const char *peer_id, PyObject *local, PyObject *remote) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    Py_buffer lb, rb;
    const uint64_t *lp = NULL, *rp = NULL;
    uint64_t *ltmp = NULL, *rtmp = NULL, id = 0;
    size_t ln = 0, rn = 0;
    int lrc, rrc = 1, rc = 1;
    if (!h) return NULL;
    lrc = kvxpy_idx_buffer(local, &lb, &lp, &ln, &ltmp);
    if (lrc == 0) rrc = kvxpy_idx_buffer(remote, &rb, &rp, &rn, &rtmp);
    if (lrc == 0 && rrc == 0 && ln == rn) {
        kvx_transport *t = h->t;
        Py_BEGIN_ALLOW_THREADS
        rc = kvx_write_blocks(&id, t, peer_id, lp, rp, ln);
        Py_END_ALLOW_THREADS
    }
    if (rrc == 0) PyBuffer_Release(&rb);
    if (lrc == 0) PyBuffer_Release(&lb);
    PyMem_Free(ltmp);
    PyMem_Free(rtmp);
    if (lrc < 0 || rrc < 0) return NULL;
    return Py_BuildValue("(iK)", rc, (unsigned long long)id);
}

/* kvx_cancel with the inflight array's capacity: too small an array (or None)
 * for KVX_CANCEL_WAIT is passed as NULL, which the C library rejects. */
int kvxpy_cancel(size_t *out_n_inflight, kvx_transport *t, const uint64_t *ids, size_t n, int mode,
                 uint64_t *inflight, size_t inflight_cap) {
    if (inflight_cap < n) inflight = NULL;
    return kvx_cancel(out_n_inflight, t, ids, n, mode, inflight);
}

/* kvx_get_stats as (rc, dict or None): every scalar field of kvx_stats by
 * its C name, and "latency_buckets", a tuple of the histogram's counts. */
PyObject *kvxpy_stats(PyObject *handle, const char *peer_id) {
    static const struct { const char *name; size_t off; } fields[] = {
#define KVXPY_FIELD(f) {#f, offsetof(kvx_stats, f)}
        KVXPY_FIELD(transfers_done), KVXPY_FIELD(transfers_failed), KVXPY_FIELD(transfers_cancelled),
        KVXPY_FIELD(bytes_done), KVXPY_FIELD(bytes_failed), KVXPY_FIELD(bytes_cancelled),
        KVXPY_FIELD(transfers_inflight), KVXPY_FIELD(bytes_inflight), KVXPY_FIELD(peers),
        KVXPY_FIELD(peers_connecting), KVXPY_FIELD(connects), KVXPY_FIELD(connect_failures),
        KVXPY_FIELD(connect_ns_total), KVXPY_FIELD(connect_ns_max), KVXPY_FIELD(connect_ns_last),
        KVXPY_FIELD(latency_count), KVXPY_FIELD(latency_ns_p50), KVXPY_FIELD(latency_ns_p90),
        KVXPY_FIELD(latency_ns_p99), KVXPY_FIELD(latency_ns_p999), KVXPY_FIELD(latency_ns_max),
        KVXPY_FIELD(transfers_failed_timeout), KVXPY_FIELD(transfers_failed_connection),
        KVXPY_FIELD(transfers_failed_removed), KVXPY_FIELD(transfers_failed_other), KVXPY_FIELD(latency_ns_sum),
#undef KVXPY_FIELD
    };
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_stats s = KVX_STATS_INIT;
    PyObject *d, *b;
    size_t i;
    int rc;
    if (!h) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = kvx_get_stats(&s, h->t, peer_id);
    Py_END_ALLOW_THREADS
    if (rc != 0) return Py_BuildValue("(iO)", rc, Py_None);
    if (!(d = PyDict_New())) return NULL;
    for (i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(*(const uint64_t *)((const char *)&s + fields[i].off));
        if (!v || PyDict_SetItemString(d, fields[i].name, v) != 0) { Py_XDECREF(v); Py_DECREF(d); return NULL; }
        Py_DECREF(v);
    }
    if (!(b = PyTuple_New(KVX_STATS_LATENCY_BUCKETS))) { Py_DECREF(d); return NULL; }
    for (i = 0; i < KVX_STATS_LATENCY_BUCKETS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(s.latency_buckets[i]);
        if (!v) { Py_DECREF(b); Py_DECREF(d); return NULL; }
        PyTuple_SET_ITEM(b, i, v);
    }
    if (PyDict_SetItemString(d, "latency_buckets", b) != 0) { Py_DECREF(b); Py_DECREF(d); return NULL; }
    Py_DECREF(b);
    return Py_BuildValue("(iN)", 0, d);
}

/* kvx_peer_rails as (rc, list of dicts (kvxpy_rail_dict) or None), in rail
 * order: asks for the count, then for that many (again if the peer was
 * replaced in between with more rails). */
PyObject *kvxpy_peer_rails(PyObject *handle, const char *peer_id) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_rail_stats *rails = NULL;
    size_t cap = 0, n = 0, i;
    PyObject *list;
    int rc;
    if (!h) return NULL;
    for (;;) {
        kvx_transport *t = h->t;
        Py_BEGIN_ALLOW_THREADS
        rc = kvx_peer_rails(t, peer_id, rails, cap, &n);
        Py_END_ALLOW_THREADS
        if (rc != 0 || n <= cap) break;
        PyMem_Free(rails);
        cap = n;
        if (!(rails = (kvx_rail_stats *)PyMem_Malloc(cap * sizeof *rails))) return PyErr_NoMemory();
    }
    if (rc != 0) { PyMem_Free(rails); return Py_BuildValue("(iO)", rc, Py_None); }
    if (!(list = PyList_New((Py_ssize_t)n))) { PyMem_Free(rails); return NULL; }
    for (i = 0; i < n; i++) {
        PyObject *d = kvxpy_rail_dict(&rails[i]);
        if (!d) { Py_DECREF(list); PyMem_Free(rails); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    PyMem_Free(rails);
    return Py_BuildValue("(iN)", 0, list);
}

/* kvx_poll_results as (rc, ids, statuses): two lists of ints of the same
 * length, one entry per finished transfer in the order of the C array
 * (status 0: done, else the KVX_E* code of why it failed), at most cap
 * entries (what does not fit stays for the next call: loop while the lists
 * hold cap entries); (rc, None, None) on failure. */
PyObject *kvxpy_poll_results(PyObject *handle, const char *peer_id, size_t cap) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_result small[64], *out = small;
    kvx_transport *t;
    PyObject *ids = NULL, *st = NULL;
    size_t n = 0, i;
    int rc;
    if (!h) return NULL;
    t = h->t;
    if (cap > sizeof small / sizeof small[0]) {
        if (cap > (size_t)PY_SSIZE_T_MAX / sizeof *out) {
            PyErr_Format(PyExc_OverflowError, "cap %zu is too large", cap);
            return NULL;
        }
        if (!(out = (kvx_result *)PyMem_Malloc(cap * sizeof *out))) return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    rc = kvx_poll_results(&n, t, peer_id, cap ? out : NULL, cap);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        if (out != small) PyMem_Free(out);
        return Py_BuildValue("(iOO)", rc, Py_None, Py_None);
    }
    if (n > cap) n = cap;
    if (!(ids = PyList_New((Py_ssize_t)n)) || !(st = PyList_New((Py_ssize_t)n))) goto fail;
    for (i = 0; i < n; i++) {
        PyObject *a = PyLong_FromUnsignedLongLong((unsigned long long)out[i].id);
        PyObject *b = a ? PyLong_FromLong((long)out[i].status) : NULL;
        if (!b) { Py_XDECREF(a); goto fail; }
        PyList_SET_ITEM(ids, (Py_ssize_t)i, a);
        PyList_SET_ITEM(st, (Py_ssize_t)i, b);
    }
    if (out != small) PyMem_Free(out);
    return Py_BuildValue("(iNN)", 0, ids, st);
fail:
    /* the ids taken from C are lost: only an out-of-memory gets here */
    Py_XDECREF(ids);
    Py_XDECREF(st);
    if (out != small) PyMem_Free(out);
    return NULL;
}

/* kvx_get_peer_state as (rc, dict (kvxpy_peer_state_dict) or None). */
PyObject *kvxpy_peer_state(PyObject *handle, const char *peer_id) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_transport *t;
    kvx_peer_state s;
    PyObject *d;
    int rc;
    if (!h) return NULL;
    t = h->t;
    memset(&s, 0, sizeof s);
    Py_BEGIN_ALLOW_THREADS
    rc = kvx_get_peer_state(t, peer_id, &s);
    Py_END_ALLOW_THREADS
    if (rc != 0) return Py_BuildValue("(iO)", rc, Py_None);
    if (!(d = kvxpy_peer_state_dict(&s))) return NULL;
    return Py_BuildValue("(iN)", 0, d);
}

/* kvx_list_peers as (rc, list of (peer_id, state dict (kvxpy_peer_state_dict))
 * or None), sorted by id as the library gives them: asks with room for the
 * last count plus some, again with more while the list grows meanwhile. */
PyObject *kvxpy_list_peers(PyObject *handle) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_peer_info *out = NULL;
    size_t cap = 0, n = 0, i;
    PyObject *list;
    int rc;
    if (!h) return NULL;
    for (;;) {
        kvx_transport *t = h->t;
        Py_BEGIN_ALLOW_THREADS
        rc = kvx_list_peers(&n, t, out, cap);
        Py_END_ALLOW_THREADS
        if (rc != 0 || n <= cap) break;
        PyMem_Free(out);
        if (n > (size_t)PY_SSIZE_T_MAX / sizeof *out - 16) { PyErr_NoMemory(); return NULL; }
        cap = n + 16; /* a few more: peers may be added before the next call */
        if (!(out = (kvx_peer_info *)PyMem_Calloc(cap, sizeof *out))) return PyErr_NoMemory();
    }
    if (rc != 0) { PyMem_Free(out); return Py_BuildValue("(iO)", rc, Py_None); }
    if (!(list = PyList_New((Py_ssize_t)n))) { PyMem_Free(out); return NULL; }
    for (i = 0; i < n; i++) {
        const kvx_peer_info *p = &out[i];
        PyObject *d = kvxpy_peer_state_dict(&p->state), *item;
        PyObject *id = d ? PyUnicode_DecodeUTF8(p->peer_id, (Py_ssize_t)strnlen(p->peer_id, sizeof p->peer_id),
                                                "replace") : NULL;
        item = id ? PyTuple_Pack(2, id, d) : NULL;
        Py_XDECREF(id);
        Py_XDECREF(d);
        if (!item) { Py_DECREF(list); PyMem_Free(out); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    PyMem_Free(out);
    return Py_BuildValue("(iN)", 0, list);
}

/* kvx_metrics_text as (rc, str or None): asks for the size, then with room
 * for it plus some, again while the text grows meanwhile (KVX_ENOBUFS). */
PyObject *kvxpy_metrics_text(PyObject *handle) {
    kvxpy_handle *h = kvxpy_from_capsule(handle, 0);
    kvx_transport *t;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    PyObject *text;
    int rc;
    if (!h) return NULL;
    t = h->t;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        rc = kvx_metrics_text(&len, t, buf, cap);
        Py_END_ALLOW_THREADS
        if (rc != KVX_ENOBUFS) break;
        PyMem_Free(buf);
        if (len > (size_t)PY_SSIZE_T_MAX - 4096) { PyErr_NoMemory(); return NULL; }
        cap = len + len / 8 + 1024; /* the text may grow before the next call */
        if (!(buf = (char *)PyMem_Malloc(cap))) return PyErr_NoMemory();
    }
    if (rc != 0 || !buf) {
        PyMem_Free(buf);
        return Py_BuildValue("(iO)", rc ? rc : KVX_EINTERNAL, Py_None);
    }
    text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strnlen(buf, cap), "replace");
    PyMem_Free(buf);
    if (!text) return NULL;
    return Py_BuildValue("(iN)", 0, text);
}
%}

%{
/* ------------------------------------------------------------ logging */

/* The Python callable the library's log records go to (kvxfer/_log.py), or
 * NULL. Read and changed with the GIL held only. */
static PyObject *kvxpy_log_callable = NULL;

static PyObject *kvxpy_log_str(const char *s) {
    if (!s) { Py_INCREF(Py_None); return Py_None; }
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* Whether the interpreter is shutting down: the GIL must not be taken then
 * (a thread that tries is ended). kvxfer/_log.py unsets the handler at exit,
 * before that; this is the guard for what it cannot see (os._exit aside). */
static int kvxpy_finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* The kvx_log_fn: on the library's log thread, with no library lock held.
 * Calls the callable with (level, message, component, peer_id or None,
 * time_ns, suppressed, dropped, thread_id); reads only the fields the
 * library's record has (record->size). */
static void kvxpy_log_trampoline(const kvx_log_record *r, void *user) {
    PyGILState_STATE g;
    PyObject *fn, *res = NULL;
    int has_tail;
    (void)user;
    if (!Py_IsInitialized() || kvxpy_finalizing()) return;
    g = PyGILState_Ensure();
    fn = kvxpy_log_callable;
    if (fn) {
        Py_INCREF(fn);
        has_tail = r->size >= offsetof(kvx_log_record, thread_id) + sizeof r->thread_id;
        res = PyObject_CallFunction(fn, "(iNNNLKKi)", (int)r->level, kvxpy_log_str(r->message),
                                    kvxpy_log_str(r->component), kvxpy_log_str(r->peer_id),
                                    (long long)r->time_ns, (unsigned long long)(has_tail ? r->suppressed : 0),
                                    (unsigned long long)(has_tail ? r->dropped : 0), has_tail ? (int)r->thread_id : 0);
        if (!res) PyErr_WriteUnraisable(fn);
        Py_XDECREF(res);
        Py_DECREF(fn);
    }
    PyGILState_Release(g);
}
%}

%inline %{
/* kvx_set_log_handler with a Python callable (see kvxpy_log_trampoline), or
 * None: back to the library's stderr lines. Returns the rc. The GIL is
 * released while the library waits for a handler call in progress (which
 * needs the GIL). A callable replaces the previous one at once (records
 * waiting for it go to the new one); None takes effect when the library
 * returns, and the previous callable is released afterwards. */
PyObject *kvxpy_set_log_handler(PyObject *fn, int level) {
    PyObject *old = NULL;
    int rc;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the log handler must be callable or None");
        return NULL;
    }
    if (fn != Py_None) {
        Py_INCREF(fn);
        old = kvxpy_log_callable;
        kvxpy_log_callable = fn;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = kvx_set_log_handler(fn != Py_None ? kvxpy_log_trampoline : NULL, NULL, level);
    Py_END_ALLOW_THREADS
    if (fn == Py_None) {
        if (rc == 0) {
            old = kvxpy_log_callable;
            kvxpy_log_callable = NULL;
        }
    } else if (rc != 0) {  /* not installed: the previous one stays */
        kvxpy_log_callable = old;
        old = fn;
    }
    Py_XDECREF(old);
    return PyLong_FromLong(rc);
}
%}
