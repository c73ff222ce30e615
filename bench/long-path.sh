#!/usr/bin/env bash
# kvxfer tcp.streams=N against iperf3 -P N on a long path: two network
# namespaces joined by a veth pair, each end delaying what it sends by
# DELAY (netem; 25 ms: a 50 ms round trip), the data direction also limited
# to RATE (netem rate). This host's kernel may have no netem, so by default
# the script runs itself inside the project's QEMU VM (tests/rdma-vm,
# Debian's kernel): it takes veth, sch_netem and sch_tbf from the kernel
# package that run-vm.sh caches and insmods them in the VM.
#
# Per round, for each N of STREAMS: iperf3 -P N, then kvxfer-bench
# (two processes, --serve in the receiving namespace, --connect in the
# sending one) with tcp.streams=N for each tcp.protection of PROTECTION
# (and the BEFORE build's kvxfer-bench with the same options). ROUNDS
# rounds; the table gives the median and min-max over the rounds of each
# GB/s (10^9 bytes of payload per second) and of the per-round ratio to
# iperf3 -P N, and kvxfer's best N against iperf3's best N.
#
# Usage: bench/long-path.sh [BUILD_DIR]          (root; default: build/)
#        bench/long-path.sh --in-vm BUILD_DIR    (what runs in the VM, or on a
#                                                 host whose kernel has netem)
# Environment (defaults in brackets):
#   ROUNDS [3]  DURATION seconds per measurement [8]  WARMUP seconds [2]
#   STREAMS ["1 2 4 8"]  PROTECTION ["none aead"]  BLOCK [1M] (batch 1, seq)
#   DELAY one way [25ms]  RATE of the data direction [300mbit] ("" or none:
#   no limit; the TCG VM's two vCPUs move about 1.5 Gbit/s of iperf3 over
#   veth, so 300 Mbit/s is a link that they can fill, with room for the
#   AEAD)  LIMIT netem queue in packets [4000]
#   BEFORE: a directory holding another build's kvxfer-bench (and its
#   libkvxfer.so*), measured in the same rounds as kind "before"
#   INFLIGHT: kvxfer-bench --inflight (transfers outstanding; its default
#   is 8 MiB worth, below a fast long path's bandwidth-delay product)
#   SS=1: `ss -tin` of the sender's sockets in the middle of each kvxfer
#   run, into OUT/ss.log; KVX_LOG: passed to both kvxfer-bench processes
#   OUT: where logs and results go [BUILD_DIR/long-path]
#   VM_TIMEOUT seconds for the whole VM run [2400]
set -euo pipefail

me=long-path.sh
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "$me: $*" >&2; exit 1; }

in_vm=
if [[ ${1:-} == --in-vm ]]; then in_vm=1; shift; fi
build=$(cd "${1:-$root/build}" && pwd) || die "no build directory ${1:-$root/build}"
bench=$build/kvxfer-bench
[[ -x $bench ]] || die "kvxfer-bench not found in $build"
out=${OUT:-$build/long-path}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# ---------------------------------------------------------------- host side
if [[ -z $in_vm ]]; then
    [[ $(id -u) -eq 0 ]] || die "run as root (network namespaces, the VM's setup)"
    vm=$root/tests/rdma-vm/run-vm.sh
    cache=${KVX_VM_CACHE:-$HOME/.cache/kvxfer-rxe-vm}
    [[ -s $cache/kernel-package ]] || "$vm" --setup
    kpkg=$(cat "$cache/kernel-package")
    deb=$(ls "$cache/$kpkg/$kpkg"_*.deb | head -n1)
    [[ -f $deb ]] || die "no kernel package in $cache/$kpkg (run $vm --setup)"
    rm -rf "$out/mods" && mkdir -p "$out/mods"
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$out/mods" --wildcards \
        './lib/modules/*/kernel/drivers/net/veth.ko*' './lib/modules/*/kernel/net/sched/sch_netem.ko*' \
        './lib/modules/*/kernel/net/sched/sch_tbf.ko*' || die "cannot unpack the modules from $deb"
    shares=(-w "$out")
    exec "$vm" -t "${VM_TIMEOUT:-2400}" "${shares[@]}" -- \
        "$(printf 'ROUNDS=%q DURATION=%q WARMUP=%q STREAMS=%q PROTECTION=%q BLOCK=%q DELAY=%q RATE=%q LIMIT=%q BEFORE=%q SS=%q INFLIGHT=%q OUT=%q bash %q --in-vm %q' \
            "${ROUNDS:-3}" "${DURATION:-8}" "${WARMUP:-2}" "${STREAMS:-1 2 4 8}" "${PROTECTION:-none aead}" \
            "${BLOCK:-1M}" "${DELAY:-25ms}" "${RATE-300mbit}" "${LIMIT:-4000}" "${BEFORE:-}" "${SS:-}" "${INFLIGHT:-}" "$out" \
            "$root/bench/long-path.sh" "$build")"
