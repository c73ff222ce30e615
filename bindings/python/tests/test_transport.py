"""kvxfer.Transport: every method, the DataTransport semantics, errors."""
import ctypes
import gc
import inspect
import socket
import threading
import time

import pytest

import kvxfer
from kvxfer import _transport

import seed_reference
from conftest import TCP, Pair, block, connect, fill_block, region, wait_for


# ------------------------------------------------------------------ properties


def test_properties_match_seed():
    mem, view = region(16, 4096)
    seed = seed_reference.SeedGeometry(view, {"model": "m", "layers": 2})
    with kvxfer.Transport(view, {"model": "m", "layers": 2}, **TCP) as t:
        assert t.base_addr == seed.base_addr == ctypes.addressof(ctypes.c_char.from_buffer(mem))
        assert (t.num_blocks, t.block_len) == (seed.num_blocks, seed.block_len) == (16, 4096)
        assert t.config_fingerprint == seed.config_fingerprint
        assert t.backend == "tcp"
        assert not t.closed
        assert "tcp" in repr(t)
    assert t.closed and "closed" in repr(t)
    assert (t.base_addr, t.num_blocks, t.block_len) == (seed.base_addr, 16, 4096)  # readable after close


def test_offset_view_base_addr():
    mem = bytearray(5 * 64)
    view = memoryview(mem)[64:].cast("B", (4, 64))  # starts one block in
    with kvxfer.Transport(view, **TCP) as t:
        assert t.base_addr == ctypes.addressof(ctypes.c_char.from_buffer(mem)) + 64
        assert (t.num_blocks, t.block_len) == (4, 64)


def test_agent_metadata():
    mem, view = region(4, 256)
    with kvxfer.Transport(view, **TCP) as t:
        m1, m2 = t.get_agent_metadata(), t.get_agent_metadata()
        assert isinstance(m1, bytes) and len(m1) > 0 and m1 == m2


# ------------------------------------------------------------------ data


def test_write_blocks_moves_bytes_and_spares_canaries(pair):
    p = pair
    for i in range(p.nb):
        fill_block(p.smem, i, p.bl, 0x10 + i)
    local, remote = [0, 1, 2, 7, 9, 15], [3, 4, 5, 0, 14, 8]
    tid = p.src.write_blocks("dst", local, remote)
    assert isinstance(tid, int) and tid > 0
    seen, _ = wait_for(p.src, [tid])
    assert seen == {tid: "done"}
    for lo, re in zip(local, remote):
        assert block(p.dmem, re, p.bl) == bytes([0x10 + lo]) * p.bl
    for i in set(range(p.nb)) - set(remote):
        assert block(p.dmem, i, p.bl) == b"\xee" * p.bl  # canaries untouched
    assert block(p.smem, 0, p.bl) == b"\x10" * p.bl  # source unchanged


def test_region_inside_larger_buffer_canaries():
    nb, bl = 8, 512
    big = bytearray(b"\xcc") * (bl + nb * bl + bl)  # canary block before and after
    dview = memoryview(big)[bl:bl + nb * bl].cast("B", (nb, bl))
    smem, sview = region(nb, bl, fill=0x5A)
    with kvxfer.Transport(sview, **TCP) as src, kvxfer.Transport(dview, **TCP) as dst:
        connect(src, dst)
        tid = src.write_blocks("dst", list(range(nb)), list(range(nb)))
        assert wait_for(src, [tid])[0] == {tid: "done"}
    assert big[:bl] == b"\xcc" * bl and big[-bl:] == b"\xcc" * bl
    assert big[bl:-bl] == b"\x5a" * (nb * bl)


def test_empty_write_is_a_transfer(pair):
    tid = pair.src.write_blocks("dst", [], [])
    assert isinstance(tid, int) and tid > 0
    assert wait_for(pair.src, [tid])[0] == {tid: "done"}


def test_ids_unique_and_reported_once(pair):
    ids = [pair.src.write_blocks("dst", [i % 16], [i % 16]) for i in range(200)]
    assert len(set(ids)) == 200 and all(i > 0 for i in ids)
    seen, extra = wait_for(pair.src, ids)
    assert set(seen.values()) == {"done"} and not extra
    assert pair.src.poll() == kvxfer.PollResult((), ())


