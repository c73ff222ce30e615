"""kvxfer.Transport: vLLM's DataTransport contract over libkvxfer."""

import array
import concurrent.futures
import os
import threading
import time
from typing import Iterable, NamedTuple, Optional, Sequence

from . import _native
from ._args import (_BACKENDS, _SEQUENCES, _U64_MAX, _UNORDERED, _as_u64, _c_fingerprint, _config_json, _enum_or_int,
                    _geometry, _option_items, _peer_arg, _u64_arg, config_fingerprint)
from ._errors import ArgumentError, ClosedError, Error, ErrorCode, ErrorInfo, last_error, strerror
from ._peers import PeerInfo, PeerLink, PeerState, _peer_infos, _peer_state
from ._waiters import _WAITERS_MAX, WAITER as _WAITER  # noqa: F401 (_WAITERS_MAX: for the tests)

__all__ = ["Transport", "PollResult", "Result", "PeerLink", "PeerState", "PeerInfo", "config_fingerprint",
           "CANCEL_MODES", "latency_bucket_bounds", "backends"]

_POLL_CAP = 256
_WAIT_SLICE_MS = 100  # wait(): the longest sleep in C between two looks for signals
CANCEL_MODES = {"immediate": _native.KVX_CANCEL_IMMEDIATE, "wait": _native.KVX_CANCEL_WAIT}


class PollResult(NamedTuple):
    """Result of polling inflight transfers (same fields as vLLM's PollResult).

    done: transfer ids that completed successfully (a tuple).
    failed: transfer ids that failed (error, timeout, peer removed, ...).

    A PollResult returned by Transport.poll() also has an attribute (not a
    tuple field: it still unpacks as (done, failed)) errors: a dict mapping
    each failed id to the ErrorInfo(code, message) of why it failed, as
    Transport.poll_results() says ({} when nothing failed).
    """

    done: Sequence[int]
    failed: Sequence[int]


class Result(NamedTuple):
    """A finished transfer (Transport.poll_results(), kvx_poll_results(3)).

    id: the transfer id write_blocks() returned.
    error: None when it is done (its bytes are in the peer's region), else
        the ErrorInfo(code, message) of why it failed: code ETIMEDOUT (its
        peer made no progress for transfer_timeout_ms, the stall timeout),
        ECONNRESET (its peer's connection failed), ECANCELED (its peer was
        removed or replaced), or another ErrorCode (a backend's own failure,
        e.g. EPERM, EBACKEND); message is kvx_strerror of the code, plus,
        when the poll named the peer, what peer_state() says about it.
    """

    id: int
    error: Optional[ErrorInfo]


# Why a transfer failed, by its status (kvx_result), for logs (kvxfer.vllm).
_FAILURE_CAUSES = {
    _native.KVX_ETIMEDOUT: "the peer made no progress for transfer_timeout_ms, the stall timeout",
    _native.KVX_ECONNRESET: "the peer's connection failed: reset, its process or host gone",
    _native.KVX_ECANCELED: "the peer was removed or replaced",
}

_POLL_RESULT_TYPES = {}  # PollResult class (kvxfer's or vLLM's) -> its subclass with errors


def _poll_result(done, failed, errors):
    """PollResult(done, failed) with the attribute errors. PollResult is
    vLLM's when kvxfer registered with it (kvxfer/__init__.py rebinds the
    name here), a NamedTuple either way, whose instances take no attributes:
    they are instances of a subclass that does (no __slots__), named alike,
    which pickles and copies as the plain PollResult (without errors)."""
    base = PollResult
    cls = _POLL_RESULT_TYPES.get(base)
    if cls is None:
        def __reduce__(self):
            return base, (self.done, self.failed)
        cls = type(base.__name__, (base,), {"__doc__": base.__doc__, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__, "__reduce__": __reduce__})
        cls = _POLL_RESULT_TYPES.setdefault(base, cls)
    r = cls(done, failed)
    r.errors = errors
    return r


