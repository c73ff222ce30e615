#!/usr/bin/env bash
# Reading from a large region registered whole or in slices
# (verbs.mr_slice_bytes), on the verbs backend in the project's VM
# (tests/rdma-vm, Soft-RoCE): kvxfer-bench with a SIZE region on each side,
# random blocks (so that every transfer reads from anywhere in the region,
# above 4 GiB as often as below), 1 MiB and 64 KiB blocks, batch 1, once
# per slice length of SLICES in each round, and once with a 256 MiB region
# (kvxfer-bench's default size: what a small registration reads at),
# ROUNDS rounds interleaved; bench/rounds.py prints median and min-max per
# kind. The registration time: tests/perf/perf_create.
#
# Some NICs were published reading from one registration above 4 GiB more
# slowly than from slices (docs/performance.md); Soft-RoCE has no memory
# translation cache, so here this shows what slicing costs, not what it
# gains. On a host with a real NIC run the inside half directly:
#   KVX_VM_DEV=mlx5_0 bench/verbs-slices.sh --inside BUILD_DIR
#
# Usage: bench/verbs-slices.sh [BUILD_DIR]   (root; default build/)
# Environment: SIZE per side in GiB [6], SLICES ["0 4294967296 1073741824"]
#   (0: one registration), ROUNDS [3], DURATION seconds [3], WARMUP [1],
#   KVX_VM_MEM for the VM [16384: both regions and the guest]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/common.sh"
me=verbs-slices.sh
die() { echo "$me: $*" >&2; exit 1; }

if [[ ${1:-} != --inside ]]; then
    build=$(cd "${1:-$root/build}" && pwd)
    [[ -x $build/kvxfer-bench ]] || die "no kvxfer-bench in $build (make build)"
    KVX_VM_MEM=${KVX_VM_MEM:-16384} exec "$root/tests/rdma-vm/run-vm.sh" -t 2400 -w "$build" -- \
        "SIZE=${SIZE:-6} SLICES='${SLICES:-}' ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-3} WARMUP=${WARMUP:-1} bash '$root/bench/verbs-slices.sh' --inside '$build'"
fi

build=${2:?usage: $me --inside BUILD_DIR}
dev=${KVX_VM_DEV:-rxe0}
size_gib=${SIZE:-6}
read -r -a slices <<<"${SLICES:-0 4294967296 1073741824}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ulimit -l unlimited

for round in $(seq "${ROUNDS:-3}"); do
    for s in small "${slices[@]}"; do
        kind="kvxfer ${size_gib} GiB, one MR" bytes=$((size_gib << 30))
        [[ $s == small ]] && kind="kvxfer 256 MiB, one MR" bytes=$((256 << 20)) s=0
        ((s > 0)) && kind="kvxfer ${size_gib} GiB, slices of $((s >> 20)) MiB"
        echo "$me: round $round: $kind a side" >&2
        for bs in 1048576 65536; do
            "$build/kvxfer-bench" --backend verbs --json --no-progress --duration "${DURATION:-3}" \
                --warmup "${WARMUP:-1}" --block-size "$bs" --blocks $((bytes / bs)) --batch 1 \
                --pattern random --option "verbs.devices=$dev" --option "verbs.mr_slice_bytes=$s" >"$tmp/run.json" ||
                die "kvxfer-bench failed ($kind, $bs B): $(cat "$tmp/run.json")"
            kvx_tag "$kind" "$round" <"$tmp/run.json" >>"$tmp/all.jsonl"
        done
    done
done
python3 "$root/bench/rounds.py" "$tmp/all.jsonl"
