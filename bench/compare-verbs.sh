#!/usr/bin/env bash
# Compare kvxfer's verbs backend with the best configuration of perftest's
# ib_write_bw on the same Soft-RoCE device, in one boot of the project's VM
# (tests/rdma-vm):
#   ib_write_bw, 4 KiB, 64 KiB and 1 MiB messages (8000, 2000, 200 of them:
#     its duration mode, -D, reports next to nothing at 1 MiB on rxe), in
#     every configuration of IB_CONFIGS (default: rdma_cm setup (-R) and
#     out-of-band setup (-x 1), each with 1 and 2 QPs, and out-of-band with
#     --tx-depth 512)
#   kvxfer-bench --backend verbs: 1 MiB and 64 KiB blocks (batch 1, seq),
#                                  4 KiB blocks (batch 16, random indexes)
# Every kind runs once per round, interleaved, REPEAT rounds (default 3);
# bench/rounds.py prints medians, min-max, and kvxfer's per-round ratio to
# the best ib_write_bw configuration at each size.
# GB/s is 10^9 bytes of payload per second on both sides. Inside the VM every
# byte is copied by an emulated CPU (TCG): only the ratios mean anything.
#
# Usage: bench/compare-verbs.sh [BUILD_DIR] [extra kvxfer-bench options]
#        (default BUILD_DIR: build; the VM sees it read-write, the tree read-only)
# Environment: DURATION seconds per measurement (default 3), REPEAT (default 3),
#              WARMUP (kvxfer, default 2), IB_CONFIGS ("|"-separated
#              ib_write_bw argument sets), KVX_VARIANTS ("|"-separated
#              kvxfer-bench option sets, each its own kind in the same
#              rounds, e.g. "|--option verbs.qps_per_peer=2": the defaults
#              and 2 QPs per peer in one boot; default: one, the defaults),
#              RAILS=2: two rails (rxe0 and rxe1, KVX_VM_DEV2/KVX_VM_ADDR2):
#              the reference is two ib_write_bw runs at once, one per
#              device, summed; kvxfer serves both (verbs.devices=all).
#              Default RAILS=1: everything on the first device alone.
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
    exec "$root/tests/rdma-vm/run-vm.sh" -t 2400 -w "$build" -- \
        "DURATION=${DURATION:-3} REPEAT=${REPEAT:-3} WARMUP=${WARMUP:-2} RAILS=${RAILS:-1} IB_CONFIGS='${IB_CONFIGS:-}' KVX_VARIANTS='${KVX_VARIANTS:-}' bash '$root/bench/compare-verbs.sh' --inside '$build'$extra"
fi

# ------------------------------------------------------------ inside the VM
shift
build=${1:?usage: $me --inside BUILD_DIR}
shift
dev=${KVX_VM_DEV:-rxe0}
addr=${KVX_VM_ADDR:?not inside the VM: run without --inside, or set KVX_VM_ADDR and KVX_VM_DEV}
rails=${RAILS:-1}
if ((rails == 2)); then
    dev2=${KVX_VM_DEV2:?RAILS=2 needs KVX_VM_DEV2 and KVX_VM_ADDR2}
    addr2=${KVX_VM_ADDR2:?RAILS=2 needs KVX_VM_ADDR2}
    kvx_rails=(--option verbs.devices=all)
else
    kvx_rails=(--option "verbs.devices=$dev")
