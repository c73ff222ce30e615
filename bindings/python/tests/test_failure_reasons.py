"""Why a transfer failed (kvx_poll_results): Transport.poll_results(), the
errors attribute of poll()'s PollResult, last_error after a poll that
reports failures, the stats by cause, and the vLLM adapter's warning.

A removed or killed peer with transfers in flight: the target is
examples/interop.py in another process (as in test_processes.py), stopped
with SIGSTOP so that nothing it was sent can complete, then removed (every
failed id says KVX_ECANCELED) or killed (KVX_ECONNRESET)."""
import contextlib
import copy
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

import kvxfer
import kvxfer.vllm
from kvxfer import ErrorCode, _native

from conftest import EXAMPLES, TCP, region, wait_for

INTEROP = os.path.join(EXAMPLES, "interop.py")
N = 16  # transfers in flight when the peer goes
CAUSES = ("transfers_failed_timeout", "transfers_failed_connection", "transfers_failed_removed",
          "transfers_failed_other")


def _state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def target_process(tmp_path, sub_env):
    """(process, its target.json) of examples/interop.py target, killed at the end."""
    proc = subprocess.Popen([sys.executable, INTEROP, "target", str(tmp_path)], env=sub_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "target.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "target did not start"
            time.sleep(0.02)
        yield proc, json.loads((tmp_path / "target.json").read_text())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(30)


def add_target(t, info, peer_id="target"):
    t.add_remote_peer(peer_id, bytes.fromhex(info["metadata"]), info["base_addr"], info["num_blocks"],
                      info["block_len"])


def freeze(proc):
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "T":
        assert time.monotonic() < deadline, "target not stopped"
        time.sleep(0.005)


def write_in_flight(t, peer_id="target"):
    ids = [t.write_blocks(peer_id, list(range(16)), list(range(16))) for _ in range(N)]
    assert None not in ids, t.last_error
    return ids


def poll_all(t, ids, how, peer_id=None, timeout=30.0):
    """Results of ids: {id: ErrorInfo or None}, polled with poll() (how="poll",
    also returning every PollResult seen) or poll_results(); fails on an id
    reported twice or not at all."""
    want, got, polls = set(ids), {}, []
    deadline = time.monotonic() + timeout
    while want - got.keys():
        if how == "poll":
            r = t.poll(peer_id)
            polls.append(r)
            assert set(r.errors) == set(r.failed)
            pairs = [(i, None) for i in r.done] + [(i, r.errors[i]) for i in r.failed]
        else:
            pairs = [(res.id, res.error) for res in t.poll_results(peer_id)]
        for i, err in pairs:
            assert i not in got, "id %d reported twice" % i
            got[i] = err
        assert time.monotonic() < deadline, "ids %s not reported" % sorted(want - got.keys())
        time.sleep(0.002)
    assert set(got) == want
    return got, polls


def check_causes(s, **want):
    assert sum(s[k] for k in CAUSES) == s["transfers_failed"], s
    for k, v in want.items():
        assert s[k] == v, (k, s)


# ------------------------------------------------------------------ the SWIG layer


def test_native_poll_results():
    # kvx_poll_results and its struct are replaced by kvxpy_poll_results: (rc, ids, statuses)
    assert not hasattr(_native, "kvx_poll_results") and not hasattr(_native, "kvx_result")
    mem, view = region(4, 64)
    t = kvxfer.Transport(view, **TCP)
    h = t._h
    assert _native.kvxpy_poll_results(h, None, 0) == (0, [], [])
    assert _native.kvxpy_poll_results(h, None, 1000) == (0, [], [])
    assert _native.kvxpy_poll_results(h, "nobody", 4) == (0, [], [])
    t.close()
    assert _native.kvxpy_poll_results(h, None, 4) == (_native.KVX_ECLOSED, None, None)
    with pytest.raises(kvxfer.ClosedError):
        t.poll_results()
    assert kvxfer.strerror(ErrorCode.ECANCELED) == _native.kvx_strerror(_native.KVX_ECANCELED)


# ------------------------------------------------------------------ done transfers


def test_poll_results_done(pair):
    ids = [pair.src.write_blocks("dst", [i], [i]) for i in range(8)]
    got, _ = poll_all(pair.src, ids, "poll_results")
    assert got == {i: None for i in ids}
    assert pair.src.poll_results() == () and pair.src.poll_results("dst") == ()
    assert pair.src.poll_results("unknown-peer") == ()
    tid = pair.src.write_blocks("dst", [1], [2])
    deadline = time.monotonic() + 15
    res = ()
    while not res and time.monotonic() < deadline:
        res = pair.src.poll_results("dst")
    assert res == (kvxfer.Result(tid, None),) and isinstance(res[0], kvxfer.Result)
    assert res[0].id == tid and res[0].error is None
    with pytest.raises(TypeError):
        pair.src.poll_results(7)
    with pytest.raises(kvxfer.ArgumentError):
        pair.src.poll_results("")
    check_causes(pair.src.stats(), transfers_failed=0, transfers_failed_removed=0)


def test_poll_result_errors_attribute(pair):
    tid = pair.src.write_blocks("dst", [0], [0])
    seen, _ = wait_for(pair.src, [tid])
    r = pair.src.poll()
    assert r == ((), ()) and r.errors == {} and isinstance(r, kvxfer.PollResult)
    assert repr(r) == "PollResult(done=(), failed=())"
    done, failed = r  # vLLM unpacks it: exactly two fields
    assert r._fields == ("done", "failed") and len(r) == 2
    assert "errors" not in r._asdict()
    for back in (pickle.loads(pickle.dumps(r)), copy.copy(r)):
        assert back == r and type(back) is kvxfer.PollResult  # the plain class, without errors


def test_poll_and_poll_results_never_report_an_id_twice(pair):
    ids = [pair.src.write_blocks("dst", [i % 16], [i % 16]) for i in range(300)]
    got = {}
    deadline = time.monotonic() + 30
    k = 0
    while len(got) < len(ids):
        k += 1
        if k % 2:
            r = pair.src.poll()
            pairs = [(i, None) for i in r.done] + [(i, r.errors[i]) for i in r.failed]
        else:
            pairs = [(x.id, x.error) for x in pair.src.poll_results("dst")]
        for i, err in pairs:
            assert i not in got, "id %d reported twice" % i
            got[i] = err
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    assert set(got) == set(ids) and set(got.values()) == {None}
    assert pair.src.poll() == ((), ()) and pair.src.poll_results() == ()


# ------------------------------------------------------------------ failures


def test_removed_then_killed_peer_with_transfers_in_flight(tmp_path, sub_env):
    mem, view = region(16, 4096)
    with target_process(tmp_path, sub_env) as (proc, info), \
            kvxfer.Transport(view, {"model": "interop", "layers": 2}, **TCP, transfer_timeout_ms=60000,
                             peer_redial_ms=0) as t:
        add_target(t, info)
        assert t.last_error is None
        # removed: poll() says why in errors and last_error
        freeze(proc)
        ids = write_in_flight(t)
        t.remove_remote_peer("target")
        got, polls = poll_all(t, ids, "poll")
        assert all(not r.done for r in polls), "a transfer to a stopped target completed"
        for i in ids:
            assert got[i].code == ErrorCode.ECANCELED and isinstance(got[i].code, ErrorCode), got[i]
            assert got[i].message == kvxfer.strerror(ErrorCode.ECANCELED) == "cancelled: the peer was removed or replaced"
            assert got[i].exception().code == ErrorCode.ECANCELED
        last_failed = [r.failed[-1] for r in polls if r.failed][-1]
        e = t.last_error
        assert e.code == ErrorCode.ECANCELED and e.name == "KVX_ECANCELED"
        assert e.message == "transfer %d failed: cancelled: the peer was removed or replaced" % last_failed, e
        check_causes(t.stats(), transfers_failed=N, transfers_failed_removed=N, transfers_failed_connection=0)
        # last_error is errno-like: a later poll without failures leaves it
        assert t.poll() == ((), ()) and t.last_error == e

        # killed: poll_results() of the peer says ECONNRESET, with the peer's state
        proc.send_signal(signal.SIGCONT)
        add_target(t, info)
        freeze(proc)
        ids = write_in_flight(t)
        proc.kill()
        proc.wait(30)
        got, _ = poll_all(t, ids, "poll_results", peer_id="target")
        for i in ids:
            assert got[i] is not None and got[i].code == ErrorCode.ECONNRESET, got[i]
            assert got[i].message.startswith(kvxfer.strerror(ErrorCode.ECONNRESET)), got[i]
        st = t.peer_state("target")
        assert st.link is kvxfer.PeerLink.BROKEN  # peer_redial_ms=0
        # what peer_state() said at the poll comes along (nothing if the poll
        # came before the peer's state changed)
        base = kvxfer.strerror(ErrorCode.ECONNRESET)
        assert {got[i].message for i in ids} <= {base, "%s; the peer is broken: %s" % (base, st.reason)}, got
        assert t.last_error == e  # poll_results() leaves last_error alone
        check_causes(t.stats("target"), transfers_failed=N, transfers_failed_connection=N,
                     transfers_failed_removed=0, transfers_failed_timeout=0)
        check_causes(t.stats(), transfers_failed=2 * N, transfers_failed_connection=N, transfers_failed_removed=N)
        t.remove_remote_peer("target")


def test_poll_names_the_peer_it_was_given(tmp_path, sub_env):
    mem, view = region(16, 4096)
    with target_process(tmp_path, sub_env) as (proc, info), \
            kvxfer.Transport(view, {"model": "interop", "layers": 2}, **TCP, transfer_timeout_ms=60000,
                             peer_redial_ms=0) as t:
        add_target(t, info)
        freeze(proc)
        ids = write_in_flight(t)
        proc.kill()
        proc.wait(30)
        got, polls = poll_all(t, ids, "poll", peer_id="target")
        last_failed = [r.failed[-1] for r in polls if r.failed][-1]
        e = t.last_error
        assert e.code == ErrorCode.ECONNRESET
        assert e.message.startswith("transfer %d to peer 'target' failed: %s" % (
            last_failed, kvxfer.strerror(ErrorCode.ECONNRESET))), e
        assert e.message.endswith(got[last_failed].message)


def test_vllm_adapter_logs_failures(tmp_path, sub_env, caplog):
    mem, view = region(16, 4096)
    caplog.set_level(logging.INFO, logger="kvxfer")
    with target_process(tmp_path, sub_env) as (proc, info), \
            kvxfer.vllm.KvxferTransport("engine-0", view, {"model": "interop", "layers": 2}, **TCP,
                                        transfer_timeout_ms=60000) as t:
        add_target(t, info)
        freeze(proc)
        ids = write_in_flight(t)
        caplog.clear()
        t.remove_remote_peer("target")
        time.sleep(0.2)
        seen, polls = set(), 0
        deadline = time.monotonic() + 30
        while len(seen) < N:
            r = t.poll()
            assert not r.done
            seen.update(r.failed)
            polls += bool(r.failed)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
        assert len(warnings) == polls, caplog.text  # one line per poll per reason
        counts = 0
        for rec in warnings:
            assert rec.name == "kvxfer.vllm"
            msg = rec.getMessage()
            assert "failed: KVX_ECANCELED (the peer was removed or replaced" in msg, msg
            n = int(msg.split()[1])
            counts += n
            assert msg.startswith("kvxfer: %d transfer%s failed: " % (n, "s" if n > 1 else "")), msg
        assert counts == N
        caplog.clear()
        assert t.poll() == ((), ())
        assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
