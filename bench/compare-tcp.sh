#!/usr/bin/env bash
# Compare kvxfer's tcp backend with the best of its references on loopback:
#   iperf3 with 1 and with 2 streams, DURATION seconds  (what TCP can do)
#   openssl speed -evp aes-128-gcm, 1 MiB buffers, one core (what the AEAD
#                               can do: the reference of tcp.protection=aead
#                               is min(best iperf3, openssl))
#   kvxfer-tcp-ref 4K random:  one plain TCP stream that gathers the same
#                               random 4 KiB blocks of a 256 MiB region with
#                               writev and scatters them with readv, 16 and 64
#                               blocks per call (what TCP can do with kvxfer's
#                               access pattern; iperf3's one small buffer stays
#                               in the caches). The 4K lines are printed against
#                               iperf3 and against it.
#   kvxfer-tls-ref 1M, 64K:     one TLS 1.3 stream (OpenSSL, AES-128-GCM) on
#                               loopback: what a protected stream reaches
#                               when the AEAD and the TCP copies share these
#                               cores (on loopback both ends do); the aead
#                               lines are printed against it too.
#   kvxfer-bench --backend tcp, tcp.protection=none and =aead (its
#                               default AES-GCM code: ipsec-mb on VAES CPUs
#                               when built with it), and aead-openssl
#                               (tcp.aead_impl=openssl):
#                               1M and 64K blocks (batch 1, seq),
#                               4K blocks (batch 16, random)
# Every kind is measured once per round, the kinds interleaved, REPEAT
# rounds (default 3); bench/rounds.py prints median and min-max of each and
# the per-round ratios of kvxfer to the best reference configuration.
# GB/s is 10^9 bytes of payload per second on both sides.
#
# Usage: bench/compare-tcp.sh [extra kvxfer-bench options, e.g. --option tcp.streams=2]
# Environment: KVXFER_BENCH (default: build/kvxfer-bench of this checkout;
#              kvxfer-tcp-ref is taken from the same directory),
#              DURATION seconds per measurement (default 3), REPEAT (default 3),
#              WARMUP seconds of unmeasured transfers per size (default 2: the
#              first pass over fresh memory is slow on some VMs),
#              PROTECTION: the kinds to run (default "none aead aead-openssl"):
#              a tcp.protection value, or aead-IMPL for tcp.aead_impl=IMPL,
#              KVXFER_BENCH_BEFORE: another build's kvxfer-bench, run in the same
#              rounds as kind "before", for before/after comparisons, with
#              BEFORE_OPTIONS (default none: the build's own default
#              tcp.protection, aead in builds that have the option; e.g.
#              BEFORE_OPTIONS="--option tcp.protection=none").
# Only loopback (127.0.0.1) is used. iperf3 is installed with apt-get if missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/common.sh"
bench=${KVXFER_BENCH:-$root/build/kvxfer-bench}
duration=${DURATION:-3}
repeat=${REPEAT:-3}
me=compare-tcp.sh

die() { echo "$me: $*" >&2; exit 1; }

[[ -x $bench ]] || die "kvxfer-bench not found at $bench (build it, or set KVXFER_BENCH)"
tcp_ref=$(dirname "$bench")/kvxfer-tcp-ref
[[ -x $tcp_ref ]] || die "kvxfer-tcp-ref not found at $tcp_ref (built with kvxfer-bench)"
tls_ref=$(dirname "$bench")/kvxfer-tls-ref
[[ -x $tls_ref ]] || die "kvxfer-tls-ref not found at $tls_ref (built with kvxfer-bench)"
[[ $duration =~ ^[0-9]+$ && $duration -ge 1 ]] || die "DURATION must be a whole number of seconds >= 1"
[[ $repeat =~ ^[0-9]+$ && $repeat -ge 1 ]] || die "REPEAT must be a whole number >= 1"

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
# a probe connection would count as a test run of the iperf3 server.
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    grep -qE "^ *[0-9]+: 0100007F:$hex 00000000:0000 0A" /proc/net/tcp
}

port=$(free_port)
iperf3 -s -B 127.0.0.1 -p "$port" >"$tmp/iperf-server.log" 2>&1 &
iperf_pid=$!
for _ in $(seq 100); do
    listening "$port" && break
    kill -0 "$iperf_pid" 2>/dev/null || die "iperf3 server failed: $(cat "$tmp/iperf-server.log")"
    sleep 0.05
done
listening "$port" || die "iperf3 server did not listen on 127.0.0.1:$port"

