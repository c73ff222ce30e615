#!/bin/bash
# Runs kvxfer's test stages; `make test` runs them all. Each stage prints a
# ctest summary; the script stops at the first failing stage.
# Usage: scripts/test.sh all|unit|asan|tsan|fuzz|bindings|interop|packaging|vm
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build}
FUZZ_SECONDS=${KVX_FUZZ_SECONDS:-40}

stage() { echo; echo "=== kvxfer test stage: $* ($(date -u +%H:%M:%S), ${SECONDS}s in) ==="; }

configure() { # dir, extra cmake args...
    configure_only "$@"
    cmake --build "$1" -j "$JOBS" >/dev/null
}

configure_only() { # dir, extra cmake args...
    local dir=$1; shift
    # warnings are errors here (not in users' builds): also in a build dir `make build` made
    if [ -f "$dir/CMakeCache.txt" ]; then cmake -S . -B "$dir" -DKVX_WERROR=ON "$@" >/dev/null
    else cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_WERROR=ON "$@" >/dev/null; fi
}

# Builds what the ctest selection (label arguments) runs, and the library
# with its plugins, not the whole tree: a stage that runs some tests in a
# build of its own (the whole tree is compiled, warnings as errors, by the
# unit stage's two builds).
configure_for() { # dir, ctest selection (one argument), extra cmake args...
    local dir=$1 sel=$2 targets
    shift 2
    configure_only "$dir" "$@"
    # shellcheck disable=SC2086 # sel: ctest's label options, word-split on purpose
    targets=$(scripts/ctest-targets.py "$dir" $sel)
    # shellcheck disable=SC2086 # one target per word
    cmake --build "$dir" -j "$JOBS" --target $targets >/dev/null
}

unit() {
    stage "unit, conformance (tcp), fingerprint corpus, fuzz replay"
    configure "$BUILD"
    (cd "$BUILD" && ctest -j "$JOBS" --output-on-failure -LE 'verbs|fuzz')
    echo "--- the library without the verbs backend and without ipsec-mb (-DKVX_VERBS=OFF -DKVX_IPSEC_MB=OFF:"
    echo "    hosts without rdma-core, non-x86 hosts): options, AES-GCM by OpenSSL alone"
    cmake -S . -B build-noverbs -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVX_WERROR=ON -DKVX_VERBS=OFF -DKVX_IPSEC_MB=OFF >/dev/null
    cmake --build build-noverbs -j "$JOBS" --target unit_options unit_options_api tcp_aead >/dev/null
    (cd build-noverbs && ctest --output-on-failure -R '^(unit_options(_api)?|tcp_aead)$')
    # gcc at -O3 warns where -O2 does not (false positives included, which
    # the tree works around): the whole tree, warnings as errors. The other
    # build types and clang: scripts/build-types.sh (not run here: 8 builds).
    echo "--- the whole tree as a Release build (gcc -O3), warnings as errors, with verbs built into the"
    echo "    library (-DKVX_PLUGINS=OFF): the public API's tests of the options and of a transport"
    configure build-release -DCMAKE_BUILD_TYPE=Release -DKVX_PLUGINS=OFF
    (cd build-release && ctest --output-on-failure -R '^(unit_options_api|conformance_api|tools_info)$')
}

asan() {
    stage "address + undefined behaviour sanitizers"
    configure build-asan -DKVX_SANITIZE=address,undefined
    # the adversarial tests assert time bars, meaningless at ASan's speed: unit stage only
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ctest -j "$JOBS" --output-on-failure -LE 'verbs|fuzz|adversarial')
}

