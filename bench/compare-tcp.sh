#!/usr/bin/env bash
# Compare kvxfer's tcp backend with iperf3 on loopback, in one run:
#   iperf3, one TCP stream, DURATION seconds        (the "what TCP can do" line)
#   openssl speed -evp aes-128-gcm, 1 MiB buffers, one core (the "what the
#                               AEAD can do" line for tcp.protection=aead)
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
. "$root/bench/common.sh"
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

py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || die "need python3 to read JSON"

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
    "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
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
kvx_bench_runs "$bench" tcp "$duration" "$tmp/kvxfer.json" "$@"

iperf_gbps=$("$py" -c '
import json, sys
ip = json.load(open(sys.argv[1]))
if "error" in ip:
    sys.exit("compare-tcp.sh: iperf3: " + str(ip["error"]))
s = ip["end"].get("sum_received") or ip["end"]["sum_sent"]
print(s["bits_per_second"] / 8 / 1e9)' "$tmp/iperf.json")
"$py" "$root/bench/ratios.py" iperf3 "*=$iperf_gbps" "$tmp/kvxfer.json"

# The AEAD's single-core speed; a protected 1 MiB transfer is measured against
# min(iperf3, openssl): it cannot beat either.
echo "$me: openssl speed -evp aes-128-gcm, 1 MiB, ${duration} s ..." >&2
ossl_gbps=$(openssl speed -evp aes-128-gcm -bytes 1048576 -seconds "$duration" -mr 2>/dev/null |
    "$py" -c '
import sys
for line in sys.stdin:
    if line.startswith("+F:"):
        print(float(line.strip().split(":")[-1]) / 1e9)  # -mr: bytes per second
        break
else:
    sys.exit("compare-tcp.sh: no result from openssl speed")')
ref=$("$py" -c 'import sys; print(min(float(sys.argv[1]), float(sys.argv[2])))' "$iperf_gbps" "$ossl_gbps")
echo "openssl aes-128-gcm 1 MiB, 1 core: $ossl_gbps GB/s; min(iperf3, openssl) = $ref GB/s"
"$py" "$root/bench/ratios.py" "min(iperf3,ossl)" "*=$ref" "$tmp/kvxfer.json"
