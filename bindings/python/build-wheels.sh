#!/bin/bash
# Builds a self-contained kvxfer wheel (libkvxfer.so.0 inside, RUNPATH $ORIGIN)
# for every CPython 3.9-3.13 on this machine, offline.
#
#   bindings/python/build-wheels.sh [BUILD_DIR [OUT_DIR]]
#       BUILD_DIR  a CMake build of libkvxfer (default: <repo>/build-wheel,
#                  configured as a Release build when it has no CMakeCache.txt)
#       OUT_DIR    where the wheels go (default: BUILD_DIR/wheels)
#   `make wheels` runs it with the defaults.
#
# 1. builds the library and its verbs plugin in BUILD_DIR (KVX_WHEEL_TARGETS,
#    default "kvxfer kvxfer-verbs", the plugin when the build has it) and
#    installs the runtime and verbs components into OUT_DIR/.stage
#    (libkvxfer.so.0, and <libdir>/kvxfer-0/libkvxfer-verbs.so, which goes
#    into the wheel's kvxfer/kvxfer-0/: beside the library, where it looks),
# 2. finds the interpreters: for each minor of KVX_WHEEL_MINORS (default
#    "9 10 11 12 13") the newest $PYENV_ROOT/versions/3.MINOR.N, else
#    /usr/bin/python3.MINOR or /usr/local/bin/python3.MINOR; an absent one is
#    skipped with a message. KVX_WHEEL_PYTHONS="/path/python ..." replaces
#    the search.
# 3. runs build_wheels.py (stdlib only, with /usr/bin/python3 or any found
#    Python >= 3.11): SWIG once, one compile per interpreter, patchelf, zip.
# OUT_DIR/wheels.tsv lists "python<TAB>wheel" for test-wheels.sh. Exits
# non-zero when an interpreter that was found could not be built for; exits
# 0 with a message when none was found.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$ROOT/build-wheel}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
OUT=${2:-$BUILD/wheels}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-$(nproc)}
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
MINORS=${KVX_WHEEL_MINORS:-9 10 11 12 13}

say() { echo "=== kvxfer wheels: $* ==="; }

# ------------------------------------------------------------------ packages
. "$ROOT/scripts/need-packages.sh"
kvx_need_packages "kvxfer wheels" swig patchelf binutils gcc cmake make g++ python3

# ------------------------------------------------------------------ interpreters
PYTHONS=()
if [ -n "${KVX_WHEEL_PYTHONS:-}" ]; then
    read -r -a PYTHONS <<<"$KVX_WHEEL_PYTHONS"
else
    for m in $MINORS; do
        py=""
        # 3.M.N only (not 3.13.0t, 3.12-dev, ...), the newest patch release
        v=$(for d in "$PYENV_ROOT"/versions/3."$m".*; do echo "${d##*/}"; done | grep -E "^3\.$m\.[0-9]+$" |
            sort -V | tail -n1 || true)
        if [ -n "$v" ] && [ -x "$PYENV_ROOT/versions/$v/bin/python3" ]; then
            py=$PYENV_ROOT/versions/$v/bin/python3
        else
            for c in /usr/bin/python3.$m /usr/local/bin/python3.$m; do
                [ -x "$c" ] && { py=$c; break; }
            done
        fi
        if [ -z "$py" ]; then
            echo "kvxfer wheels: skipping cp3$m: no CPython 3.$m ($PYENV_ROOT/versions/3.$m.*, /usr/bin/python3.$m, /usr/local/bin/python3.$m)"
            continue
        fi
        if ! "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
            echo "kvxfer wheels: skipping cp3$m: $py has no Python.h (Debian: python3.$m-dev)"
            continue
        fi
        PYTHONS+=("$py")
    done
fi
if [ ${#PYTHONS[@]} -eq 0 ]; then
    echo "kvxfer wheels: no CPython 3.9-3.13 found: no wheels built"
    : >"$OUT/wheels.tsv"
    exit 0
fi
# the builder needs tomllib (3.11+): Debian's python3, else a found one
DRIVER=""
for c in /usr/bin/python3 "${PYTHONS[@]}"; do
    if [ -x "$c" ] && "$c" -c 'import tomllib' 2>/dev/null; then DRIVER=$c; break; fi
done
[ -n "$DRIVER" ] || { echo "kvxfer wheels: need a Python >= 3.11 to run build_wheels.py" >&2; exit 1; }

# ------------------------------------------------------------------ library
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    say "configuring $BUILD (Release)"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
TARGETS=${KVX_WHEEL_TARGETS:-kvxfer}
if [ -z "${KVX_WHEEL_TARGETS:-}" ] && [ "$(cmake --build "$BUILD" --target help | grep -c 'kvxfer-verbs')" != 0 ]; then
    TARGETS="kvxfer kvxfer-verbs"
fi
say "building $TARGETS in $BUILD"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$JOBS" --target $TARGETS >/dev/null
STAGE=$OUT/.stage
rm -rf "$STAGE"
cmake --install "$BUILD" --component runtime --prefix "$STAGE" >/dev/null
cmake --install "$BUILD" --component verbs --prefix "$STAGE" >/dev/null
SO=$(find "$STAGE" -name 'libkvxfer.so.0' -print -quit)
[ -n "$SO" ] || { echo "kvxfer wheels: no libkvxfer.so.0 under $STAGE" >&2; exit 1; }

say "building for ${PYTHONS[*]}"
"$DRIVER" "$HERE/build_wheels.py" --include "$ROOT/include" --libdir "$(dirname "$SO")" \
    --out "$OUT" --jobs "$JOBS" "${PYTHONS[@]}"