# iperf3 STREAMS ROUND: one reference line
iperf() {
    iperf3 -c 127.0.0.1 -p "$port" -t "$duration" -P "$1" -J >"$tmp/iperf.json" ||
        die "iperf3 client failed: $(head -c 2000 "$tmp/iperf.json")"
    "$py" -c '
import json, sys
ip = json.load(open(sys.argv[1]))
if "error" in ip:
    sys.exit("compare-tcp.sh: iperf3: " + str(ip["error"]))
s = ip["end"].get("sum_received") or ip["end"]["sum_sent"]
print(json.dumps({"round": int(sys.argv[2]), "family": "iperf3", "kind": "iperf3 -P %s" % sys.argv[3],
                  "block_size": 0, "gb_per_s": s["bits_per_second"] / 8 / 1e9}))' "$tmp/iperf.json" "$2" "$1" >>"$tmp/all.jsonl"
}

# The AEAD's single-core speed at 1 MiB buffers.
aead() {
    openssl speed -evp aes-128-gcm -bytes 1048576 -seconds "$duration" -mr 2>/dev/null | "$py" -c '
import json, sys
for line in sys.stdin:
    if line.startswith("+F:"):  # -mr: bytes per second
        print(json.dumps({"round": int(sys.argv[1]), "family": "openssl", "kind": "openssl aes-128-gcm 1 core",
                          "block_size": 0, "gb_per_s": float(line.strip().split(":")[-1]) / 1e9}))
        break
else:
    sys.exit("compare-tcp.sh: no result from openssl speed")' "$1" >>"$tmp/all.jsonl"
}

# kvxfer-tcp-ref GATHER ROUND: plain TCP, random 4 KiB blocks, GATHER per call.
tcp_ref_line() {
    "$tcp_ref" 4K "$1" random 256M "$duration" "${WARMUP:-2}" >"$tmp/ref.json" || die "kvxfer-tcp-ref failed"
    kvx_tag "tcp-ref random, $1 per call" "$2" tcp-ref <"$tmp/ref.json" >>"$tmp/all.jsonl"
}

# kvxfer-tls-ref BLOCK ROUND: a TLS 1.3 stream, BLOCK per SSL_write.
tls_ref_line() {
    "$tls_ref" "$1" 256M "$duration" "${WARMUP:-2}" >"$tmp/ref.json" || die "kvxfer-tls-ref failed"
    kvx_tag "tls-ref TLS 1.3 AES-128-GCM" "$2" tls-ref <"$tmp/ref.json" >>"$tmp/all.jsonl"
}

protections=${PROTECTION:-none aead aead-openssl}
vs=()  # what each kvxfer kind is measured against
for prot in $protections; do
    if [[ $prot == aead* ]]; then
        # the cipher's ceiling joins each TCP one; protected tcp is held to a
        # single stream, min(iperf3 -P 1, openssl); and a TLS stream
        vs+=(--vs "kvxfer $prot=iperf3,openssl" --vs "kvxfer $prot=tcp-ref,openssl"
             --vs "kvxfer $prot=iperf3:iperf3 -P 1,openssl" --vs "kvxfer $prot=tls-ref")
    else
        vs+=(--vs "kvxfer $prot=iperf3" --vs "kvxfer $prot=tcp-ref")
    fi
done
[[ -z ${KVXFER_BENCH_BEFORE:-} ]] || vs+=(--vs "before=iperf3")
for round in $(seq "$repeat"); do
    echo "$me: round $round of $repeat: iperf3 -P 1, -P 2, openssl, tcp-ref, tls-ref, kvxfer ($protections)" >&2
    iperf 1 "$round"
    iperf 2 "$round"
    aead "$round"
    tcp_ref_line 16 "$round"
    tcp_ref_line 64 "$round"
    if [[ " $protections " == *" aead"* ]]; then
        tls_ref_line 1M "$round"
        tls_ref_line 64K "$round"
    fi
    for prot in $protections; do
        opts=(--option "tcp.protection=${prot%%-*}")
        [[ $prot != *-* ]] || opts+=(--option "tcp.aead_impl=${prot#*-}")
        kvx_bench_runs "$bench" tcp "$duration" "$tmp/kvx.json" "${opts[@]}" "$@"
        kvx_tag "kvxfer $prot" "$round" <"$tmp/kvx.json" >>"$tmp/all.jsonl"
    done
    if [[ -n ${KVXFER_BENCH_BEFORE:-} ]]; then
        read -ra before_opts <<<"${BEFORE_OPTIONS:-}"
        kvx_bench_runs "$KVXFER_BENCH_BEFORE" tcp "$duration" "$tmp/kvx.json" "${before_opts[@]}" "$@"
        kvx_tag "before" "$round" <"$tmp/kvx.json" >>"$tmp/all.jsonl"
    fi
done
"$py" "$root/bench/rounds.py" "$tmp/all.jsonl" "${vs[@]}"
