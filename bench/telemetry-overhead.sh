#!/usr/bin/env bash
# What telemetry costs: kvxfer-bench at 4 KiB blocks, random indexes, batch 16
# (the small-transfer case, where per-transfer costs show most), from a build
# with telemetry (the default) and one configured with -DKVX_TELEMETRY=OFF,
# run alternately N times each (N >= 3); prints every run and the ratio of
# the medians (on / off) of GB/s.
#
#   bench/telemetry-overhead.sh BUILD_ON BUILD_OFF [N] [DURATION]
#
# e.g.  cmake -S . -B build-notel -DKVX_TELEMETRY=OFF && cmake --build build-notel --target kvxfer-bench
#       bench/telemetry-overhead.sh build build-notel 5 3
set -euo pipefail
on=${1:?usage: $0 BUILD_ON BUILD_OFF [N] [DURATION]}
off=${2:?usage: $0 BUILD_ON BUILD_OFF [N] [DURATION]}
n=${3:-5}
duration=${4:-3}
[ "$n" -ge 3 ] || { echo "$0: N must be at least 3" >&2; exit 2; }
for b in "$on" "$off"; do
    [ -x "$b/kvxfer-bench" ] || { echo "$0: no $b/kvxfer-bench" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { # BUILD LABEL
    "$1/kvxfer-bench" --backend tcp --block-size 4K --batch 16 --pattern random --duration "$duration" \
        --json --no-progress >>"$tmp/$2.json"
}
for i in $(seq "$n"); do
    run "$on" on
    run "$off" off
done
python3 - "$tmp/on.json" "$tmp/off.json" <<'PY'
import json, statistics, sys
on = [json.loads(l)["gb_per_s"] for l in open(sys.argv[1])]
off = [json.loads(l)["gb_per_s"] for l in open(sys.argv[2])]
agree = [json.loads(l)["lib_agrees"] for l in open(sys.argv[1])]
print("telemetry on  (GB/s):", " ".join("%.3f" % v for v in on), " median %.3f" % statistics.median(on))
print("telemetry off (GB/s):", " ".join("%.3f" % v for v in off), " median %.3f" % statistics.median(off))
print("library view agrees:", " ".join(agree))
print("ratio on/off of the medians: %.3f" % (statistics.median(on) / statistics.median(off)))
PY
