"""Regions (memoryview, numpy, bytearray, mmap) and index arrays (numpy)."""
import array
import mmap

import numpy as np
import pytest

import kvxfer
from kvxfer import _transport

from conftest import TCP, connect, region, wait_for


def _xfer(src, dst, local, remote):
    connect(src, dst)
    tid = src.write_blocks("dst", local, remote)
    assert tid is not None
    assert wait_for(src, [tid])[0] == {tid: "done"}


# ------------------------------------------------------------------ regions


def test_numpy_uint8_regions():
    a = np.zeros((16, 1024), np.uint8)
    b = np.full((16, 1024), 0xEE, np.uint8)
    a[np.arange(16)] = (np.arange(16) * 7)[:, None]
    with kvxfer.Transport(a, **TCP) as src, kvxfer.Transport(b, **TCP) as dst:
        assert src.base_addr == a.ctypes.data and (src.num_blocks, src.block_len) == (16, 1024)
        _xfer(src, dst, np.array([1, 2, 3]), np.array([10, 11, 12], np.uint64))
    assert (b[10:13] == a[1:4]).all()
    assert (np.delete(b, [10, 11, 12], axis=0) == 0xEE).all()


def test_numpy_other_dtype_block_len_is_items():
    """block_len is view.shape[1], as vLLM's DataTransport defines it; peers
    exchange it in those units and add_remote_peer converts."""
    a = np.arange(4 * 256, dtype=np.float16).reshape(4, 256)
    b = np.zeros((4, 256), np.float16)
    with kvxfer.Transport(a, **TCP) as src, kvxfer.Transport(b, **TCP) as dst:
        assert (dst.num_blocks, dst.block_len, dst.block_len_bytes) == (4, 256, 512)
        _xfer(src, dst, [1, 2], [3, 0])
        assert (b[3] == a[1]).all() and (b[0] == a[2]).all()
        with pytest.raises(ValueError):  # bytes where items are meant: a geometry mismatch
            src.add_remote_peer("x", dst.get_agent_metadata(), dst.base_addr, dst.num_blocks,
                                dst.block_len_bytes)


def test_numpy_rejections():
    a = np.zeros((8, 64), np.uint8)
    with pytest.raises(ValueError):
        kvxfer.Transport(a[:, ::2], **TCP)  # not C-contiguous
    with pytest.raises(ValueError):
        kvxfer.Transport(a.T, **TCP)
    ro = np.zeros((4, 64), np.uint8)
    ro.setflags(write=False)
    with pytest.raises(TypeError):
        kvxfer.Transport(ro, **TCP)
    with pytest.raises(TypeError):
        kvxfer.Transport(np.empty((4, 8), dtype=object), **TCP)
    with pytest.raises(ValueError):
        kvxfer.Transport(np.zeros(256, np.uint8), **TCP)  # 1-D without geometry
    with pytest.raises(ValueError):
        kvxfer.Transport(np.zeros((2, 2, 64), np.uint8), **TCP)
    with pytest.raises(ValueError):
        kvxfer.Transport(np.zeros((0, 64), np.uint8), **TCP)
    with kvxfer.Transport(np.zeros(256, np.uint8), num_blocks=4, **TCP) as t:
        assert (t.num_blocks, t.block_len) == (4, 64)


def test_numpy_region_is_held():
    a = np.zeros(4 * 64, np.uint8)
    t = kvxfer.Transport(a, block_len=64, **TCP)
    with pytest.raises(ValueError):
        a.resize(8 * 64)  # refcheck: the exported buffer keeps a reference
    t.close()


def test_bytearray_with_geometry():
    mem = bytearray(1000)
    with kvxfer.Transport(mem, num_blocks=3, block_len=300, **TCP) as t:  # region = first 900 bytes
        assert (t.num_blocks, t.block_len) == (3, 300)
    with kvxfer.Transport.from_buffer(mem, 2, 500, {"a": 1}, **TCP) as t:
        assert (t.num_blocks, t.block_len) == (2, 500) and t.config_fingerprint
    with kvxfer.Transport(mem, block_len=250, **TCP) as t:
        assert t.num_blocks == 4
    with pytest.raises(ValueError):
        kvxfer.Transport(mem, block_len=300, **TCP)  # 1000 is no multiple of 300
    with pytest.raises(ValueError):
        kvxfer.Transport(mem, num_blocks=5, block_len=300, **TCP)  # too small
    with pytest.raises(ValueError):
        kvxfer.Transport(mem, num_blocks=0, block_len=300, **TCP)
    with pytest.raises(ValueError):
        kvxfer.Transport(mem, **TCP)  # 1-D without geometry
    with pytest.raises(TypeError):
        kvxfer.Transport(mem, num_blocks="3", block_len=300, **TCP)
    mem.append(0)  # nothing left exported


def test_readonly_and_non_buffers():
    with pytest.raises(TypeError):
        kvxfer.Transport(bytes(1024), num_blocks=4, **TCP)
    with pytest.raises(TypeError):
        kvxfer.Transport(memoryview(bytearray(1024)).toreadonly(), num_blocks=4, **TCP)
    with pytest.raises(TypeError):
        kvxfer.Transport([0] * 1024, num_blocks=4, **TCP)
    with pytest.raises(TypeError):
        kvxfer.Transport("x" * 1024, num_blocks=4, **TCP)


