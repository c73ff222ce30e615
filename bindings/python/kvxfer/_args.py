"""Argument checks and conversions of the Python layer: peer ids, 64-bit
values, index lists (to C arrays without a Python int per index where the
caller has an array), the region's geometry, the config fingerprint and
option keys. Used by _transport.Transport; nothing here holds a transport."""

import array
import hashlib
import json
import math
import operator
import sys
from collections.abc import Mapping
from typing import Optional

from . import _native
from ._errors import ArgumentError, last_error

_U64_MAX = (1 << 64) - 1
# The backends built into the library (kvx_backends(3)). Their names are the
# option prefixes: a keyword option's first '_' after one stands for '.'
# (tcp_listen -> "tcp.listen").
_BACKENDS = tuple(n for n in _native.kvx_backends().split(",") if n)

def _enum_or_int(cls, value):
    """cls(value), or the int itself for a value a newer library added."""
    try:
        return cls(value)
    except ValueError:
        return value


# ------------------------------------------------------------------ arguments


def _peer_arg(peer_id, what="peer_id"):
    """A peer id as the C library takes it: str, 1..255 UTF-8 bytes, no NUL."""
    if not isinstance(peer_id, str):
        raise TypeError("%s must be a str, not %s" % (what, type(peer_id).__name__))
    try:
        n = len(peer_id.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ArgumentError(_native.KVX_EINVAL, "%s %r is not encodable as UTF-8: %s" % (what, peer_id, e)) from None
    if n == 0 or n > _native.KVX_PEER_ID_MAX or "\0" in peer_id:
        raise ArgumentError(_native.KVX_EINVAL, "%s %r must be 1..%d UTF-8 bytes without NUL"
                            % (what, peer_id, _native.KVX_PEER_ID_MAX))
    return peer_id


def _u64_arg(value, what):
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__)) from None
    if v < 0 or v > _U64_MAX:
        raise ArgumentError(_native.KVX_ERANGE, "%s = %d is not in 0..2**64-1" % (what, v))
    return v


def _numpy():
    return sys.modules.get("numpy")  # an ndarray argument implies numpy is imported


def _bad_index(seq, what):
    for pos, v in enumerate(seq):
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError("%s[%d] must be an int, not %s" % (what, pos, type(v).__name__)) from None
        if v < 0:
            return ArgumentError(_native.KVX_ERANGE, "%s[%d] = %d is negative" % (what, pos, v))
        if v > _U64_MAX:
            return ArgumentError(_native.KVX_ERANGE, "%s[%d] = %d does not fit in 64 bits" % (what, pos, v))
    return TypeError("%s must be a sequence of ints" % what)


_SEQUENCES = (list, tuple, range)
# Index lists whose order is arbitrary: refused by write_blocks.
_UNORDERED = (set, frozenset, dict, type({}.keys()), type({}.values()), type({}.items()))


def _as_u64(seq, what, drop_invalid=False):
    """An object exporting a C-contiguous uint64 buffer with seq's values.

    numpy integer arrays: zero-copy when C-contiguous uint64 (or int64 with no
    negative value); other integer dtypes are converted. Python sequences and
    iterables of ints become array('Q'). Negative or > 2**64-1 values raise
    ArgumentError (a ValueError), or are dropped when drop_invalid."""
    np = _numpy()
    if np is not None and isinstance(seq, np.ndarray):
        if seq.ndim != 1:
            raise ArgumentError(_native.KVX_EINVAL, "%s must be a 1-D array, not %d-D" % (what, seq.ndim))
        kind = seq.dtype.kind
        if kind not in "iu":
            raise TypeError("%s must be an integer array, not dtype %s" % (what, seq.dtype))
        if kind == "i" and seq.size:
            neg = seq < 0
            if neg.any():
                if drop_invalid:
                    seq = seq[~neg]
                else:
                    pos = int(neg.argmax())
                    raise ArgumentError(_native.KVX_ERANGE, "%s[%d] = %d is negative" % (what, pos, int(seq[pos])))
        if seq.dtype.itemsize == 8 and seq.dtype.isnative and seq.flags.c_contiguous:
            return seq if kind == "u" else seq.view(np.uint64)
        return np.ascontiguousarray(seq, dtype=np.uint64)
    if isinstance(seq, array.array) and seq.typecode in "QL" and seq.itemsize == 8:
        return seq
    if isinstance(seq, str):
        raise TypeError("%s must be a sequence of ints, not str" % what)
    if isinstance(seq, (bytes, bytearray, memoryview)) or not isinstance(seq, (list, tuple, range)):
        try:
            seq = list(seq)  # (array('Q', bytes) would reinterpret raw bytes)
        except TypeError:
            raise TypeError("%s must be a sequence of ints, not %s" % (what, type(seq).__name__)) from None
    try:
        return array.array("Q", seq)
    except OverflowError:
        if drop_invalid:
            return array.array("Q", [v for v in map(operator.index, seq) if 0 <= v <= _U64_MAX])
        raise _bad_index(seq, what) from None
    except TypeError:
        raise _bad_index(seq, what) from None


