#!/usr/bin/env python3
"""Summarise interleaved rounds of kvxfer and reference-tool measurements.

Usage: rounds.py FILE [--vs KIND=FAMILY[,FAMILY...]]...
       rounds.py --cold FILE

FILE holds JSON lines, one per measurement, each with:
  round       the round it was taken in (runs of every kind interleave
              within a round, so a busy neighbour hurts them alike)
  kind        the configuration, e.g. "kvxfer none" or "iperf3 -P 2"
  family      for a reference tool: its name ("iperf3", "ib_write_bw",
              "openssl", "memcpy"); absent for kvxfer lines
  block_size  bytes; 0 in a reference line means "every block size"
  pattern, batch   (kvxfer-bench --json fields; optional for references)
  gb_per_s    10^9 payload bytes per second
  failed, verified (kvxfer lines: a failed or unverified run is an error)

For every reference family and block size the best configuration is the
one with the highest median: kvxfer is compared with that one only. --vs
says which families a kvxfer kind is measured against (default: every
family); with several, the reference of a round is the smallest of their
best configurations (e.g. min(iperf3, openssl) for an encrypted stream).
Given more than once for a kind, each --vs prints its own rows (a family
measured at some block sizes only, e.g. tcp-ref, adds rows for those).
FAMILY:KIND pins one configuration instead of the family's best, for a bar
stated against it (e.g. iperf3:iperf3 -P 1, a single stream).
The ratio printed is the median of the per-round ratios (kvxfer in round r
over the reference in round r) with their min-max.

--cold: every line has cold_gb_per_s (the first bytes after connecting) and
gb_per_s (steady, right after); printed per kind and block size: both, and
cold/steady, each as median (min-max) over the rounds.
"""
import json
import statistics
import sys


def size_name(n):
    if n == 0:
        return "all"
    for unit, shift in (("M", 20), ("K", 10)):
        if n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return "%dB" % n


def spread(values):
    return statistics.median(values), min(values), max(values)


def fmt(values):
    m, lo, hi = spread(values)
    return "%7.3f (%.3f-%.3f)" % (m, lo, hi)


class Rounds:
    def __init__(self, rows):
        self.anchor = {}  # family -> kind -> block_size -> {round: gbps}
        self.kvx = {}  # kind -> (block_size, pattern, batch) -> {round: gbps}
        for r in rows:
            if "family" in r:
                (self.anchor.setdefault(r["family"], {}).setdefault(r["kind"], {})
                 .setdefault(r.get("block_size", 0), {})[r["round"]]) = r["gb_per_s"]
                continue
            if r.get("failed") or r.get("verified") == "no":
                sys.exit("rounds.py: a kvxfer run failed or did not verify: %s" % json.dumps(r))
            key = (r["block_size"], r.get("pattern", ""), r.get("batch", 1))
            self.kvx.setdefault(r["kind"], {}).setdefault(key, {})[r["round"]] = r["gb_per_s"]

    def values(self, family, kind, bs):
        per = self.anchor[family][kind]
        return per.get(bs, per.get(0))

    def best(self, family, bs):
        """(kind, {round: gbps}) of the family's best configuration at bs."""
        cands = [(k, self.values(family, k, bs)) for k in self.anchor[family]]
        cands = [(k, v) for k, v in cands if v]
        if not cands:
            return None
        return max(cands, key=lambda kv: statistics.median(kv[1].values()))

    def print_anchors(self):
        print("references, GB/s: median (min-max) over rounds; * = best of its family at that size")
        for fam in sorted(self.anchor):
            for kind in self.anchor[fam]:
                for bs, per in sorted(self.anchor[fam][kind].items()):
                    sizes = [bs] if bs else sorted({k[0] for v in self.kvx.values() for k in v})
                    star = any(self.best(fam, s)[0] == kind for s in sizes)
                    print("  %-34s %5s %24s %s" % (kind, size_name(bs), fmt(list(per.values())), "*" if star else ""))

    def print_kvx(self, vs):
        print("kvxfer against the best reference configuration (ratio: median (min-max) of per-round ratios)")
        print("  %-22s %5s %-9s %24s  %-38s %s" % ("kind", "block", "pattern", "kvxfer GB/s", "reference", "ratio"))
        for kind, rows in self.kvx.items():
            for n, fams in enumerate(vs.get(kind, [sorted(self.anchor)])):
                self.print_rows(kind, rows, fams, n > 0)

    def pick(self, spec, bs):
        """(kind, {round: gbps}) for a --vs entry: FAMILY (its best) or FAMILY:KIND."""
        fam, _, kind = spec.partition(":")
        if not kind:
            return self.best(fam, bs)
        v = self.values(fam, kind, bs) if kind in self.anchor.get(fam, {}) else None
        return (kind, v) if v else None

    def print_rows(self, kind, rows, fams, only_measured):
        known = [f for f in fams if f.partition(":")[0] in self.anchor]
        for (bs, pat, batch), per in sorted(rows.items(), key=lambda kv: -kv[0][0]):
            refs = [(f, self.pick(f, bs)) for f in known]
            refs = [(f, b) for f, b in refs if b]
            if only_measured and (not known or len(refs) < len(known)):
                continue  # a family of this comparison was not measured at this size
            ratios, names = [], " / ".join("%s" % b[0] for _, b in refs) or "-"
            for rnd, g in per.items():
                ref = [b[1][rnd] for _, b in refs if rnd in b[1]]
                if len(ref) == len(refs) and ref and min(ref) > 0:
                    ratios.append(g / min(ref))
            ratio = "%.2f (%.2f-%.2f)" % spread(ratios) if ratios else "-"
            print("  %-22s %5s %-9s %24s  %-38s %s" % (kind, size_name(bs), "%s b%d" % (pat, batch),
                                                       fmt(list(per.values())), names[:38], ratio))


def print_cold(rows):
    by = {}
    for r in rows:
        by.setdefault((r["block_size"], r["kind"]), []).append((r["cold_gb_per_s"], r["gb_per_s"]))
    print("the first bytes after connecting (cold) vs the same again right after (steady), GB/s: median (min-max)")
    print("  %-15s %5s %24s %24s %24s" % ("kind", "block", "cold", "steady", "cold/steady"))
    for (bs, kind), v in sorted(by.items()):
        print("  %-15s %5s %24s %24s %24s" % (kind, size_name(bs), fmt([c for c, _ in v]), fmt([g for _, g in v]),
                                             fmt([c / g for c, g in v if g > 0])))


def read_rows(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.lstrip().startswith("{")]
    if not rows:
        sys.exit("rounds.py: no measurements in %s" % path)
    print("%d rounds, every kind measured once per round, interleaved" % len({x["round"] for x in rows}))
    return rows


def main(argv):
    if len(argv) == 3 and argv[1] == "--cold":
        print_cold(read_rows(argv[2]))
        return
    if len(argv) < 2:
        sys.exit(__doc__)
    vs = {}
    args = argv[2:]
    while args:
        if args[0] != "--vs" or len(args) < 2 or "=" not in args[1]:
            sys.exit(__doc__)
        kind, _, fams = args[1].partition("=")
        vs.setdefault(kind, []).append(fams.split(","))
        args = args[2:]
    rows = read_rows(argv[1])
    r = Rounds(rows)
    r.print_anchors()
    r.print_kvx(vs)


if __name__ == "__main__":
    main(sys.argv)
