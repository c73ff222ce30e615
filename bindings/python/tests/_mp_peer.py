"""Child side of test_processes.py's multiprocessing test (spawned)."""
import time


def target(conn, nb, bl, config):
    import kvxfer
    mem = bytearray(b"\xee") * (nb * bl)
    with kvxfer.Transport(mem, config, num_blocks=nb, block_len=bl, backend="tcp", tcp_listen="127.0.0.1:0") as t:
        conn.send((t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len, t.config_fingerprint))
        if not conn.poll(60):
            conn.send("timeout")
            return
        expect = conn.recv()  # {remote index: byte value}
        for i in range(nb):
            want = bytes([expect.get(i, 0xEE)]) * bl
            if bytes(mem[i * bl:(i + 1) * bl]) != want:
                conn.send("block %d differs" % i)
                return
        conn.send("verified")
        conn.recv()  # wait until the parent is done with us
    time.sleep(0)
