#!/usr/bin/env bash
# Compare kvxfer's tcp backend with iperf3 on loopback, in one run:
#   iperf3, one TCP stream, DURATION seconds        (the "what TCP can do" line)
#   kvxfer-bench --backend tcp: 1M and 64K blocks (batch 1, seq)
#                               4K blocks (batch 16, random)
# and print: block size, kvxfer GB/s, iperf3 GB/s, ratio kvxfer/iperf3.
# GB/s is 10^9 bytes of payload per second on both sides.
#
# Usage: bench/compare-tcp.sh [extra kvxfer-bench options, e.g. --option tcp.streams=2]
# Environment: KVXFER_BENCH (default: build/kvxfer-bench of this checkout),
#              DURATION seconds per measurement (default 3).
# Only loopback (127.0.0.1) is used. iperf3 is installed with apt-get if missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=${KVXFER_BENCH:-$root/build/kvxfer-bench}
duration=${DURATION:-3}
me=compare-tcp.sh

die() { echo "$me: $*" >&2; exit 1; }

[[ -x $bench ]] || die "kvxfer-bench not found at $bench (build it, or set KVXFER_BENCH)"
[[ $duration =~ ^[0-9]+$ && $duration -ge 1 ]] || die "DURATION must be a whole number of seconds >= 1"

if ! command -v iperf3 >/dev/null 2>&1; then
    [[ $(id -u) -eq 0 ]] || die "iperf3 is missing: apt-get install -y iperf3"
    echo "$me: installing iperf3" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y iperf3 >/dev/null 2>&1 ||
        { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; } ||
        die "apt-get install iperf3 failed"
fi

py=
if [[ -x /usr/bin/python3 ]]; then py=/usr/bin/python3
elif command -v python3 >/dev/null 2>&1; then py=$(command -v python3)
fi
[[ -n $py ]] || command -v jq >/dev/null 2>&1 || die "need python3 or jq to read JSON"

tmp=$(mktemp -d)
iperf_pid=
cleanup() {
    if [[ -n $iperf_pid ]] && kill -0 "$iperf_pid" 2>/dev/null; then
        kill "$iperf_pid" 2>/dev/null || true
        wait "$iperf_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free loopback port: bind port 0 and read what the kernel chose.
free_port() {
    if [[ -n $py ]]; then
        "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    else
        echo $((20000 + RANDOM % 20000)) # no python: pick one; iperf3 fails loudly if taken
    fi
}

# True once something listens on 127.0.0.1:$1. Reads /proc instead of probing:
# a probe connection would use up the one-off (-1) iperf3 server.
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    grep -qE "^ *[0-9]+: 0100007F:$hex 00000000:0000 0A" /proc/net/tcp
}

port=$(free_port)
iperf3 -s -1 -B 127.0.0.1 -p "$port" >"$tmp/iperf-server.log" 2>&1 &
iperf_pid=$!
for _ in $(seq 100); do
    listening "$port" && break
    kill -0 "$iperf_pid" 2>/dev/null || die "iperf3 server failed: $(cat "$tmp/iperf-server.log")"
    sleep 0.05
done
listening "$port" || die "iperf3 server did not listen on 127.0.0.1:$port"

echo "$me: iperf3, 1 stream, ${duration} s ..." >&2
iperf3 -c 127.0.0.1 -p "$port" -t "$duration" -J >"$tmp/iperf.json" ||
    die "iperf3 client failed: $(head -c 2000 "$tmp/iperf.json")"
wait "$iperf_pid" 2>/dev/null || true
iperf_pid=

echo "$me: kvxfer-bench --backend tcp ..." >&2
common=(--backend tcp --json --no-progress --duration "$duration")
"$bench" "${common[@]}" --block-size 1M,64K --batch 1 --pattern seq "$@" >"$tmp/kvxfer.json" ||
    die "kvxfer-bench failed (1M, 64K); output: $(cat "$tmp/kvxfer.json")"
"$bench" "${common[@]}" --block-size 4K --batch 16 --pattern random "$@" >>"$tmp/kvxfer.json" ||
    die "kvxfer-bench failed (4K); output: $(cat "$tmp/kvxfer.json")"

if [[ -n $py ]]; then
    "$py" - "$tmp/iperf.json" "$tmp/kvxfer.json" <<'EOF'
import json, sys

with open(sys.argv[1]) as f:
    ip = json.load(f)
if "error" in ip:
    sys.exit("compare-tcp.sh: iperf3: " + str(ip["error"]))
end = ip["end"]
summary = end.get("sum_received") or end["sum_sent"]
iperf_gbps = summary["bits_per_second"] / 8 / 1e9

rows = []
with open(sys.argv[2]) as f:
    for line in f:
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))

def size(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n

print("%-9s %-14s %8s %12s %12s %8s %10s %9s" % ("block", "batch/pattern", "inflight", "kvxfer GB/s",
      "iperf3 GB/s", "ratio", "p50 us", "verified"))
for r in rows:
    print("%-9s %-14s %8d %12.3f %12.3f %8.2f %10.1f %9s" % (
        size(r["block_size"]), "%d %s" % (r["batch"], r["pattern"]), r["inflight"], r["gb_per_s"],
        iperf_gbps, r["gb_per_s"] / iperf_gbps if iperf_gbps > 0 else 0.0,
        r["p50_us"], r["verified"]))
EOF
else
    iperf_gbps=$(jq -r '(.end.sum_received // .end.sum_sent).bits_per_second / 8 / 1e9' "$tmp/iperf.json")
    printf '%-9s %-14s %12s %12s %8s %10s %9s\n' block batch/pattern "kvxfer GB/s" "iperf3 GB/s" ratio "p50 us" verified
    jq -r '[.block_size, .batch, .pattern, .gb_per_s, .p50_us, .verified] | @tsv' "$tmp/kvxfer.json" |
        while IFS=$'\t' read -r bs batch pattern gbps p50 verified; do
            awk -v bs="$bs" -v b="$batch" -v p="$pattern" -v g="$gbps" -v i="$iperf_gbps" \
                -v l="$p50" -v v="$verified" 'BEGIN {
                    s = (bs % 1048576 == 0) ? (bs / 1048576 " MiB") : (bs % 1024 == 0) ? (bs / 1024 " KiB") : (bs " B")
                    printf "%-9s %-14s %12.3f %12.3f %8.2f %10.1f %9s\n", s, b " " p, g, i, (i > 0 ? g / i : 0), l, v }'
        done
fi
