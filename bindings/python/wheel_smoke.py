#!/usr/bin/env python3
"""Smoke test of an installed kvxfer wheel (bindings/python/test-wheels.sh
runs it in a fresh venv per interpreter). Standard library only (unittest):
no pytest, no numpy. Any CPython >= 3.9.

    KVX_WHEEL_VERSION=0.9.0 KVX_WHEEL_FORBIDDEN=/path/to/build python -I wheel_smoke.py

Checks that
  - kvxfer imports from the venv's site-packages, at the wheel's version;
  - the extension and libkvxfer.so.0 carry RUNPATH $ORIGIN, `ldd` resolves
    libkvxfer.so.0 to the copy inside the package (and nothing is "not
    found"), and the process really mapped that copy: none from
    KVX_WHEEL_FORBIDDEN (the build tree), /usr or LD_LIBRARY_PATH (which
    must be unset);
  - config fingerprints equal the known vector (cba5ae8625a9ca0f, as in the
    Go and Rust bindings' tests) and sha256(json.dumps(..., sort_keys=True,
    separators=(",", ":")))[:16] computed here, also a transport's;
  - two tcp transports on the loopback move blocks both ways, and the data
    (random bytes) arrives where it should, the other blocks untouched;
  - the vllm.general_plugins entry point is installed.
"""
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import unittest

os.environ.setdefault("KVXFER_NO_VLLM", "1")
import kvxfer  # noqa: E402

PKGDIR = os.path.dirname(os.path.abspath(kvxfer.__file__))
KNOWN = ({"model": "interop", "layers": 2}, "cba5ae8625a9ca0f")
TCP = {"backend": "tcp", "tcp_listen": "127.0.0.1:0"}


def reference(cfg):
    """The seed's fingerprint (vLLM's DataTransport._compute_fingerprint)."""
    if not cfg:
        return ""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def runpath(path):
    out = subprocess.run(["readelf", "-dW", path], check=True, stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[([^\]]*)\]", out)
    return m.group(1) if m else None


