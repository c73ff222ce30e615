"""Python per-call overhead of write_blocks with 1,000 indexes given as a
list, a numpy int64 array and a numpy int32 array, above the C call itself
(the SWIG entry point with ready uint64 buffers). Prints the medians (also
under pytest's output capture); asserts only what is deterministic: arrays take the
buffer path (no conversion to Python ints, no numpy temporary)."""
import array
import statistics
import time

import numpy as np
import pytest

import kvxfer
from kvxfer import _native, _transport

from conftest import Pair

N = 1000
CALLS = 300


@pytest.fixture
def bench_pair():
    p = Pair(nb=2 * N, bl=64)
    yield p
    p.close()


def drain(t, ids):
    pending = set(ids)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        r = t.poll()
        pending -= set(r.done) | set(r.failed)
    assert not pending


def medians_us(calls, t):
    """Median wall time of each call() in microseconds, and the median of its
    difference to calls[0] within a round: the variants run interleaved, so
    the machine's noise falls on all of them alike. Transfers drain untimed."""
    times = {name: [] for name in calls}
    ids = []
    names = list(calls)
    for r in range(CALLS):
        for name in names[r % len(names):] + names[:r % len(names)]:  # each variant in each position
            call = calls[name]
            t0 = time.perf_counter_ns()
            tid = call()
            times[name].append((time.perf_counter_ns() - t0) / 1000)
            assert tid, t.last_error
            ids.append(tid)
        drain(t, ids)
        ids = []
    first = next(iter(calls))
    return {name: (statistics.median(v), statistics.median(a - b for a, b in zip(v, times[first])))
            for name, v in times.items()}


def test_write_blocks_overhead(bench_pair, capsys):
    t = bench_pair.src
    local = list(range(N))
    remote = list(range(N, 2 * N))
    h = t._handle()
    lq, rq = array.array("Q", local), array.array("Q", remote)

    def c_call():
        rc, tid = _native.kvxpy_write_blocks(h, "dst", lq, rq)
        assert rc == 0
        return tid

    calls = {"C call (SWIG, ready uint64 buffers)": c_call}
    for name, dtype in (("list", None), ("numpy int64", np.int64), ("numpy int32", np.int32),
                        ("numpy uint64", np.uint64)):
        lo, re = (local, remote) if dtype is None else (np.array(local, dtype=dtype), np.array(remote, dtype=dtype))
        calls[name] = (lambda lo, re: lambda: t.write_blocks("dst", lo, re))(lo, re)
    figures = medians_us(calls, t)
    with capsys.disabled():
        print("\nwrite_blocks, %d indexes, median of %d interleaved rounds (tcp loopback):" % (N, CALLS))
        for name, (us, extra) in figures.items():
            print("  %-36s %7.1f us  %+6.1f us above the C call" % (name, us, extra))


@pytest.mark.parametrize("make", [
    lambda v: np.array(v, dtype=np.int32),
    lambda v: np.array(v, dtype=np.int64),
    lambda v: np.array(v, dtype=np.uint32),
    lambda v: array.array("i", v),
    lambda v: memoryview(array.array("q", v)),
], ids=["numpy-int32", "numpy-int64", "numpy-uint32", "array-i", "memoryview-q"])
def test_arrays_take_the_buffer_path(bench_pair, monkeypatch, make):
    """Integer arrays reach C as buffers: the general path (Python ints,
    numpy temporaries) is never entered, and the transfer is right."""
    t = bench_pair.src

    def no_conversion(*a, **k):
        raise AssertionError("an integer array went through the conversion path")

    monkeypatch.setattr(_transport, "_as_u64", no_conversion)
    tid = t.write_blocks("dst", make(list(range(8))), make(list(range(100, 108))))
    assert tid, t.last_error
    drain(t, [tid])


def test_arrays_fall_back_for_errors(bench_pair):
    """Negative values, length mismatches and non-integer arrays still get the
    general path's precise answers."""
    t = bench_pair.src
    assert t.write_blocks("dst", np.array([0, -1], dtype=np.int32), np.array([1, 2], dtype=np.int32)) is None
    assert "negative" in t.last_error.message
    assert t.write_blocks("dst", np.array([0, 1], dtype=np.int64), np.array([1], dtype=np.int64)) is None
    assert "entries" in t.last_error.message
    with pytest.raises(TypeError):
        t.write_blocks("dst", np.array([0.0]), np.array([1.0]))
    assert t.write_blocks("dst", np.array([0], dtype=np.int32), np.array([10 ** 6], dtype=np.int64)) is None
    assert t.last_error.code == _native.KVX_ERANGE  # from the C library, through the buffer path
