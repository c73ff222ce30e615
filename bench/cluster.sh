#!/usr/bin/env bash
# A cluster on one machine: HOSTS processes, each with one kvxfer tcp
# transport in its own network namespace, all namespaces on one Linux bridge,
# every host writing batches of 4-16 blocks of 64 KiB to random peers (8
# transfers in flight per host; every block verified by its target). Runs the
# kvx_cluster program of tests/cluster (scenario nofault) REPEAT times and
# prints, per round and as median (min-max) over the rounds:
#   aggregate GB/s       block bytes done by all hosts per second of the run
#   min/median           the slowest host's MB/s over the median host's: how
#                        evenly the hosts move bytes (1 = all alike)
#   p99 ms               submit -> done seen by kvx_poll, over all hosts
#   failed               transfers failed (0 expected without a fault)
# plus each round's per-host MB/s range. The numbers are the sum over hosts
# sharing the machine's cores: a measure of the library under contention
# (event loops, AEAD, verification) rather than of a network.
#
# Usage: bench/cluster.sh [BUILD_DIR]   (default: build of this checkout; it
#        builds nothing: cmake --build BUILD_DIR --target kvx_cluster first)
# Environment: HOSTS (default 12), SECONDS_PER_RUN (default 20), REPEAT
#              (default 3), KVX_LOG (the hosts' log level, default warn).
# Needs root, iproute2 and nftables (namespaces; nothing outside them is
# touched). Exit status: 0, or 1 when a round's checks failed (its FAIL lines
# are printed; the numbers are printed all the same).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
hosts=${HOSTS:-12}
seconds=${SECONDS_PER_RUN:-20}
repeat=${REPEAT:-3}
me=cluster.sh

die() { echo "$me: $*" >&2; exit 1; }

prog=$build/tests/cluster/kvx_cluster
[[ -x $prog ]] || die "kvx_cluster not found at $prog (cmake --build $build --target kvx_cluster)"
[[ $hosts =~ ^[0-9]+$ && $hosts -ge 3 ]] || die "HOSTS must be a whole number >= 3"
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 1 ]] || die "SECONDS_PER_RUN must be a whole number of seconds >= 1"
[[ $repeat =~ ^[0-9]+$ && $repeat -ge 1 ]] || die "REPEAT must be a whole number >= 1"
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || die "need python3 to read the results"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

failed_rounds=0
for round in $(seq "$repeat"); do
    echo "$me: round $round of $repeat: $hosts hosts, $seconds s, nofault" >&2
    rc=0
    "$prog" --hosts "$hosts" --seconds "$seconds" --scenario nofault >"$tmp/out" 2>&1 || rc=$?
    [[ $rc -ne 77 ]] || die "kvx_cluster skipped itself (needs root, iproute2 and nftables): $(tail -1 "$tmp/out")"
    line=$(grep -m1 '^CLUSTER_RESULT ' "$tmp/out") ||
        die "round $round: no result line (exit $rc); output: $(tail -20 "$tmp/out")"
    echo "${line#CLUSTER_RESULT }" >>"$tmp/all.jsonl"
    if [[ $rc -ne 0 ]]; then
        failed_rounds=$((failed_rounds + 1))
        grep 'FAIL:' "$tmp/out" | sed "s/^ */$me: round $round: /" >&2 || true
    fi
done

"$py" - "$tmp/all.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for i, r in enumerate(rows, 1):
    print("round %d: %.3f GB/s aggregate, host MB/s %.1f-%.1f (median %.1f), min/median %.2f, "
          "p50 %.1f ms, p99 %.1f ms, %d failed, %d checks failed"
          % (i, r["gb_per_s"], r["host_mb_per_s_min"], r["host_mb_per_s_max"], r["host_mb_per_s_median"],
             r["min_median_ratio"], r["p50_ms"], r["p99_ms"], r["failed"], r["checks_failed"]))
def summary(name, key, fmt):
    v = [r[key] for r in rows]
    print(("%-18s " + fmt + " (" + fmt + "-" + fmt + ")") % (name, statistics.median(v), min(v), max(v)))
print("%d hosts, %d round(s), median (min-max):" % (rows[0]["hosts"], len(rows)))
summary("aggregate GB/s", "gb_per_s", "%.3f")
summary("min/median", "min_median_ratio", "%.2f")
summary("p99 ms", "p99_ms", "%.1f")
summary("failed", "failed", "%d")
EOF
[[ $failed_rounds -eq 0 ]] || die "$failed_rounds of $repeat round(s) failed their checks (FAIL lines above)"