def test_poll_collects_more_than_one_array(pair, monkeypatch):
    monkeypatch.setattr(_transport, "_POLL_CAP", 4)
    ids = [pair.src.write_blocks("dst", [i % 16], [i % 16]) for i in range(50)]
    got, biggest = [], 0
    deadline = time.monotonic() + 15
    while len(got) < 50 and time.monotonic() < deadline:
        time.sleep(0.2)
        r = pair.src.poll()
        biggest = max(biggest, len(r.done) + len(r.failed))
        got += list(r.done) + list(r.failed)
    assert sorted(got) == sorted(ids)
    assert biggest > 4  # one poll() looped over several kvx_poll calls


def test_poll_result_type(pair):
    r = pair.src.poll()
    assert isinstance(r, tuple) and r._fields == ("done", "failed")
    done, failed = r
    assert done == () and failed == ()  # tuples, as vLLM's tests compare


def test_wait_sleeps_until_something_is_ready(pair):
    t = pair.src
    assert t.wait(0) == 0
    t0 = time.monotonic()
    assert t.wait(0.05) == 0
    assert time.monotonic() - t0 >= 0.045  # it slept (no upper bound: the machine may be busy)
    ids = [t.write_blocks("dst", [i], [i]) for i in range(4)]
    got = []
    while len(got) < 4:
        assert t.wait() >= 1  # no limit: returns once some are ready
        r = t.poll()
        got += list(r.done) + list(r.failed)
    assert sorted(got) == sorted(ids) and t.wait(0) == 0
    for bad in (-1, "1", True, float("nan")):
        with pytest.raises(kvxfer.ArgumentError):
            t.wait(bad)


def test_wait_is_woken_by_close_in_another_thread():
    mem, view = region(4, 64)
    t = kvxfer.Transport(view, **TCP)
    caught = []

    def waiter():
        try:
            t.wait()
        except kvxfer.ClosedError as e:
            caught.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)  # most likely asleep in C by now; the assertions hold either way
    t.close()
    th.join(10)
    assert not th.is_alive() and len(caught) == 1


def test_fileno_is_readable_while_ids_are_ready(pair):
    import selectors

    t = pair.src
    fd = t.fileno()
    assert fd == t.fileno() and fd >= 0
    sel = selectors.DefaultSelector()
    sel.register(t, selectors.EVENT_READ)  # a Transport is a selectable object: it has fileno()
    assert sel.select(0) == []
    tid = t.write_blocks("dst", [1], [2])
    assert len(sel.select(20)) == 1
    assert sel.select(0)  # level-triggered: still readable until polled
    r = t.poll()
    assert list(r.done) + list(r.failed) == [tid]
    assert sel.select(0) == []
    sel.close()


def test_poll_by_peer():
    p = Pair()
    cmem, cview = region(p.nb, p.bl)
    try:
        with kvxfer.Transport(cview, **TCP) as c:
            connect(p.src, c, "c")
            a = p.src.write_blocks("dst", [1], [1])
            b = p.src.write_blocks("c", [2], [2])
            seen_c, extra_c = wait_for(p.src, [b], peer_id="c")
            assert seen_c == {b: "done"} and a not in extra_c
            assert p.src.poll("unknown-peer") == ((), ())
            assert wait_for(p.src, [a])[0] == {a: "done"}
    finally:
        p.close()


def test_many_threads(pair):
    ids, lock = [], threading.Lock()

    def worker(k):
        for i in range(50):
            tid = pair.src.write_blocks("dst", [(k + i) % 16], [(k * 3 + i) % 16])
            assert tid is not None
            with lock:
                ids.append(tid)
            pair.src.poll("nobody")

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert len(set(ids)) == 200
    assert set(wait_for(pair.src, ids)[0].values()) == {"done"}


# ------------------------------------------------------------------ peers


def test_remove_and_readd_peer(pair):
    pair.src.remove_remote_peer("dst")
    assert pair.src.write_blocks("dst", [0], [0]) is None
    assert pair.src.last_error.code == kvxfer.ErrorCode.ENOENT
    assert "dst" in pair.src.last_error.message
    connect(pair.src, pair.dst)
    tid = pair.src.write_blocks("dst", [0], [0])
    assert wait_for(pair.src, [tid])[0] == {tid: "done"}


