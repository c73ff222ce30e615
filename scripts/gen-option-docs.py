#!/usr/bin/env python3
"""Write the option docs from the option tables.

The option tables in src/ (src/core/options.cpp and each backend's entry file)
are the only text of every option. kvxfer-options (tools/kvxfer-options.cpp,
built with the library) prints them; this script puts that output between the
marker lines of

  README.md                    <!-- BEGIN generated options table ... -->
                               <!-- END generated options table -->
  docs/man/kvx_options_set.3   .\\" BEGIN generated options ...
                               .\\" END generated options

Usage:
  scripts/gen-option-docs.py [--tool PATH]            rewrite both files
  scripts/gen-option-docs.py [--tool PATH] --out DIR  write the copies to DIR
  scripts/gen-option-docs.py [--tool PATH] --check    exit 1 (with a diff) when
                                                      the committed files differ

PATH defaults to build/kvxfer-options (`make build`, or
`cmake --build BUILD --target option-docs`). The ctest option_docs runs --check.
"""
import argparse
import difflib
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# file (relative to ROOT), tool flag, begin marker prefix, end marker line
TARGETS = [
    ("README.md", "--markdown", "<!-- BEGIN generated options table", "<!-- END generated options table -->"),
    ("docs/man/kvx_options_set.3", "--man", '.\\" BEGIN generated options', '.\\" END generated options'),
]


def splice(path, text, begin, end, generated):
    """text with the lines between the begin and end marker lines replaced."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, l in enumerate(lines) if l.startswith(begin)]
    ends = [i for i, l in enumerate(lines) if l.rstrip("\n") == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        sys.exit(f"gen-option-docs: {path}: expected one line starting '{begin}' and, after it, one line '{end}'")
    return "".join(lines[: starts[0] + 1]) + generated + "".join(lines[ends[0]:])


def generate(tool):
    """{relative path: new text} for every target."""
    out = {}
    for rel, flag, begin, end in TARGETS:
        run = subprocess.run([tool, flag], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"gen-option-docs: {tool} {flag} failed ({run.returncode}): {run.stderr.strip()}")
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            out[rel] = splice(rel, f.read(), begin, end, run.stdout)
    return out


def main():
    ap = argparse.ArgumentParser(description="Write the option docs of README.md and kvx_options_set(3).")
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "kvxfer-options"),
                    help="the kvxfer-options program (default: build/kvxfer-options)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--out", help="write the generated copies into this directory instead")
    mode.add_argument("--check", action="store_true", help="fail when the committed files differ")
    args = ap.parse_args()
    if not os.access(args.tool, os.X_OK):
        sys.exit(f"gen-option-docs: no program {args.tool}: build the library first, or pass --tool")

    new = generate(args.tool)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="kvxfer-option-docs.") as tmp:
            return check(new, tmp)
    where = args.out or ROOT
    for rel, text in new.items():
        dest = os.path.join(where, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"gen-option-docs: wrote {dest}")
    return 0


def check(new, tmp):
    """Writes the copies into tmp and compares the committed files with them."""
    stale = []
    for rel, text in new.items():
        dest = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            old = f.read()
        if old != text:
            stale.append(rel)
            sys.stderr.writelines(difflib.unified_diff(old.splitlines(keepends=True), text.splitlines(keepends=True),
                                                       f"{rel} (committed)", f"{rel} (generated)"))
    if stale:
        verb = "differs" if len(stale) == 1 else "differ"
        print(f"gen-option-docs: {' and '.join(stale)} {verb} from the option tables: edit the tables in src/, "
              "then run scripts/gen-option-docs.py (or cmake --build BUILD --target option-docs)", file=sys.stderr)
        return 1
    print("gen-option-docs: README.md and docs/man/kvx_options_set.3 match the option tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
