"""The shm backend the way vLLM uses it: the region handed to the transport is
an mmap of a file under /dev/shm (vllm_offload_*.mmap). Same-host peers must
take the zero-copy path (the writer maps the file and copies into it), with
no option set, and write exactly the requested blocks."""
import mmap
import os

import pytest

import kvxfer
from conftest import connect, region, wait_for

NB, BL = 32, 64 * 1024


@pytest.fixture
def shm_file():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = "/dev/shm/vllm_offload_kvxfer_test_%d.mmap" % os.getpid()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, NB * BL)
        m = mmap.mmap(fd, NB * BL, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        yield m
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)


def test_dev_shm_mmap_takes_the_mapped_path(shm_file):
    m = shm_file
    m[:] = b"\x22" * (NB * BL)
    src_mem, src_view = region(NB, BL)
    dst_view = memoryview(m).cast("B", (NB, BL))
    with kvxfer.Transport(src_view) as src, kvxfer.Transport(dst_view) as dst:
        assert src.backend == dst.backend == "shm"  # the default: every usable backend, shm first
        connect(src, dst)
        assert src.peer_backend("dst") == ("shm", "mapped")
        for i in range(NB):
            src_mem[i * BL:(i + 1) * BL] = bytes([i + 1]) * BL
        local, remote = [1, 2, 3, 9, 30], [4, 5, 6, 0, 31]
        tid = src.write_blocks("dst", local, remote)
        assert tid is not None
        states, extra = wait_for(src, [tid])
        assert states == {tid: "done"} and not extra
        for i in range(NB):
            got = bytes(m[i * BL:(i + 1) * BL])
            want = bytes([local[remote.index(i)] + 1]) * BL if i in remote else b"\x22" * BL
            assert got == want, "block %d" % i
    del dst_view


def test_alloc_region_takes_the_mapped_path():
    m = kvxfer.alloc_region(NB * BL)
    assert len(m) == NB * BL and m[:16] == bytes(16)
    src_mem, src_view = region(NB, BL)
    dst_view = memoryview(m).cast("B", (NB, BL))
    with kvxfer.Transport(src_view) as src, kvxfer.Transport(dst_view) as dst:
        connect(src, dst)
        assert src.peer_backend("dst") == ("shm", "mapped")
        src_mem[3 * BL:4 * BL] = b"\x33" * BL
        tid = src.write_blocks("dst", [3], [7])
        states, extra = wait_for(src, [tid])
        assert states == {tid: "done"} and not extra
        assert bytes(m[7 * BL:8 * BL]) == b"\x33" * BL
        assert bytes(m[6 * BL:7 * BL]) == bytes(BL) and bytes(m[8 * BL:9 * BL]) == bytes(BL)
        with pytest.raises(BufferError):
            m.close()  # the transport's region is a view of it
    del dst_view
    m.close()


def test_alloc_region_rejects_bad_sizes():
    for bad in (0, -1, 1.5, True, "4096"):
        with pytest.raises(ValueError) as e:
            kvxfer.alloc_region(bad)
        assert "nbytes=" in str(e.value)
