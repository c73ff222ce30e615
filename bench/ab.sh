#!/usr/bin/env bash
# A/B of two kvxfer builds, interleaved: for each of REPEAT rounds (default
# 3), each build runs kvxfer-bench on each backend of BACKENDS (default
# "tcp shm") with block sizes SIZES (default 4K,64K,1M) for DURATION seconds
# (default 2) each, one process pair on this host. Prints per backend and
# size the median [min-max] GB/s of each build and the B/A ratio of each
# round. For a change that should cost nothing (a refactoring, a release).
# ARGS: more kvxfer-bench arguments for every run, e.g. ARGS="--pattern
# random --batch 16" SIZES=4K.
# Usage: bench/ab.sh A/kvxfer-bench B/kvxfer-bench
set -euo pipefail
a=${1:?usage: bench/ab.sh A/kvxfer-bench B/kvxfer-bench}
b=${2:?usage: bench/ab.sh A/kvxfer-bench B/kvxfer-bench}
repeat=${REPEAT:-3}; duration=${DURATION:-2}; sizes=${SIZES:-4K,64K,1M}; backends=${BACKENDS:-tcp shm}
out=$(mktemp); trap 'rm -f "$out"' EXIT
for r in $(seq "$repeat"); do
    for side in A B; do
        bin=$([ $side = A ] && echo "$a" || echo "$b")
        for be in $backends; do
            echo "ab.sh: round $r of $repeat: $side, $be" >&2
            # shellcheck disable=SC2086 # ARGS: several words
            "$bin" --no-progress --json --duration "$duration" --backend "$be" --block-size "$sizes" ${ARGS:-} |
                sed -n "s/^{/{\"side\":\"$side\",\"round\":$r,\"be\":\"$be\",/p" >> "$out"
        done
    done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["be"], r["block_size"], r["side"])][r["round"]] = r["gb_per_s"]
print("| backend | block | A GB/s | B GB/s | B/A per round |\n|---|---|---|---|---|")
for (be, bs, side) in sorted(k for k in runs if k[2] == "A"):
    a, b = runs[(be, bs, "A")], runs.get((be, bs, "B"), {})
    fmt = lambda v: f"{st.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" if v else "-"
    ratios = " ".join(f"{b[k] / a[k]:.2f}" for k in sorted(a) if k in b)
    print(f"| {be} | {bs // 1024} KiB | {fmt(list(a.values()))} | {fmt(list(b.values()))} | {ratios} |")
PY
