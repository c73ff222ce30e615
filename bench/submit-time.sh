#!/usr/bin/env bash
# Time inside kvx_write_blocks of two kvxfer builds, interleaved: for each
# of REPEAT rounds (default 3), each build runs kvxfer-bench on each
# configuration of CONFIGS (default "shm shm-mapped tcp": shm into private
# memory, the bench's default; shm into a shared region, the mapped path;
# tcp) with each shape of SHAPES (default "64:65536 64K:1000 1M:16", block
# size:blocks per call, random indexes) for DURATION seconds (default 3).
# Prints per configuration and shape the median [min-max] over the rounds
# of each build's submit p50, p99 and max, its CPU-time p50 and p99 (the
# call's own work: wall time above it waited for a core) and the cost of
# checking the index lists alone (kvxfer-bench --json: submit_*), and its
# GB/s. ARGS: more kvxfer-bench arguments for every run; KEEP=FILE keeps
# the JSON lines.
# Usage: bench/submit-time.sh A/kvxfer-bench B/kvxfer-bench
set -euo pipefail
a=${1:?usage: bench/submit-time.sh A/kvxfer-bench B/kvxfer-bench}
b=${2:?usage: bench/submit-time.sh A/kvxfer-bench B/kvxfer-bench}
repeat=${REPEAT:-3}; duration=${DURATION:-3}
configs=${CONFIGS:-shm shm-mapped tcp}; shapes=${SHAPES:-64:65536 64K:1000 1M:16}
out=${KEEP:-$(mktemp)}; [ -n "${KEEP:-}" ] && : > "$out" || trap 'rm -f "$out"' EXIT
for r in $(seq "$repeat"); do
    for side in A B; do
        bin=$([ $side = A ] && echo "$a" || echo "$b")
        for cfg in $configs; do
            be=${cfg%-mapped}; region=$([ "$cfg" = "$be" ] && echo private || echo shared)
            for shape in $shapes; do
                echo "submit-time.sh: round $r of $repeat: $side, $cfg, $shape" >&2
                # shellcheck disable=SC2086 # ARGS: several words
                "$bin" --no-progress --json --duration "$duration" --backend "$be" --target-region "$region" \
                    --block-size "${shape%%:*}" --batch "${shape##*:}" --pattern random ${ARGS:-} |
                    sed -n "s/^{/{\"side\":\"$side\",\"round\":$r,\"cfg\":\"$cfg\",/p" >> "$out"
            done
        done
    done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["cfg"], r["block_size"], r["batch"], r["side"])].append(r)
keys = ["submit_p50_us", "submit_p99_us", "submit_max_us", "submit_cpu_p50_us", "submit_cpu_p99_us",
        "submit_validate_us", "gb_per_s"]
fmt = lambda v: f"{st.median(v):.4g} [{min(v):.4g}-{max(v):.4g}]"
print("| config | shape | build | submit p50 us | submit p99 us | submit max us | CPU p50 us | CPU p99 us "
      "| lists alone us | GB/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (cfg, bs, n, side) in sorted(runs, key=lambda k: (k[0], -k[2], k[3])):
    rs = runs[(cfg, bs, n, side)]
    size = f"{bs >> 20} MiB" if bs >= 1 << 20 else f"{bs >> 10} KiB" if bs >= 1024 else f"{bs} B"
    print(f"| {cfg} | {n} x {size} | {side} | " + " | ".join(fmt([x[k] for x in rs]) for k in keys) + " |")
PY
