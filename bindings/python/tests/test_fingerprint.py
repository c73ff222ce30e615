"""Config fingerprints: kvxfer (computed in C) equals the seed's Python."""
import collections
import math
import random
import struct
import sys

import pytest

import kvxfer

from conftest import TCP, connect, region
from seed_reference import compute_fingerprint as reference

ALPHABET = ("abcxyz_-. 0123456789\"\\/\b\f\n\r\t\x00\x01\x1f\x7f\x80\xa0\xe9\xff"
            "\u0100\u07ff\u0800\u2028\u2029\ufeff\uffff\u00e9\u4e2d\u6587"
            "\U00010000\U0001f600\U0010ffff")


def rand_str(rng, n=8):
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, n)))


def rand_float(rng):
    kind = rng.randrange(6)
    if kind == 0:
        while True:  # any finite double, by bit pattern
            f = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if math.isfinite(f):
                return f
    if kind == 1:
        return rng.choice([0.0, -0.0, 1.0, -1.0, 0.1, 1e16, 1e15, 1e-5, 1e-4, 5e-324, 2.2250738585072014e-308,
                           1.7976931348623157e308, 123456789012345678.0, 0.30000000000000004, 1e22, 1e21,
                           9007199254740993.0, 2.5e-05, 100.0])
    if kind == 2:
        return rng.uniform(-1e6, 1e6)
    if kind == 3:
        return float(rng.randint(-10 ** 17, 10 ** 17))
    if kind == 4:
        return rng.random() * 10 ** rng.randint(-30, 30)
    return round(rng.uniform(-100, 100), rng.randint(0, 6))


def rand_int(rng):
    return rng.choice([
        rng.randint(-10, 10), rng.randint(-2 ** 63, 2 ** 64), 2 ** 64, -2 ** 63 - 1, 10 ** rng.randint(18, 400),
        -(10 ** rng.randint(18, 60)) - 7, rng.getrandbits(rng.randint(1, 3000)),
    ])


def rand_value(rng, depth):
    k = rng.randrange(9 if depth < 5 else 6)
    if k == 0:
        return rand_int(rng)
    if k == 1:
        return rand_float(rng)
    if k == 2:
        return rand_str(rng, 12)
    if k == 3:
        return rng.choice([True, False, None])
    if k == 4:
        return rng.randint(0, 1000)
    if k == 5:
        return rand_str(rng, 3)
    if k == 6:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return rand_dict(rng, depth + 1)


def rand_dict(rng, depth=0):
    return {rand_str(rng, 6): rand_value(rng, depth) for _ in range(rng.randint(0, 6))}


def vllm_like(rng):
    return {
        "model": rng.choice(["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B-FP8", "mistral\u00e9"]),
        "dtype": rng.choice(["bfloat16", "float16", "fp8"]),
        "num_layers": rng.randint(1, 128),
        "num_kv_heads": rng.randint(1, 64),
        "head_size": rng.choice([64, 128, 256]),
        "block_size": rng.choice([16, 32]),
        "kv_cache_dtype": "auto",
        "tp": [rng.randint(1, 8), rng.randint(1, 8)],
        "rope": {"theta": rng.choice([10000.0, 500000.0, 1e6]), "scaling": None},
    }


def test_empty_configs():
    for cfg in (None, {}, collections.OrderedDict()):
        assert kvxfer.config_fingerprint(cfg) == reference(cfg) == ""
    assert kvxfer.config_fingerprint({"a": {}}) == reference({"a": {}}) != ""


def test_fixed_examples():
    for cfg in ({"model": "interop", "layers": 2}, {"b": 1, "a": 2}, {"a": [1, 2.5, "x", None, True]},
                {"\u00e9": "\U0001f600"}, {"big": 10 ** 4000}, {"f": 1e16, "g": 1e-5, "h": -0.0},
                {"nested": {"z": {"y": {"x": [{}]}}}}, {"": ""}, {"a\x00b": "\x7f"}):
        assert kvxfer.config_fingerprint(cfg) == reference(cfg), cfg
    assert kvxfer.config_fingerprint({"model": "interop", "layers": 2}) == \
        reference({"layers": 2, "model": "interop"})  # key order does not matter


def test_random_dicts_match_reference():
    rng = random.Random(20240601)
    n = 0
    for _ in range(3000):
        cfg = rand_dict(rng)
        assert kvxfer.config_fingerprint(cfg) == reference(cfg), cfg
        n += 1
    for _ in range(300):
        cfg = vllm_like(rng)
        assert kvxfer.config_fingerprint(cfg) == reference(cfg), cfg
    assert n == 3000


