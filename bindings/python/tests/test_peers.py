"""Transport.peers() (kvx_list_peers): every peer, sorted by id, with its
state; a removed peer is not listed; a peer being added is CONNECTING."""
import socket
import time

import pytest

import kvxfer
from kvxfer import PeerLink

from conftest import TCP, connect, region, wait_for


def test_peers_sorted_removed_not_listed():
    mems = [region(8, 512) for _ in range(3)]
    with kvxfer.Transport(mems[0][1], **TCP) as src, kvxfer.Transport(mems[1][1], **TCP) as b, \
            kvxfer.Transport(mems[2][1], **TCP) as a:
        assert src.peers() == []
        t0 = time.time_ns()
        connect(src, b, "peer-b")
        connect(src, a, "peer-a")
        got = src.peers()
        assert [p.peer_id for p in got] == ["peer-a", "peer-b"]  # by id, not by the order of the adds
        for p in got:
            assert isinstance(p, kvxfer.PeerInfo)
            assert p.link is PeerLink.UP and p.state == "up"
            assert (p.backend, p.path, p.error, p.reason) == ("tcp", "", kvxfer.ErrorCode.OK, "")
            assert (p.in_flight, p.reconnects, p.attempts, p.next_attempt_ns) == (0, 0, 0, 0)
            assert p.since_ns >= t0 - 10**9
            # the same fields as peer_state() (since_ns: the library converts it to
            # CLOCK_REALTIME at each call, which may differ by a few ns)
            st = src.peer_state(p.peer_id)
            assert p.peer_state._replace(since_ns=0) == st._replace(since_ns=0)
            assert abs(p.since_ns - st.since_ns) < 10**6
        assert got[0].last_progress_ns == 0  # before its first transfer
        tid = src.write_blocks("peer-b", [0, 1], [2, 3])
        assert wait_for(src, [tid])[0] == {tid: "done"}
        b_info = [p for p in src.peers() if p.peer_id == "peer-b"][0]
        assert b_info.last_progress_ns >= t0 and b_info.in_flight == 0
        src.remove_remote_peer("peer-a")
        assert [p.peer_id for p in src.peers()] == ["peer-b"]
        src.close()
        with pytest.raises(kvxfer.ClosedError):
            src.peers()


def test_a_peer_being_added_is_connecting():
    hole = socket.socket()  # accepts and never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    try:
        m1, v1 = region(8, 512)
        m2, v2 = region(8, 512)
        with kvxfer.Transport(v1, tcp_advertise="127.0.0.1:%d" % hole.getsockname()[1], **TCP) as silent, \
                kvxfer.Transport(v2, connect_timeout_ms=10000, **TCP) as t:
            t0 = time.time_ns()
            fut = t.add_remote_peer_async("s", silent.get_agent_metadata(), silent.base_addr, silent.num_blocks,
                                          silent.block_len)
            peers = t.peers()
            assert len(peers) == 1
            p = peers[0]
            assert (p.peer_id, p.link, p.state) == ("s", PeerLink.CONNECTING, "connecting")
            assert (p.backend, p.in_flight, p.reconnects, p.last_progress_ns) == ("", 0, 0, 0)
            assert p.since_ns >= t0 - 10**9
            with pytest.raises(kvxfer.RequestError):
                t.peer_state("s")  # not registered yet
            t.remove_remote_peer("s")
            assert isinstance(fut.exception(timeout=10), kvxfer.RequestError)
            assert t.peers() == []
    finally:
        hole.close()
