"""Build of the kvxfer Python package: a SWIG extension (kvxfer._native) over
libkvxfer.so plus the pure-Python package kvxfer.

The installed C library is found through, in this order:
  KVXFER_PREFIX=/prefix      (prefix/include/kvxfer.h, prefix/lib*/libkvxfer.so)
  pkg-config kvxfer          (set PKG_CONFIG_PATH=/prefix/lib/pkgconfig)
Other environment switches:
  KVXFER_RPATH=0             do not embed the library directory as an rpath
                             (default: embedded unless it is a system directory)
  KVXFER_BUNDLE_LIB=1        copy libkvxfer.so.N into the package and load it
                             through $ORIGIN (a self-contained wheel)
  SWIG=/path/to/swig         the SWIG executable (default: swig on PATH)

Offline wheel (as the project's test script does):
  PKG_CONFIG_PATH=... pip wheel --no-build-isolation --no-deps --no-index -w dist ./python
One self-contained wheel per CPython 3.9-3.13 on the machine, without
setuptools in those interpreters: build-wheels.sh (build_wheels.py, which runs
SWIG with the flags of BuildExt below: keep the two in step).
"""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 62.4
    from setuptools.command.build import build
except ImportError:  # pragma: no cover
    from distutils.command.build import build

HERE = os.path.dirname(os.path.abspath(__file__))
SWIG_INTERFACE = os.path.join("swig", "_native.i")
SYSTEM_LIBDIRS = {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}


def _fail(msg):
    sys.stderr.write("kvxfer setup: %s\n" % msg)
    raise SystemExit(1)