def test_remove_unknown_peer(pair):
    assert pair.src.remove_remote_peer("nope") is None  # a no-op, as vLLM's reaper needs
    assert pair.src.last_error.code == kvxfer.ErrorCode.ENOENT
    assert pair.src.remove_remote_peer("") is None  # cannot have been added either
    with pytest.raises(TypeError):
        pair.src.remove_remote_peer(7)


def test_add_twice_replaces(pair):
    connect(pair.src, pair.dst)  # replaces the registration, no error
    tid = pair.src.write_blocks("dst", [0], [0])
    assert wait_for(pair.src, [tid])[0] == {tid: "done"}


def test_add_bad_metadata_and_geometry(pair):
    meta = pair.dst.get_agent_metadata()
    d = pair.dst
    with pytest.raises(kvxfer.ArgumentError) as ei:
        pair.src.add_remote_peer("x", meta[:10], d.base_addr, d.num_blocks, d.block_len)
    assert ei.value.code == kvxfer.ErrorCode.EBADMETA and isinstance(ei.value, ValueError)
    with pytest.raises(kvxfer.ArgumentError) as ei:
        pair.src.add_remote_peer("x", meta, d.base_addr, d.num_blocks + 1, d.block_len)
    assert ei.value.code == kvxfer.ErrorCode.EGEOMETRY
    with pytest.raises(kvxfer.ArgumentError):
        pair.src.add_remote_peer("x", meta, d.base_addr + 1, d.num_blocks, d.block_len)
    with pytest.raises(kvxfer.ArgumentError):
        pair.src.add_remote_peer("x", meta, -1, d.num_blocks, d.block_len)
    with pytest.raises(TypeError):
        pair.src.add_remote_peer("x", meta.hex(), d.base_addr, d.num_blocks, d.block_len)
    with pytest.raises(TypeError):
        pair.src.add_remote_peer("x", meta, "0", d.num_blocks, d.block_len)
    # bytearray / memoryview metadata are fine
    pair.src.add_remote_peer("y", bytearray(meta), d.base_addr, d.num_blocks, d.block_len)
    pair.src.add_remote_peer("z", memoryview(meta), d.base_addr, d.num_blocks, d.block_len)


def test_block_len_must_match():
    amem, aview = region(4, 64)
    bmem, bview = region(4, 128)
    with kvxfer.Transport(aview, **TCP) as a, kvxfer.Transport(bview, **TCP) as b:
        with pytest.raises(kvxfer.ArgumentError) as ei:
            connect(a, b)
        assert ei.value.code == kvxfer.ErrorCode.EGEOMETRY
        assert "block_len 128 differs from the local block_len 64" in str(ei.value)


def test_block_len_error_in_the_callers_units():
    """A float32 view counts block_len in items: the error names the number
    the caller passed, not the bytes it became."""
    np = pytest.importorskip("numpy")
    a_arr, b_arr = np.zeros((4, 16), np.float32), np.zeros((4, 32), np.float32)
    with kvxfer.Transport(a_arr, **TCP) as a, kvxfer.Transport(b_arr, **TCP) as b:
        assert (a.block_len, b.block_len) == (16, 32)
        with pytest.raises(kvxfer.ArgumentError) as ei:
            a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
        assert ei.value.code == kvxfer.ErrorCode.EGEOMETRY
        msg = str(ei.value)
        assert "block_len 32 differs from the local block_len 16" in msg and "128 bytes against 64" in msg
        assert a.last_error.code == kvxfer.ErrorCode.EGEOMETRY


def test_connection_refused_is_peer_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more
    amem, aview = region(4, 64)
    bmem, bview = region(4, 64)
    with kvxfer.Transport(aview, **TCP) as a, \
            kvxfer.Transport(bview, **TCP, tcp_advertise="127.0.0.1:%d" % port) as b:
        with pytest.raises(kvxfer.PeerError) as ei:
            connect(a, b)
        # tcp retries a refused connection until connect_timeout_ms (a peer may
        # be restarting), so the last attempt may end in the deadline instead
        assert ei.value.code in (kvxfer.ErrorCode.ECONNREFUSED, kvxfer.ErrorCode.EHOSTUNREACH,
                                 kvxfer.ErrorCode.ETIMEDOUT)
        assert a.write_blocks("dst", [0], [0]) is None  # nothing was registered


