#!/usr/bin/env python3
"""Builds one self-contained kvxfer wheel per CPython interpreter, offline and
without setuptools/wheel in the target interpreters (pyenv's 3.12 and 3.13
have neither, 3.9's setuptools 58 cannot read pyproject.toml's [project]).

    build_wheels.py --include DIR --libdir DIR --out DIR [--work DIR]
                    [--jobs N] [--manifest FILE] PYTHON...

Run it with a Python >= 3.11 (tomllib); bindings/python/build-wheels.sh picks
the interpreters and stages the library. For every PYTHON it
  1. compiles the SWIG wrapper (generated once: its C is the same for every
     Python 3) against that interpreter's headers into
     kvxfer/__native<EXT_SUFFIX>, linked with LIBDIR/libkvxfer.so.0,
  2. copies libkvxfer.so.0 (LIBDIR's SONAME file, debug info stripped) next
     to it, and the library's plugins (LIBDIR/kvxfer-0/*.so: the verbs
     backend) into kvxfer/kvxfer-0/, where libkvxfer looks for them,
  3. sets RUNPATH with patchelf: $ORIGIN on the extension and on
     libkvxfer.so.0, $ORIGIN/.. on the plugins, so the wheel needs nothing
     from the build tree, /usr/local or LD_LIBRARY_PATH,
  4. writes kvxfer-<version>-cp3X-cp3X-linux_x86_64.whl (name, metadata and
     entry points from pyproject.toml, the version from kvxfer.h, like
     setup.py), reproducibly (sorted entries, fixed timestamps).
The platform tag is linux_x86_64, not manylinux: libkvxfer needs libraries
outside the manylinux policy (libcrypto.so.3; the verbs plugin libibverbs.so.1
and librdmacm.so.1, loaded only for verbs) and glibc >= 2.34 from the system; each wheel's
line says which (readelf NEEDED, objdump GLIBC_ versions).
The manifest (default OUT/wheels.tsv) lists "python<TAB>wheel" per built
wheel; the exit status is non-zero when any interpreter failed.
"""

import argparse
import base64
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

try:
    import tomllib
except ImportError:  # pragma: no cover
    sys.exit("build_wheels.py: needs Python >= 3.11 (tomllib) to read pyproject.toml; run it with /usr/bin/python3")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PKG = "kvxfer"
PLUGIN_SUBDIR = "kvxfer-0"       # kvxfer/kvxfer-0/*.so: the library's plugins (LIBDIR/kvxfer-0/*.so)
SONAME_GLOB = "libkvxfer.so.*"
# zip timestamps: SOURCE_DATE_EPOCH, else 1980-01-01 (the zip epoch)
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
# Libraries a manylinux wheel may leave to the system (PEP 600 / auditwheel policy)
MANYLINUX_OK = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
                "libstdc++.so.6", "libcrypt.so.1", "libutil.so.1", "libnsl.so.1", "ld-linux-x86-64.so.2",
                "libz.so.1", "libexpat.so.1"}

