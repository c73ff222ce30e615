#!/usr/bin/env bash
# Cold start: how fast the first bytes after kvx_add_remote_peer move,
# against the steady rate that follows, beside what a plain TCP stream over
# loopback does cold on the same machine (kvxfer-cold-ref: a fresh region,
# every page touched from user space first, recv() into it), in one run:
#   kvxfer-bench --backend tcp --cold 512M, 64K and 1M blocks (256 MiB regions)
#   the same with --option region_prewarm=1 (both transports have the kernel
#                read their region at create; the create time is not counted)
#   kvxfer-cold-ref, the same block sizes, region and bytes
# REPEAT rounds (default 3), interleaved; printed: cold GB/s, steady GB/s and
# cold/steady for both, median (min-max).
#
# Usage: bench/compare-cold.sh [extra kvxfer-bench options]
# Environment: KVXFER_BENCH, KVXFER_COLD_REF (default: this checkout's build/),
#              REPEAT (default 3), DURATION (steady seconds, default 2).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/common.sh"
bench=${KVXFER_BENCH:-$root/build/kvxfer-bench}
ref=${KVXFER_COLD_REF:-$root/build/kvxfer-cold-ref}
repeat=${REPEAT:-3}
duration=${DURATION:-2}
me=compare-cold.sh
die() { echo "$me: $*" >&2; exit 1; }
[[ -x $bench ]] || die "kvxfer-bench not found at $bench (build it, or set KVXFER_BENCH)"
[[ -x $ref ]] || die "kvxfer-cold-ref not found at $ref (build it, or set KVXFER_COLD_REF)"
[[ $repeat =~ ^[0-9]+$ && $repeat -ge 1 ]] || die "REPEAT must be a whole number >= 1"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

for round in $(seq "$repeat"); do
    echo "$me: round $round of $repeat" >&2
    for prewarm in 0 1; do
        "$bench" --backend tcp --json --no-progress --block-size 64K,1M --cold 512M --warmup 0 \
            --duration "$duration" --option region_prewarm=$prewarm "$@" >"$tmp/kvx.json" ||
            die "kvxfer-bench region_prewarm=$prewarm failed: $(cat "$tmp/kvx.json")"
        kvx_tag "$( ((prewarm)) && echo "kvxfer prewarm" || echo "kvxfer tcp")" "$round" <"$tmp/kvx.json" >>"$tmp/all.jsonl"
    done
    for bs in 64K 1M; do
        "$ref" "$bs" 256M 512M | kvx_tag "plain tcp" "$round" >>"$tmp/all.jsonl"
    done
done

/usr/bin/python3 "$root/bench/rounds.py" --cold "$tmp/all.jsonl"