def test_add_remote_peer_releases_the_gil():
    """A peer that accepts TCP but never answers: add_remote_peer blocks for
    connect_timeout_ms while other Python threads keep running."""
    bh = socket.socket()
    bh.bind(("127.0.0.1", 0))
    bh.listen(8)
    amem, aview = region(4, 64)
    bmem, bview = region(4, 64)
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    with kvxfer.Transport(aview, **TCP, connect_timeout_ms=800) as a, \
            kvxfer.Transport(bview, **TCP, tcp_advertise="127.0.0.1:%d" % bh.getsockname()[1]) as b:
        th = threading.Thread(target=spin)
        th.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(kvxfer.PeerError) as ei:
                connect(a, b)
        finally:
            stop.set()
            th.join()
        elapsed = time.monotonic() - t0
    bh.close()
    assert ei.value.code in (kvxfer.ErrorCode.ETIMEDOUT, kvxfer.ErrorCode.EAUTH, kvxfer.ErrorCode.ECONNRESET)
    assert 0.5 < elapsed < 10
    assert ticks[0] > 50  # the spinning thread ran while we were blocked


def test_peer_broken_returns_none_not_raise():
    p = Pair()
    try:
        tid = p.src.write_blocks("dst", [0], [0])
        wait_for(p.src, [tid])
        p.dst.close()
        deadline, result = time.monotonic() + 15, 0
        pending = []
        while time.monotonic() < deadline:
            result = p.src.write_blocks("dst", [1], [1])
            if result is None:
                break
            pending.append(result)
            time.sleep(0.01)
        assert result is None
        assert p.src.last_error.code == kvxfer.ErrorCode.EPEERBROKEN
        assert p.src.last_error.scope == kvxfer.Scope.PEER
        assert isinstance(p.src.last_error.exception(), kvxfer.PeerError)
        if pending:
            wait_for(p.src, pending)  # each reported (done or failed), none lost
        p.src.remove_remote_peer("dst")  # recovery: remove (and re-add)
    finally:
        p.close()


def test_remove_peer_fails_inflight_or_completes(pair):
    ids = [pair.src.write_blocks("dst", list(range(16)), list(range(16))) for _ in range(20)]
    pair.src.remove_remote_peer("dst")
    seen, _ = wait_for(pair.src, ids)
    assert set(seen) == set(ids)  # each one reported, done or failed


# ------------------------------------------------------------------ argument mistakes


def test_write_blocks_argument_errors(pair):
    """Values (which vLLM takes from the peer's messages) give None and
    last_error; only types raise."""
    w = pair.src.write_blocks
    err = lambda: pair.src.last_error  # noqa: E731
    assert w("dst", [0, 1], [0]) is None and err().code == kvxfer.ErrorCode.EINVAL
    assert w("dst", [16], [0]) is None
    assert err().code == kvxfer.ErrorCode.ERANGE and "16" in err().message
    assert w("dst", [0], [99]) is None and "99" in err().message
    assert w("dst", [0, 1], [5, 5]) is None and err().code == kvxfer.ErrorCode.EINVAL
    assert w("dst", [-1], [0]) is None and err().code == kvxfer.ErrorCode.ERANGE
    assert w("dst", [0], [2 ** 64]) is None and err().code == kvxfer.ErrorCode.ERANGE
    assert isinstance(err().exception(), ValueError)
    with pytest.raises(TypeError):
        w("dst", [0.0], [0])
    with pytest.raises(TypeError):
        w("dst", ["0"], [0])
    with pytest.raises(TypeError):
        w("dst", 0, 0)
    with pytest.raises(TypeError):
        w(b"dst", [0], [0])
    # unordered collections: local and remote would pair up by chance
    for bad in ({0, 1}, frozenset([0, 1]), {0: 0, 1: 1}, {0: 0, 1: 1}.keys(), {0: 0, 1: 1}.values()):
        with pytest.raises(TypeError, match="order"):
            w("dst", bad, [0, 1])
        with pytest.raises(TypeError, match="remote_idxs"):
            w("dst", [0, 1], bad)
    assert w("", [0], [0]) is None
    assert w("x" * 256, [0], [0]) is None
    assert w("a\0b", [0], [0]) is None
    assert pair.src.last_error.code == kvxfer.ErrorCode.EINVAL
    # local duplicates are fine (the same block sent to two places)
    tid = w("dst", [3, 3], [4, 5])
    assert wait_for(pair.src, [tid])[0] == {tid: "done"}


