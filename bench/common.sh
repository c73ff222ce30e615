# shellcheck shell=bash
# Shared by compare-tcp.sh and compare-verbs.sh (sourced, bash; uses the
# caller's die).

# kvx_bench_runs BENCH BACKEND DURATION OUT [extra kvxfer-bench options]:
# the kvxfer side of every comparison, as --json lines in OUT: 1 MiB and
# 64 KiB blocks (batch 1, seq), then 4 KiB blocks (batch 16, random indexes).
kvx_bench_runs() {
    local bench=$1 backend=$2 duration=$3 out=$4
    shift 4
    local common=(--backend "$backend" --json --no-progress --duration "$duration")
    "$bench" "${common[@]}" --block-size 1M,64K --batch 1 --pattern seq "$@" >"$out" ||
        die "kvxfer-bench failed (1M, 64K); output: $(cat "$out")"
    "$bench" "${common[@]}" --block-size 4K --batch 16 --pattern random "$@" >>"$out" ||
        die "kvxfer-bench failed (4K); output: $(cat "$out")"
}