def _geometry(view, num_blocks, block_len):
    """(num_blocks, block_len in bytes, unit) of the region, checking it can be
    lent as a writable C-contiguous buffer of plain bytes. unit is the size of
    one item of a 2-D view (block_len in vLLM's sense is view.shape[1] items),
    1 when the geometry is given in bytes."""
    unit = 1
    try:
        mv = memoryview(view)
    except TypeError:
        raise TypeError("view must support the buffer protocol (memoryview, numpy array, bytearray, mmap), "
                        "not %s" % type(view).__name__) from None
    with mv:
        if mv.readonly:
            raise TypeError("view must be writable (got a read-only %s)" % type(view).__name__)
        if not mv.c_contiguous:
            raise ArgumentError(_native.KVX_EINVAL, "view must be C-contiguous")
        if "O" in mv.format:
            raise TypeError("view must hold plain data, not Python objects (format %r)" % mv.format)
        nbytes = mv.nbytes
        if num_blocks is None and block_len is None:
            if mv.ndim != 2:
                raise ArgumentError(_native.KVX_EINVAL,
                                    "view must be 2-D (num_blocks x block_len) or num_blocks=/block_len= "
                                    "must be given; got a %d-D buffer" % mv.ndim)
            num_blocks, block_len, unit = mv.shape[0], mv.shape[1] * mv.itemsize, mv.itemsize
        elif num_blocks is None or block_len is None:
            given = _u64_arg(num_blocks if block_len is None else block_len,
                             "num_blocks" if block_len is None else "block_len")
            if given == 0 or nbytes % given:
                raise ArgumentError(_native.KVX_EINVAL, "a buffer of %d bytes is no whole number of %s = %d"
                                    % (nbytes, "blocks, num_blocks" if block_len is None else "blocks of block_len",
                                       given))
            num_blocks, block_len = (given, nbytes // given) if block_len is None else (nbytes // given, given)
        else:
            num_blocks = _u64_arg(num_blocks, "num_blocks")
            block_len = _u64_arg(block_len, "block_len")
            if num_blocks * block_len > nbytes:
                raise ArgumentError(_native.KVX_EINVAL, "a buffer of %d bytes cannot hold %d blocks of %d bytes"
                                    % (nbytes, num_blocks, block_len))
    if num_blocks == 0 or block_len == 0:
        raise ArgumentError(_native.KVX_EINVAL, "empty region: num_blocks=%d, block_len=%d" % (num_blocks, block_len))
    return num_blocks, block_len, unit


def _config_json(config_fields):
    """(JSON text or None, expected fingerprint): the seed's computation."""
    if config_fields is None:
        return None, ""
    if not isinstance(config_fields, Mapping):
        raise TypeError("config_fields must be a dict or None, not %s" % type(config_fields).__name__)
    if not config_fields:
        return None, ""
    if not isinstance(config_fields, dict):
        config_fields = dict(config_fields)
    bad = _non_finite(config_fields, "config_fields")
    if bad:
        raise ArgumentError(_native.KVX_ECONFIG, "%s is %r: NaN and infinities are not JSON numbers, so the config "
                            "cannot be fingerprinted (give it as a string, or leave it out)" % bad)
    canonical = json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
    return canonical, hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _non_finite(value, path):
    """(path, value) of the first NaN or infinity in value (dicts, lists and
    tuples walked in order), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, dict):
        items = ((k, v) for k, v in value.items())
        for k, v in items:
            found = _non_finite(v, "%s[%r]" % (path, k))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _non_finite(v, "%s[%d]" % (path, i))
            if found:
                return found
    return None


def _c_fingerprint(text, expect):
    rc, fp = _native.kvx_config_fingerprint(text)
    if rc:
        raise last_error(rc)
    if fp != expect:
        # Only non-str keys get here: json.dumps sorts them by value (2 < 10)
        # before turning them into strings, the C library sorts strings ("10" < "2").
        raise ArgumentError(_native.KVX_ECONFIG,
                            "config_fields cannot be fingerprinted compatibly with vLLM (%s != %s); "
                            "use str keys" % (fp, expect))
    return fp


def config_fingerprint(config_fields: Optional[dict]) -> str:
    """The fingerprint a Transport gets for config_fields: the first 16 hex
    digits of sha256(json.dumps(config_fields, sort_keys=True,
    separators=(",", ":"))), "" for None or {}, computed by the C library
    (and checked against Python's own result).

    Raises TypeError for what json.dumps cannot serialize, and ArgumentError
    (a ValueError, code KVX_ECONFIG) for what kvxfer refuses to hash: NaN and
    infinities, lone surrogates, nesting deeper than 256, non-str keys whose
    order differs from their string order."""
    text, expect = _config_json(config_fields)
    if text is None:
        return ""
    return _c_fingerprint(text, expect)


def _option_items(backend, options):
    items = []
    if backend is not None:
        if not isinstance(backend, str):
            raise TypeError("backend must be a str, not %s" % type(backend).__name__)
        items.append(("backend", backend))
    for key, value in options.items():
        if value is None:
            continue
        ckey = key
        if "." not in key:
            head, sep, rest = key.partition("_")
            if sep and rest and head in _BACKENDS:
                ckey = head + "." + rest
        if isinstance(value, bool):
            raise TypeError("option %s: expected str or int, not bool" % key)
        if isinstance(value, str):
            cval = value
        elif isinstance(value, int):
            cval = str(int(value))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            cval = ",".join(value)  # tcp_advertise=["10.0.0.1:0", "127.0.0.1:0"]
        else:
            raise TypeError("option %s: expected str or int, not %s" % (key, type(value).__name__))
        if "\0" in ckey or "\0" in cval:
            raise ArgumentError(_native.KVX_EINVAL, "option %s: NUL character" % key)
        items.append((ckey, cval))
    return items
