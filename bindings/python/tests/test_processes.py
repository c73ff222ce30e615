"""Two processes: multiprocessing (spawn), the examples, a peer that dies,
and the registration with vLLM's DataTransport (a stand-in vllm package)."""
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import kvxfer

import _mp_peer
from conftest import EXAMPLES, HERE, TCP, region, wait_for
from seed_reference import compute_fingerprint as reference

INTEROP = os.path.join(EXAMPLES, "interop.py")


def test_two_processes_multiprocessing():
    nb, bl, cfg = 32, 8192, {"model": "mp", "layers": 4}
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_mp_peer.target, args=(child, nb, bl, cfg))
    proc.start()
    try:
        assert parent.poll(60), "child did not start"
        meta, base, n, length, fp = parent.recv()
        assert fp == reference(cfg)
        mem, view = region(nb, bl)
        for i in range(nb):
            mem[i * bl:(i + 1) * bl] = bytes([i * 5 + 1]) * bl
        with kvxfer.Transport(view, cfg, **TCP) as t:
            t.add_remote_peer("child", meta, base, n, length)
            local, remote = list(range(0, nb, 2)), list(range(nb - 1, 0, -2))
            tid = t.write_blocks("child", local, remote)
            assert wait_for(t, [tid])[0] == {tid: "done"}
            parent.send({r: l * 5 + 1 for l, r in zip(local, remote)})
            assert parent.poll(60)
            assert parent.recv() == "verified"
            parent.send("bye")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


def _run(args, env, timeout=90):
    return subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True, timeout=timeout)


def test_quickstart_example(sub_env):
    r = _run([os.path.join(EXAMPLES, "quickstart.py")], sub_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data verified" in r.stdout


def test_interop_example(tmp_path, sub_env):
    target = subprocess.Popen([sys.executable, INTEROP, "target", str(tmp_path)], env=sub_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ini = _run([INTEROP, "initiator", str(tmp_path)], sub_env)
        out, err = target.communicate(timeout=90)
    finally:
        if target.poll() is None:
            target.kill()
    assert ini.returncode == 0, ini.stdout + ini.stderr
    assert target.returncode == 0, out + err
    fp = reference({"model": "interop", "layers": 2})
    assert ini.stdout.splitlines()[0] == out.splitlines()[0] == "fingerprint " + fp
    assert ini.stdout.splitlines()[-1] == "sent"
    assert out.splitlines()[-1] == "verified"
    assert (tmp_path / "done").exists() and (tmp_path / "target.json").exists()
    assert not (tmp_path / "target.json.tmp").exists()
    assert _run([INTEROP], sub_env).returncode == 2


def test_peer_process_dies(tmp_path, sub_env):
    """A peer killed mid-way is peer trouble: transfers fail or complete,
    write_blocks returns None, nothing raises."""
    target = subprocess.Popen([sys.executable, INTEROP, "target", str(tmp_path)], env=sub_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "target.json").exists():
            assert time.monotonic() < deadline and target.poll() is None
            time.sleep(0.02)
        import json
        info = json.loads((tmp_path / "target.json").read_text())
        mem, view = region(16, 4096)
        with kvxfer.Transport(view, {"model": "interop", "layers": 2}, **TCP, transfer_timeout_ms=3000) as t:
            t.add_remote_peer("target", bytes.fromhex(info["metadata"]), info["base_addr"], 16, 4096)
            tid = t.write_blocks("target", list(range(16)), list(range(16)))
            assert wait_for(t, [tid])[0] == {tid: "done"}
            target.send_signal(signal.SIGKILL)
            target.wait(30)
            ids, result = [], 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                result = t.write_blocks("target", [0], [0])
                if result is None:
                    break
                ids.append(result)
                t.poll()
                time.sleep(0.01)
            assert result is None
            assert t.last_error.scope == kvxfer.Scope.PEER
            t.remove_remote_peer("target")
    finally:
        if target.poll() is None:
            target.kill()


FAKE_VLLM_CHECK = textwrap.dedent("""
    import kvxfer
    from vllm.v1.kv_offload.tiering.p2p.data import base
    assert kvxfer.DataTransport is base.DataTransport
    assert issubclass(kvxfer.Transport, base.DataTransport)
    assert kvxfer.PollResult is base.PollResult
    mem = bytearray(4 * 64)
    with kvxfer.Transport(mem, num_blocks=4, block_len=64, backend="tcp", tcp_listen="127.0.0.1:0") as t:
        assert isinstance(t, base.DataTransport)
        r = t.poll()
        assert isinstance(r, base.PollResult) and r == ((), ()) and r.errors == {}
    print("registered")
""")


def _fake_vllm(root, base_source):
    pkg = root / "vllm" / "v1" / "kv_offload" / "tiering" / "p2p" / "data"
    pkg.mkdir(parents=True)
    d = root / "vllm"
    for part in ("", "v1", "kv_offload", "tiering", "p2p", "data"):
        d = d / part if part else d
        (d / "__init__.py").write_text("")
    (pkg / "base.py").write_text(base_source)


def test_registers_with_vllm_when_importable(tmp_path, sub_env):
    with open(os.path.join(HERE, "seed_reference.py")) as f:
        _fake_vllm(tmp_path, f.read())
    env = dict(sub_env)
    env.pop("KVXFER_NO_VLLM")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    r = _run(["-c", FAKE_VLLM_CHECK], env)
    assert r.returncode == 0 and "registered" in r.stdout, r.stdout + r.stderr
    env["KVXFER_NO_VLLM"] = "1"
    r = _run(["-c", "import kvxfer; assert kvxfer.DataTransport is None; print('skipped')"], env)
    assert r.returncode == 0 and "skipped" in r.stdout, r.stderr


def test_broken_or_missing_vllm_never_fails(tmp_path, sub_env):
    _fake_vllm(tmp_path, "raise RuntimeError('broken vllm')\n")
    env = dict(sub_env)
    env.pop("KVXFER_NO_VLLM")
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    code = "import kvxfer; assert kvxfer.DataTransport is None; assert kvxfer.PollResult._fields; print('ok')"
    r = _run(["-c", code], env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    shutil.rmtree(tmp_path / "vllm")  # (a real vLLM, if installed, may be found now)
    r = _run(["-c", "import kvxfer; assert kvxfer.PollResult._fields; print('ok')"], env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_fork_child_cannot_use_parent_transport():
    mem, view = region(4, 64)
    with kvxfer.Transport(view, **TCP) as t:
        pid = os.fork()
        if pid == 0:  # child: every call refused, GC and close must not hang or crash
            code = 1
            try:
                try:
                    t.poll()
                except kvxfer.ClosedError as e:
                    if "fork" in e.message:
                        code = 0
                from kvxfer import _native
                try:
                    _native.kvx_poll(t._h, None, None, None)
                    code = 1
                except RuntimeError:
                    pass
                t.close()
                del t
                import gc
                gc.collect()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert t.poll() == ((), ())  # the parent's transport is unaffected
        assert len(t.get_agent_metadata()) > 0
