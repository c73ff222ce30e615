"""The internal SWIG layer (kvxfer._native): conventions the package relies on."""
import array

import pytest

import kvxfer
from kvxfer import _native

from conftest import TCP, region


def test_versions():
    assert _native.kvx_version_number() == kvxfer.library_version_number
    assert kvxfer.library_version == "%d.%d.%d" % (_native.KVX_VERSION_MAJOR, _native.KVX_VERSION_MINOR,
                                                   _native.KVX_VERSION_PATCH)
    assert kvxfer.HEADER_VERSION_NUMBER == _native.KVX_VERSION_NUMBER
    assert kvxfer.__version__ == kvxfer.library_version


def test_error_helpers():
    assert _native.kvx_strerror(_native.KVX_ENOENT)
    assert isinstance(_native.kvx_strerror(-123456), str)
    assert _native.kvx_error_scope_of(0) == _native.KVX_SCOPE_NONE
    assert _native.kvx_error_scope_of(_native.KVX_ECONNREFUSED) == _native.KVX_SCOPE_PEER
    assert _native.kvx_error_scope_of(-987654) == _native.KVX_SCOPE_TRANSPORT
    assert isinstance(_native.kvx_last_error_message(), str)


def test_library_facts():
    # kvx_backends: comma-separated, in order of preference; each name is a backend option value
    names = _native.kvx_backends().split(",")
    assert kvxfer.backends() == tuple(names) and "tcp" in names and len(set(names)) == len(names)
    rc, opts = _native.kvx_options_create()
    try:
        assert _native.kvx_options_set(opts, "backend", _native.kvx_backends()) == 0
    finally:
        _native.kvx_options_destroy(opts)
    # kvx_stats_bucket_lower_ns: strictly increasing, UINT64_MAX past the last bucket
    n = _native.KVX_STATS_LATENCY_BUCKETS
    lo = [_native.kvx_stats_bucket_lower_ns(i) for i in range(n + 2)]
    assert lo[:9] == list(range(9)) and lo[16] == 16 and lo[17] == 18
    assert all(a < b for a, b in zip(lo, lo[1:n])) and lo[n] == lo[n + 1] == 2**64 - 1
    assert all(lo[i + 1] - lo[i] <= lo[i] // 8 for i in range(8, n - 1))
    with pytest.raises(OverflowError):
        _native.kvx_stats_bucket_lower_ns(-1)


def test_out_params_are_tuples():
    rc, fp = _native.kvx_config_fingerprint('{"a":1}')
    assert (rc, len(fp)) == (0, 16)
    assert _native.kvx_config_fingerprint(None) == (0, "")
    rc, fp = _native.kvx_config_fingerprint("[1]")
    assert rc == _native.KVX_ECONFIG and fp == ""
    assert "object" in _native.kvx_last_error_message() or _native.kvx_last_error_message()


def test_options():
    rc, opts = _native.kvx_options_create()
    assert rc == 0 and opts is not None
    try:
        assert _native.kvx_options_set(opts, "tcp.listen", "127.0.0.1:0") == 0
        assert _native.kvx_options_set(opts, "no.such.key", "1") == _native.KVX_EINVAL
        assert "no.such.key" in _native.kvx_last_error_message()
    finally:
        _native.kvx_options_destroy(opts)
    _native.kvx_options_destroy(None)


def _open():
    mem = bytearray(4 * 64)
    rc, opts = _native.kvx_options_create()
    for k, v in (("backend", "tcp"), ("tcp.listen", "127.0.0.1:0")):
        assert _native.kvx_options_set(opts, k, v) == 0
    rc, h = _native.kvxpy_open(mem, 4, 64, None, opts)
    _native.kvx_options_destroy(opts)
    assert rc == 0
    return mem, h


def test_handle_lifecycle_and_buffer():
    mem, h = _open()
    assert _native.kvxpy_holds_region(h) is True
    with pytest.raises(BufferError):
        mem.append(0)
    assert _native.kvx_transport_num_blocks(h) == (0, 4)
    assert _native.kvx_transport_backend(h) == "tcp"
    assert _native.kvxpy_close(h) == 0
    assert _native.kvxpy_holds_region(h) is False
    mem.append(0)  # released
    assert _native.kvxpy_close(h) == 0  # idempotent
    rc, n = _native.kvx_get_agent_metadata(h, None)
    assert rc == _native.KVX_ECLOSED
    assert _native.kvx_transport_num_blocks(h) == (0, 4)  # properties stay readable


def test_open_checks_region():
    mem, view = region(2, 64)
    with pytest.raises(ValueError):
        _native.kvxpy_open(view, 3, 64, None, None)
    with pytest.raises((BufferError, TypeError)):
        _native.kvxpy_open(b"x" * 128, 2, 64, None, None)
    view.release()
    mem.append(1)  # nothing held after failures


def test_bad_handle_and_buffers():
    with pytest.raises(TypeError):
        _native.kvx_transport_num_blocks(object())
    with pytest.raises(TypeError):
        _native.kvx_transport_num_blocks(None)
    mem, h = _open()
    try:
        with pytest.raises(TypeError):  # 4-byte items are not uint64 indexes
            _native.kvxpy_write_blocks(h, "p", array.array("I", [1]), array.array("I", [1]))
        with pytest.raises(BufferError):  # read-only poll output
            _native.kvx_poll(h, None, bytes(64), None)
        # lengths that differ never reach C with a wrong n
        rc, tid = _native.kvxpy_write_blocks(h, "p", array.array("Q", [1, 2]), array.array("Q", [1]))
        assert rc == _native.KVX_EINVAL and tid == 0
        # a too-small inflight array for "wait" is passed as NULL: C says EINVAL
        rc, n = _native.kvxpy_cancel(h, array.array("Q", [1, 2]), _native.KVX_CANCEL_WAIT, array.array("Q", [0]))
        assert rc == _native.KVX_EINVAL and n == 0
        assert _native.kvx_poll(h, None, None, None) == (0, 0, 0)
    finally:
        _native.kvxpy_close(h)


def test_peer_rails_is_a_list():
    # kvx_peer_rails and its struct are replaced by kvxpy_peer_rails: (rc, list of dicts or None)
    assert not hasattr(_native, "kvx_peer_rails") and not hasattr(_native, "kvx_rail_stats")
    assert _native.KVX_RAIL_NAME_LEN == 96
    mem, h = _open()
    try:
        assert _native.kvxpy_peer_rails(h, "p") == (_native.KVX_ENOENT, None)
        assert "p" in _native.kvx_last_error_message()
    finally:
        _native.kvxpy_close(h)
    assert _native.kvxpy_peer_rails(h, "p") == (_native.KVX_ECLOSED, None)


def test_peer_state_is_a_dict():
    # kvx_get_peer_state and its struct are replaced by kvxpy_peer_state: (rc, dict or None)
    assert not hasattr(_native, "kvx_get_peer_state") and not hasattr(_native, "kvx_peer_state")
    assert _native.KVX_PEER_REASON_LEN == 160
    assert (_native.KVX_PEER_UP, _native.KVX_PEER_RECONNECTING, _native.KVX_PEER_BROKEN,
            _native.KVX_PEER_CONNECTING) == (0, 1, 2, 3)
    assert [int(v) for v in kvxfer.PeerLink] == [0, 1, 2, 3]
    mem, h = _open()
    try:
        assert _native.kvxpy_peer_state(h, "p") == (_native.KVX_ENOENT, None)
        assert "p" in _native.kvx_last_error_message()
        assert _native.kvxpy_peer_state(h, None)[0] == _native.KVX_EINVAL
    finally:
        _native.kvxpy_close(h)
    assert _native.kvxpy_peer_state(h, "p") == (_native.KVX_ECLOSED, None)
