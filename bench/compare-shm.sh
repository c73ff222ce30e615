#!/usr/bin/env bash
# Compare kvxfer's shm backend with kvxfer tcp over loopback and with a plain
# single-threaded memcpy, on this host, in one run. Every line is measured
# REPEAT times (default 3), the kinds interleaved within each round so that a
# busy neighbour hurts them alike; printed: median and min-max GB/s, and the
# ratios of the medians.
#
#   memcpy       kvxfer-memcpy-ref: one thread, the same block sizes, the same
#                working-set size (256 MiB), seq batch 1 / 4K random batch 16
#   pvw          kvxfer-memcpy-ref ... pvw: the same copies into a child
#                process's private memory, one process_vm_writev per call
#                (all of a call's blocks in it): the ceiling of the kernel
#                path, which "shm private" takes
#   shm mapped   kvxfer-bench --backend shm --target-region shared
#                (the target's region is a sealed memfd; vLLM's /dev/shm files
#                take the same path), shm.threads=1 (one copy thread; the
#                submitting thread copies a small transfer when it sleeps)
#   memcpy x2, pvw x2  the same references with two threads at once, each
#                into its own half of the destination: the references of
#                the shm.threads=2 lines (the shm lines are still judged
#                against one thread's memcpy; these ratios are printed beside them)
#   shm mapped 2 the same with shm.threads=2, the default (two copy
#                threads; 4M and 1M: split from 1 MiB; 64K and 4K: batched)
#   shm private  --backend shm, the target's region private: process_vm_writev
#   memcpy thp, pvw thp, shm private thp  the same three with the regions on
#                transparent huge pages (MADV_HUGEPAGE; kvxfer-bench
#                --target-region thp; skipped when the kernel has no THP or
#                it is set to never). The plain lines are on 4 KiB pages
#                (MADV_NOHUGEPAGE). memcpy, the anchor of every ratio, is the
#                better of "memcpy" and "memcpy thp" per size
#   shm private 2  the same with shm.threads=2, the default (4M and 1M:
#                split from 512 KiB; 64K and 4K: batched, one
#                process_vm_writev per batch)
#   shm private 2 hp  the same with region_hugepages=1 on both sides: the
#                library moves the regions (advised MADV_NOHUGEPAGE by the bench,
#                4 KiB pages) onto transparent huge pages at create (skipped,
#                as the thp lines, without THP)
#   pvw x2 thp   pvw x2 with both regions on huge pages: its reference
#   shm staged   the same with shm.private=staged: through the target's staging
#                ring (the path of a writer the kernel refuses; two copies)
#   tcp          --backend tcp over 127.0.0.1
#
# Usage: bench/compare-shm.sh [extra kvxfer-bench options]
# Environment: KVXFER_BENCH, KVXFER_MEMCPY_REF (default: this checkout's
# build/), DURATION seconds per measurement (default 2), REPEAT (default 3),
# WARMUP seconds before each kvxfer measurement (default 3).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/bench/common.sh"
bench=${KVXFER_BENCH:-$root/build/kvxfer-bench}
ref=${KVXFER_MEMCPY_REF:-$root/build/kvxfer-memcpy-ref}
duration=${DURATION:-2}
repeat=${REPEAT:-3}
# Unmeasured seconds per size before kvxfer is measured: long enough for one
# pass over the working set, since the memcpy reference touches its buffers
# before it measures too (first writes into fresh memory are far slower on
# some VMs: 0.1 GB/s measured on the development box).
warmup=${WARMUP:-3}
me=compare-shm.sh

die() { echo "$me: $*" >&2; exit 1; }
[[ -x $bench ]] || die "kvxfer-bench not found at $bench (build it, or set KVXFER_BENCH)"
[[ -x $ref ]] || die "kvxfer-memcpy-ref not found at $ref (build it, or set KVXFER_MEMCPY_REF)"
[[ $duration =~ ^[0-9]+$ && $duration -ge 1 ]] || die "DURATION must be a whole number of seconds >= 1"
[[ $repeat =~ ^[0-9]+$ && $repeat -ge 1 ]] || die "REPEAT must be a whole number >= 1"
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || die "need python3"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# kind, then JSON lines tagged with it (and the round), into $tmp/all.jsonl
tag() { kvx_tag "$1" "$round" >>"$tmp/all.jsonl"; }

kv_sizes() { # kind, block sizes, batch, pattern, then kvxfer-bench options
    local kind=$1 sizes=$2 batch=$3 pattern=$4
    shift 4
    "$bench" --json --no-progress --duration "$duration" --warmup "$warmup" --block-size "$sizes" --batch "$batch" \
        --pattern "$pattern" "$@" >"$tmp/out" || die "kvxfer-bench $* ($sizes) failed: $(cat "$tmp/out")"
    tag "$kind" <"$tmp/out"
}

kv() { # kind, then kvxfer-bench options: 4M, 1M, 64K seq batch 1, and 4K random batch 16
    local kind=$1
    shift
    kv_sizes "$kind" 4M,1M,64K 1 seq "$@"
    kv_sizes "$kind" 4K 16 random "$@"
}

# The thp lines need THP in the kernel, and not disabled.
thp_mode=$(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo "absent")
have_thp=1
[[ $thp_mode == absent || $thp_mode == *"[never]"* ]] && have_thp=0
echo "$me: transparent huge pages: $thp_mode$( ((have_thp)) || echo ' (thp lines skipped)')" >&2

