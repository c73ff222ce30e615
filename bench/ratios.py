#!/usr/bin/env python3
"""Print kvxfer-bench --json results against a reference tool's GB/s.

Usage: ratios.py REF_NAME REF KVX_JSON
  REF       GB/s of the reference: "*=G" (one value for every block size)
            or "SIZE=G,SIZE=G,..." per block size in bytes (a size without a
            value gets ratio 0).
  KVX_JSON  file of kvxfer-bench --json lines (one object per result).
GB/s is 10^9 bytes of payload per second on both sides.
"""
import json
import sys


def size(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    name, ref_arg, path = argv[1:]
    ref = {}
    for item in ref_arg.split(","):
        k, _, v = item.partition("=")
        ref[k] = float(v)
    rows = []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.lstrip().startswith("{")]
    if not rows:
        sys.exit("ratios.py: no kvxfer-bench results in %s" % path)
    head = "%s GB/s" % name
    print("%-9s %-14s %8s %12s %*s %8s %10s %9s" % ("block", "batch/pattern", "inflight", "kvxfer GB/s",
          max(12, len(head)), head, "ratio", "p50 us", "verified"))
    for r in rows:
        g = ref.get(str(r["block_size"]), ref.get("*", 0.0))
        print("%-9s %-14s %8d %12.4f %*.4f %8.2f %10.1f %9s" % (
            size(r["block_size"]), "%d %s" % (r["batch"], r["pattern"]), r["inflight"], r["gb_per_s"],
            max(12, len(head)), g, r["gb_per_s"] / g if g > 0 else 0.0, r["p50_us"], r["verified"]))


if __name__ == "__main__":
    main(sys.argv)
