#!/usr/bin/env python3
"""Cross-language interop example (tests/interop/PROTOCOL.md), Python side.

    interop.py target DIR      create a transport, publish DIR/target.json,
                               wait for DIR/done, verify the 16 blocks
    interop.py initiator DIR   read DIR/target.json, write local block i ->
                               remote block i (i < 16) in one call, wait for
                               it, create DIR/done

Both print "fingerprint <16 hex>" first. Exit status 0 on success, 1 on
failure (2 on usage errors). Standard library + kvxfer only.
"""
import json
import os
import sys
import time

import kvxfer

NUM_BLOCKS, BLOCK_LEN = 16, 4096
CONFIG = {"model": "interop", "layers": 2}
OPTIONS = {"backend": "shm,tcp", "tcp_listen": "127.0.0.1:0"}
WAIT_FILE_S = 60.0
TRANSFER_S = 30.0


def pattern(i):
    return (i * 37 + 11) & 0xFF


def make_transport():
    mem = bytearray(NUM_BLOCKS * BLOCK_LEN)  # zero-filled
    view = memoryview(mem).cast("B", (NUM_BLOCKS, BLOCK_LEN))
    t = kvxfer.Transport(view, CONFIG, **OPTIONS)
    print("fingerprint", t.config_fingerprint, flush=True)
    return t, mem


def wait_for(path, seconds):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def target(d):
    t, mem = make_transport()
    with t:
        info = {
            "metadata": t.get_agent_metadata().hex(),
            "base_addr": t.base_addr,
            "num_blocks": t.num_blocks,
            "block_len": t.block_len,
            "fingerprint": t.config_fingerprint,
        }
        tmp = os.path.join(d, "target.json.tmp")
        with open(tmp, "w") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(d, "target.json"))
        if not wait_for(os.path.join(d, "done"), WAIT_FILE_S):
            print("timed out waiting for %s" % os.path.join(d, "done"), flush=True)
            return 1
        bad = []
        for i in range(NUM_BLOCKS):
            block = mem[i * BLOCK_LEN:(i + 1) * BLOCK_LEN]
            want = pattern(i)
            if block.count(want) != BLOCK_LEN:
                pos = next(k for k, b in enumerate(block) if b != want)
                bad.append("block %d: byte %d is 0x%02x, expected 0x%02x" % (i, pos, block[pos], want))
        if bad:
            print("\n".join(bad), flush=True)
            return 1
        print("verified", flush=True)
        return 0


def initiator(d):
    path = os.path.join(d, "target.json")
    if not wait_for(path, WAIT_FILE_S):
        print("timed out waiting for %s" % path, flush=True)
        return 1
    with open(path) as f:
        info = json.load(f)
    t, mem = make_transport()
    with t:
        if info.get("fingerprint") != t.config_fingerprint:
            print("target fingerprint %r differs from ours" % info.get("fingerprint"), flush=True)
        for i in range(NUM_BLOCKS):
            mem[i * BLOCK_LEN:(i + 1) * BLOCK_LEN] = bytes([pattern(i)]) * BLOCK_LEN
        try:
            t.add_remote_peer("target", bytes.fromhex(info["metadata"]), int(info["base_addr"]),
                              int(info["num_blocks"]), int(info["block_len"]))
        except kvxfer.Error as e:
            print("add_remote_peer failed: %s" % e, flush=True)
            return 1
        print("path %s %s" % t.peer_backend("target"), flush=True)
        idxs = list(range(NUM_BLOCKS))
        tid = t.write_blocks("target", idxs, idxs)
        if tid is None:
            print("write_blocks failed: %s" % (t.last_error,), flush=True)
            return 1
        deadline = time.monotonic() + TRANSFER_S
        while True:
            res = t.poll()
            if tid in res.failed:
                print("transfer %d failed" % tid, flush=True)
                return 1
            if tid in res.done:
                break
            if time.monotonic() > deadline:
                print("transfer %d not done after %gs" % (tid, TRANSFER_S), flush=True)
                return 1
            time.sleep(0.001)
    with open(os.path.join(d, "done"), "w"):
        pass
    print("sent", flush=True)
    return 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("target", "initiator"):
        print("usage: %s target|initiator DIR" % argv[0], file=sys.stderr)
        return 2
    return target(argv[2]) if argv[1] == "target" else initiator(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
