#!/usr/bin/env python3
"""Print the build targets a ctest selection needs, from a configured tree.

Usage: scripts/ctest-targets.py BUILD_DIR [ctest selection arguments...]
e.g.   scripts/ctest-targets.py build-tsan -L threads

The targets are the programs the selected tests start or name as
arguments (any argument, or the value of a -DNAME=VALUE argument, that is
a file under BUILD_DIR named like a target), plus the library and its
plugins, which every test loads. A stage
that runs some of the tests builds these alone instead of the whole tree
(scripts/test.sh). It reads the CTestTestfile.cmake files, which exist
before anything is built (ctest itself leaves out the command of a test
whose program is not built yet).
"""
import json
import os
import re
import subprocess
import sys

ADD_TEST = re.compile(r"^add_test\(\[=\[(.+?)\]=\] (.*)\)$")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip())
    build = os.path.realpath(sys.argv[1])
    selected = json.loads(subprocess.run(
        ["ctest", "-N", "--show-only=json-v1", *sys.argv[2:]], cwd=build,
        check=True, capture_output=True, text=True).stdout).get("tests", [])
    names = {t["name"] for t in selected}
    if not names:
        sys.exit("ctest-targets: the selection %s has no tests" % sys.argv[2:])
    help_text = subprocess.run(["cmake", "--build", build, "--target", "help"],
                               check=True, capture_output=True, text=True).stdout
    known = {m.group(1) for m in re.finditer(r"^\.\.\. (\S+)", help_text, re.M)}
    wanted = {t for t in ("kvxfer", "kvxfer-verbs") if t in known}
    found = set()
    for root, _, files in os.walk(build):
        if "CTestTestfile.cmake" not in files:
            continue
        with open(os.path.join(root, "CTestTestfile.cmake")) as f:
            for line in f:
                m = ADD_TEST.match(line.strip())
                if not m or m.group(1) not in names:
                    continue
                found.add(m.group(1))
                for arg in re.findall(r'"([^"]*)"', m.group(2)):
                    path = os.path.normpath(re.sub(r"^-D\w+=", "", arg))
                    if path.startswith(build + os.sep) and os.path.basename(path) in known:
                        wanted.add(os.path.basename(path))
    if found != names:
        sys.exit("ctest-targets: no add_test found for %s" % sorted(names - found))
    print("\n".join(sorted(wanted)))


if __name__ == "__main__":
    main()
