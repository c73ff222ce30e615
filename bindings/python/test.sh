#!/bin/bash
# Builds and tests the Python binding against a CMake build of libkvxfer.
#
#   bindings/python/test.sh [BUILD_DIR]     (default BUILD_DIR: <repo>/build)
#
# 1. installs missing Debian packages (as root; else names them and fails),
# 2. builds BUILD_DIR (configuring it if needed) and stages it: cmake --install
#    BUILD_DIR --prefix BUILD_DIR/stage (a no-op build after `make build`),
# 3. builds the SWIG extension against the staged install (pkg-config) into
#    BUILD_DIR/python/lib, from a copy of the sources (the tree stays clean),
# 4. runs pytest with /usr/bin/python3 (no tests collected = failure),
# 5. builds the wheel offline (pip wheel --no-build-isolation --no-deps
#    --no-index), checks its contents, installs it into a venv and runs the
#    quickstart example from there; the same for a self-contained wheel
#    (KVXFER_BUNDLE_LIB=1) that carries libkvxfer.so.0 itself.
# Exits non-zero on the first failure. PYTEST_ARGS adds pytest arguments.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$ROOT/build}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
PY=/usr/bin/python3
JOBS=${JOBS:-$(nproc)}
OUT=$BUILD/python
STAGE=$BUILD/stage

say() { echo "=== kvxfer python: $* ==="; }

# ------------------------------------------------------------------ 1. packages
. "$ROOT/scripts/need-packages.sh"
kvx_need_packages "kvxfer python" swig python3 python3-dev python3-pytest python3-numpy python3-setuptools python3-pip \
    python3-wheel python3-venv pkgconf cmake make g++

# ------------------------------------------------------------------ 2. library
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    say "configuring $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
# the whole default target: cmake --install also installs man pages, tools...
cmake --build "$BUILD" -j "$JOBS" >/dev/null
rm -rf "$STAGE"
cmake --install "$BUILD" --prefix "$STAGE" >/dev/null
PC=$(find "$STAGE" -name kvxfer.pc -print -quit)
[ -n "$PC" ] || { echo "kvxfer python: no kvxfer.pc under $STAGE" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$PC")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
unset KVXFER_PREFIX KVXFER_BUNDLE_LIB

# ------------------------------------------------------------------ 3. extension
say "building the extension against $STAGE"
rm -rf "$OUT"
mkdir -p "$OUT/src"
SRC="$OUT/src/python"
# a copy: setuptools writes *.egg-info and build/ next to setup.py
(cd "$HERE" && tar --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=.pytest_cache --exclude=./kvxfer/_native.py --exclude='./kvxfer/__native*' -cf - .) |
    (mkdir -p "$SRC" && cd "$SRC" && tar -xf -)
(cd "$SRC" && "$PY" setup.py -q build --build-base "$OUT/build" --build-lib "$OUT/lib") >"$OUT/build.log" 2>&1 ||
    { cat "$OUT/build.log" >&2; echo "kvxfer python: extension build failed" >&2; exit 1; }
ls "$OUT"/lib/kvxfer/__native*.so "$OUT/lib/kvxfer/_native.py" >/dev/null

# ------------------------------------------------------------------ 4. pytest
say "pytest ($PY)"
set +e
(cd "$OUT" && PYTHONPATH="$OUT/lib" PYTHONDONTWRITEBYTECODE=1 KVXFER_NO_VLLM= \
    "$PY" -m pytest -p no:cacheprovider -q -ra "$HERE/tests" ${PYTEST_ARGS:-})
rc=$?
set -e
if [ $rc -eq 5 ]; then
    echo "kvxfer python: pytest collected no tests" >&2
    exit 1
elif [ $rc -ne 0 ]; then
    echo "kvxfer python: pytest failed (exit $rc)" >&2
    exit $rc
fi

# ------------------------------------------------------------------ 5. wheel
say "offline wheel"
rm -rf "$OUT/dist" "$OUT/venv"
(cd "$OUT/src" && "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$OUT/dist" ./python) \
    >"$OUT/wheel.log" 2>&1 || { cat "$OUT/wheel.log" >&2; echo "kvxfer python: wheel build failed" >&2; exit 1; }
WHEEL=$(ls "$OUT"/dist/kvxfer-*.whl)
"$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["kvxfer/__init__.py", "kvxfer/_transport.py", "kvxfer/_args.py", "kvxfer/_errors.py", "kvxfer/_native.py",
        "kvxfer/vllm.py", "kvxfer/_peers.py", "kvxfer/_waiters.py", "kvxfer/_log.py", "kvxfer/prometheus.py"]
missing = [n for n in need if n not in names]
if not any(n.startswith("kvxfer/__native") and n.endswith(".so") for n in names):
    missing.append("kvxfer/__native*.so")
if missing:
    sys.exit("wheel %s lacks %s" % (sys.argv[1], missing))
print("wheel contents ok:", sys.argv[1].rsplit("/", 1)[-1])
EOF
"$PY" -m venv --system-site-packages "$OUT/venv"
"$OUT/venv/bin/python" -m pip install -q --no-index --no-deps "$WHEEL"
(cd / && KVXFER_NO_VLLM=1 "$OUT/venv/bin/python" -I -c \
    "import kvxfer, sys; assert kvxfer.__file__.startswith(sys.prefix), kvxfer.__file__; print('wheel imports', kvxfer.library_version, 'from', kvxfer.__file__)")
(cd / && KVXFER_NO_VLLM=1 "$OUT/venv/bin/python" -I "$HERE/examples/quickstart.py")
# vLLM finds the adapter through this entry point (kvxfer/vllm.py)
(cd / && KVXFER_NO_VLLM=1 "$OUT/venv/bin/python" -I -c "
from importlib.metadata import entry_points
eps = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'kvxfer']
assert len(eps) == 1 and eps[0].value == 'kvxfer.vllm:register', eps
eps[0].load()()  # KVXFER_VLLM unset: a no-op
print('vllm.general_plugins entry point:', eps[0].value)")

say "self-contained wheel (KVXFER_BUNDLE_LIB=1: libkvxfer.so.0 inside, RUNPATH \$ORIGIN)"
rm -rf "$OUT/dist-bundled" "$OUT/venv-bundled" "$OUT/src/python/build"
(cd "$OUT/src" && KVXFER_BUNDLE_LIB=1 "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-index \
    -w "$OUT/dist-bundled" ./python) >"$OUT/wheel-bundled.log" 2>&1 ||
    { cat "$OUT/wheel-bundled.log" >&2; echo "kvxfer python: bundled wheel build failed" >&2; exit 1; }
"$PY" -m venv --system-site-packages "$OUT/venv-bundled"
"$OUT/venv-bundled/bin/python" -m pip install -q --no-index --no-deps "$OUT"/dist-bundled/kvxfer-*.whl
EXT=$(ls "$OUT"/venv-bundled/lib/python3*/site-packages/kvxfer/__native*.so)
# (through a file: with pipefail, grep -q exiting early can kill ldd with SIGPIPE)
ldd "$EXT" >"$OUT/ldd-bundled.txt"
grep -q "libkvxfer.so.0 => $(dirname "$EXT")/libkvxfer.so.0" "$OUT/ldd-bundled.txt" ||
    { cat "$OUT/ldd-bundled.txt" >&2; echo "kvxfer python: bundled extension does not load its own libkvxfer" >&2; exit 1; }
(cd / && KVXFER_NO_VLLM=1 "$OUT/venv-bundled/bin/python" -I "$HERE/examples/quickstart.py")
say "all passed"
