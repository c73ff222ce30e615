#!/bin/bash
# Cross-language interop: pairs an initiator of one language with a target of
# another, each its own process, on one host (PROTOCOL.md: they must pick shm), and checks that every
# language computes the same config fingerprint.
# Usage: tests/interop/run.sh BUILD_DIR
# Each language's command comes from an environment variable (set by
# scripts/test.sh after the bindings are built): KVX_INTEROP_C,
# KVX_INTEROP_PY, KVX_INTEROP_GO, KVX_INTEROP_RS. Pairs whose languages are
# missing fail the run (a missing binding is a failure, not a skip).
set -euo pipefail
BUILD=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
C=${KVX_INTEROP_C:-$BUILD/tests/interop/interop}
declare -A CMD=([c]="$C" [py]="${KVX_INTEROP_PY:-}" [go]="${KVX_INTEROP_GO:-}" [rs]="${KVX_INTEROP_RS:-}"
               [old]="${KVX_INTEROP_OLD:-}")
EXPECT=${KVX_INTEROP_EXPECT:-shm}  # the path the pairs must choose
PAIRS=${KVX_INTEROP_PAIRS:-"py:go rs:c c:py go:rs"}  # initiator:target
fail=0
fps=()
for pair in $PAIRS; do
    ini=${pair%%:*}; tgt=${pair##*:}
    for l in $ini $tgt; do
        [ -n "${CMD[$l]}" ] || { echo "interop: no command for language '$l'"; fail=1; continue 2; }
    done
    dir=$(mktemp -d)
    ${CMD[$tgt]} target "$dir" > "$dir/target.out" 2>&1 & tpid=$!
    if ! timeout 90 ${CMD[$ini]} initiator "$dir" > "$dir/initiator.out" 2>&1; then
        echo "interop: $ini -> $tgt: initiator failed:"; cat "$dir/initiator.out"; fail=1
    fi
    if ! wait $tpid; then
        echo "interop: $ini -> $tgt: target failed:"; cat "$dir/target.out"; fail=1
    elif grep -qx verified "$dir/target.out"; then
        # Same host: the pair must have chosen shm (PROTOCOL.md), or what the run narrowed it to.
        path=$(awk '/^path /{print $2 ($3 ? " (" $3 ")" : ""); exit}' "$dir/initiator.out")
        echo "interop: $ini -> $tgt: verified over ${path:-an unnamed path}"
        case $path in "$EXPECT"*) ;; *) echo "interop: $ini -> $tgt: expected $EXPECT"; fail=1 ;; esac
    else
        echo "interop: $ini -> $tgt: target did not verify"; cat "$dir/target.out"; fail=1
    fi
    fps+=("$ini $(awk '/^fingerprint/{print $2; exit}' "$dir/initiator.out")")
    fps+=("$tgt $(awk '/^fingerprint/{print $2; exit}' "$dir/target.out")")
    rm -rf "$dir"
done
distinct=$(printf '%s\n' "${fps[@]}" | awk '{print $2}' | sort -u)
want=$(/usr/bin/python3 -c 'import json,hashlib; print(hashlib.sha256(json.dumps({"model":"interop","layers":2},sort_keys=True,separators=(",",":")).encode()).hexdigest()[:16])')
if [ "$distinct" = "$want" ]; then
    echo "interop: fingerprint $want identical in: $(printf '%s\n' "${fps[@]}" | awk '{print $1}' | sort -u | tr '\n' ' ')(python3 agrees)"
else
    echo "interop: fingerprints differ (python3 says $want):"; printf '  %s\n' "${fps[@]}"; fail=1
fi
[ $fail = 0 ] && echo "interop: all pairs passed" || echo "interop: FAILED"
exit $fail
