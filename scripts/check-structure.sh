#!/bin/bash
# Structure rules the build and review rely on (src/backends/README.md):
#   1. no function in src/ or bench/ over 80 lines;
#   2. the core names no backend: no KVX_HAVE_* switch, no backend folder include;
#   3. layers: each layer's include farm (BUILD/layers/NAME) lets through what
#      it may include and nothing else — checked by compiling one include each;
#   4. no "seed" in code or the public header (say "vLLM's DataTransport");
#   5. every backend has one shape: NAME_entry.cpp (the only file defining its
#      registry entry), NAME_wire.cpp, NAME_listener.cpp, NAME_peer.cpp;
#   6. backends drive the handshake engine (handshake/engine.h), never the
#      message codec or the proofs themselves;
#   7. a test program is named after its folder and first source
#      (tests/FOLDER/test_[FOLDER_]STEM.c -> FOLDER_STEM), and each ctest run
#      of it is that name or the name plus a suffix.
# Usage: scripts/check-structure.sh BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: $0 BUILD_DIR}
CXX=${CXX:-c++}
bad=0
complain() { echo "check-structure: $*" >&2; bad=1; }

# 1. function length (universal-ctags gives each function's first and last line)
long=$(ctags --languages=C,C++ --fields=+ne -o - --kinds-c++=f --kinds-c=f -R src bench $(ls -d tools 2>/dev/null) 2>/dev/null |
    awk -F'\t' '{l=e=0; for(i=1;i<=NF;i++){if($i~/^line:/)l=substr($i,6); if($i~/^end:/)e=substr($i,5)}
                 if(e-l+1>80) printf "%s:%s %s (%d lines)\n", $2, l, $1, e-l+1}')
[ -z "$long" ] || complain "functions over 80 lines:"$'\n'"$long"
n=$(ctags --languages=C,C++ --fields=+ne -o - --kinds-c++=f --kinds-c=f -R src | grep -c "end:")
[ "$n" -gt 100 ] || complain "ctags found only $n functions in src/: is universal-ctags installed?"

# 2. the core walks the registry
git grep -n 'KVX_HAVE_' -- src/core src/capi && complain "a backend switch in the core"
git grep -n '#include "backends/' -- src/core src/capi src/backend_api src/registry &&
    complain "the core includes a backend"

# 3. layer boundaries: what must and must not compile from each layer
try() { # layer header expect(ok|fail)
    local out
    out=$(printf '#include "%s"\n' "$2" | $CXX -std=c++20 -fsyntax-only -x c++ -I "$BUILD/layers/$1" \
          -I include $(pkg-config --cflags-only-I libibverbs 2>/dev/null) - 2>&1)
    local rc=$?
    if [ "$3" = ok ] && [ $rc -ne 0 ]; then complain "layer $1 cannot include $2: $out"; fi
    if [ "$3" = fail ] && [ $rc -eq 0 ]; then complain "layer $1 may include $2, but must not"; fi
}
[ -d "$BUILD/layers/core" ] || complain "no layer include farms in $BUILD/layers (configure first)"
try util util/event_loop.h ok;       try util wire/metadata.h fail
try wire wire/metadata.h ok;         try wire handshake/handshake.h fail
try handshake handshake/engine.h ok; try handshake backend_api/backend.h fail
try backend_api backend_api/ops.h ok; try backend_api registry/registry.h fail
try backend_api backends/tcp/tcp.h fail; try backend_api core/transport.h fail
try registry registry/registry.h ok; try registry backends/tcp/tcp.h fail; try registry core/transport.h fail
try core core/transport.h ok;        try core backends/tcp/tcp.h fail
try tcp backends/tcp/tcp.h ok;       try tcp core/transport.h fail
if [ -d "$BUILD/layers/verbs" ]; then
    try verbs backends/verbs/verbs.h ok; try verbs backends/tcp/tcp.h fail; try tcp backends/verbs/verbs.h fail
fi

# 4. names
git grep -n -i -w 'seed' -- src include && complain "'seed' in code or header"

# 5. one shape per backend
for dir in src/backends/*/; do
    name=$(basename "$dir")
    for role in entry wire listener peer; do
        [ -f "$dir${name}_$role.cpp" ] || complain "backend $name has no ${name}_$role.cpp (src/backends/README.md)"
    done
    # (a plugin backend: its stub holds the library's entry, its plugin file hands out the real one)
    other=$(git grep -l "kvx_backend_$name\b" -- "$dir*.cpp" "$dir*.h" |
        grep -v -e "/${name}_entry.cpp$" -e "/${name}_stub.cpp$" -e "/${name}_plugin.cpp$")
    [ -z "$other" ] || complain "backend $name defines its registry entry outside ${name}_entry.cpp: $other"
done

# 6. the handshake engine, not its primitives
git grep -n -E 'handshake::(verify|answer|expect_answer|expect_accept|derive_keys|encode|decode|ChallengeCookies)\b' \
    -- "src/backends/*.cpp" "src/backends/*.h" "src/core/*" "src/capi/*" &&
    complain "a backend or the core bypasses the handshake engine"

# 7. test names
names=$(/usr/bin/python3 - <<'PY'
import glob, os, re
progs = {}
for cm in sorted(glob.glob("tests/*/CMakeLists.txt")):
    folder = os.path.basename(os.path.dirname(cm))
    text = open(cm).read()
    for name, first in re.findall(r"kvx_cmocka_test\(\s*(\w+)\s+SOURCES\s+([^\s)]+)", text):
        stem = re.sub(r"\.(c|cpp)$", "", os.path.basename(first))
        stem = stem[len("test_"):] if stem.startswith("test_") else stem
        stem = stem[len(folder) + 1:] if stem.startswith(folder + "_") else stem
        if name != folder + "_" + stem:
            print(f"{cm}: program {name} from {first} should be named {folder}_{stem}")
        progs[name] = cm
for cm in sorted(glob.glob("tests/*/CMakeLists.txt")):
    for run, cmd in re.findall(r"add_test\(NAME\s+(\S+)\s+COMMAND\s+(\S+)", open(cm).read()):
        if cmd in progs and not run.startswith(cmd):
            print(f"{cm}: run {run} of program {cmd} should start with {cmd}")
PY
) || complain "the test-name check could not run (/usr/bin/python3)"
[ -z "$names" ] || complain "test names:"$'\n'"$names"

[ $bad -eq 0 ] && echo "check-structure: ok ($n functions, layers and names as drawn)"
exit $bad