def test_index_sequence_kinds(pair):
    import array
    ids = [
        pair.src.write_blocks("dst", (0, 1), (2, 3)),
        pair.src.write_blocks("dst", range(4), range(4, 8)),
        pair.src.write_blocks("dst", (i for i in [1]), iter([9])),
        pair.src.write_blocks("dst", array.array("Q", [1]), array.array("q", [2])),
        pair.src.write_blocks("dst", [True], [False]),
        pair.src.write_blocks("dst", bytearray([1, 2]), b"\x03\x04"),
    ]
    assert None not in ids
    assert set(wait_for(pair.src, ids)[0].values()) == {"done"}


def test_cancel(pair):
    assert pair.src.cancel([]) == []
    assert pair.src.cancel([], mode="wait") == []
    assert pair.src.cancel([123456, -5, 2 ** 70]) == []  # unknown ids are ignored
    ids = [pair.src.write_blocks("dst", list(range(16)), list(range(16))) for _ in range(30)]
    half, rest = ids[:15], ids[15:]
    assert pair.src.cancel(half) == []
    inflight = pair.src.cancel(rest, mode="wait")
    assert set(inflight) <= set(rest) and len(set(inflight)) == len(inflight)
    reported = []
    deadline = time.monotonic() + 10
    while set(inflight) - set(reported) and time.monotonic() < deadline:
        r = pair.src.poll()
        reported += list(r.done) + list(r.failed)
        time.sleep(0.01)
    time.sleep(0.2)
    r = pair.src.poll()
    reported += list(r.done) + list(r.failed)
    assert set(inflight) <= set(reported)  # "wait": what is still in flight surfaces in poll()
    assert len(reported) == len(set(reported)) and set(reported) <= set(ids)
    with pytest.raises(ValueError):
        pair.src.cancel([1], mode="later")
    with pytest.raises(ValueError):
        pair.src.cancel([1], mode=1)
    with pytest.raises(TypeError):
        pair.src.cancel(5)


@pytest.mark.parametrize("mode", ["immediate", "wait"])
def test_cancel_forgets_finished_unpolled_ids(pair, mode):
    tid = pair.src.write_blocks("dst", [0], [0])
    time.sleep(0.3)  # almost surely done by now; not polled yet
    back = pair.src.cancel([tid], mode)
    if back:
        # still on the wire on a very loaded machine: then it surfaces once
        assert mode == "wait" and back == [tid]
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not seen:
            r = pair.src.poll()
            seen = r.done + r.failed
            time.sleep(0.001)
        assert seen == [tid]
    time.sleep(0.1)
    r = pair.src.poll()
    assert tid not in r.done and tid not in r.failed


def test_last_error_stays_after_a_success(pair):
    """Like errno: a later success leaves the last failure as it is."""
    assert pair.src.last_error is None
    assert pair.src.write_blocks("ghost", [0], [0]) is None
    tid = pair.src.write_blocks("dst", [1], [2])
    assert tid is not None
    assert wait_for(pair.src, [tid])[0] == {tid: "done"}
    assert pair.src.last_error.code == kvxfer.ErrorCode.ENOENT
    assert "ghost" in pair.src.last_error.message


def test_last_error_is_per_thread(pair):
    assert pair.src.write_blocks("ghost", [0], [0]) is None
    other = []
    th = threading.Thread(target=lambda: other.append(pair.src.last_error))
    th.start()
    th.join()
    assert other == [None]
    assert pair.src.last_error.code == kvxfer.ErrorCode.ENOENT


# ------------------------------------------------------------------ options