fi

# ---------------------------------------------------------------- in the VM
rounds=${ROUNDS:-3} duration=${DURATION:-8} warmup=${WARMUP:-2}
streams=${STREAMS:-1 2 4 8} prots=${PROTECTION:-none aead} block=${BLOCK:-1M}
delay=${DELAY:-25ms} rate=${RATE-300mbit} limit=${LIMIT:-4000} before=${BEFORE:-} inflight=${INFLIGHT:-}
[[ $rate == none ]] && rate=
A=kvxlpA B=kvxlpB            # A sends (initiator, iperf3 -c), B receives (target, iperf3 -s)
ipA=10.77.0.1 ipB=10.77.0.2
nsA() { ip netns exec $A "$@"; }
nsB() { ip netns exec $B "$@"; }

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    ip netns del $A 2>/dev/null || true
    ip netns del $B 2>/dev/null || true
}
trap cleanup EXIT

if [[ -d $out/mods ]]; then
    for m in veth sch_netem sch_tbf; do
        ko=$(find "$out/mods" -name "$m.ko*" | head -n1)
        [[ -n $ko ]] || continue
        grep -q "^$m " /proc/modules || insmod "$ko" || die "insmod $ko failed"
    done
fi
ip netns del $A 2>/dev/null || true
ip netns del $B 2>/dev/null || true
ip netns add $A && ip netns add $B
ip link add lpA netns $A type veth peer name lpB netns $B || die "cannot create the veth pair"
nsA ip addr add $ipA/24 dev lpA && nsB ip addr add $ipB/24 dev lpB
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set lpA up && ip -n $B link set lpB up
nsA tc qdisc add dev lpA root netem delay "$delay" limit "$limit" ${rate:+rate $rate} || die "netem on lpA failed"
nsB tc qdisc add dev lpB root netem delay "$delay" limit "$limit" || die "netem on lpB failed"
{
    echo "# $(uname -r), $(nproc) CPUs; $A -> $B: $(nsA tc qdisc show dev lpA)"
    echo "# $B -> $A: $(nsB tc qdisc show dev lpB)"
    echo "# $A tcp_wmem $(nsA sysctl -n net.ipv4.tcp_wmem), $B tcp_rmem $(nsB sysctl -n net.ipv4.tcp_rmem), cc $(nsA sysctl -n net.ipv4.tcp_congestion_control)"
} | tee "$out/setup.txt" >&2

res=$out/results.jsonl
: > "$res"
: > "$out/ss.log"
py=/usr/bin/python3

listening() {  # NS PORT: something listens on PORT in NS
    ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q LISTEN
}
wait_listen() {
    for _ in $(seq 200); do listening "$1" "$2" && return 0; sleep 0.1; done
    die "nothing listens on port $2 in $1"
}

nsB iperf3 -s -B $ipB -p 5201 > "$out/iperf-server.log" 2>&1 &
pids+=($!)
wait_listen $B 5201

record() {  # KIND STREAMS ROUND < json: one result line
    "$py" -c '
import json, sys
kind, n, rnd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
probes = int(sys.argv[4]) if len(sys.argv) > 4 else None  # at KVX_LOG=debug: probes by the target
text = sys.stdin.read()
if kind == "iperf3":
    d = json.loads(text)
    if "error" in d: sys.exit("iperf3: " + d["error"])
    s = d["end"].get("sum_received") or d["end"]["sum_sent"]
    print(json.dumps({"kind": kind, "streams": n, "round": rnd, "gb_per_s": s["bits_per_second"] / 8e9,
                      "retrans": d["end"].get("sum_sent", {}).get("retransmits")}))
else:
    for l in text.splitlines():
        if l.lstrip().startswith("{"):
            d = json.loads(l)
            print(json.dumps({"kind": kind, "streams": n, "round": rnd, "gb_per_s": d["gb_per_s"],
                              "p50_us": d["p50_us"], "verified": d["verified"], "probes": probes}))' "$@" >> "$res"
}

