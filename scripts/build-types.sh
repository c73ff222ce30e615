#!/usr/bin/env bash
# Builds the whole tree (library, tools, tests, bindings' C parts) with every
# CMake build type, with gcc and with clang, warnings as errors: the check
# behind "builds warning-free with Debug, Release, RelWithDebInfo and
# MinSizeRel, gcc and clang". make test builds RelWithDebInfo (gcc, and
# clang for the fuzzers) and Release (gcc); this runs all eight, about 25
# minutes on two cores. Usage: scripts/build-types.sh [DIR]  (default /tmp)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-/tmp}
jobs=$(nproc)
status=0
for cc in gcc clang; do
    for bt in Debug Release RelWithDebInfo MinSizeRel; do
        d="$out/kvxfer-bt-$cc-$bt"
        if [[ $cc == clang ]]; then cxx=clang++; else cxx=g++; fi
        if CC=$cc CXX=$cxx cmake -S "$root" -B "$d" -DCMAKE_BUILD_TYPE=$bt -DKVX_WERROR=ON >"$d.log" 2>&1 &&
            cmake --build "$d" -j "$jobs" >>"$d.log" 2>&1; then
            echo "ok      $cc $bt"
        else
            echo "FAILED  $cc $bt (see $d.log)"
            grep -m5 -E 'error|warning:' "$d.log" || true
            status=1
        fi
    done
done
exit $status
