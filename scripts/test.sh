#!/bin/bash
# Runs kvxfer's test stages; `make test` runs them all. Each stage prints a
# ctest summary; the script stops at the first failing stage.
# Usage: scripts/test.sh all|unit|asan|tsan|fuzz|vm
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build}
FUZZ_SECONDS=${KVX_FUZZ_SECONDS:-60}

stage() { echo; echo "=== kvxfer test stage: $* ==="; }

configure() { # dir, extra cmake args...
    local dir=$1; shift
    [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    cmake --build "$dir" -j "$JOBS" >/dev/null
}

unit() {
    stage "unit, conformance (tcp), fingerprint corpus, fuzz replay"
    configure "$BUILD"
    (cd "$BUILD" && ctest -j "$JOBS" --output-on-failure -LE 'verbs|fuzz')
}

asan() {
    stage "address + undefined behaviour sanitizers"
    configure build-asan -DKVX_SANITIZE=address,undefined
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest -j "$JOBS" --output-on-failure -LE 'verbs|fuzz')
}

tsan() {
    stage "thread sanitizer (tests labelled threads: one process, many threads)"
    configure build-tsan -DKVX_SANITIZE=thread
    (cd build-tsan && TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$PWD/../tests/tsan.supp" \
        ctest --output-on-failure -L threads)
}

fuzz() {
    stage "libFuzzer, ${FUZZ_SECONDS}s per target"
    CC=clang CXX=clang++ configure build-fuzz -DKVX_FUZZ=ON -DKVX_FUZZ_SECONDS="$FUZZ_SECONDS"
    (cd build-fuzz && ctest --output-on-failure -L fuzz)
}

vm() {
    stage "verbs backend inside the Soft-RoCE VM"
    configure "$BUILD"
    if ! grep -q KVX_HAVE_VERBS "$BUILD/CMakeFiles/kvxfer_core.dir/flags.make" 2>/dev/null; then
        echo "verbs backend not built: nothing to run in the VM" >&2
        return 1
    fi
    local b
    b=$(cd "$BUILD" && pwd)
    tests/rdma-vm/run-vm.sh -t 1500 -w "$b" -- \
        "cd '$b' && KVX_TEST_BACKEND=verbs ctest --output-on-failure -L 'conformance|verbs'"
}

case "${1:-all}" in
    all) unit; asan; tsan; fuzz; vm ;;
    unit|asan|tsan|fuzz|vm) "$1" ;;
    *) echo "usage: $0 all|unit|asan|tsan|fuzz|vm" >&2; exit 2 ;;
esac