tsan() {
    stage "thread sanitizer (tests labelled threads: one process, many threads)"
    configure_for build-tsan "-L threads" -DKVX_SANITIZE=thread
    (cd build-tsan && TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$PWD/../tests/tsan.supp" \
        ctest --output-on-failure -L threads)
}

fuzz() {
    stage "libFuzzer, ${FUZZ_SECONDS}s per target"
    # clang warnings are not errors here yet: the gcc stages hold the line
    CC=clang CXX=clang++ configure_for build-fuzz "-L fuzz" -DKVX_FUZZ=ON -DKVX_FUZZ_SECONDS="$FUZZ_SECONDS" -DKVX_WERROR=OFF
    # one fuzzer per core (each is single-threaded): CI's time, not less fuzzing
    (cd build-fuzz && ctest -j "$JOBS" --output-on-failure -L fuzz)
}

bindings() {
    stage "bindings: Python (SWIG), Go (SWIG + cgo), Rust (bindgen)"
    configure "$BUILD"
    bindings/python/test.sh "$BUILD"
    # a wheel per CPython 3.9-3.13 found (absent ones skipped), each tested in a fresh venv
    bindings/python/test-wheels.sh "$BUILD"
    bindings/go/test.sh "$BUILD"
    bindings/rust/test.sh "$BUILD"
}

interop() {
    stage "cross-language interop (separate processes over tcp)"
    configure "$BUILD"
    local b
    b=$(cd "$BUILD" && pwd)
    [ -x "$b/go/bin/interop" ] && [ -f "$b/rust/KVX_INTEROP_RS" ] && [ -d "$b/python/lib" ] || {
        echo "interop: the bindings are not built in $b (run scripts/test.sh bindings first)" >&2
        return 1
    }
    KVX_INTEROP_PY="env PYTHONPATH=$b/python/lib /usr/bin/python3 $PWD/bindings/python/examples/interop.py" \
    KVX_INTEROP_GO="$b/go/bin/interop" \
    KVX_INTEROP_RS="$(cat "$b/rust/KVX_INTEROP_RS")" \
    KVX_INTEROP_PAIRS="py:go go:py rs:c c:rs go:rs rs:py py:c c:go" \
        tests/interop/run.sh "$b"
    # the last release of the previous minor (0.4.6) against this build
    tests/interop/cross-version.sh "$b" 6d4ae99 0.4.6
}

packaging() {
    stage "packages: .deb (lintian) and .rpm (rpmlint), each with its install test; ABI check"
    configure "$BUILD"
    # each builds its packages (lintian / rpmlint) and installs them into a throwaway root
    packaging/test-install.sh build-deb
    KVX_PKG_FORMAT=rpm packaging/test-install.sh build-rpm
    packaging/abi-check.sh "$BUILD"
}

vm() {
    stage "verbs backend inside the Soft-RoCE VM"
    configure "$BUILD"
    if [ ! -d "$BUILD/src/backends/verbs/CMakeFiles/kvx_verbs.dir" ]; then
        echo "verbs backend not built: nothing to run in the VM" >&2
        return 1
    fi
    local b
    b=$(cd "$BUILD" && pwd)
    tests/rdma-vm/run-vm.sh -t 1500 -w "$b" -- \
        "cd '$b' && echo '--- kvxfer-info: the Soft-RoCE devices listed, their ports ACTIVE, verbs usable' &&
         ctest --output-on-failure -R '^tools_info_vm\$' &&
         echo '--- the verbs plugin: loaded from kvxfer-0/ and serving; plugins of another ABI or build refused' &&
         ctest --output-on-failure -R '^plugins_load' &&
         echo '--- the conformance suite over two rails (rxe0, rxe1)' &&
         KVX_TEST_BACKEND=verbs ctest --output-on-failure -L conformance -E '^conformance_procs\$' &&
         echo '--- one rail: the verbs tests, and the processes whose timing assumes one (metadata surgery on rail 0, a kill mid-transfer)' &&
         KVX_TEST_BACKEND=verbs KVX_TEST_OPTIONS=verbs.devices=\$KVX_VM_DEV ctest --output-on-failure \
             -R '^(conformance_procs|verbs_.*)\$' -E '^verbs_rails\$' &&
         echo '--- kvxfer-bench choosing among verbs and tcp (the per-peer pick must be verbs; shm, the best same-host path, left out), verified' &&
         ./kvxfer-bench --no-progress --duration 0.5 --json --backend verbs,tcp > bench.json && cat bench.json &&
         [ \$(grep -c '\"backend\":\"verbs\".*\"verified\":\"yes\"' bench.json) = 3 ] &&
         echo '--- kvx_add_remote_peer on verbs (rdma_cm over rxe; a figure, not a test)' &&
         tests/perf/perf_connect 20 1 verbs &&
         echo '--- rails: netdevs taken down (last: Soft-RoCE does not recover from that)' &&
         ctest --output-on-failure -R '^verbs_rails\$'"
}

case "${1:-all}" in
    all) unit; asan; tsan; fuzz; bindings; interop; packaging; vm ;;
    unit|asan|tsan|fuzz|bindings|interop|packaging|vm) "$1" ;;
    *) echo "usage: $0 all|unit|asan|tsan|fuzz|bindings|interop|packaging|vm" >&2; exit 2 ;;
esac
