"""Install test consumer (Python, the python3-kvxfer package): two tcp
transports in one process, blocks written from one into the other, every byte
checked. Prints where the module and libkvxfer.so.0 were loaded from, so that
packaging/test-install.sh can check they are the installed ones."""
import sys
import time

import kvxfer

NUM_BLOCKS, BLOCK_LEN = 16, 4096


def loaded_library():
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libkvxfer.so" in path:
                return path
    return "?"


def pattern(block):
    return bytes((block * 29 + i * 5 + 7) & 0xFF for i in range(BLOCK_LEN))


def vllm_plugin():
    """The entry point through which vLLM loads kvxfer's adapter."""
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvxfer"]
    assert len(eps) == 1 and eps[0].value == "kvxfer.vllm:register", eps
    eps[0].load()  # importable; without KVXFER_VLLM=1 calling it would do nothing
    return eps[0].value


def main():
    print("module:", kvxfer.__file__)
    print("vllm plugin:", vllm_plugin())
    print("library:", loaded_library())
    print("version:", kvxfer.library_version)
    src = bytearray(b"".join(pattern(b) for b in range(NUM_BLOCKS)))
    dst = bytearray(b"\x33" * (NUM_BLOCKS * BLOCK_LEN))
    local, remote = [0, 1, 2, 9, 15], [3, 4, 5, 0, 14]
    opts = dict(backend="tcp", tcp_listen="127.0.0.1:0")
    with kvxfer.Transport(memoryview(src).cast("B", (NUM_BLOCKS, BLOCK_LEN)), {"model": "py"}, **opts) as a, \
            kvxfer.Transport(memoryview(dst).cast("B", (NUM_BLOCKS, BLOCK_LEN)), {"model": "py"}, **opts) as b:
        a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
        tid = a.write_blocks("b", local, remote)
        if tid is None:
            sys.exit("consumer-python: write_blocks failed: %s" % (a.last_error,))
        deadline = time.monotonic() + 30
        while True:
            done, failed = a.poll()
            if failed:
                sys.exit("consumer-python: transfer failed")
            if tid in done:
                break
            if time.monotonic() > deadline:
                sys.exit("consumer-python: transfer not done after 30 s")
            time.sleep(0.001)
    src_of = dict(zip(remote, local))
    for r in range(NUM_BLOCKS):
        want = pattern(src_of[r]) if r in src_of else b"\x33" * BLOCK_LEN
        if dst[r * BLOCK_LEN:(r + 1) * BLOCK_LEN] != want:
            sys.exit("consumer-python: block %d differs" % r)
    print("verified: %d blocks of %d bytes over tcp" % (len(local), BLOCK_LEN))


if __name__ == "__main__":
    main()