class Install(unittest.TestCase):
    def test_imported_from_the_venv(self):
        self.assertTrue(PKGDIR.startswith(os.path.realpath(sys.prefix)) or PKGDIR.startswith(sys.prefix),
                        "kvxfer from %s, not from the venv %s" % (PKGDIR, sys.prefix))
        self.assertIn("site-packages", PKGDIR)
        want = os.environ.get("KVX_WHEEL_VERSION")
        if want:
            self.assertEqual(kvxfer.__version__, want)
            self.assertEqual(kvxfer.library_version, want)

    def test_no_loader_path(self):
        self.assertFalse(os.environ.get("LD_LIBRARY_PATH"), "LD_LIBRARY_PATH is set: the test would prove nothing")

    def test_runpath_origin(self):
        exts = glob.glob(os.path.join(PKGDIR, "__native*.so"))
        self.assertEqual(len(exts), 1, exts)
        for f in exts + [os.path.join(PKGDIR, "libkvxfer.so.0")]:
            self.assertEqual(runpath(f), "$ORIGIN", f)
        for f in glob.glob(os.path.join(PKGDIR, "kvxfer-0", "*.so")):  # the library's plugins
            self.assertEqual(runpath(f), "$ORIGIN/..", f)

    def test_ldd_resolves_inside_the_wheel(self):
        ext = glob.glob(os.path.join(PKGDIR, "__native*.so"))[0]
        for f in (ext, os.path.join(PKGDIR, "libkvxfer.so.0")):
            out = subprocess.run(["ldd", f], check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
            self.assertNotIn("not found", out, "%s:\n%s" % (f, out))
            if f == ext:
                m = re.search(r"libkvxfer\.so\.0 => (\S+)", out)
                self.assertIsNotNone(m, out)
                self.assertEqual(os.path.realpath(m.group(1)), os.path.realpath(os.path.join(PKGDIR, "libkvxfer.so.0")),
                                 out)

    def test_loaded_library_is_the_bundled_one(self):
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
        kvx = sorted(p for p in paths if "libkvxfer" in os.path.basename(p) or "__native" in os.path.basename(p))
        self.assertTrue(kvx, "libkvxfer not mapped")
        pkg = os.path.realpath(PKGDIR)
        for p in kvx:
            self.assertIn(os.path.dirname(os.path.realpath(p)), (pkg, os.path.join(pkg, "kvxfer-0")),
                          "mapped from outside the wheel: %s" % p)
        forbidden = os.environ.get("KVX_WHEEL_FORBIDDEN")
        if forbidden:
            forbidden = os.path.realpath(forbidden)
            bad = [p for p in paths if p.startswith(forbidden + "/") and not p.startswith(os.path.realpath(sys.prefix))]
            self.assertEqual(bad, [], "mapped from the build tree")

    def test_verbs_plugin_bundled(self):
        plugin = os.path.join(PKGDIR, "kvxfer-0", "libkvxfer-verbs.so")
        if not os.path.exists(plugin):
            self.skipTest("a wheel of a library built without the verbs plugin")
        mem = bytearray(4 * 4096)
        try:
            kvxfer.Transport(memoryview(mem).cast("B", (4, 4096)), None, backend="verbs").close()
        except kvxfer.Error as e:  # no RDMA device here: the plugin's own reason, not the loader's
            self.assertNotIn("libkvxfer-verbs.so", str(e))
        with open("/proc/self/maps") as f:
            self.assertIn(os.path.realpath(plugin), f.read(), "the bundled verbs plugin was not loaded")

    def test_vllm_entry_point(self):
        from importlib.metadata import entry_points
        eps = entry_points()
        eps = eps.select(group="vllm.general_plugins") if hasattr(eps, "select") else eps.get("vllm.general_plugins", [])
        self.assertEqual([(e.name, e.value) for e in eps if e.name == "kvxfer"], [("kvxfer", "kvxfer.vllm:register")])


class Fingerprint(unittest.TestCase):
    def test_known_vector(self):
        cfg, fp = KNOWN
        self.assertEqual(reference(cfg), fp)
        self.assertEqual(kvxfer.config_fingerprint(cfg), fp)
        self.assertEqual(kvxfer.config_fingerprint({"layers": 2, "model": "interop"}), fp)

    def test_reference_values(self):
        for cfg in (None, {}, {"a": {}}, {"b": 1, "a": 2}, {"a": [1, 2.5, "x", None, True]},
                    {"\u00e9": "\U0001f600", "\u4e2d": ["\u2028", "\x00\x1f\x7f"]},
                    {"f": 1e16, "g": 1e-5, "h": -0.0, "i": 0.30000000000000004, "big": 10 ** 40},
                    {"model": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16", "num_layers": 32,
                     "rope": {"theta": 500000.0, "scaling": None}, "tp": [1, 2]},
                    {"nested": {"z": {"y": {"x": [{}]}}}}):
            self.assertEqual(kvxfer.config_fingerprint(cfg), reference(cfg), cfg)


class Transfer(unittest.TestCase):
    NB, BL = 32, 16384

    def region(self, fill=None):
        mem = bytearray(os.urandom(self.NB * self.BL)) if fill is None else bytearray([fill]) * (self.NB * self.BL)
        return mem, memoryview(mem).cast("B", (self.NB, self.BL))

    def block(self, mem, i):
        return bytes(mem[i * self.BL:(i + 1) * self.BL])

    def wait(self, t, tid):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = t.poll()
            if tid in r.failed:
                self.fail("transfer %d failed: %s" % (tid, t.last_error))
            if tid in r.done:
                return
            time.sleep(0.001)
        self.fail("transfer %d not done within 20 s" % tid)

    def test_tcp_loopback_both_ways(self):
        cfg, fp = KNOWN
        amem, aview = self.region()
        bmem, bview = self.region(fill=0xEE)
        a0, b0 = bytes(amem), bytes(bmem)
        with kvxfer.Transport(aview, cfg, **TCP) as a, kvxfer.Transport(bview, cfg, **TCP) as b:
            self.assertEqual((a.backend, b.backend), ("tcp", "tcp"))
            self.assertEqual((a.config_fingerprint, b.config_fingerprint), (fp, fp))
            self.assertEqual((a.num_blocks, a.block_len), (self.NB, self.BL))
            a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
            b.add_remote_peer("a", a.get_agent_metadata(), a.base_addr, a.num_blocks, a.block_len)
            src, dst = [0, 1, 2, 3, 10, 31], [31, 30, 5, 6, 7, 0]
            tid = a.write_blocks("b", src, dst)
            self.assertIsNotNone(tid, a.last_error)
            self.wait(a, tid)
            for s, d in zip(src, dst):
                self.assertEqual(self.block(bmem, d), self.block(amem, s), "a[%d] -> b[%d]" % (s, d))
            for i in set(range(self.NB)) - set(dst):
                self.assertEqual(self.block(bmem, i), self.block(b0, i), "b[%d] written" % i)
            # and back: b's blocks 5, 6 (a's 2, 3 now) into a's 20, 21
            tid = b.write_blocks("a", [5, 6], [20, 21])
            self.assertIsNotNone(tid, b.last_error)
            self.wait(b, tid)
            self.assertEqual(self.block(amem, 20), self.block(a0, 2))
            self.assertEqual(self.block(amem, 21), self.block(a0, 3))
            for i in set(range(self.NB)) - {20, 21}:
                self.assertEqual(self.block(amem, i), self.block(a0, i), "a[%d] written" % i)
            a.remove_remote_peer("b")
            b.remove_remote_peer("a")

    def test_fingerprint_mismatch_refused(self):
        _, aview = self.region()
        _, bview = self.region()
        with kvxfer.Transport(aview, {"model": "a"}, **TCP) as a, kvxfer.Transport(bview, {"model": "b"}, **TCP) as b:
            with self.assertRaises(kvxfer.RequestError) as cm:
                a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
            self.assertEqual(cm.exception.code, kvxfer.ErrorCode.EFINGERPRINT)


if __name__ == "__main__":
    print("kvxfer %s (libkvxfer %s) from %s, Python %s" % (kvxfer.__version__, kvxfer.library_version, PKGDIR,
                                                            sys.version.split()[0]), flush=True)
    unittest.main(verbosity=1)
