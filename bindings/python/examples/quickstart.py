#!/usr/bin/env python3
"""kvxfer quickstart: two transports in one process, one WRITE between them.

In a real deployment each side runs in its own process or host, and the
agent metadata plus the geometry travel over your control plane.
Run: python3 quickstart.py
"""
import time

import kvxfer

NUM_BLOCKS, BLOCK_LEN = 8, 4096
CONFIG = {"model": "quickstart", "num_layers": 2, "dtype": "bfloat16"}
OPTS = dict(backend="tcp", tcp_listen="127.0.0.1:0")


def main():
    # The local KV block storage: a 2-D memoryview (num_blocks x block_len bytes).
    # (numpy arrays of shape (num_blocks, block_len) work as well.)
    src_mem, dst_mem = bytearray(NUM_BLOCKS * BLOCK_LEN), bytearray(NUM_BLOCKS * BLOCK_LEN)
    src = memoryview(src_mem).cast("B", (NUM_BLOCKS, BLOCK_LEN))
    dst = memoryview(dst_mem).cast("B", (NUM_BLOCKS, BLOCK_LEN))
    for i in range(NUM_BLOCKS):
        src_mem[i * BLOCK_LEN:(i + 1) * BLOCK_LEN] = bytes([i + 1]) * BLOCK_LEN

    def block(mem, i):
        return bytes(mem[i * BLOCK_LEN:(i + 1) * BLOCK_LEN])

    with kvxfer.Transport(src, CONFIG, **OPTS) as sender, kvxfer.Transport(dst, CONFIG, **OPTS) as receiver:
        print("fingerprint", sender.config_fingerprint, "backend", sender.backend)
        # Control plane: the receiver hands its metadata and geometry to the sender.
        sender.add_remote_peer("receiver", receiver.get_agent_metadata(),
                               receiver.base_addr, receiver.num_blocks, receiver.block_len)
        # One-sided WRITE: local blocks 0,1,2 -> remote blocks 5,6,7.
        tid = sender.write_blocks("receiver", [0, 1, 2], [5, 6, 7])
        if tid is None:
            raise SystemExit("write_blocks failed: %s" % (sender.last_error,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            result = sender.poll()
            if tid in result.done:
                break
            if tid in result.failed:
                raise SystemExit("transfer %d failed" % tid)
            time.sleep(0.001)
        else:
            raise SystemExit("transfer %d timed out" % tid)
        ok = all(block(dst_mem, 5 + i) == bytes([i + 1]) * BLOCK_LEN for i in range(3))
        untouched = all(block(dst_mem, i) == bytes(BLOCK_LEN) for i in range(5))
        print("transfer", tid, "done;", "data verified" if ok and untouched else "DATA MISMATCH")
        sender.remove_remote_peer("receiver")
        return 0 if ok and untouched else 1


if __name__ == "__main__":
    raise SystemExit(main())