def test_random_floats_and_ints():
    rng = random.Random(7)
    for _ in range(3000):
        cfg = {"f": rand_float(rng), "i": rand_int(rng), "l": [rand_float(rng) for _ in range(3)]}
        assert kvxfer.config_fingerprint(cfg) == reference(cfg), cfg


def test_transport_fingerprint_matches_reference():
    rng = random.Random(99)
    mem, view = region(2, 64)
    for _ in range(25):
        cfg = rand_dict(rng) if rng.random() < 0.5 else vllm_like(rng)
        with kvxfer.Transport(view, cfg, **TCP) as t:
            assert t.config_fingerprint == reference(cfg)


def test_mapping_types():
    cfg = collections.OrderedDict([("b", 1), ("a", 2)])
    assert kvxfer.config_fingerprint(cfg) == reference(cfg)
    import types
    proxy = types.MappingProxyType({"a": 1})
    assert kvxfer.config_fingerprint(proxy) == reference({"a": 1})
    with pytest.raises(TypeError):
        kvxfer.config_fingerprint([("a", 1)])
    with pytest.raises(TypeError):
        kvxfer.config_fingerprint("{}")


def test_non_str_keys():
    # Where the order of the converted keys agrees, fingerprints agree.
    for cfg in ({1: "a", 2: "b"}, {1.5: 0}, {True: 1}, {None: 1}, {"x": {3: 4, 5: 6}}):
        assert kvxfer.config_fingerprint(cfg) == reference(cfg), cfg
    # json.dumps sorts 2 < 10 before making them strings; kvxfer refuses
    # rather than produce a different fingerprint.
    with pytest.raises(kvxfer.ArgumentError) as ei:
        kvxfer.config_fingerprint({2: "a", 10: "b"})
    assert ei.value.code == kvxfer.ErrorCode.ECONFIG
    with pytest.raises(TypeError):  # the seed fails the same way
        kvxfer.config_fingerprint({1: "a", "b": 2})


@pytest.mark.parametrize("cfg", [
    {"x": float("nan")}, {"x": float("inf")}, {"x": [float("-inf")]}, {"s": "\ud800"}, {"\udfff": 1},
])
def test_refused_configs(cfg):
    reference(cfg)  # Python would hash these; kvxfer refuses (never a different hash)
    with pytest.raises(kvxfer.ArgumentError) as ei:
        kvxfer.config_fingerprint(cfg)
    assert ei.value.code == kvxfer.ErrorCode.ECONFIG
    mem, view = region(2, 64)
    with pytest.raises(ValueError):
        kvxfer.Transport(view, cfg, **TCP)
    view.release()
    mem.append(0)


@pytest.mark.parametrize("cfg,where", [
    ({"x": float("nan")}, "config_fields['x'] is nan"),
    ({"a": 1, "b": {"c": [0.5, float("inf")]}}, "config_fields['b']['c'][1] is inf"),
    ({"x": (float("-inf"),)}, "config_fields['x'][0] is -inf"),
])
def test_non_finite_named(cfg, where):
    """The error names the value and where it is, not a JSON parser's position."""
    with pytest.raises(kvxfer.ArgumentError) as ei:
        kvxfer.config_fingerprint(cfg)
    assert ei.value.code == kvxfer.ErrorCode.ECONFIG
    assert where in str(ei.value) and "parse error" not in str(ei.value)


def test_depth_limit():
    ok = {}
    cur = ok
    for _ in range(255):
        cur["a"] = {}
        cur = cur["a"]
    assert kvxfer.config_fingerprint(ok) == reference(ok)
    deep = {"a": ok}
    with pytest.raises(kvxfer.ArgumentError):
        kvxfer.config_fingerprint(deep)


def test_unserializable_like_the_seed():
    for cfg in ({"x": object()}, {"x": {1, 2}}, {(1, 2): 3}):
        with pytest.raises(TypeError):
            reference(cfg)
        with pytest.raises(TypeError):
            kvxfer.config_fingerprint(cfg)


def test_fingerprints_gate_peers():
    views = [region(4, 64) for _ in range(4)]
    cfgs = [{"model": "a"}, {"model": "b"}, None, {}]
    ts = [kvxfer.Transport(v, c, **TCP) for (m, v), c in zip(views, cfgs)]
    try:
        with pytest.raises(kvxfer.RequestError) as ei:
            connect(ts[0], ts[1])
        assert ei.value.code == kvxfer.ErrorCode.EFINGERPRINT
        connect(ts[0], ts[2], "none")  # "" is compatible with every peer, both ways
        connect(ts[2], ts[0], "a")
        connect(ts[3], ts[1], "b")
        assert ts[2].config_fingerprint == ts[3].config_fingerprint == ""
    finally:
        for t in ts:
            t.close()
