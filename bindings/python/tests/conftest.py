import os
import sys
import time

import pytest

import kvxfer

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, HERE)  # seed_reference

TCP = {"backend": "tcp", "tcp_listen": "127.0.0.1:0"}


def region(num_blocks, block_len, fill=0):
    """(bytearray, 2-D memoryview over it)."""
    mem = bytearray([fill]) * (num_blocks * block_len)
    return mem, memoryview(mem).cast("B", (num_blocks, block_len))


def block(mem, i, block_len):
    return bytes(mem[i * block_len:(i + 1) * block_len])


def fill_block(mem, i, block_len, value):
    mem[i * block_len:(i + 1) * block_len] = bytes([value]) * block_len


def connect(src, dst, peer_id="dst"):
    src.add_remote_peer(peer_id, dst.get_agent_metadata(), dst.base_addr, dst.num_blocks, dst.block_len)


def wait_for(t, ids, timeout=15.0, peer_id=None):
    """Poll until every id in ids was reported; returns ({id: "done"|"failed"}, extra ids seen)."""
    ids = set(ids)
    seen, extra = {}, []
    deadline = time.monotonic() + timeout
    while ids - seen.keys():
        r = t.poll() if peer_id is None else t.poll(peer_id)
        for state, lst in (("done", r.done), ("failed", r.failed)):
            for i in lst:
                assert i not in seen, "id %d reported twice" % i
                if i in ids:
                    seen[i] = state
                else:
                    extra.append(i)
        if time.monotonic() > deadline:
            raise AssertionError("ids %s not reported within %ss" % (sorted(ids - seen.keys()), timeout))
        time.sleep(0.001)
    return seen, extra


class Pair:
    def __init__(self, nb=16, bl=4096, config=None, **opts):
        self.nb, self.bl = nb, bl
        self.smem, self.sview = region(nb, bl)
        self.dmem, self.dview = region(nb, bl, fill=0xEE)  # canary everywhere
        o = dict(TCP, **opts)
        self.src = kvxfer.Transport(self.sview, config, **o)
        self.dst = kvxfer.Transport(self.dview, config, **o)
        connect(self.src, self.dst)

    def close(self):
        self.src.close()
        self.dst.close()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


@pytest.fixture
def sub_env():
    """Environment for child processes that import kvxfer like this one."""
    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(kvxfer.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["KVXFER_NO_VLLM"] = "1"
    return env