def _pkg_config(*args):
    exe = os.environ.get("PKG_CONFIG", "pkg-config")
    try:
        out = subprocess.run([exe, *args, "kvxfer"], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        return None
    except subprocess.CalledProcessError:
        return None
    return out.strip()


def find_kvxfer():
    """(include_dirs, library_dirs, libraries, extra_compile_args, libdir)."""
    prefix = os.environ.get("KVXFER_PREFIX")
    if prefix:
        prefix = os.path.abspath(prefix)
        inc = os.path.join(prefix, "include")
        libdir = None
        for cand in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            d = os.path.join(prefix, cand)
            if glob.glob(os.path.join(d, "libkvxfer.so*")):
                libdir = d
                break
        if not os.path.isfile(os.path.join(inc, "kvxfer.h")) or libdir is None:
            _fail("KVXFER_PREFIX=%s has no include/kvxfer.h and lib*/libkvxfer.so" % prefix)
        return [inc], [libdir], ["kvxfer"], [], libdir
    cflags = _pkg_config("--cflags")
    libs = _pkg_config("--libs")
    libdir = _pkg_config("--variable=libdir")
    if cflags is None or libs is None:
        _fail("cannot find libkvxfer: install it, or set PKG_CONFIG_PATH=<prefix>/lib/pkgconfig "
              "or KVXFER_PREFIX=<prefix>")
    inc, other = [], []
    for tok in shlex.split(cflags):
        (inc.append(tok[2:]) if tok.startswith("-I") else other.append(tok))
    libdirs, libnames = [], []
    for tok in shlex.split(libs):
        if tok.startswith("-L"):
            libdirs.append(tok[2:])
        elif tok.startswith("-l"):
            libnames.append(tok[2:])
    if not inc:
        inc = [_pkg_config("--variable=includedir")]
    return inc, libdirs, libnames or ["kvxfer"], other, libdir or (libdirs[0] if libdirs else None)


def header_version(include_dirs):
    for d in include_dirs:
        path = os.path.join(d, "kvxfer.h")
        if os.path.isfile(path):
            text = open(path, encoding="utf-8").read()
            parts = [re.search(r"#define\s+KVX_VERSION_%s\s+(\d+)" % k, text) for k in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return ".".join(m.group(1) for m in parts)
    _fail("kvxfer.h not found in %s" % include_dirs)


INCLUDE_DIRS, LIBRARY_DIRS, LIBRARIES, EXTRA_CFLAGS, LIBDIR = find_kvxfer()
BUNDLE = os.environ.get("KVXFER_BUNDLE_LIB", "0") not in ("", "0")
RPATH = []
if BUNDLE:
    RPATH = ["$ORIGIN"]
elif os.environ.get("KVXFER_RPATH", "1") not in ("", "0") and LIBDIR and \
        os.path.realpath(LIBDIR) not in SYSTEM_LIBDIRS:
    RPATH = [os.path.realpath(LIBDIR)]


class BuildExt(build_ext):
    """Runs SWIG itself: the C wrapper goes to build_temp, the generated
    kvxfer/_native.py next to the extension (build_lib, or the source package
    with --inplace), so that it is part of the wheel whatever order setuptools
    runs build_py and build_ext in."""

    def build_extension(self, ext):
        if ext.name == "kvxfer.__native":
            swig = os.environ.get("SWIG") or shutil.which("swig") or shutil.which("swig4.0")
            if not swig:
                _fail("SWIG not found (Debian: apt-get install swig)")
            outdir = os.path.dirname(self.get_ext_fullpath(ext.name))
            os.makedirs(outdir, exist_ok=True)
            os.makedirs(self.build_temp, exist_ok=True)
            wrap = os.path.join(self.build_temp, "_native_wrap.c")
            cmd = [swig, "-python", "-threads", "-DSWIGWORDSIZE64", "-Wall"]
            cmd += ["-I" + d for d in INCLUDE_DIRS]
            cmd += ["-outdir", outdir, "-o", wrap, os.path.join(HERE, SWIG_INTERFACE)]
            self.announce("swig: " + " ".join(cmd), level=2)
            subprocess.run(cmd, check=True)
            ext.sources = [wrap]
        super().build_extension(ext)
        if BUNDLE and ext.name == "kvxfer.__native":
            self._bundle_library(os.path.dirname(self.get_ext_fullpath(ext.name)))

    def _bundle_library(self, pkgdir):
        # Copy the SONAME file (libkvxfer.so.N) so that $ORIGIN finds it.
        cands = sorted(glob.glob(os.path.join(LIBDIR, "libkvxfer.so.*")), key=len)
        if not cands:
            _fail("KVXFER_BUNDLE_LIB: no libkvxfer.so.* in %s" % LIBDIR)
        soname = os.path.basename(cands[0])
        dest = os.path.join(pkgdir, soname)
        shutil.copyfile(os.path.realpath(cands[0]), dest)
        strip = shutil.which("strip")
        if strip:  # a RelWithDebInfo library is mostly debug info
            subprocess.run([strip, "--strip-debug", dest], check=False)

    def get_outputs(self):
        outs = super().get_outputs()
        for ext in self.extensions:
            if ext.name == "kvxfer.__native":
                outs.append(os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), "_native.py"))
        return outs


class Build(build):
    # build_ext first (see BuildExt): harmless either way, and keeps the
    # generated module visible to anything build_py-based that runs later.
    sub_commands = [c for c in build.sub_commands if c[0] == "build_ext"] + \
                   [c for c in build.sub_commands if c[0] != "build_ext"]


setup(
    version=header_version(INCLUDE_DIRS),
    packages=["kvxfer"],
    ext_modules=[
        Extension(
            "kvxfer.__native",
            sources=[SWIG_INTERFACE],  # replaced by the generated wrapper in BuildExt
            include_dirs=INCLUDE_DIRS,
            library_dirs=LIBRARY_DIRS,
            libraries=LIBRARIES,
            runtime_library_dirs=RPATH,
            extra_compile_args=EXTRA_CFLAGS + ["-fno-strict-aliasing"],
        )
    ],
    cmdclass={"build_ext": BuildExt, "build": Build},
)
