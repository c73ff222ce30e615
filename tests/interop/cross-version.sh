#!/bin/bash
# A released kvxfer and this one connect and write both ways, over shm and
# over tcp: the metadata, the handshake and the data paths are unchanged.
# Builds the C interop program of the release (a commit of this repository's
# history, exported with git archive) once, into BUILD/release-LABEL, and
# pairs it with this build's through tests/interop/run.sh.
# Usage: tests/interop/cross-version.sh BUILD_DIR COMMIT LABEL
set -euo pipefail
BUILD=$(cd "${1:?usage: cross-version.sh BUILD_DIR COMMIT LABEL}" && pwd)
REF=${2:?commit}
LABEL=${3:?label}
cd "$(dirname "$0")/../.."
if ! git cat-file -e "$REF^{commit}" 2>/dev/null; then
    echo "cross-version: SKIPPED: commit $REF (kvxfer $LABEL) is not in this clone (shallow?); fetch the history to run it"
    exit 0
fi
OLD=$BUILD/release-$LABEL
bin=$OLD/build/tests/interop/interop
if [ ! -x "$bin" ] || [ "$(cat "$OLD/commit" 2>/dev/null)" != "$(git rev-parse "$REF")" ]; then
    echo "cross-version: building kvxfer $LABEL ($REF) in $OLD"
    rm -rf "$OLD"
    mkdir -p "$OLD/src"
    git archive "$REF" | tar -x -C "$OLD/src"
    cmake -S "$OLD/src" -B "$OLD/build" -DCMAKE_BUILD_TYPE=Release -DKVX_VERBS=OFF > "$OLD/configure.log"
    make -C "$OLD/build" -j "$(nproc)" interop > "$OLD/build.log"
    git rev-parse "$REF" > "$OLD/commit"
fi
fail=0
echo "cross-version: kvxfer $LABEL <-> this build, shm"
KVX_INTEROP_OLD=$bin KVX_INTEROP_PAIRS="old:c c:old" tests/interop/run.sh "$BUILD" || fail=1
echo "cross-version: kvxfer $LABEL <-> this build, tcp (this side serves tcp only)"
KVX_INTEROP_OLD=$bin KVX_INTEROP_PAIRS="old:c c:old" KVX_INTEROP_BACKEND=tcp KVX_INTEROP_EXPECT=tcp \
    tests/interop/run.sh "$BUILD" || fail=1
exit $fail