def test_option_key_mapping():
    items = dict(_transport._option_items("tcp", {
        "tcp_listen": "127.0.0.1:0", "tcp_streams": 4, "verbs_gid_index": 3, "connect_timeout_ms": 100,
        "transfer_timeout_ms": 200, "tcp.advertise": "127.0.0.1:0", "shm_x": "y", "unset": None,
    }))
    assert items == {"backend": "tcp", "tcp.listen": "127.0.0.1:0", "tcp.streams": "4", "verbs.gid_index": "3",
                     "connect_timeout_ms": "100", "transfer_timeout_ms": "200", "tcp.advertise": "127.0.0.1:0",
                     "shm.x": "y"}
    assert dict(_transport._option_items(None, {"tcp_advertise": ["a:1", "b:2"]})) == {"tcp.advertise": "a:1,b:2"}
    with pytest.raises(TypeError):
        _transport._option_items(None, {"tcp_streams": True})
    with pytest.raises(TypeError):
        _transport._option_items(None, {"tcp_streams": 1.5})


def test_options_reach_the_library():
    p = Pair(tcp_streams=4, transfer_timeout_ms=5000, connect_timeout_ms=2000)
    try:
        tid = p.src.write_blocks("dst", list(range(16)), list(range(16)))
        assert wait_for(p.src, [tid])[0] == {tid: "done"}
    finally:
        p.close()
    mem, view = region(2, 64)
    with kvxfer.Transport(view, **{"backend": "tcp", "tcp.listen": "127.0.0.1:0"}) as t:
        assert t.backend == "tcp"


@pytest.mark.parametrize("kw", [
    {"tcp_streams": 99}, {"no_such_option": "1"}, {"connect_timeout_ms": 0}, {"backend": "nope"},
    {"tcp_listen": "not an address"},
])
def test_bad_options(kw):
    mem, view = region(2, 64)
    opts = dict(TCP, **kw)
    with pytest.raises(ValueError) as ei:
        kvxfer.Transport(view, **opts)
    assert isinstance(ei.value, kvxfer.Error) and ei.value.message
    view.release()
    mem.append(0)  # nothing kept


def test_unavailable_backend():
    mem, view = region(2, 64)
    with pytest.raises(kvxfer.Error) as ei:
        kvxfer.Transport(view, backend="shm,carrier-pigeon")
    assert ei.value.code == kvxfer.ErrorCode.EINVAL


def test_peer_backend_names_the_path():
    a_mem, a_view = region(8, 4096)
    b_mem, b_view = region(8, 4096)
    with kvxfer.Transport(a_view, backend="tcp,shm", tcp_listen="127.0.0.1:0") as a, \
            kvxfer.Transport(b_view, backend="shm", tcp_listen="127.0.0.1:0") as b:
        assert b.backend == "shm"
        # every backend served, in order of preference (not of the list
        # given), not only the first: a names both
        assert a.backends == ("shm", "tcp") and b.backends == ("shm",)
        assert "backends=shm,tcp" in repr(a)
        connect(a, b)
        assert a.peer_backend("dst") == ("shm", "process_vm_writev")  # a bytearray: private memory
        with pytest.raises(kvxfer.Error) as ei:
            a.peer_backend("nobody")
        assert ei.value.code == kvxfer.ErrorCode.ENOENT


def fails_as_peer_backend(t, query):
    """query(peer_id) of a per-peer call fails as peer_backend does: an
    unknown peer (the same error class, ENOENT, last_error), an empty id, and
    (last: it closes t) a closed transport. t has a peer "dst"."""
    with pytest.raises(kvxfer.Error) as backend_ei:
        t.peer_backend("nobody")
    with pytest.raises(kvxfer.Error) as ei:
        query("nobody")
    assert type(ei.value) is type(backend_ei.value) and isinstance(ei.value, kvxfer.RequestError)
    assert ei.value.code == kvxfer.ErrorCode.ENOENT and t.last_error.code == kvxfer.ErrorCode.ENOENT
    with pytest.raises(kvxfer.ArgumentError):
        query("")
    t.close()
    with pytest.raises(kvxfer.ClosedError):
        query("dst")


def test_peer_rails_only_verbs_has_rails(pair):
    assert pair.src.peer_backend("dst") == ("tcp", "")
    assert pair.src.peer_rails("dst") == []
    fails_as_peer_backend(pair.src, pair.src.peer_rails)