PROBE = r"""
import json, sys, sysconfig
print(json.dumps({
    "impl": sys.implementation.name, "version": list(sys.version_info[:3]),
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"), "include": sysconfig.get_paths()["include"],
    "platform": sysconfig.get_platform(), "gil_disabled": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "debug": hasattr(sys, "gettotalrefcount"), "executable": sys.executable}))
"""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def header_version(include_dir):
    """KVX_VERSION_MAJOR.MINOR.PATCH of kvxfer.h (as setup.py's header_version)."""
    text = open(os.path.join(include_dir, "kvxfer.h"), encoding="utf-8").read()
    parts = [re.search(r"#define\s+KVX_VERSION_%s\s+(\d+)" % k, text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        sys.exit("build_wheels.py: no KVX_VERSION_* in %s/kvxfer.h" % include_dir)
    return ".".join(m.group(1) for m in parts)


def metadata(project, version):
    """METADATA (core metadata 2.1) from pyproject.toml's [project]."""
    lines = ["Metadata-Version: 2.1", "Name: %s" % project["name"], "Version: %s" % version]
    if project.get("description"):
        lines.append("Summary: %s" % project["description"])
    lic = project.get("license", {})
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    for c in project.get("classifiers", []):
        lines.append("Classifier: %s" % c)
    if project.get("requires-python"):
        lines.append("Requires-Python: %s" % project["requires-python"])
    for dep in project.get("dependencies", []):
        lines.append("Requires-Dist: %s" % dep)
    for extra, deps in sorted(project.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    body = ""
    readme = project.get("readme")
    if isinstance(readme, str) and os.path.isfile(os.path.join(HERE, readme)):
        lines.append("Description-Content-Type: text/markdown" if readme.endswith(".md") else
                     "Description-Content-Type: text/plain")
        body = "\n" + open(os.path.join(HERE, readme), encoding="utf-8").read()
    return "\n".join(lines) + "\n" + body


def entry_points(project):
    out = []
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    for group, eps in sorted(groups.items()):
        out.append("[%s]" % group)
        out += ["%s = %s" % (k, v) for k, v in sorted(eps.items())]
        out.append("")
    return "\n".join(out)


def swig_wrapper(include_dir, work):
    """Runs SWIG once (the flags of setup.py's BuildExt): (wrapper.c, _native.py)."""
    swig = os.environ.get("SWIG") or shutil.which("swig") or shutil.which("swig4.0")
    if not swig:
        sys.exit("build_wheels.py: SWIG not found (Debian: apt-get install swig)")
    outdir = os.path.join(work, "swig")
    os.makedirs(outdir, exist_ok=True)
    wrap = os.path.join(outdir, "_native_wrap.c")
    cmd = [swig, "-python", "-threads", "-DSWIGWORDSIZE64", "-Wall", "-I" + include_dir,
           "-outdir", outdir, "-o", wrap, os.path.join(HERE, "swig", "_native.i")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("build_wheels.py: swig failed:\n%s%s" % (r.stdout, r.stderr))
    return wrap, os.path.join(outdir, "_native.py")


def elf_needed(path):
    out = run(["readelf", "-dW", path]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def glibc_max(path):
    out = run(["objdump", "-T", path]).stdout
    vers = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+[0-9])", out)}
    return ".".join(map(str, max(vers))) if vers else None


def manylinux_verdict(bundled):
    """Why this is no manylinux wheel: the NEEDED libraries outside the
    manylinux policy (not bundled), and the newest glibc symbol version."""
    names = {os.path.basename(p) for p in bundled}
    outside, glibc = set(), []
    for p in bundled:
        outside |= {n for n in elf_needed(p) if n not in MANYLINUX_OK and n not in names
                    and not n.startswith("libpython")}
        g = glibc_max(p)
        if g:
            glibc.append(g)
    g = max(glibc, key=lambda s: tuple(map(int, s.split(".")))) if glibc else "?"
    return sorted(outside), g


def wheel_tag(info):
    if info["impl"] != "cpython":
        raise RuntimeError("not CPython (%s)" % info["impl"])
    if info["debug"]:
        raise RuntimeError("a debug build of CPython (abi tag d) is not supported")
    py = "cp%d%d" % tuple(info["version"][:2])
    abi = py + ("t" if info["gil_disabled"] else "")
    plat = info["platform"].replace("-", "_").replace(".", "_")
    return py, abi, plat


def record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def write_wheel(path, files):
    """files: [(arcname, bytes, executable)]; RECORD added last."""
    records = []
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        stamp = time.gmtime(EPOCH)[:6]
        for arcname, data, exe in files:
            zi = zipfile.ZipInfo(arcname, date_time=stamp)
            zi.external_attr = ((0o100755 if exe else 0o100644) & 0xFFFF) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
            records.append(record_line(arcname, data))
        record_name = [a for a, _, _ in files if a.endswith(".dist-info/WHEEL")][0].rsplit("/", 1)[0] + "/RECORD"
        records.append("%s,," % record_name)
        zi = zipfile.ZipInfo(record_name, date_time=stamp)
        zi.external_attr = (0o100644 & 0xFFFF) << 16
        zi.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(zi, "\n".join(records) + "\n")
    os.replace(tmp, path)


def build_one(python, a, ctx):
    """Builds the wheel for one interpreter; returns (wheel path, notes)."""
    info = json.loads(run([python, "-c", PROBE]).stdout)
    py, abi, plat = wheel_tag(info)
    low = re.fullmatch(r">=\s*(\d+)\.(\d+)", ctx["requires_python"] or "")
    if low and tuple(info["version"][:2]) < (int(low.group(1)), int(low.group(2))):
        raise RuntimeError("Python %d.%d is outside requires-python %s (pyproject.toml)"
                           % (info["version"][0], info["version"][1], ctx["requires_python"]))
    work = os.path.join(a.work, py)
    shutil.rmtree(work, ignore_errors=True)
    pkgdir = os.path.join(work, PKG)
    os.makedirs(os.path.join(pkgdir, PLUGIN_SUBDIR))
    # 1. the extension
    ext = os.path.join(pkgdir, "__native" + info["ext_suffix"])
    obj = os.path.join(work, "_native_wrap.o")
    cc = os.environ.get("CC", "gcc")
    cflags = ["-pthread", "-fPIC", "-O2", "-g0", "-fno-strict-aliasing", "-DNDEBUG"]
    cmds = [[cc] + cflags + ["-I" + info["include"], "-I" + a.include, "-c", ctx["wrap"], "-o", obj],
            # the SONAME file itself: the runtime component has no libkvxfer.so link
            [cc, "-pthread", "-shared", "-o", ext, obj, os.path.join(a.libdir, ctx["soname"])]]
    log = []
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True)
        log.append("$ " + " ".join(cmd) + "\n" + r.stdout + r.stderr)
        if r.returncode:
            raise RuntimeError("compiling the SWIG wrapper for %s failed:\n%s" % (info["executable"], "".join(log)))
    with open(os.path.join(work, "build.log"), "w") as f:
        f.write("".join(log))
    run(["strip", "--strip-unneeded", ext])
    # 2. the library and its plugins
    lib = os.path.join(pkgdir, ctx["soname"])
    shutil.copyfile(ctx["lib_real"], lib)
    run(["strip", "--strip-debug", lib])
    plugins = []
    for p in ctx["plugins"]:
        dest = os.path.join(pkgdir, PLUGIN_SUBDIR, os.path.basename(p))
        shutil.copyfile(p, dest)
        run(["strip", "--strip-debug", dest])
        plugins.append(dest)
    # 3. RUNPATHs: everything resolves inside the package
    for f, rp in [(ext, "$ORIGIN"), (lib, "$ORIGIN")] + [(p, "$ORIGIN/..") for p in plugins]:
        run(["patchelf", "--set-rpath", rp, f])
        got = run(["patchelf", "--print-rpath", f]).stdout.strip()
        if got != rp:
            raise RuntimeError("patchelf: %s has RUNPATH %r, not %r" % (f, got, rp))
    # 4. the wheel
    version = ctx["version"]
    distinfo = "%s-%s.dist-info" % (PKG, version)
    tag = "%s-%s-%s" % (py, abi, plat)
    files = []
    for src in sorted(glob.glob(os.path.join(HERE, PKG, "*.py"))) + [ctx["native_py"]]:
        files.append(("%s/%s" % (PKG, os.path.basename(src)), open(src, "rb").read(), False))
    for p in [ext, lib] + plugins:
        files.append((os.path.relpath(p, work), open(p, "rb").read(), True))
    files.sort(key=lambda f: f[0])
    files += [
        (distinfo + "/METADATA", ctx["metadata"].encode(), False),
        (distinfo + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: kvxfer build_wheels.py\nRoot-Is-Purelib: false\n"
                               "Tag: %s\n" % tag).encode(), False),
        (distinfo + "/top_level.txt", (PKG + "\n").encode(), False),
    ]
    if ctx["entry_points"]:
        files.append((distinfo + "/entry_points.txt", ctx["entry_points"].encode(), False))
    if os.path.isfile(os.path.join(ROOT, "LICENSE")):
        files.append((distinfo + "/LICENSE", open(os.path.join(ROOT, "LICENSE"), "rb").read(), False))
    whl = os.path.join(a.out, "%s-%s-%s.whl" % (PKG, version, tag))
    write_wheel(whl, files)
    outside, glibc = manylinux_verdict([ext, lib] + plugins)
    note = "platform tag %s, not manylinux: needs %s from the system, glibc >= %s" % (
        plat, ", ".join(outside) or "nothing else", glibc)
    return whl, info, note


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--include", required=True, help="directory with kvxfer.h")
    ap.add_argument("--libdir", required=True, help="directory with libkvxfer.so* (and kvxfer-0/*.so plugins)")
    ap.add_argument("--out", required=True, help="where the wheels go")
    ap.add_argument("--work", help="scratch directory (default: OUT/.work)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--manifest", help="default: OUT/wheels.tsv")
    ap.add_argument("pythons", nargs="+")
    a = ap.parse_args()
    for tool in ("patchelf", "readelf", "objdump", "strip"):
        if not shutil.which(tool):
            sys.exit("build_wheels.py: %s not found (Debian: apt-get install %s)"
                     % (tool, "patchelf" if tool == "patchelf" else "binutils"))
    a.include, a.libdir, a.out = map(os.path.abspath, (a.include, a.libdir, a.out))
    a.work = os.path.abspath(a.work or os.path.join(a.out, ".work"))
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    for old in glob.glob(os.path.join(a.out, PKG + "-*.whl")):
        os.unlink(old)

    libs = sorted(glob.glob(os.path.join(a.libdir, SONAME_GLOB)), key=len)
    if not libs:
        sys.exit("build_wheels.py: no %s in %s" % (SONAME_GLOB, a.libdir))
    with open(os.path.join(ROOT, "bindings", "python", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    version = header_version(a.include)
    wrap, native_py = swig_wrapper(a.include, a.work)
    ctx = {
        "soname": os.path.basename(libs[0]), "lib_real": os.path.realpath(libs[0]),
        "plugins": sorted(glob.glob(os.path.join(a.libdir, PLUGIN_SUBDIR, "*.so"))),
        "version": version, "metadata": metadata(project, version), "entry_points": entry_points(project),
        "wrap": wrap, "native_py": native_py, "requires_python": project.get("requires-python"),
    }
    print("kvxfer %s: %s%s" % (version, ctx["lib_real"], "; plugins: " + ", ".join(ctx["plugins"])
                                if ctx["plugins"] else "; no plugins in %s/%s" % (a.libdir, PLUGIN_SUBDIR)))
    manifest, failed = [], 0
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futs = [(p, pool.submit(build_one, p, a, ctx)) for p in a.pythons]
        for python, fut in futs:
            try:
                whl, info, note = fut.result()
            except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
                failed += 1
                detail = e.stderr if isinstance(e, subprocess.CalledProcessError) else ""
                print("FAILED %s: %s %s" % (python, e, detail or ""), file=sys.stderr)
                continue
            print("built %s (%d bytes) with %s %s; %s" % (os.path.basename(whl), os.path.getsize(whl),
                                                          python, ".".join(map(str, info["version"])), note))
            manifest.append("%s\t%s" % (python, whl))
    with open(a.manifest or os.path.join(a.out, "wheels.tsv"), "w") as f:
        f.write("".join(line + "\n" for line in manifest))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
