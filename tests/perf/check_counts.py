#!/usr/bin/env python3
"""Counts the instructions per call of write_blocks + poll (perf_ops under
callgrind, main thread only: deterministic, unlike time) and compares them with
the committed baseline. Fails when a figure grows more than --tolerance over
its baseline, or when the many-peers figure exceeds 1.5 x the single-peer one.
Exits 77 (skip) when valgrind is missing or the build is not comparable.
  check_counts.py --exe perf_ops --baseline baseline.txt [--update]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
BASELINE_COMPILER = "GNU-12"


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--exe", required=True)
    p.add_argument("--baseline", required=True)
    p.add_argument("--build-type", default="RelWithDebInfo")
    p.add_argument("--sanitize", default="")
    p.add_argument("--compiler", default="GNU-12", help="CMAKE_CXX_COMPILER_ID-VERSION of the build")
    p.add_argument("--workdir", default="callgrind")
    p.add_argument("--tolerance", type=float, default=0.20)
    p.add_argument("--update", action="store_true", help="write the measured figures as the new baseline")
    return p.parse_args()


def skip_reason(a):
    if a.sanitize:
        return f"built with -fsanitize={a.sanitize}: instruction counts are not comparable"
    if a.build_type != "RelWithDebInfo":
        return f"CMAKE_BUILD_TYPE={a.build_type}: the baseline is for RelWithDebInfo"
    if not a.compiler.startswith(BASELINE_COMPILER):
        return f"compiler {a.compiler}: the baseline is for {BASELINE_COMPILER}.x (Debian 12's g++)"
    if not shutil.which("valgrind"):
        return "valgrind is not installed (scripts/deps.sh installs it)"
    return None


def measure(a):
    """{(scenario, batch): instructions per call} from one callgrind run."""
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    out = os.path.join(a.workdir, "cg.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                    a.exe], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    figures = {}
    for path in sorted(glob.glob(out + ".*-01")):  # every dump's main thread
        text = open(path).read()
        label = re.search(r"^desc: Trigger: Client Request: (\S+) (\d+) (\d+)$", text, re.M)
        total = re.search(r"^summary: (\d+)$", text, re.M)
        if label and total:
            scenario, batch, calls = label.group(1), int(label.group(2)), int(label.group(3))
            figures[(scenario, batch)] = int(total.group(1)) // calls
    if not figures:
        sys.exit(f"perf_count: no callgrind dump found in {a.workdir}")
    return figures


def read_baseline(path):
    base = {}
    for line in open(path):
        line = line.split("#")[0].split()
        if line:
            base[(line[0], int(line[1]))] = int(line[2])
    return base


def write_baseline(path, figures):
    with open(path, "w") as f:
        f.write("# Instructions per call of write_blocks + poll on the instant backend (tests/perf):\n"
                "# callgrind Ir of the calling thread, RelWithDebInfo, gcc 12 / glibc 2.36 (Debian 12).\n"
                "# perf_count fails when a figure grows more than 20 %. Regenerate after a deliberate change:\n"
                "#   tests/perf/check_counts.py --exe build/tests/perf/perf_ops --baseline tests/perf/baseline.txt "
                "--update\n"
                "# scenario batch instructions_per_call\n")
        for (scenario, batch), ir in sorted(figures.items()):
            f.write(f"{scenario} {batch} {ir}\n")


def main():
    a = parse_args()
    why = skip_reason(a)
    if why:
        print(f"perf_count: skipped: {why}")
        return SKIP
    figures = measure(a)
    if a.update:
        write_baseline(a.baseline, figures)
    base = read_baseline(a.baseline)
    bad = []
    print(f"{'scenario':8} {'batch':>5} {'Ir/call':>9} {'Ir/block':>9} {'baseline':>9} {'change':>7}")
    for key, ir in sorted(figures.items()):
        ref = base.get(key)
        change = f"{(ir - ref) / ref * 100:+6.1f}%" if ref else "   new"
        print(f"{key[0]:8} {key[1]:5} {ir:9} {ir / key[1]:9.1f} {ref or '-':>9} {change}")
        if ref and ir > ref * (1 + a.tolerance):
            bad.append(f"{key[0]} batch {key[1]}: {ir} instructions per call, baseline {ref} "
                       f"(+{(ir - ref) / ref * 100:.0f} % > {a.tolerance * 100:.0f} %)")
    single, many = figures.get(("single", 16)), figures.get(("scale", 16))
    if single and many and many > 1.5 * single:
        bad.append(f"1,000 peers / 100k in flight: {many} instructions per call > 1.5 x single peer {single}")
    for b in bad:
        print(f"perf_count: FAIL: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