def test_peer_state_up(pair):
    st = pair.src.peer_state("dst")
    assert isinstance(st, kvxfer.PeerState) and st.link is kvxfer.PeerLink.UP
    assert (st.backend, st.path) == pair.src.peer_backend("dst") == ("tcp", "")
    assert st.error == kvxfer.ErrorCode.OK == 0 and st.reason == ""
    assert (st.in_flight, st.reconnects, st.attempts, st.next_attempt_ns) == (0, 0, 0, 0)
    assert abs(st.since_ns - time.time_ns()) < 600 * 10**9  # CLOCK_REALTIME, since the add
    with pytest.raises(AttributeError):
        st.link = kvxfer.PeerLink.BROKEN  # immutable
    with pytest.raises(TypeError):
        pair.src.peer_state(None)
    fails_as_peer_backend(pair.src, pair.src.peer_state)


@pytest.mark.parametrize("redial_ms, link", [(50, kvxfer.PeerLink.RECONNECTING), (0, kvxfer.PeerLink.BROKEN)],
                         ids=["redial_50ms", "redial_off"])
def test_peer_state_after_the_target_closed(redial_ms, link):
    """The target goes away: the peer stays registered and goes RECONNECTING
    (attempts that fail: nobody answers) or, with peer_redial_ms=0, BROKEN."""
    smem, sview = region(4, 256)
    dmem, dview = region(4, 256)
    with kvxfer.Transport(sview, **TCP, peer_redial_ms=redial_ms) as src, kvxfer.Transport(dview, **TCP) as dst:
        connect(src, dst)
        assert src.peer_state("dst").link is kvxfer.PeerLink.UP
        dst.close()
        # a write notices the break if nothing else did (refused, or accepted and reported failed)
        tid = src.write_blocks("dst", [1], [1])
        if tid is not None:
            assert wait_for(src, [tid], timeout=40)[0] == {tid: "failed"}
        deadline = time.monotonic() + 20
        st = src.peer_state("dst")
        while st.link is not link and time.monotonic() < deadline:
            time.sleep(0.01)
            st = src.peer_state("dst")
        assert st.link is link, st
        assert st.error != 0 and isinstance(st.error, kvxfer.ErrorCode) and st.reason
        assert st.backend == "tcp" and st.reconnects == 0
        assert src.write_blocks("dst", [1], [1]) is None
        assert src.last_error.code == kvxfer.ErrorCode.EPEERBROKEN
        if link is kvxfer.PeerLink.RECONNECTING:
            while st.attempts < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
                st = src.peer_state("dst")
            assert st.attempts >= 2 and st.link is kvxfer.PeerLink.RECONNECTING, st
        else:
            time.sleep(0.3)
            st = src.peer_state("dst")
            assert st.link is kvxfer.PeerLink.BROKEN and st.attempts == 0 and st.next_attempt_ns == 0, st
        src.remove_remote_peer("dst")
        with pytest.raises(kvxfer.RequestError):
            src.peer_state("dst")


# ------------------------------------------------------------------ lifecycle


def test_close_idempotent_and_closed_errors():
    mem, view = region(4, 64)
    t = kvxfer.Transport(view, **TCP)
    t.close()
    t.close()
    assert t.closed
    for call in (t.get_agent_metadata, t.poll, lambda: t.add_remote_peer("p", b"x" * 64, 0, 4, 64),
                 lambda: t.cancel([1])):
        with pytest.raises(kvxfer.ClosedError) as ei:
            call()
        assert ei.value.code == kvxfer.ErrorCode.ECLOSED
        assert isinstance(ei.value, kvxfer.TransportError) and not isinstance(ei.value, ValueError)
    # the DataTransport calls vLLM makes outside its error handling never raise
    assert t.write_blocks("p", [0], [0]) is None and t.last_error.code == kvxfer.ErrorCode.ECLOSED
    assert t.remove_remote_peer("p") is None
    fut = t.add_remote_peer_async("p", b"x" * 64, 0, 4, 64)
    assert isinstance(fut.exception(timeout=5), kvxfer.ClosedError)
    assert t.stats()["transfers_done"] == 0  # telemetry stays readable


def test_context_manager_closes_on_exception():
    mem, view = region(4, 64)
    with pytest.raises(RuntimeError):
        with kvxfer.Transport(view, **TCP) as t:
            raise RuntimeError("boom")
    assert t.closed


