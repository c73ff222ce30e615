#!/usr/bin/python3
"""Check a fingerprint checker binary (fp_check) against the corpus.

Usage: check_corpus.py FP_CHECK [--seed S] [--count N] [--corpus PATH]
       [--verify-golden] [--show N]

Builds the deterministic corpus of gen_corpus.py in memory (expected values
computed by the running CPython >= 3.11, i.e. by Python's own json/hashlib),
or reads one written by gen_corpus.py with --corpus, feeds every text to
FP_CHECK (framing: "<len>\\n<bytes>\\n" per case) and compares per case:
  expect "<16 hex>" or ""  ->  "OK <same>"
  expect "ERROR"           ->  "ERR -1008 <non-empty message>" (KVX_ECONFIG)
--verify-golden (with --corpus) recomputes each stored expectation with the
running Python and reports disagreements.
Exit status: 0 when every case matches, 1 otherwise. Standard library only.
"""

import argparse
import base64
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import gen_corpus  # noqa: E402

KVX_ECONFIG = -1008


def load(path):
    cases = []
    with open(path, encoding="ascii") as f:
        for n, line in enumerate(f):
            obj = json.loads(line)
            if n == 0 and "generator" in obj:
                continue
            cases.append(obj)
    return cases


def show(b, limit=300):
    r = repr(b)
    return r if len(r) <= limit else r[:limit] + "... (%d bytes)" % len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checker")
    ap.add_argument("--corpus", help="read this file instead of generating")
    ap.add_argument("--seed", type=int, default=gen_corpus.SEED)
    ap.add_argument("--count", type=int, default=gen_corpus.COUNT)
    ap.add_argument("--verify-golden", action="store_true")
    ap.add_argument("--show", type=int, default=20, help="mismatches to print in full")
    a = ap.parse_args()

    gen_corpus.require_python()
    if not a.corpus:
        cases = gen_corpus.make_cases(a.seed, a.count)
        source = "generated in memory (seed %d)" % a.seed
    else:
        cases = load(a.corpus)
        source = a.corpus
    texts = [base64.b64decode(c["b64"]) for c in cases]

    golden_bad = 0
    if a.verify_golden:
        for c, t in zip(cases, texts):
            exp, _ = gen_corpus.reference(t)
            if exp != c["expect"]:
                golden_bad += 1
                print("GOLDEN DIFFERS case %d: stored %r, this Python %r: %s" %
                      (c["id"], c["expect"], exp, show(t)))

    stdin = b"".join(b"%d\n%s\n" % (len(t), t) for t in texts)
    p = subprocess.run([a.checker], input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=600)
    lines = p.stdout.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    problems = []
    if p.returncode != 0:
        problems.append("checker exited with status %d; stderr:\n%s" %
                        (p.returncode, p.stderr.decode("utf-8", "replace")[-4000:]))
    if len(lines) != len(cases):
        problems.append("checker answered %d of %d cases" % (len(lines), len(cases)))

    mismatches = []
    passed = 0
    for c, t, line in zip(cases, texts, lines):
        exp = c["expect"]
        if exp == gen_corpus.ECONFIG:
            parts = line.split(" ", 2)
            ok = (len(parts) == 3 and parts[0] == "ERR" and parts[1] == str(KVX_ECONFIG)
                  and parts[2].strip() != "")
        else:
            ok = line == "OK " + exp
        if ok:
            passed += 1
        else:
            mismatches.append((c, t, line))

    for c, t, line in mismatches[:a.show]:
        print("MISMATCH case %d (%s): expected %r%s, got %r\n  input: %s" %
              (c["id"], c["cat"], c["expect"] if c["expect"] != "ERROR" else "ECONFIG",
               " (%s)" % c["why"] if c.get("why") else "", line, show(t)))
    if len(mismatches) > a.show:
        print("... and %d more mismatches" % (len(mismatches) - a.show))
    for msg in problems:
        print("ERROR: " + msg)

    n_err = sum(c["expect"] == gen_corpus.ECONFIG for c in cases)
    n_empty = sum(c["expect"] == "" for c in cases)
    print("corpus %s: %d cases (%d hashed, %d empty, %d ECONFIG): %d passed, %d mismatched%s" %
          (source, len(cases), len(cases) - n_err - n_empty, n_empty, n_err, passed,
           len(cases) - passed, ", %d golden differences" % golden_bad if a.verify_golden else ""))
    return 0 if passed == len(cases) and not problems and not golden_bad else 1


if __name__ == "__main__":
    sys.exit(main())