for round in $(seq "$repeat"); do
    echo "$me: round $round of $repeat" >&2
    { "$ref" 4M,1M,64K 256M seq 1 "$duration" && "$ref" 4K 256M random 16 "$duration"; } | tag memcpy
    { "$ref" 4M,1M,64K 256M seq 1 "$duration" pvw && "$ref" 4K 256M random 16 "$duration" pvw; } | tag pvw
    { "$ref" 4M,1M,64K 256M seq 1 "$duration" threads=2 && "$ref" 4K 256M random 16 "$duration" threads=2; } | tag "memcpy x2"
    { "$ref" 4M,1M,64K 256M seq 1 "$duration" pvw threads=2 && "$ref" 4K 256M random 16 "$duration" pvw threads=2; } | tag "pvw x2"
    if ((have_thp)); then
        { "$ref" 4M,1M,64K 256M seq 1 "$duration" thp && "$ref" 4K 256M random 16 "$duration" thp; } | tag "memcpy thp"
        { "$ref" 4M,1M,64K 256M seq 1 "$duration" pvw thp && "$ref" 4K 256M random 16 "$duration" pvw thp; } | tag "pvw thp"
        { "$ref" 4M,1M,64K 256M seq 1 "$duration" pvw thp threads=2 && "$ref" 4K 256M random 16 "$duration" pvw thp threads=2; } | tag "pvw x2 thp"
    fi
    kv "shm mapped" --backend shm --target-region shared --option shm.threads=1 "$@"
    kv "shm mapped 2" --backend shm --target-region shared --option shm.threads=2 "$@"
    kv "shm private" --backend shm --option shm.threads=1 "$@"
    kv "shm private 2" --backend shm --option shm.threads=2 "$@"
    if ((have_thp)); then
        kv "shm private thp" --backend shm --target-region thp --option shm.threads=1 "$@"
        kv "shm private 2 hp" --backend shm --option shm.threads=2 --option region_hugepages=1 "$@"
    fi
    kv "shm staged" --backend shm --option shm.threads=1 --option shm.private=staged "$@"
    kv "tcp" --backend tcp "$@"
done

"$py" - "$tmp/all.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    if r["kind"] not in ("memcpy", "pvw", "memcpy thp", "pvw thp", "memcpy x2", "pvw x2", "pvw x2 thp"):
        if r.get("failed") or r.get("verified") == "no":
            sys.exit("compare-shm.sh: a kvxfer run failed or did not verify: %s" % r)
    by.setdefault((r["kind"], r["block_size"], r["pattern"]), []).append(r["gb_per_s"])
def cell(kind, bs, pat):
    v = by.get((kind, bs, pat))
    return (statistics.median(v), min(v), max(v), len(v)) if v else None
def best_memcpy(bs, pat):  # the stronger anchor of the two memory kinds
    cs = [c for c in (cell("memcpy", bs, pat), cell("memcpy thp", bs, pat)) if c]
    return max(cs) if cs else None
def fmt(c):
    return "%6.2f (%5.2f-%5.2f)" % c[:3] if c else "%19s" % "-"
sizes = [(4 << 20, "seq"), (1 << 20, "seq"), (64 << 10, "seq"), (4 << 10, "random")]
kinds = ["memcpy", "memcpy thp", "memcpy x2", "pvw", "pvw thp", "pvw x2", "pvw x2 thp", "shm mapped", "shm mapped 2",
         "shm private", "shm private 2", "shm private thp", "shm private 2 hp", "shm staged", "tcp"]
print("GB/s, median (min-max) of %d rounds; 4K = random, batch 16; others seq, batch 1" % max(len(v) for v in by.values()))
print("%-10s" % "block" + "".join("%21s" % k for k in kinds))
for bs, pat in sizes:
    name = "%dK" % (bs >> 10) if bs < (1 << 20) else "%dM" % (bs >> 20)
    print("%-10s" % name + "".join("  " + fmt(cell(k, bs, pat)) for k in kinds))
print()
print("ratios of medians (memcpy: the better of memcpy and memcpy thp at that size):")
for bs, pat in sizes:
    name = "%dK" % (bs >> 10) if bs < (1 << 20) else "%dM" % (bs >> 20)
    parts = []
    for k, ref in (("shm mapped", "memcpy"), ("shm mapped 2", "memcpy"), ("shm private", "memcpy"),
                   ("shm private 2", "memcpy"), ("shm private thp", "memcpy"), ("shm private 2 hp", "memcpy"),
                   ("pvw", "memcpy"), ("pvw thp", "memcpy"), ("shm private 2 hp", "pvw x2 thp"), ("shm private 2 hp", "shm private 2"),
                   ("shm private", "pvw"), ("shm private thp", "pvw thp"), ("shm mapped 2", "memcpy x2"),
                   ("shm private 2", "pvw x2"), ("shm staged", "memcpy"),
                   ("shm mapped", "tcp"), ("shm mapped 2", "tcp"), ("shm staged", "tcp")):
        a = cell(k, bs, pat)
        b = best_memcpy(bs, pat) if ref == "memcpy" else cell(ref, bs, pat)
        if a and b and b[0] > 0:
            parts.append("%s/%s %.2f" % (k, ref, a[0] / b[0]))
    print("%-6s %s" % (name, "; ".join(parts)))
PY
