#!/bin/bash
# Builds the per-interpreter wheels (build-wheels.sh) and tests each one in a
# fresh venv of its own interpreter:
#
#   bindings/python/test-wheels.sh [BUILD_DIR]     (default BUILD_DIR: <repo>/build)
#
# For every wheel in BUILD_DIR/wheels/wheels.tsv: `python -m venv` (pip from
# the interpreter's ensurepip, offline), `pip install --no-index --no-deps
# WHEEL`, then wheel_smoke.py (unittest: import, RUNPATH $ORIGIN, ldd and
# /proc/self/maps show the bundled libkvxfer.so.0, the fingerprint's known
# vector, two tcp transports on the loopback moving verified blocks) with
# LD_LIBRARY_PATH and PYTHON* unset, python -I, from /: nothing from the
# build tree or the source tree can be used. Interpreters that are absent are
# skipped with a message (build-wheels.sh); every wheel built must pass.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$ROOT/build}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
OUT=$BUILD/wheels

"$HERE/build-wheels.sh" "$BUILD" "$OUT"
[ -s "$OUT/wheels.tsv" ] || { echo "kvxfer wheels: no interpreter, nothing to test (skipped)"; exit 0; }
# the venvs live outside the build tree, which the smoke test forbids
VENVS=$(mktemp -d "${TMPDIR:-/tmp}/kvxfer-wheels.XXXXXX")
trap 'rm -rf "$VENVS"' EXIT

fail=0
summary=()
while IFS=$'\t' read -r py whl; do
    tag=$(basename "$whl" .whl | cut -d- -f3)
    version=$(basename "$whl" .whl | cut -d- -f2)
    venv=$VENVS/venv-$tag
    echo "=== kvxfer wheels: $tag: fresh venv ($py), pip install --no-index $(basename "$whl") ==="
    rm -rf "$venv"
    if ! "$py" -m venv "$venv" >"$OUT/venv-$tag.log" 2>&1 ||
       ! "$venv/bin/python" -m pip install -q --no-index --no-deps "$whl" >>"$OUT/venv-$tag.log" 2>&1; then
        cat "$OUT/venv-$tag.log" >&2
        summary+=("$tag: install FAILED")
        fail=1
        continue
    fi
    # nothing from the environment: no loader path, no PYTHONPATH, no source tree (-I, cwd /)
    if (cd / && env -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONPATH -u PYTHONHOME -u PYTHONSTARTUP \
            HOME="$VENVS" KVXFER_NO_VLLM=1 KVX_WHEEL_VERSION="$version" KVX_WHEEL_FORBIDDEN="$BUILD" \
            "$venv/bin/python" -I "$HERE/wheel_smoke.py"); then
        summary+=("$tag: passed ($(basename "$whl"), $(stat -c %s "$whl") bytes)")
    else
        summary+=("$tag: smoke test FAILED")
        fail=1
    fi
    rm -rf "$venv"   # (pass or fail: the log and the wheel stay in $OUT)
done <"$OUT/wheels.tsv"

echo "=== kvxfer wheels: summary ==="
printf '  %s\n' "${summary[@]}"
exit $fail