def test_close_fails_inflight_and_stops_writes():
    p = Pair()
    ids = [p.src.write_blocks("dst", list(range(16)), list(range(16))) for _ in range(10)]
    p.dst.close()  # the target goes away: nothing may land in its region any more
    before = bytes(p.dmem)
    time.sleep(0.2)
    assert bytes(p.dmem) == before
    p.dview.release()  # the transport no longer holds an export of the view
    p.dmem.append(0)
    seen, _ = wait_for(p.src, ids)
    assert set(seen) == set(ids)
    p.src.close()


def test_gc_without_close_releases_buffer():
    mem, view = region(4, 64)
    t = kvxfer.Transport(view, **TCP)
    del t, view
    gc.collect()
    mem.append(0)


def test_errors_carry_code_and_message():
    e = kvxfer.Error(kvxfer.ErrorCode.ENOENT)
    assert e.code == -2 and e.message == kvxfer.strerror(-2) and e.name == "KVX_ENOENT"
    assert "KVX_ENOENT" in str(e)
    import pickle
    e2 = pickle.loads(pickle.dumps(kvxfer.PeerError(-111, "refused")))
    assert type(e2) is kvxfer.PeerError and (e2.code, e2.message) == (-111, "refused")
    assert kvxfer.error_scope(kvxfer.ErrorCode.EPEERBROKEN) == kvxfer.Scope.PEER
    assert issubclass(kvxfer.ArgumentError, ValueError) and issubclass(kvxfer.ArgumentError, kvxfer.RequestError)
    assert issubclass(kvxfer.RequestError, ValueError) and issubclass(kvxfer.PeerError, ValueError)
    assert issubclass(kvxfer.ClosedError, kvxfer.TransportError)
    assert not issubclass(kvxfer.TransportError, ValueError)


def test_not_picklable(pair):
    import pickle
    with pytest.raises(TypeError):
        pickle.dumps(pair.src)


# ------------------------------------------------------------------ drop-in


def test_implements_the_seed_interface():
    abstract = seed_reference.DataTransport.__abstractmethods__
    assert abstract == {"get_agent_metadata", "add_remote_peer", "remove_remote_peer", "write_blocks", "poll",
                        "cancel", "close"}
    for name in abstract:
        ours = inspect.signature(getattr(kvxfer.Transport, name))
        seed = inspect.signature(getattr(seed_reference.DataTransport, name))
        for pname, param in seed.parameters.items():
            assert pname in ours.parameters, (name, pname)
            assert ours.parameters[pname].default == param.default, (name, pname)
    for prop in ("base_addr", "num_blocks", "block_len", "config_fingerprint"):
        assert isinstance(getattr(kvxfer.Transport, prop), property)
    ctor = inspect.signature(kvxfer.Transport)
    assert list(ctor.parameters)[:2] == ["view", "config_fields"]
    seed_reference.DataTransport.register(kvxfer.Transport)
    mem, view = region(2, 64)
    with kvxfer.Transport(view, **TCP) as t:
        assert isinstance(t, seed_reference.DataTransport)
    assert kvxfer.PollResult._fields == seed_reference.PollResult._fields


def _seed_style_transfer(src, dst, nb, bl, dmem):
    """Code written against the seed's DataTransport API only."""
    src.add_remote_peer("peer-1", dst.get_agent_metadata(), dst.base_addr, dst.num_blocks, dst.block_len)
    tid = src.write_blocks("peer-1", [0, 1], [1, 0])
    assert tid is not None
    assert src.write_blocks("not-registered", [0], [0]) is None
    done = []
    for _ in range(10000):
        res = src.poll()
        done += res.done
        assert not res.failed
        if tid in done:
            break
        time.sleep(0.001)
    assert tid in done
    assert src.cancel([tid]) == [] and src.cancel([tid], "wait") == []
    src.remove_remote_peer("peer-1")
    src.close()
    src.close()


def test_seed_style_usage():
    smem, sview = region(4, 128)
    dmem, dview = region(4, 128)
    smem[:128] = b"A" * 128
    smem[128:256] = b"B" * 128
    dst = kvxfer.Transport(dview, {"model": "x"}, **TCP)
    src = kvxfer.Transport(sview, {"model": "x"}, **TCP)
    _seed_style_transfer(src, dst, 4, 128, dmem)
    assert dmem[:256] == b"B" * 128 + b"A" * 128
    dst.close()