def latency_bucket_bounds(i: int) -> tuple:
    """(lo_ns, hi_ns) of bucket i of the latency histogram (kvx_get_stats(3)),
    from the library (kvx_stats_bucket_lower_ns(3)); hi_ns is None for the
    last bucket, which has no upper bound."""
    if not 0 <= i < _native.KVX_STATS_LATENCY_BUCKETS:
        raise IndexError("latency bucket %d is not in 0..%d" % (i, _native.KVX_STATS_LATENCY_BUCKETS - 1))
    lo = _native.kvx_stats_bucket_lower_ns(i)
    return lo, (_native.kvx_stats_bucket_lower_ns(i + 1) if i + 1 < _native.KVX_STATS_LATENCY_BUCKETS else None)


def backends() -> tuple:
    """Names of the backends built into the loaded library, in order of
    preference (kvx_backends(3)), e.g. ("shm", "verbs", "tcp"). Listed when
    built in, usable on this host or not; "auto" serves on the usable ones."""
    return _BACKENDS


# ------------------------------------------------------------------ Transport


class Transport:
    """A kvxfer transport over a local region of num_blocks x block_len bytes:
    a drop-in for vLLM's DataTransport
    (vllm.v1.kv_offload.tiering.p2p.data.base).

    Transport(view, config_fields=None, *, backend="auto", num_blocks=None,
              block_len=None, **options)

    view: the local KV block storage, written into by remote peers at any
        time until close(): a 2-D memoryview (num_blocks x block_len), a 2-D
        C-contiguous numpy array (block_len = shape[1] items, as vLLM's
        DataTransport says; block_len_bytes is the row size in bytes), or any
        writable C-contiguous buffer (bytearray, mmap, ...) with num_blocks=
        and/or block_len= (bytes) given. The buffer is held (not
        copied) until close(): a bytearray/mmap cannot be resized or closed
        meanwhile (BufferError).
    config_fields: dict of model config values; its fingerprint must match
        the peers'. None or {} -> "" (compatible with any peer).
    backend: "auto" (every backend usable here; each peer gets, when added,
        the first path both sides offer: shm on the same host, else verbs,
        else tcp), or a comma-separated list of backends ("shm,tcp", "tcp").
    options: C library options as keywords; the first "_" after a backend
        prefix becomes ".": tcp_listen="127.0.0.1:0" -> "tcp.listen",
        tcp_advertise=[...], tcp_streams=4, verbs_device="rxe0",
        connect_timeout_ms=5000, transfer_timeout_ms=30000. Dotted names
        work too: **{"tcp.listen": "0.0.0.0:0"}.

    Errors follow vLLM's DataTransport exactly (bindings/python/README.md has
    the table of every method x failure): add_remote_peer raises a ValueError
    (kvxfer.RequestError, ArgumentError or PeerError) for every failure
    caused by the peer or its metadata; add_remote_peer_async puts that
    exception into its future; write_blocks returns None (see last_error)
    for every problem with the peer or its indexes; remove_remote_peer of an
    unknown id does nothing. Only TypeError (and, outside those three,
    ClosedError/TransportError) is raised for the caller's own mistakes.
    Thread safety: every method may be called from several threads at once;
    the GIL is released while the C library works. A transport belongs to the
    process that created it: in a fork()ed child its methods raise
    ClosedError (close() there only releases the child's buffer).
    """

    def __init__(self, view, config_fields: Optional[dict] = None, *, backend: str = "auto",
                 num_blocks: Optional[int] = None, block_len: Optional[int] = None, **options):
        self._h = None
        self._closed = True
        self._tls = threading.local()
        nb, bl, self._unit = _geometry(view, num_blocks, block_len)
        text, expect = _config_json(config_fields)
        if text is not None:
            _c_fingerprint(text, expect)  # refuse before creating anything
        items = _option_items(backend, options)
        rc, opts = _native.kvx_options_create()
        if rc:
            raise last_error(rc)
        err = None
        try:
            for k, v in items:
                rc = _native.kvx_options_set(opts, k, v)
                if rc:
                    err = last_error(rc)
                    break
            else:
                rc, h = _native.kvxpy_open(view, nb, bl, text, opts)
                if rc:
                    err = last_error(rc)
        finally:
            _native.kvx_options_destroy(opts)
        if err is not None:
            raise err
        self._h = h
        self._pid = os.getpid()
        self._closed = False
        self._view = view  # as the seed does; the native handle holds the buffer itself
        self._base_addr = self._prop(_native.kvx_transport_base_addr)
        self._num_blocks = self._prop(_native.kvx_transport_num_blocks)
        self._block_len = self._prop(_native.kvx_transport_block_len)
        self._config_fingerprint = self._prop(_native.kvx_transport_config_fingerprint)
        self._backend = _native.kvx_transport_backend(h)
        self._backends = tuple(_native.kvx_transport_backends(h).split(","))
        _WAITER.start()
        if self._config_fingerprint != expect:  # cannot happen: checked above
            self.close()
            raise ArgumentError(_native.KVX_ECONFIG, "fingerprint %r != %r" % (self._config_fingerprint, expect))

    @classmethod
    def from_buffer(cls, buffer, num_blocks: int, block_len: int, config_fields: Optional[dict] = None,
                    **kwargs) -> "Transport":
        """A transport over the first num_blocks * block_len bytes of any
        writable C-contiguous buffer (bytearray, mmap, numpy array...)."""
        return cls(buffer, config_fields, num_blocks=num_blocks, block_len=block_len, **kwargs)

    # -------------------------------------------------------------- internals

    def _handle(self):
        h = self._h
        if h is None:
            raise ClosedError(_native.KVX_ECLOSED, "transport is not open")
        if self._pid != os.getpid():
            raise ClosedError(_native.KVX_ECLOSED, "transport belongs to process %d, not to this fork()ed child; "
                              "create a new transport here" % self._pid)
        return h

    def _prop(self, fn):
        rc, value = fn(self._h)
        if rc:
            raise self._error(rc)
        return value

    def _error(self, rc):
        """Exception for rc, recorded as this thread's last_error."""
        err = last_error(rc)
        self._tls.error = ErrorInfo(err.code, err.message)
        return err

    def _raise_local(self, err):
        self._tls.error = ErrorInfo(err.code, err.message)
        raise err

    # -------------------------------------------------------------- properties

    @property
    def base_addr(self) -> int:
        """Base address of the local block memory region."""
        return self._base_addr

    @property
    def num_blocks(self) -> int:
        """Number of blocks in the local region."""
        return self._num_blocks

    @property
    def block_len(self) -> int:
        """Size of each block, as vLLM's DataTransport defines it: the view's
        shape[1] (bytes for a uint8 view, items of the view's type
        otherwise); bytes when the geometry was given with block_len=."""
        return self._block_len // self._unit

    @property
    def block_len_bytes(self) -> int:
        """Size of each block in bytes (what the C library calls block_len)."""
        return self._block_len

    @property
    def config_fingerprint(self) -> str:
        """Content hash of the model configuration: 16 hex chars, or ""."""
        return self._config_fingerprint

    @property
    def backend(self) -> str:
        """The most preferred backend this transport serves on: "shm", "verbs"
        or "tcp" (it may serve on several, see backends; peer_backend() says
        which one a given peer uses)."""
        return self._backend

    @property
    def backends(self) -> tuple:
        """Every backend this transport serves on, in order of preference,
        e.g. ("shm", "tcp"): what its metadata offers, so the paths its peers
        can take. With backend="auto", every backend usable on this host: a
        transport whose backend is "shm" may well serve peers on other hosts
        over tcp."""
        return self._backends

    def peer_backend(self, peer_id: str) -> tuple:
        """(backend, path) of a registered peer: the backend its transfers
        take ("shm", "verbs", "tcp") and, for shm, how ("mapped": our writer
        maps the peer's region and copies into it; "process_vm_writev": the
        kernel copies into the peer's private memory; "staged": through the
        peer's staging ring, see option shm.private); path is "" for the
        others. Raises the library's error (e.g. KVX_ENOENT for an unknown
        or still-connecting peer, KVX_ECLOSED)."""
        h = self._handle()
        rc, backend, path = _native.kvx_peer_backend(h, _peer_arg(peer_id))
        if rc:
            raise self._error(rc)
        return backend, path

    def peer_rails(self, peer_id: str) -> list:
        """The rails a registered peer's transfers are striped over
        (kvx_peer_rails(3)): a local RDMA port paired with one of the peer's
        (option verbs.devices), in rail order, each a dict: name
        ("rxe0:1 -> 198.18.0.1:20049"), up (True: carries transfers; False:
        taken out, for good), bytes and parts (of the transfers it
        completed), failures (times taken out), changed_ns (when it last
        changed state, ns since the epoch). Only verbs has rails: [] for a
        peer on tcp or shm. A snapshot; the counters never go back while the
        peer is registered. Raises the library's error (e.g. KVX_ENOENT for
        an unknown or still-connecting peer, KVX_ECLOSED)."""
        h = self._handle()
        rc, rails = _native.kvxpy_peer_rails(h, _peer_arg(peer_id))
        if rc:
            raise self._error(rc)
        return rails

    def peer_state(self, peer_id: str) -> PeerState:
        """The state of a registered peer's connection (kvx_get_peer_state(3))
        as a PeerState: link UP, RECONNECTING (its connection failed; it
        reconnects in the background, option peer_redial_ms, and write_blocks
        returns None with KVX_EPEERBROKEN meanwhile) or BROKEN (failed, no
        reconnection: peer_redial_ms=0; remove and re-add it), the error and
        reason of the failure, since when, the attempts and the next one, its
        transfers in flight and its path. A peer stays registered through a
        failure; a reconnection may take another path (peer_backend()). A
        snapshot: the state may change right after. Raises the library's
        error, as peer_backend (e.g. KVX_ENOENT for an unknown or
        still-connecting peer, KVX_ECLOSED)."""
        h = self._handle()
        rc, d = _native.kvxpy_peer_state(h, _peer_arg(peer_id))
        if rc:
            raise self._error(rc)
        return _peer_state(d)

    def peers(self) -> list:
        """Every peer of the transport (kvx_list_peers(3)), sorted by id (byte
        order): the registered ones (link UP, RECONNECTING, BROKEN) and those
        being added (CONNECTING: add_remote_peer() or _async() under way), as
        PeerInfo(peer_id, link, error, backend, path, in_flight, since_ns,
        next_attempt_ns, reconnects, attempts, reason, last_progress_ns);
        p.state is the link's name ("up", ...). A removed peer is not
        listed; a peer being replaced is listed once, connecting. A snapshot
        taken at one instant. Raises ClosedError after close()."""
        h = self._handle()
        rc, items = _native.kvxpy_list_peers(h)
        if rc:
            raise self._error(rc)
        return _peer_infos(items)

    def metrics_text(self) -> str:
        """The transport's counters and peers as Prometheus text (exposition
        format 0.0.4, kvx_metrics_text(3); docs/metrics.md lists the
        families): serve it on a /metrics endpoint as it is, or register
        kvxfer.prometheus.Collector(self) with prometheus_client. Raises
        ClosedError after close(), RequestError (KVX_ENOTSUP) for a library
        built without telemetry."""
        h = self._handle()
        rc, text = _native.kvxpy_metrics_text(h)
        if rc:
            raise self._error(rc)
        return text

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_error(self) -> Optional[ErrorInfo]:
        """(code, message) of the calling thread's most recent failed call on
        this transport (e.g. why write_blocks returned None), or None if
        none failed yet. Like errno, a later call that succeeds leaves it as
        it is: read it right after the call that failed (a None from
        write_blocks), not to learn whether the last call failed. A poll()
        that reports failed transfers sets it too, to the last failed id's
        reason ("transfer 7 to peer 'p1' failed: timed out"; code
        ETIMEDOUT, ECONNRESET, ECANCELED...); poll_results() does not."""
        return getattr(self._tls, "error", None)

    # -------------------------------------------------------------- DataTransport

    def get_agent_metadata(self) -> bytes:
        """Opaque bytes for the peer's add_remote_peer(). They contain the
        secret that lets a holder write into this region: hand them only to
        peers that may do so."""
        h = self._handle()
        buf = None
        while True:
            rc, n = _native.kvx_get_agent_metadata(h, buf)
            if rc == 0 and buf is not None:
                return bytes(buf[:n])
            if rc not in (0, _native.KVX_ENOBUFS):
                raise self._error(rc)
            buf = bytearray(n)

    def _start_registration(self, peer_id, agent_metadata, base_addr, num_blocks, block_len):
        """Checks the arguments and starts kvx_add_remote_peer_async with
        KVX_PEER_REPLACE; the registration id. Raises TypeError, or the
        kvxfer.Error of a failure the C library reports at once."""
        h = self._handle()
        if isinstance(agent_metadata, str):
            raise TypeError("agent_metadata must be bytes, not str")
        try:
            peer_id = _peer_arg(peer_id)
            base_addr = _u64_arg(base_addr, "base_addr")
            num_blocks = _u64_arg(num_blocks, "num_blocks")
            block_len = _u64_arg(block_len, "block_len")
            if block_len * self._unit > _U64_MAX:
                raise ArgumentError(_native.KVX_ERANGE, "block_len = %d items of %d bytes does not fit in 64 bits"
                                    % (block_len, self._unit))
            if block_len * self._unit != self._block_len:  # said here, in the caller's units
                raise ArgumentError(_native.KVX_EGEOMETRY, "peer %r: block_len %d differs from the local block_len "
                                    "%d%s" % (peer_id, block_len, self._block_len // self._unit,
                                              "" if self._unit == 1 else " (items of %d bytes: %d bytes against %d)"
                                              % (self._unit, block_len * self._unit, self._block_len)))
        except ArgumentError as e:
            self._raise_local(e)
        rc, reg = _native.kvx_add_remote_peer_async(h, peer_id, agent_metadata, base_addr, num_blocks,
                                                    block_len * self._unit, _native.KVX_PEER_REPLACE)
        if rc:
            raise self._error(rc)
        return h, reg

    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int, num_blocks: int,
                        block_len: int) -> None:
        """Register a remote peer and connect to it (authenticated); blocks up
        to connect_timeout_ms (the GIL is released meanwhile).

        Re-adding a registered id replaces the old registration: its transfers
        in flight fail, as on remove_remote_peer(), and a registration of the
        id still in progress (add_remote_peer_async) is superseded.
        block_len is in the units of this transport's block_len (items of the
        view's second dimension; bytes for a byte view).

        Every failure caused by the peer or its metadata raises a ValueError:
        ArgumentError (bad metadata, geometry, peer id value), RequestError
        (fingerprint, version, no backend in common, cancelled by a later
        add or a remove), PeerError (refused, timed out, unreachable,
        authentication). TypeError for argument types; ClosedError and
        TransportError (not ValueErrors) for the transport's own trouble.
        On failure no peer is registered under peer_id."""
        h, reg = self._start_registration(peer_id, agent_metadata, base_addr, num_blocks, block_len)
        state = _native.KVX_REGISTRATION_PENDING
        try:
            while state == _native.KVX_REGISTRATION_PENDING:  # in slices, so that signals get through
                rc, state, err = _native.kvx_registration_status(h, reg, 200)
                if rc:
                    raise self._error(rc)
        except BaseException:
            if state == _native.KVX_REGISTRATION_PENDING:  # interrupted: it must not publish behind our back
                _native.kvx_remove_remote_peer(h, peer_id)
            raise
        if state == _native.KVX_REGISTRATION_FAILED:
            raise self._error(err)  # the message is the registration's, set for this thread

    def add_remote_peer_async(self, peer_id: str, agent_metadata: bytes, base_addr: int, num_blocks: int,
                              block_len: int) -> "concurrent.futures.Future[None]":
        """add_remote_peer() without blocking: returns at once a
        concurrent.futures.Future that gets None when the peer is registered,
        or the exception add_remote_peer() would have raised (a failed
        future means: reject the peer). Never raises: even argument errors
        end up in the future, as with vLLM's DataTransport default.

        The future is running from the start (Future.cancel() returns
        False); remove_remote_peer(peer_id) cancels the registration, and a
        later add of the same id supersedes it: its future then fails with a
        RequestError (KVX_ECANCELED). close() fails it with ClosedError. A
        cancelled or superseded registration never publishes. The library
        connects with at most 16 threads per transport, in the order of the
        calls: behind registrations to peers that do not answer, a future
        settles up to a connect timeout later per 16 of them ahead
        (kvx_add_remote_peer_async(3)). Done callbacks run on one of
        kvxfer's waiter threads (at most 4 in the process)."""
        fut = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()
        try:
            h, reg = self._start_registration(peer_id, agent_metadata, base_addr, num_blocks, block_len)
        except Exception as e:  # noqa: BLE001 - the future carries it, as vLLM's default does
            fut.set_exception(e)
            return fut
        _WAITER.add(h, reg, fut)
        return fut

    def remove_remote_peer(self, peer_id: str) -> None:
        """Unregister a peer: its transfers in flight fail (they surface in
        poll()'s failed list), its connections are closed, a registration of
        it in progress is cancelled (never publishes). The id may be added
        again. Removing an id that is not registered (never added, rejected,
        removed already, or after close()) does nothing: vLLM's reaper calls
        this for every dead session. Raises only TypeError (peer_id not a
        str); last_error says what happened otherwise."""
        if not isinstance(peer_id, str):
            raise TypeError("peer_id must be a str, not %s" % type(peer_id).__name__)
        try:
            h = self._handle()
            peer_id = _peer_arg(peer_id)
        except Error as e:  # closed, or an id that cannot have been added
            self._tls.error = ErrorInfo(e.code, e.message)
            return
        rc = _native.kvx_remove_remote_peer(h, peer_id)
        if rc:
            err = self._error(rc)
            if rc not in (_native.KVX_ENOENT, _native.KVX_ECLOSED):
                raise err

    def write_blocks(self, peer_id: str, local_idxs: Sequence[int], remote_idxs: Sequence[int]) -> Optional[int]:
        """Submit a WRITE: local block local_idxs[i] -> peer's block
        remote_idxs[i]. Never blocks on the network.

        Returns the transfer id (an int > 0, reported once by poll()), or
        None for every problem with the peer or the indexes, with last_error
        saying why: peer not registered (or still connecting), its
        connection failed earlier (KVX_EPEERBROKEN: it reconnects in the
        background, see peer_state(), or remove and re-add it), an index out of
        range on either side or negative, a remote index repeated in one
        call, lists of different lengths, the transport closed. Raises only
        TypeError (an argument of the wrong type). Index lists: sequences of
        ints, or 1-D integer arrays: C-contiguous buffers of 4- or 8-byte
        integers (numpy int32/int64/uint32/uint64, array.array, memoryview)
        go to C without a Python int per index, 8-byte ones without a copy.
        Not a set or a dict: their order is arbitrary, so local and remote
        blocks would pair up by chance (TypeError)."""
        for what, idxs in (("local_idxs", local_idxs), ("remote_idxs", remote_idxs)):
            if isinstance(idxs, _UNORDERED):
                raise TypeError("%s must be an ordered sequence of ints, not %s (its order is arbitrary: "
                                "local and remote blocks would pair up by chance)" % (what, type(idxs).__name__))
        try:
            h = self._handle()
            peer_id = _peer_arg(peer_id)
            if type(local_idxs) not in _SEQUENCES:
                # integer arrays (4 or 8 bytes) go to C as they are
                rc, tid = _native.kvxpy_write_blocks_buf(h, peer_id, local_idxs, remote_idxs)
                if rc != _native.KVXPY_FALLBACK:
                    if rc == 0:
                        return tid
                    self._error(rc)
                    return None
            loc = _as_u64(local_idxs, "local_idxs")
            rem = _as_u64(remote_idxs, "remote_idxs")
            if len(loc) != len(rem):
                raise ArgumentError(_native.KVX_EINVAL, "local_idxs has %d entries, remote_idxs %d"
                                    % (len(loc), len(rem)))
        except Error as e:
            self._tls.error = ErrorInfo(e.code, e.message)
            return None
        rc, tid = _native.kvxpy_write_blocks(h, peer_id, loc, rem)
        if rc == 0:
            return tid
        self._error(rc)
        return None

    def _poll_results(self, peer_id):
        """(handle, peer_id checked, ids, statuses) of every finished
        transfer (kvx_poll_results, in rounds of _POLL_CAP)."""
        h = self._handle()
        if peer_id is not None:
            peer_id = _peer_arg(peer_id)
        ids, statuses = [], []
        while True:
            rc, i, st = _native.kvxpy_poll_results(h, peer_id, _POLL_CAP)
            if rc:
                raise self._error(rc)
            ids += i
            statuses += st
            if len(i) < _POLL_CAP:
                return h, peer_id, ids, statuses

    @staticmethod
    def _failure_infos(h, peer_id):
        """A function status -> ErrorInfo for the failures of one poll: the
        code (an ErrorCode where known) and kvx_strerror's text, plus, when
        the poll named the peer and the failure was not its removal, what
        peer_state() says about it (looked up once per poll, and only then)."""
        infos, notes = {}, []

        def peer_note():
            if not notes:
                rc, d = _native.kvxpy_peer_state(h, peer_id)
                note = ""
                if rc == 0 and d["reason"]:
                    link = _enum_or_int(PeerLink, d["link"])
                    note = "; the peer is %s: %s" % (link.name.lower() if isinstance(link, PeerLink) else link,
                                                     d["reason"])
                notes.append(note)
            return notes[0]

        def info(status):
            e = infos.get(status)
            if e is None:
                msg = strerror(status)
                if peer_id is not None and status != _native.KVX_ECANCELED:
                    msg += peer_note()
                e = infos[status] = ErrorInfo(_enum_or_int(ErrorCode, status), msg)
            return e
        return info

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        """Collect finished transfers: PollResult(done, failed), tuples of
        ids, each id reported exactly once (by poll() or poll_results(),
        whichever takes it first). peer_id restricts to one peer's transfers
        (an unknown id yields nothing). Progress does not depend on polling:
        backends run on their own threads.

        The result also carries why each failed id failed, in its attribute
        errors (not a tuple field): {id: ErrorInfo(code, message)}, as
        poll_results() reports them. When some failed, the calling thread's
        last_error becomes that of the last failed id, with a message naming
        the id, the peer when peer_id named it, and the reason
        ("transfer 7 to peer 'p1' failed: timed out"); like errno, it stays
        after later polls that report no failure."""
        h, peer_id, ids, statuses = self._poll_results(peer_id)
        if not any(statuses):
            return _poll_result(tuple(ids), (), {})
        info = self._failure_infos(h, peer_id)
        done, failed, errors = [], [], {}
        for i, st in zip(ids, statuses):
            if st:
                failed.append(i)
                errors[i] = info(st)
            else:
                done.append(i)
        last = errors[failed[-1]]
        self._tls.error = ErrorInfo(last.code, "transfer %d%s failed: %s" % (
            failed[-1], "" if peer_id is None else " to peer %r" % peer_id, last.message))
        return _poll_result(tuple(done), tuple(failed), errors)

    def poll_results(self, peer_id: Optional[str] = None) -> tuple:
        """Collect finished transfers with the reason of each failure
        (kvx_poll_results(3)): a tuple of Result(id, error), error None when
        the transfer is done, else ErrorInfo(code, message): ETIMEDOUT (the
        stall timeout), ECONNRESET (the peer's connection failed),
        ECANCELED (the peer was removed or replaced), or another code (a
        backend's own failure). Takes from the same queues as poll(): each
        id is reported exactly once, by one of them. peer_id as for poll();
        when given, a failure's message also says what peer_state() says
        about the peer. Does not set last_error: each failure is in its
        Result. Raises as poll() does."""
        h, peer_id, ids, statuses = self._poll_results(peer_id)
        if not any(statuses):
            return tuple(Result(i, None) for i in ids)
        info = self._failure_infos(h, peer_id)
        return tuple(Result(i, info(st) if st else None) for i, st in zip(ids, statuses))

    def wait(self, timeout: Optional[float] = None) -> int:
        """Sleep until poll() has something to report, or timeout seconds
        pass (None: no limit); returns at once when ids are ready already.
        Returns how many ids poll() would report now (0: the time ran out).
        The GIL is released while it sleeps, in slices of at most 100 ms so
        that signals (KeyboardInterrupt) are handled. Raises ClosedError when
        the transport is closed, also by close() in another thread while this
        one waits (kvx_wait(3))."""
        h = self._handle()
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
                self._raise_local(ArgumentError(_native.KVX_EINVAL, "timeout %r is not None or a number of "
                                                "seconds >= 0" % (timeout,)))
            deadline = time.monotonic() + timeout
        while True:
            left_ms = _WAIT_SLICE_MS
            if timeout is not None:
                left_ms = min(left_ms, max(0, int((deadline - time.monotonic()) * 1000 + 0.999)))
            rc, n = _native.kvx_wait(h, left_ms)
            if rc:
                raise self._error(rc)
            if n or (timeout is not None and time.monotonic() >= deadline):
                return n

    def fileno(self) -> int:
        """A file descriptor that is readable while poll() has something to
        report, for event loops: select/selectors, or asyncio's
        loop.add_reader(t.fileno(), callback). Level-triggered: readable
        until poll() has taken every ready id; readable for good once the
        transport is closed (poll() then raises ClosedError). Owned by the
        transport: never read, write or close it (kvx_completion_fd(3))."""
        h = self._handle()
        rc, fd = _native.kvx_completion_fd(h)
        if rc:
            raise self._error(rc)
        return fd

    def stats(self, peer_id: Optional[str] = None) -> dict:
        """Telemetry of the transport (peer_id None: every peer it ever had)
        or of one peer (since it was first added; remove forgets it), as a
        dict: transfers_done/_failed/_cancelled, bytes_done/_failed/
        _cancelled, transfers_failed_timeout/_connection/_removed/_other
        (transfers_failed by cause, as poll_results() reports it:
        ETIMEDOUT, ECONNRESET, ECANCELED (or lost at close), any other
        code; they add up to transfers_failed), transfers_inflight,
        bytes_inflight, peers, peers_connecting, connects,
        connect_failures, connect_ns_total/_max/_last, latency_count,
        latency_ns_p50/_p90/_p99/_p999/_max, latency_ns_sum (the latencies
        added up, exact), and latency_histogram: [(lo_ns, hi_ns, count),
        ...] for the non-empty buckets (hi_ns None for the last, open
        one). Latency: from
        write_blocks() until the library learnt the bytes landed
        (kvx_get_stats(3)). Works after close(). Raises RequestError
        (KVX_ENOENT) for an unknown peer, (KVX_ENOTSUP) for a library built
        without telemetry."""
        h = self._h
        if h is None:
            raise ClosedError(_native.KVX_ECLOSED, "transport is not open")
        if peer_id is not None:
            peer_id = _peer_arg(peer_id)
        rc, d = _native.kvxpy_stats(h, peer_id)
        if rc:
            raise self._error(rc)
        buckets = d.pop("latency_buckets")
        d["latency_histogram"] = [latency_bucket_bounds(i) + (n,) for i, n in enumerate(buckets) if n]
        return d

    def cancel(self, transfer_ids: Iterable[int], mode: str = "immediate") -> list:
        """Cancel transfers; unknown or already reported ids are ignored.

        mode="immediate": forget the ids (never reported by poll); bytes
            already on the wire may still land. Returns [].
        mode="wait": release what can be released (not started, or finished
            but not polled yet: never reported); returns the ids still on the
            wire, which poll() will report as done or failed."""
        h = self._handle()
        m = CANCEL_MODES.get(mode) if isinstance(mode, str) else None
        if m is None:
            self._raise_local(ArgumentError(_native.KVX_EINVAL, "cancel mode %r is not 'immediate' or 'wait'"
                                            % (mode,)))
        ids = _as_u64(transfer_ids, "transfer_ids", drop_invalid=True)
        inflight = array.array("Q", bytes(8 * len(ids))) if m == _native.KVX_CANCEL_WAIT else None
        rc, n = _native.kvxpy_cancel(h, ids, m, inflight)
        if rc:
            raise self._error(rc)
        return inflight[:n].tolist() if inflight is not None else []

    def close(self) -> None:
        """Fail transfers in flight, disconnect peers, stop the backend and
        release the region's buffer. When it returns, kvxfer writes nothing
        more into the region. Idempotent; afterwards other methods raise
        ClosedError (properties stay readable)."""
        h = self._h
        if h is None or self._closed:
            return
        self._closed = True
        rc = _native.kvxpy_close(h)
        self._view = None  # the region's owner may now close or resize it (mmap.close())
        if rc:
            raise self._error(rc)

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a kvxfer.Transport cannot be pickled; send get_agent_metadata() to peers instead")

    def __repr__(self) -> str:
        if self._h is None:
            return "<kvxfer.Transport (not open)>"
        return "<kvxfer.Transport backends=%s num_blocks=%d block_len=%d fingerprint=%r%s>" % (
            ",".join(self._backends), self._num_blocks, self._block_len, self._config_fingerprint,
            " closed" if self._closed else "")