iperf() {  # N ROUND
    nsA iperf3 -c $ipB -p 5201 -P "$1" -t $((duration + warmup)) -O "$warmup" -J > "$out/iperf.json" ||
        die "iperf3 -P $1 failed: $(head -c 1000 "$out/iperf.json")"
    record iperf3 "$1" "$2" < "$out/iperf.json"
}

port=7400
kvx() {  # KIND BENCH N PROT ROUND
    local kind=$1 exe=$2 n=$3 prot=$4 rnd=$5 lib
    lib=$(dirname "$exe")
    port=$((port + 1))
    local o=(--option "tcp.protection=$prot")
    LD_LIBRARY_PATH=$lib nsB "$exe" --serve $ipB:$port --once --backend tcp "${o[@]}" \
        --option tcp.listen=$ipB:0 > "$out/target-$kind-$prot-$n-$rnd.log" 2>&1 &
    local tpid=$!
    pids+=($tpid)
    wait_listen $B $port
    if [[ -n ${SS:-} ]]; then
        ( sleep $((warmup + duration / 2 + 2)); { echo "== $kind $prot streams=$n round $rnd"; nsA ss -tinO dst $ipB; } >> "$out/ss.log" 2>&1 ) &
    fi
    LD_LIBRARY_PATH=$lib nsA "$exe" --connect $ipB:$port --backend tcp "${o[@]}" --option "tcp.streams=$n" \
        --option tcp.listen=$ipA:0 --block-size "$block" --batch 1 --blocks 64 --pattern seq ${inflight:+--inflight "$inflight"} \
        --duration "$duration" --warmup "$warmup" --json --no-progress > "$out/kvx.json" 2> "$out/initiator.err" ||
        echo "$me: kvxfer-bench $kind $prot streams=$n failed: $(tail -n 3 "$out/initiator.err")" >&2
    wait "$tpid" 2>/dev/null || true
    record "$kind $prot" "$n" "$rnd" "$(grep -c 'probing the connection' "$out/target-$kind-$prot-$n-$rnd.log" || true)" \
        < "$out/kvx.json"
}

for r in $(seq "$rounds"); do
    for n in $streams; do
        echo "$me: round $r/$rounds, $n stream(s)" >&2
        iperf "$n" "$r"
        for p in $prots; do
            kvx kvxfer "$bench" "$n" "$p" "$r"
            [[ -z $before ]] || kvx before "$before/kvxfer-bench" "$n" "$p" "$r"
        done
    done
done

"$py" - "$res" <<'EOF' | tee "$out/table.txt"
import json, sys, statistics as st
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
val = defaultdict(dict)                     # (kind, n) -> round -> GB/s
for r in rows: val[(r["kind"], r["streams"])][r["round"]] = r["gb_per_s"]
kinds = sorted({k for k, _ in val}, key=lambda k: (k != "iperf3", k))
ns = sorted({n for _, n in val})
def fmt(xs): return "%.4f (%.4f-%.4f)" % (st.median(xs), min(xs), max(xs)) if xs else "-"
def rfmt(xs): return "%.2f (%.2f-%.2f)" % (st.median(xs), min(xs), max(xs)) if xs else "-"
print("GB/s, median (min-max) over rounds; ratio = per-round kvxfer / iperf3 -P N")
print("| streams | " + " | ".join(kinds) + " | " + " | ".join("%s / iperf3" % k for k in kinds if k != "iperf3") + " |")
print("|---" * (1 + 2 * len(kinds) - 1) + "|")
for n in ns:
    cells = [fmt(list(val[(k, n)].values())) for k in kinds]
    ip = val[("iperf3", n)]
    rat = [rfmt([v / ip[r] for r, v in val[(k, n)].items() if r in ip and ip[r] > 0]) for k in kinds if k != "iperf3"]
    print("| %d | " % n + " | ".join(cells + rat) + " |")
best_ip = [max(val[("iperf3", n)].get(r, 0) for n in ns) for r in sorted(val[("iperf3", ns[0])])]
for k in kinds:
    if k == "iperf3": continue
    med = {n: st.median(val[(k, n)].values()) for n in ns if val[(k, n)]}
    bn = max(med, key=med.get)
    ipmed = max(st.median(val[("iperf3", n)].values()) for n in ns)
    print("%s: best streams=%d %.4f GB/s = %.2f x best iperf3 (%.4f); streams=1 %.4f; slowest N>1 / N=1: %.2f"
          % (k, bn, med[bn], med[bn] / ipmed, ipmed, med.get(1, float("nan")),
             min(med[n] for n in med if n > 1) / med[1] if 1 in med and len(med) > 1 else float("nan")))
EOF
