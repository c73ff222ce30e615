# shellcheck shell=bash
# Shared by the compare-*.sh scripts (sourced, bash; uses the
# caller's die).

# kvx_bench_runs BENCH BACKEND DURATION OUT [extra kvxfer-bench options]:
# the kvxfer side of every comparison, as --json lines in OUT: 1 MiB and
# 64 KiB blocks (batch 1, seq), then 4 KiB blocks (batch 16, random indexes),
# each after WARMUP seconds (default 2) of unmeasured transfers.
kvx_bench_runs() {
    local bench=$1 backend=$2 duration=$3 out=$4
    shift 4
    local common=(--backend "$backend" --json --no-progress --duration "$duration" --warmup "${WARMUP:-2}")
    "$bench" "${common[@]}" --block-size 1M,64K --batch 1 --pattern seq "$@" >"$out" ||
        die "kvxfer-bench failed (1M, 64K); output: $(cat "$out")"
    "$bench" "${common[@]}" --block-size 4K --batch 16 --pattern random "$@" >>"$out" ||
        die "kvxfer-bench failed (4K); output: $(cat "$out")"
}

# kvx_tag KIND ROUND [FAMILY] < JSON lines (kvxfer-bench --json, or a
# reference tool's): the same lines with the kind and round that
# bench/rounds.py groups by, and for a reference tool its family.
kvx_tag() {
    /usr/bin/python3 -c 'import json, sys
for l in sys.stdin:
    if l.lstrip().startswith("{"):
        d = json.loads(l); d["kind"] = sys.argv[1]; d["round"] = int(sys.argv[2])
        if len(sys.argv) > 3: d["family"] = sys.argv[3]
        print(json.dumps(d))' "$@"
}
