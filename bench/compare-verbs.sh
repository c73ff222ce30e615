#!/usr/bin/env bash
# Compare kvxfer's verbs backend with perftest's ib_write_bw on the same
# Soft-RoCE device, in one boot of the project's VM (tests/rdma-vm):
#   ib_write_bw over rdma_cm (-R), 4 KiB, 64 KiB and 1 MiB messages
#   kvxfer-bench --backend verbs: 1 MiB and 64 KiB blocks (batch 1, seq),
#                                  4 KiB blocks (batch 16, random indexes)
# and print: block size, kvxfer GB/s, ib_write_bw GB/s, ratio kvxfer/ib_write_bw.
# GB/s is 10^9 bytes of payload per second on both sides. Inside the VM every
# byte is copied by an emulated CPU (TCG): only the ratios mean anything.
#
# Usage: bench/compare-verbs.sh [BUILD_DIR] [extra kvxfer-bench options]
#        (default BUILD_DIR: build; the VM sees it read-write, the tree read-only)
# Environment: DURATION seconds per kvxfer measurement (default 3).
# On a host with a real RDMA NIC, run the inside half directly:
#        KVX_VM_ADDR=<the NIC's IP> KVX_VM_DEV=mlx5_0 bench/compare-verbs.sh --inside BUILD_DIR
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/common.sh"
me=compare-verbs.sh
die() { echo "$me: $*" >&2; exit 1; }

if [[ ${1:-} != --inside ]]; then
    build=${1:-$root/build}
    [[ $# -gt 0 ]] && shift
    [[ -x $build/kvxfer-bench ]] || die "no kvxfer-bench in $build (make build)"
    build=$(cd "$build" && pwd)
    extra=""
    [[ $# -gt 0 ]] && extra=$(printf ' %q' "$@")
    exec "$root/tests/rdma-vm/run-vm.sh" -t 900 -w "$build" -- \
        "DURATION=${DURATION:-3} bash '$root/bench/compare-verbs.sh' --inside '$build'$extra"
fi

# ------------------------------------------------------------ inside the VM
shift
build=${1:?usage: $me --inside BUILD_DIR}
shift
dev=${KVX_VM_DEV:-rxe0}
addr=${KVX_VM_ADDR:?not inside the VM: run without --inside, or set KVX_VM_ADDR and KVX_VM_DEV}
duration=${DURATION:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Is an rdma_cm listener on port $1 up yet?
cm_listening() { rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$1 "; }

# ib_write_bw SIZE ITERS PORT -> prints "SIZE AVG_MB_PER_S"
write_bw() {
    local size=$1 iters=$2 port=$3 spid
    local args=(-d "$dev" -F -R -s "$size" -n "$iters" -p "$port")
    timeout 300 ib_write_bw "${args[@]}" >"$tmp/srv.$port" 2>&1 &
    spid=$!
    for _ in $(seq 200); do
        cm_listening "$port" && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    cm_listening "$port" || { cat "$tmp/srv.$port" >&2; die "ib_write_bw server did not listen"; }
    timeout 300 ib_write_bw "${args[@]}" "$addr" >"$tmp/cli.$port" 2>&1 ||
        { cat "$tmp/cli.$port" "$tmp/srv.$port" >&2; die "ib_write_bw client ($size B) failed"; }
    wait "$spid" || die "ib_write_bw server ($size B) failed"
    awk -v s="$size" '$1 == s && NF >= 5 { print s, $4; exit }' "$tmp/cli.$port"
}

echo "$me: ib_write_bw on $dev ($addr) ..." >&2
{
    write_bw 4096 4000 18611
    write_bw 65536 1000 18612
    write_bw 1048576 200 18613
} >"$tmp/ibwbw.txt"

echo "$me: kvxfer-bench --backend verbs ..." >&2
kvx_bench_runs "$build/kvxfer-bench" verbs "$duration" "$tmp/kvx.json" "$@"

ref=$(awk '{ printf "%s%s=%s", (NR > 1 ? "," : ""), $1, $2 / 1000 }' "$tmp/ibwbw.txt")  # MB/s -> GB/s
python3 "$root/bench/ratios.py" ib_write_bw "$ref" "$tmp/kvx.json"
