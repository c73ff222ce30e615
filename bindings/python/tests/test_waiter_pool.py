"""add_remote_peer_async at scale: the threads that settle its futures
(kvxfer's waiter pool, threads named "kvxfer-registrations") stay few while
100 registrations are pending and are gone again after, down to the one the
pool keeps; the library's own connect threads too (/proc/self/status). A
bounded pool must not starve: a registration that ends while every waiter
is busy with another one still settles at once."""
import socket
import threading
import time

import pytest

import kvxfer
from kvxfer import ErrorCode, _transport

from conftest import TCP, region, wait_for

N = 100
SETTLE_S = 5.0  # waiters linger well under a second, the library's connect threads too


def _waiters():
    return sum(1 for th in threading.enumerate() if th.name == "kvxfer-registrations")


def _proc_threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def _settle(count, want, timeout=SETTLE_S):
    """count() once it equals want, or its last value after timeout seconds."""
    deadline = time.monotonic() + timeout
    n = count()
    while n != want and time.monotonic() < deadline:
        time.sleep(0.01)
        n = count()
    return n


def _meta(t):
    return (t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len)


@pytest.fixture
def target():
    mem, view = region(16, 4096, fill=0xEE)
    with kvxfer.Transport(view, **TCP) as t:
        yield t


@pytest.fixture
def local():
    mem, view = region(16, 4096)
    with kvxfer.Transport(view, **TCP) as t:
        yield t


def test_100_async_adds_bounded_and_back_to_start(local, target):
    _settle(_waiters, 1)  # what earlier tests left lingers for a moment
    start, start_w, start_proc = threading.active_count(), _waiters(), _proc_threads()
    assert start_w == 1  # the pool keeps one, started with the first transport
    peak = [start, start_w, start_proc]

    def sample():
        for k, n in enumerate((threading.active_count(), _waiters(), _proc_threads())):
            peak[k] = max(peak[k], n)

    meta, settled = _meta(target), []
    futs = []
    for i in range(N):
        fut = local.add_remote_peer_async("p%d" % i, *meta)
        fut.add_done_callback(lambda f, i=i: settled.append(i))
        futs.append(fut)
        sample()
    deadline = time.monotonic() + 30
    while not all(f.done() for f in futs):
        assert time.monotonic() < deadline, "%d futures pending after 30 s" % sum(not f.done() for f in futs)
        sample()
        time.sleep(0.001)
    for i, f in enumerate(futs):
        assert f.result() is None, "p%d: %r" % (i, f.exception())
    after = _settle(threading.active_count, start)
    after_w = _waiters()
    after_proc = _settle(_proc_threads, start_proc)
    print("\n%d async adds: Python threads %d -> peak %d -> %d (waiters %d -> %d -> %d, cap %d); "
          "process threads %d -> peak %d -> %d"
          % (N, start, peak[0], after, start_w, peak[1], after_w, _transport._WAITERS_MAX, start_proc, peak[2],
             after_proc))
    assert sorted(settled) == list(range(N))  # every done callback ran, once
    assert peak[1] <= _transport._WAITERS_MAX
    assert peak[0] <= start + _transport._WAITERS_MAX - start_w
    assert (after, after_w, after_proc) == (start, start_w, start_proc)
    tid = local.write_blocks("p99", [0], [1])  # registered for real
    assert wait_for(local, [tid])[0] == {tid: "done"}


@pytest.fixture
def silent():
    """Metadata of a peer that accepts TCP connections and never answers."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    mem, view = region(16, 4096)
    with kvxfer.Transport(view, tcp_advertise="127.0.0.1:%d" % hole.getsockname()[1], **TCP) as t:
        yield _meta(t)
    hole.close()


def test_busy_waiters_do_not_starve_others(silent):
    """More registrations to a silent peer than waiters: every waiter is busy
    for the connect timeout, yet one removed (or closed) meanwhile settles
    at once, not when a waiter gets free."""
    mem, view = region(16, 4096)
    with kvxfer.Transport(view, connect_timeout_ms=4000, **TCP) as t:
        futs = [t.add_remote_peer_async("s%d" % i, *silent) for i in range(3 * _transport._WAITERS_MAX)]
        time.sleep(0.1)  # the waiters took theirs
        for i in (len(futs) - 1, 0):  # one queued for a waiter, one a waiter may be on
            t0 = time.monotonic()
            t.remove_remote_peer("s%d" % i)
            exc = futs[i].exception(timeout=3)
            took = time.monotonic() - t0
            assert isinstance(exc, kvxfer.RequestError) and exc.code == ErrorCode.ECANCELED
            assert took < 0.5, "s%d settled %.0f ms after its remove" % (i, took * 1e3)
        t0 = time.monotonic()
        t.close()
        for f in futs[1:-1]:
            assert isinstance(f.exception(timeout=3), kvxfer.ClosedError)
        assert time.monotonic() - t0 < 1.0