fi
duration=${DURATION:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Is an rdma_cm listener on port $1 up yet?
cm_listening() { rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$1 "; }

# write_bw ROUND SIZE ITERS PORT ARGS...: one server/client pair on device
# $wdev (default $dev) at $waddr, one reference line ("kind" = the
# arguments) into $wout (default all.jsonl)
write_bw() {
    local round=$1 size=$2 iters=$3 port=$4 spid
    shift 4
    local cm=0 d=${wdev:-$dev} a=${waddr:-$addr} out=${wout:-$tmp/all.jsonl}
    [[ " $* " == *" -R "* ]] && cm=1
    local args=(-d "$d" -F -s "$size" -n "$iters" -p "$port" "$@")
    timeout 300 ib_write_bw "${args[@]}" >"$tmp/srv.$port" 2>&1 &
    spid=$!
    for _ in $(seq 200); do
        if ((cm)); then cm_listening "$port" && break; else [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && break; fi
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    # A client that finds no listener (rdma_cm REJECTED, reason 8: the
    # server was not ready although its port showed) tries once more.
    timeout 300 ib_write_bw "${args[@]}" "$a" >"$tmp/cli.$port" 2>&1 ||
        { sleep 1; kill -0 "$spid" 2>/dev/null && timeout 300 ib_write_bw "${args[@]}" "$a" >"$tmp/cli.$port" 2>&1; } ||
        { cat "$tmp/cli.$port" "$tmp/srv.$port" >&2; die "ib_write_bw client ($size B, $*) failed"; }
    wait "$spid" || die "ib_write_bw server ($size B, $*) failed"
    awk -v s="$size" -v r="$round" -v k="ib_write_bw $*" '$1 == s && NF >= 5 && $4 > 0 {
        printf "{\"round\": %d, \"family\": \"ib_write_bw\", \"kind\": \"%s\", \"block_size\": %d, \"gb_per_s\": %f}\n", r, k, s, $4 / 1000; exit }' \
        "$tmp/cli.$port" >>"$out"
}

# write_bw_rails ROUND SIZE ITERS PORT ARGS...: write_bw on both devices at
# once (ports PORT and PORT+1); one line, their sum, kind "2 rails: ...".
write_bw_rails() {
    local round=$1 size=$2 iters=$3 port=$4 p1 p2
    shift 4
    rm -f "$tmp/pair.0" "$tmp/pair.1"
    wdev=$dev waddr=$addr wout=$tmp/pair.0 write_bw "$round" "$size" "$iters" "$port" "$@" &
    p1=$!
    wdev=$dev2 waddr=$addr2 wout=$tmp/pair.1 write_bw "$round" "$size" "$iters" "$((port + 1))" "$@" &
    p2=$!
    wait "$p1" && wait "$p2" || die "ib_write_bw on two rails ($size B, $*) failed"
    python3 - "$tmp/pair.0" "$tmp/pair.1" >>"$tmp/all.jsonl" <<'PY'
import json, sys
a, b = (json.loads(open(f).read()) for f in sys.argv[1:3])
a["kind"] = "2 rails: " + a["kind"]
a["gb_per_s"] += b["gb_per_s"]
print(json.dumps(a))
PY
}

IFS='|' read -r -a configs <<<"${IB_CONFIGS:-"-R|-R -q 2|-x 1|-x 1 -q 2|-x 1 --tx-depth 512"}"
IFS='|' read -r -a variants <<<"${KVX_VARIANTS:-}"
[[ ${#variants[@]} -gt 0 ]] || variants=("")
repeat=${REPEAT:-3}
port=18611
for round in $(seq "$repeat"); do
    echo "$me: round $round of $repeat: ib_write_bw on $dev ($addr)${dev2:+ and $dev2 ($addr2) at once}," \
        "${#configs[@]} configurations; kvxfer-bench on $rails rail(s)" >&2
    for cfg in "${configs[@]}"; do
        for si in 4096:8000 65536:2000 1048576:200; do
            if ((rails == 2)); then
                # shellcheck disable=SC2086 # cfg is a list of arguments
                write_bw_rails "$round" "${si%:*}" "${si#*:}" "$port" $cfg
            else
                # shellcheck disable=SC2086 # cfg is a list of arguments
                write_bw "$round" "${si%:*}" "${si#*:}" "$port" $cfg
            fi
            port=$((port + 2))
        done
    done
    for v in "${variants[@]}"; do
        # shellcheck disable=SC2086 # v is a list of arguments
        kvx_bench_runs "$build/kvxfer-bench" verbs "$duration" "$tmp/kvx.json" "${kvx_rails[@]}" "$@" $v
        kvx_tag "kvxfer verbs${v:+ $v}" "$round" <"$tmp/kvx.json" >>"$tmp/all.jsonl"
    done
done
python3 "$root/bench/rounds.py" "$tmp/all.jsonl"
