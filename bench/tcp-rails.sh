#!/bin/bash
# Two tcp rails against one, and against iperf3 (issue 29's tcp bars):
# two network namespaces joined by two veth pairs, each through a token
# bucket of RATE (tbf, on the initiator's side; rail 2's RATE2 when given:
# rails of different speeds). In each of REPEAT rounds, in
# this order: iperf3 one stream on rail 1; two iperf3 at once, one per rail,
# summed; kvxfer-bench tcp with tcp.interfaces=<rail 1> (one rail); with
# tcp.interfaces=all (two rails). Prints GB/s median (min-max) and the
# medians of the per-round ratios. Needs root, iproute2, tc, iperf3.
#   bench/tcp-rails.sh BUILD_DIR      (RATE=400mbit RATE2=RATE REPEAT=3 BLOCK=1M DURATION=3)
set -euo pipefail
build=${1:?usage: bench/tcp-rails.sh BUILD_DIR}
bench=$(readlink -f "$build/kvxfer-bench")
RATE=${RATE:-400mbit}
RATE2=${RATE2:-$RATE} REPEAT=${REPEAT:-3} BLOCK=${BLOCK:-1M} DURATION=${DURATION:-3}
[ "$(id -u)" = 0 ] || { echo "tcp-rails.sh: needs root (network namespaces)" >&2; exit 1; }
a=kvxrla$$ b=kvxrlb$$
cleanup() { ip netns del $a 2>/dev/null || true; ip netns del $b 2>/dev/null || true; }
trap cleanup EXIT
ip netns add $a; ip netns add $b
for i in 1 2; do
    ip link add rla$i netns $a type veth peer name rlb$i netns $b
    ip -n $a addr add 10.23$i.0.1/24 dev rla$i; ip -n $b addr add 10.23$i.0.2/24 dev rlb$i
    ip -n $a link set rla$i up; ip -n $b link set rlb$i up
    rate=$RATE; [ $i = 2 ] && rate=$RATE2
    ip netns exec $a tc qdisc add dev rla$i root tbf rate "$rate" burst 512kb latency 50ms
done
ip -n $a link set lo up; ip -n $b link set lo up
gbps_iperf() { python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)'; }
iperf_one() {
    ip netns exec $b iperf3 -s -1 -B 10.231.0.2 -p 5201 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec $a iperf3 -J -c 10.231.0.2 -p 5201 -t "$DURATION" | gbps_iperf
    wait
}
iperf_two() {
    ip netns exec $b iperf3 -s -1 -B 10.231.0.2 -p 5201 >/dev/null 2>&1 &
    ip netns exec $b iperf3 -s -1 -B 10.232.0.2 -p 5202 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec $a iperf3 -J -c 10.231.0.2 -p 5201 -t "$DURATION" > /tmp/rails1.$$ &
    ip netns exec $a iperf3 -J -c 10.232.0.2 -p 5202 -t "$DURATION" > /tmp/rails2.$$
    wait
    python3 -c "print($(gbps_iperf < /tmp/rails1.$$) + $(gbps_iperf < /tmp/rails2.$$))"
    rm -f /tmp/rails1.$$ /tmp/rails2.$$
}
kvx() {  # $1: tcp.interfaces
    ip netns exec $b "$bench" --serve 7300 --once --backend tcp --option tcp.listen=0.0.0.0:0 >/dev/null 2>&1 &
    sleep 0.5
    ip netns exec $a "$bench" --connect 10.231.0.2:7300 --backend tcp --block-size "$BLOCK" \
        --duration "$DURATION" --option "tcp.interfaces=$1" --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gb_per_s"])'
    wait
}
out=$(mktemp)
for r in $(seq "$REPEAT"); do
    echo "round $r" >&2
    printf '%s %s %s %s\n' "$(iperf_one)" "$(iperf_two)" "$(kvx rla1)" "$(kvx all)" >> "$out"
done
rates=$RATE; [ "$RATE2" != "$RATE" ] && rates="$RATE and $RATE2"
python3 - "$out" "$rates" "$BLOCK" <<'PY'
import sys, statistics as st
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
def fmt(v): return "%.3f (%.3f-%.3f)" % (st.median(v), min(v), max(v))
col = list(zip(*rows))
print("tcp rails, %s per rail (tbf), block %s, %d rounds; GB/s median (min-max)" % (sys.argv[2], sys.argv[3], len(rows)))
print("| iperf3, rail 1 | 2 x iperf3, one per rail | kvxfer, 1 rail | kvxfer, 2 rails | 2 rails / 1 rail | 2 rails / 2 x iperf3 | 1 rail / iperf3 |")
print("|---|---|---|---|---|---|---|")
r21 = [r[3] / r[2] for r in rows]; r2i = [r[3] / r[1] for r in rows]; r1i = [r[2] / r[0] for r in rows]
print("| %s | %s | %s | %s | %s | %s | %s |" % (fmt(col[0]), fmt(col[1]), fmt(col[2]), fmt(col[3]),
      "%.2f (%.2f-%.2f)" % (st.median(r21), min(r21), max(r21)), "%.2f (%.2f-%.2f)" % (st.median(r2i), min(r2i), max(r2i)),
      "%.2f (%.2f-%.2f)" % (st.median(r1i), min(r1i), max(r1i))))
PY
rm -f "$out"