def test_bytearray_is_held_until_close():
    mem = bytearray(4 * 64)
    t = kvxfer.Transport(mem, num_blocks=4, block_len=64, **TCP)
    for resize in (lambda: mem.append(1), lambda: mem.extend(b"xy"), lambda: mem.clear(),
                   lambda: mem.__delitem__(slice(0, 4))):
        with pytest.raises(BufferError):
            resize()
    mem[0:4] = b"abcd"  # same-size writes are fine
    t.close()
    mem.append(1)
    t.close()


def test_memoryview_is_held_until_close():
    mem, view = region(4, 64)
    t = kvxfer.Transport(view, **TCP)
    with pytest.raises(BufferError):
        view.release()
    with pytest.raises(BufferError):
        mem.append(0)
    t.close()
    view.release()
    mem.append(0)


def test_mmap_region():
    nb, bl = 8, 4096
    src_map = mmap.mmap(-1, nb * bl)
    dst_map = mmap.mmap(-1, nb * bl)
    src_map[:] = bytes(range(256)) * (nb * bl // 256)
    with kvxfer.Transport(src_map, num_blocks=nb, block_len=bl, **TCP) as src, \
            kvxfer.Transport(dst_map, num_blocks=nb, block_len=bl, **TCP) as dst:
        with pytest.raises(BufferError):
            dst_map.resize(2 * nb * bl)
        with pytest.raises(BufferError):
            dst_map.close()
        _xfer(src, dst, [0, 5], [7, 2])
    assert dst_map[7 * bl:8 * bl] == src_map[0:bl]
    assert dst_map[2 * bl:3 * bl] == src_map[5 * bl:6 * bl]
    assert dst_map[0:bl] == bytes(bl)
    dst_map.close()  # released after close()
    src_map.close()


# ------------------------------------------------------------------ index arrays


def test_u64_zero_copy():
    u = np.arange(10, dtype=np.uint64)
    assert _transport._as_u64(u, "x") is u
    i = np.arange(10, dtype=np.int64)
    v = _transport._as_u64(i, "x")
    assert v.dtype == np.uint64 and np.shares_memory(v, i)
    q = array.array("Q", [1, 2])
    assert _transport._as_u64(q, "x") is q


def test_u64_conversions():
    for arr in (np.arange(5, dtype=np.int32), np.arange(5, dtype=np.uint8), np.arange(10, dtype=np.int64)[::2],
                np.arange(5, dtype=">i8")):
        out = _transport._as_u64(arr, "x")
        assert list(out) == [int(x) for x in arr]
        assert out.dtype == np.uint64 and out.flags.c_contiguous
    assert list(_transport._as_u64([np.int64(3), np.uint32(4)], "x")) == [3, 4]
    with pytest.raises(ValueError) as ei:
        _transport._as_u64(np.array([1, -2]), "local_idxs")
    assert "local_idxs[1]" in str(ei.value)
    with pytest.raises(ValueError):
        _transport._as_u64([0, -1], "x")
    with pytest.raises(TypeError):
        _transport._as_u64(np.array([1.0]), "x")
    with pytest.raises(TypeError):
        _transport._as_u64(np.array([True]), "x")
    with pytest.raises(ValueError):
        _transport._as_u64(np.zeros((2, 2), np.uint64), "x")
    with pytest.raises(TypeError):
        _transport._as_u64("12", "x")
    assert list(_transport._as_u64(np.array([5, -1, 6]), "x", drop_invalid=True)) == [5, 6]
    assert list(_transport._as_u64([5, -1, 2 ** 64, 6], "x", drop_invalid=True)) == [5, 6]


def test_numpy_index_arrays_end_to_end():
    nb, bl = 32, 256
    a = np.arange(nb * bl, dtype=np.uint32).astype(np.uint8).reshape(nb, bl)
    b = np.zeros((nb, bl), np.uint8)
    with kvxfer.Transport(a, **TCP) as src, kvxfer.Transport(b, **TCP) as dst:
        connect(src, dst)
        perm = np.random.default_rng(1).permutation(nb)
        ids = [
            src.write_blocks("dst", np.arange(8, dtype=np.uint64), perm[:8].astype(np.uint64)),
            src.write_blocks("dst", np.arange(8, 16, dtype=np.int64), perm[8:16]),
            src.write_blocks("dst", np.arange(16, 24, dtype=np.int32), perm[16:24].astype(np.int16)),
            src.write_blocks("dst", np.arange(24, 32)[::-1].copy()[::-1], perm[24:]),
        ]
        assert None not in ids
        assert set(wait_for(src, ids)[0].values()) == {"done"}
        # index values come from the peer: None (last_error), never an exception
        assert src.write_blocks("dst", np.array([0, -1]), np.array([0, 1])) is None
        assert src.last_error.code == kvxfer.ErrorCode.ERANGE
        assert src.write_blocks("dst", np.array([nb]), np.array([0])) is None
        with pytest.raises(TypeError):
            src.write_blocks("dst", np.array([0.0]), np.array([0]))
        more = [src.write_blocks("dst", [0], [0]) for _ in range(5)]
        assert src.cancel(np.array(more, dtype=np.uint64), mode="wait") is not None
        src.cancel(np.array(more))
    assert (b[perm] == a).all()
