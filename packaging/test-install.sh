#!/bin/sh
# Install test: build the .debs (or, with KVX_PKG_FORMAT=rpm, the .rpms),
# unpack them into a throwaway root (nothing on the running system changes;
# rpm2cpio | cpio for rpms), then build and run consumers against that root
# only:
#   - a C program through pkg-config (PKG_CONFIG_LIBDIR = the root's pkgconfig
#     directory, so no other kvxfer.pc can be seen),
#   - a C++ program through find_package(kvxfer) (CMAKE_PREFIX_PATH=ROOT/usr),
#   - kvxfer-bench and kvxfer-info from the root,
#   - the Go package (#cgo pkg-config) and the Rust crates (pkg-config), when
#     bindings/go and bindings/rust exist and the toolchains are installed,
#   - the Python module from the python3-kvxfer package, when it was built.
# Each consumer moves blocks between two tcp transports in one process and
# checks the bytes, and must be running the root's libkvxfer.so.0.
#
# The verbs plugin's package (libkvxfer0-verbs / kvxfer-verbs) is unpacked
# last: first everything above runs without it, libkvxfer.so.0 must not need
# libibverbs, librdmacm or libIPSec_MB (ldd), and backend=verbs must fail with
# KVX_ENOTSUP naming libkvxfer-verbs.so (packaging/consumers/c/verbs-check.c);
# then, with the plugin in ROOT/LIBDIR/kvxfer-0/, backend=verbs must load it
# and fail (this host has no RDMA device) or work for the plugin's own
# reasons. The packages' dependencies are checked too: the core library's
# none on rdma-core, the plugin's on the exact version-release of the library
# and on libibverbs and librdmacm.
#
#   packaging/test-install.sh [BUILD_DIR]
#
# BUILD_DIR is the packaging build tree (packaging/build-deb.sh BUILD_DIR, or
# build-rpm.sh); the rpm root has the RPM layout (usr/lib64, lib64/python3.X);
# default: a temporary directory, removed afterwards. Exits non-zero on the
# first failure.
set -eu
. "$(dirname "$0")/common.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/kvxfer-install-test.XXXXXX")
keep=${KVX_KEEP_TEST_DIR:-}
cleanup() { [ -n "$keep" ] || rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
fmt=${KVX_PKG_FORMAT:-deb}
case $fmt in deb|rpm) ;; *) echo "test-install: KVX_PKG_FORMAT must be deb or rpm, not '$fmt'" >&2; exit 2 ;; esac
build=${1:-$work/build-$fmt}

step() { echo "=== test-install: $*"; }
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }

# run OUT WHAT CMD...: runs CMD with the root's library directory on the
# loader path, output to OUT and shown; fails if CMD fails.
run() {
    out=$1 what=$2
    shift 2
    rc=0
    LD_LIBRARY_PATH=$libdir "$@" >"$out" 2>&1 || rc=$?
    cat "$out"
    [ "$rc" -eq 0 ] || fail "$what exited with $rc"
}

# Fails unless the program's output names a libkvxfer.so.0 inside the root.
expect_root_library() { # output-file what
    grep -q "^library: $libdir/libkvxfer\.so\.0" "$1" ||
        fail "$2 did not run the root's library: $(grep '^library:' "$1" || echo 'no library line')"
}

step "packages (packaging/build-$fmt.sh $build)"
"$kvx_src/packaging/build-$fmt.sh" "$build" >"$work/build-$fmt.log" 2>&1 ||
    { tail -n 40 "$work/build-$fmt.log" >&2; fail "packaging/build-$fmt.sh"; }
grep -E '^(W|E|I): ' "$work/build-$fmt.log" || true

root=$work/root
mkdir -p "$root"
unpack() { # package file
    echo "unpacking $(basename "$1")"
    if [ "$fmt" = deb ]; then
        dpkg-deb -x "$1" "$root"
    else
        rpm2cpio "$1" | (cd "$root" && cpio -idm --quiet) || fail "cannot unpack $1"
    fi
}
pkg_name() { # package file
    if [ "$fmt" = deb ]; then dpkg-deb -f "$1" Package; else rpm -qp --qf '%{NAME}' "$1"; fi
}
# The run-time dependencies of a package, one per line.
pkg_requires() { # package file
    if [ "$fmt" = deb ]; then
        dpkg-deb -f "$1" Depends | tr ',' '\n' | sed -e 's/^ *//' -e '/^$/d'
    else
        rpm -qp --requires "$1" | grep -v '^rpmlib('
    fi
}
if [ "$fmt" = deb ]; then core_pkg=libkvxfer0 verbs_pkg=libkvxfer0-verbs
else core_pkg=kvxfer-libs verbs_pkg=kvxfer-verbs; fi
core_file='' verbs_file=''
for d in "$build"/packages/*."$fmt"; do
    case $(pkg_name "$d") in
        "$core_pkg") core_file=$d ;;
        "$verbs_pkg") verbs_file=$d; continue ;;  # unpacked after the tests without it
    esac
    unpack "$d"
done
[ -n "$core_file" ] || fail "no $core_pkg package in $build/packages"
# A plugin build (-DKVX_PLUGINS=ON, the default, and KVX_VERBS=ON) must have
# made the plugin's package.
cache_on() { grep -Eqi "^$1:BOOL=(ON|TRUE|1|YES)\$" "$build/CMakeCache.txt"; }
if cache_on KVX_PLUGINS && cache_on KVX_VERBS; then
    [ -n "$verbs_file" ] || fail "a plugin build without the $verbs_pkg package"
elif [ -n "$verbs_file" ]; then
    fail "$verbs_pkg built, but this is not a plugin build"
fi
pyver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$fmt" = deb ]; then
    multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
    rel_lib=usr/lib/$multiarch
    pydir=$root/usr/lib/python3/dist-packages
else
    rel_lib=usr/lib64
    pydir=$root/usr/lib64/python$pyver/site-packages
fi
libdir=$root/$rel_lib
version=$(kvx_version)

step "layout"
for f in usr/include/kvxfer.h usr/include/kvxfer/stats.h usr/include/kvxfer/log.h "$rel_lib/libkvxfer.so.$version" \
         "$rel_lib/pkgconfig/kvxfer.pc" "$rel_lib/cmake/kvxfer/kvxferConfig.cmake" \
         "$rel_lib/cmake/kvxfer/kvxferConfigVersion.cmake" usr/bin/kvxfer-bench usr/bin/kvxfer-info \
         usr/share/man/man7/kvxfer.7.gz usr/share/man/man1/kvxfer-bench.1.gz \
         usr/share/man/man1/kvxfer-info.1.gz; do
    [ -f "$root/$f" ] || fail "missing /$f"
done
[ "$(readlink "$libdir/libkvxfer.so.0")" = "libkvxfer.so.$version" ] || fail "libkvxfer.so.0 link"
[ "$(readlink "$libdir/libkvxfer.so")" = "libkvxfer.so.0" ] || fail "libkvxfer.so link"
readelf -d "$libdir/libkvxfer.so.$version" | grep -q 'SONAME.*\[libkvxfer\.so\.0\]' || fail "SONAME is not libkvxfer.so.0"
readelf -d "$libdir/libkvxfer.so.$version" | grep -Eq 'RPATH|RUNPATH' && fail "library has an RPATH/RUNPATH"
for t in kvxfer-bench kvxfer-info; do
    readelf -d "$root/usr/bin/$t" | grep -Eq 'RPATH|RUNPATH' && fail "$t has an RPATH/RUNPATH"
done
for f in "$libdir/libkvxfer.so.$version" "$root/usr/bin/kvxfer-bench" "$root/usr/bin/kvxfer-info"; do
    file -L "$f" | grep -q ', stripped' || fail "$f is not stripped"
done
for fn in $(sed -n 's/^ *\(kvx_[a-z_]*\);$/\1/p' "$kvx_src/src/kvxfer.map"); do
    [ -e "$root/usr/share/man/man3/$fn.3.gz" ] || fail "no man page for $fn"
done
# An alias page is a symlink to its group's page.
man -M "$root/usr/share/man" -w kvx_transport_destroy | grep -q "^$root/usr/share/man/man3/kvx_transport_close.3.gz" ||
    fail "man kvx_transport_destroy does not resolve to kvx_transport_close(3) in the root"
echo "ok: header, library $version (SONAME libkvxfer.so.0), links, kvxfer.pc, CMake package, kvxfer-bench, kvxfer-info, man pages"

step "package dependencies: $core_pkg without rdma-core${verbs_file:+, $verbs_pkg on it and on rdma-core}"
pkg_requires "$core_file" | sed "s/^/  $core_pkg requires: /"
if [ "$fmt" = deb ]; then
    dpkg-deb -f "$core_file" Recommends Suggests | sed "s/^/  $core_pkg /"
else
    rpm -qp --suggests "$core_file" | sed "s/^/  $core_pkg suggests: /"
fi
if [ -n "$verbs_file" ]; then
    pkg_requires "$core_file" | grep -Ei 'ibverbs|rdmacm|ipsec' &&
        fail "$core_pkg requires the libraries above: only $verbs_pkg may need rdma-core, and ipsec-mb is optional"
    if [ "$fmt" = deb ]; then
        vr=$(dpkg-deb -f "$core_file" Version)
        exact="libkvxfer0 (= $vr)"
    else
        vr=$(rpm -qp --qf '%{VERSION}-%{RELEASE}' "$core_file")
        exact="kvxfer-libs = $vr"
    fi
    pkg_requires "$verbs_file" >"$work/verbs-requires"
    sed "s/^/  $verbs_pkg requires: /" "$work/verbs-requires"
    grep -qxF "$exact" "$work/verbs-requires" || fail "$verbs_pkg does not require exactly '$exact'"
    for l in ibverbs rdmacm; do
        grep -Eq "^lib$l(1 |\.so\.1)" "$work/verbs-requires" || fail "$verbs_pkg does not require lib$l"
    done
    if [ "$fmt" = deb ]; then
        dpkg-deb -c "$core_file" | grep -q '/kvxfer-0/' && fail "$core_pkg holds files of kvxfer-0/"
        dpkg-deb -c "$verbs_file" | awk '$1 !~ /^d/ { print $NF }' | grep -v '^\./usr/share/' >"$work/verbs-files"
        dpkg-deb -e "$verbs_file" "$work/verbs-control"
        for f in "$work"/verbs-control/*; do
            case ${f##*/} in control|md5sums) ;; *)
                fail "$verbs_pkg has the control file ${f##*/}: a plugin needs no shlibs, symbols, trigger or script" ;;
            esac
        done
        dpkg-deb -e "$core_file" "$work/core-control"
        grep -n KVXFER_PRIVATE "$work/core-control/symbols" "$work/core-control/shlibs" &&
            fail "$core_pkg's symbols or shlibs name the private node KVXFER_PRIVATE"
    else
        rpm -qlp "$core_file" | grep -q '/kvxfer-0' && fail "$core_pkg holds files of kvxfer-0/"
        rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$verbs_file" |
            awk '$1 !~ /^d/ { print "." $2 }' | grep -v '^\./usr/share/' >"$work/verbs-files"
        [ -z "$(rpm -qp --scripts "$verbs_file")" ] || fail "$verbs_pkg has scriptlets (a plugin needs no ldconfig)"
        rpm -qp --provides "$verbs_file" | grep -v "^$verbs_pkg" | sed "s/^/  $verbs_pkg provides: /"
        rpm -qp --provides "$verbs_file" | grep -q 'libkvxfer-verbs' &&
            fail "$verbs_pkg provides its private plugin as a shared library"
        rpm -qp --provides "$core_file" "$verbs_file" | grep KVXFER_PRIVATE &&
            fail "the private node KVXFER_PRIVATE is provided (no interface: kvxfer-verbs requires the exact kvxfer-libs)"
    fi
    printf '%s\n' "./$rel_lib/kvxfer-0/libkvxfer-verbs.so" | cmp -s - "$work/verbs-files" ||
        { sed 's/^/  /' "$work/verbs-files"; fail "$verbs_pkg must hold /$rel_lib/kvxfer-0/libkvxfer-verbs.so (and its documentation) only"; }
fi
echo "ok"

step "libkvxfer.so.0 needs no rdma-core and no ipsec-mb library"
readelf -d "$libdir/libkvxfer.so.$version" | grep NEEDED
LD_LIBRARY_PATH=$libdir ldd "$libdir/libkvxfer.so.0" >"$work/ldd.txt" || fail "ldd $libdir/libkvxfer.so.0"
if [ -n "$verbs_file" ]; then
    grep -Ei 'ibverbs|rdmacm|IPSec_MB' "$work/ldd.txt" &&
        fail "libkvxfer.so.0 loads the libraries above (ldd)"
    [ ! -e "$libdir/kvxfer-0" ] || fail "$libdir/kvxfer-0 exists without $verbs_pkg"
    echo "ok: ldd names no libibverbs, librdmacm or libIPSec_MB; no kvxfer-0/ without $verbs_pkg"
else
    echo "SKIP: no plugin build, verbs is in libkvxfer.so.0"
fi

step "the exported interface carries no private dependency"
if grep -v '^ *#' "$libdir"/cmake/kvxfer/*.cmake | grep -Ei 'openssl|crypto|ibverbs|rdmacm|nlohmann|kvxfer_core|Threads'; then
    fail "a private dependency leaks into the CMake package (lines above)"
fi
grep -q '^Libs: -L${libdir} -lkvxfer$' "$libdir/pkgconfig/kvxfer.pc" || fail "kvxfer.pc Libs is not just -lkvxfer"
grep -q '^libdir=${prefix}/'"${rel_lib#usr/}"'$' "$libdir/pkgconfig/kvxfer.pc" || fail "kvxfer.pc libdir is not \${prefix}/${rel_lib#usr/}"
echo "ok"

# ------------------------------------------------------------------ C via pkg-config
step "C consumer via pkg-config"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR KVXFER_LIB_DIR KVXFER_INCLUDE_DIR
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig"
pc_version=$(pkg-config --modversion kvxfer)
[ "$pc_version" = "$version" ] || fail "pkg-config --modversion says $pc_version, not $version"
cflags=$(pkg-config --cflags kvxfer)
libs=$(pkg-config --libs kvxfer)
echo "pkg-config --cflags: $cflags"
echo "pkg-config --libs:   $libs"
case "$cflags" in *"-I$root/"*) ;; *) fail "--cflags does not point into the root" ;; esac
case "$libs" in *"-L$root/"*) ;; *) fail "--libs does not point into the root" ;; esac
case "$libs" in *crypto*) fail "--libs exposes a private dependency" ;; esac
pkg-config --static --libs kvxfer | grep -q -- '-lcrypto' || fail "--static --libs lacks Libs.private"
mkdir -p "$work/c"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror $cflags -o "$work/c/consumer" \
    "$kvx_src/packaging/consumers/c/consumer.c" $libs
readelf -d "$work/c/consumer" | grep NEEDED
readelf -d "$work/c/consumer" | grep NEEDED | grep -Eq 'crypto|ibverbs|rdmacm|stdc\+\+' &&
    fail "the C consumer links a private dependency of libkvxfer"
run "$work/c/out" "the C consumer" "$work/c/consumer"
expect_root_library "$work/c/out" "the C consumer"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror $cflags -o "$work/c/verbs-check" \
    "$kvx_src/packaging/consumers/c/verbs-check.c" $libs

# ------------------------------------------------------------------ C++ via CMake
step "C++ consumer via find_package(kvxfer)"
# Debian's CMake does not search PREFIX/lib64/cmake (FIND_LIBRARY_USE_LIB64_PATHS
# is off there); Fedora's does. For the rpm root on this host, name the
# directory as a prefix of its own (PREFIX/<name>*/ is searched).
cxx_lib64=
[ "$fmt" = rpm ] && cxx_lib64="-DCMAKE_PREFIX_PATH=$root/usr;$root/usr/lib64/cmake"
cmake -S "$kvx_src/packaging/consumers/cxx" -B "$work/cxx" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$root/usr" ${cxx_lib64:+"$cxx_lib64"} \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" >"$work/cxx.log" 2>&1 ||
    { cat "$work/cxx.log" >&2; fail "cmake configure of the C++ consumer"; }
grep 'kvxfer .* from' "$work/cxx.log"
kvxfer_dir=$(sed -n 's/^kvxfer_DIR:PATH=//p' "$work/cxx/CMakeCache.txt")
case "$kvxfer_dir" in "$root"/*) ;; *) fail "find_package found kvxfer in $kvxfer_dir, not in the root" ;; esac
cmake --build "$work/cxx" >"$work/cxx-build.log" 2>&1 || { cat "$work/cxx-build.log" >&2; fail "C++ consumer build"; }
run "$work/cxx/out" "the C++ consumer" "$work/cxx/consumer-cxx"
expect_root_library "$work/cxx/out" "the C++ consumer"

# A newer major version must be refused (SameMajorVersion).
mkdir -p "$work/cxx-major"
cat >"$work/cxx-major/CMakeLists.txt" <<EOT
cmake_minimum_required(VERSION 3.16)
project(major NONE)
find_package(kvxfer 1 CONFIG QUIET)
if(kvxfer_FOUND)
  message(FATAL_ERROR "kvxfer $version accepted a request for major version 1")
endif()
EOT
cmake -S "$work/cxx-major" -B "$work/cxx-major/b" -DCMAKE_PREFIX_PATH="$root/usr" ${cxx_lib64:+"$cxx_lib64"} >/dev/null ||
    fail "find_package(kvxfer 1) was not refused"
echo "ok: find_package(kvxfer 1) refused by version $version"

# ------------------------------------------------------------------ kvxfer-bench
step "kvxfer-bench from the root"
run "$work/bench.out" "kvxfer-bench" "$root/usr/bin/kvxfer-bench" --backend tcp --block-size 64K \
    --duration 0.3 --warmup 0 --no-progress --option tcp.listen=127.0.0.1:0

step "kvxfer-info from the root"
run "$work/info.txt" "kvxfer-info" "$root/usr/bin/kvxfer-info"
"$root/usr/bin/kvxfer-info" --json >"$work/info.json" || fail "kvxfer-info --json exited with $?"
/usr/bin/python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
assert j["version"] == sys.argv[2], j["version"]
assert j["backends"]["tcp"]["usable"], j["backends"]["tcp"]["reason"]' "$work/info.json" "$version" ||
    fail "kvxfer-info --json: not version $version with tcp usable"

# ------------------------------------------------------------------ Go
step "Go package via #cgo pkg-config"
go_dir=$kvx_src/bindings/go
if [ ! -f "$go_dir/go.mod" ]; then
    echo "SKIP: bindings/go does not exist"
elif ! command -v go >/dev/null; then
    echo "SKIP: go is not installed (apt-get install golang-go)"
else
    # The test binary of package kvxfer, built through its #cgo pkg-config
    # line (PKG_CONFIG_LIBDIR is the root's), then run against the root.
    (cd "$go_dir" && GOCACHE="$work/go-cache" GOPATH="$work/go-path" GOFLAGS=-mod=mod GOPROXY=off \
        CGO_ENABLED=1 go test -c -o "$work/go.test" .) || fail "go test -c in bindings/go"
    LD_LIBRARY_PATH=$libdir ldd "$work/go.test" | grep -q "libkvxfer.so.0 => $libdir/libkvxfer.so.0" ||
        fail "the Go test binary does not resolve libkvxfer.so.0 in the root"
    (cd "$go_dir" && run "$work/go.out" "the Go package's tests" "$work/go.test" -test.count=1) || exit 1
fi

# ------------------------------------------------------------------ Rust
step "Rust crates via pkg-config"
rust_dir=$kvx_src/bindings/rust
if [ ! -f "$rust_dir/kvxfer-sys/Cargo.toml" ]; then
    echo "SKIP: bindings/rust does not exist"
elif ! command -v cargo >/dev/null; then
    echo "SKIP: cargo is not installed"
else
    # kvxfer-sys's build script links through `pkg-config --libs kvxfer`.
    (cd "$rust_dir" && CARGO_TARGET_DIR="$work/rust-target" CARGO_HOME="$work/cargo-home" \
        LD_LIBRARY_PATH=$libdir cargo test --offline --locked >"$work/rust.out" 2>&1) ||
        { cat "$work/rust.out"; fail "cargo test in bindings/rust"; }
    grep '^test result' "$work/rust.out" | awk '{ p += $4; f += $6 } END { print p " Rust tests passed, " f " failed" }'
    n=0
    for t in "$work"/rust-target/debug/deps/link-*; do
        [ -x "$t" ] || continue
        LD_LIBRARY_PATH=$libdir ldd "$t" | grep -q "libkvxfer.so.0 => $libdir/libkvxfer.so.0" ||
            fail "the Rust test binary $t does not resolve libkvxfer.so.0 in the root"
        n=$((n + 1))
    done
    [ "$n" -gt 0 ] || fail "no kvxfer-sys link test binary found"
    echo "ok: kvxfer-sys's link test resolves libkvxfer.so.0 in the root"
fi

# ------------------------------------------------------------------ Python
step "Python module (python3-kvxfer)"
if ls "$build"/packages/python3-kvxfer[-_]*."$fmt" >/dev/null 2>&1; then
    run "$work/python.out" "the Python consumer" env KVXFER_NO_VLLM=1 PYTHONDONTWRITEBYTECODE=1 \
        PYTHONNOUSERSITE=1 PYTHONPATH="$pydir" \
        /usr/bin/python3 "$kvx_src/packaging/consumers/python/consumer.py"
    grep -q "^module: $pydir/kvxfer/" "$work/python.out" ||
        fail "the Python consumer did not import the root's module"
    expect_root_library "$work/python.out" "the Python consumer"
else
    echo "SKIP: no python3-kvxfer package (bindings/python absent, or -DKVX_PACKAGE_PYTHON=OFF)"
fi

# ------------------------------------------------------------------ verbs
# The plugin is looked for in KVX_PLUGIN_PATH, then kvxfer-0/ beside the
# libkvxfer.so.0 that runs (the root's), then the compiled-in /usr/LIBDIR/kvxfer-0
# of this host: neither of the others may hold one.
unset KVX_PLUGIN_PATH
verbs_check() { # OUT
    run "$1" "verbs-check" env KVX_LOG=info "$work/c/verbs-check"
    expect_root_library "$1" "verbs-check"
    sed -n 's/^message: //p' "$1" >"$1.msg"
}
step "backend=verbs without $verbs_pkg"
if [ -z "$verbs_file" ]; then
    echo "SKIP: no plugin build"
else
    host_plugin=/$rel_lib/kvxfer-0/libkvxfer-verbs.so
    [ ! -e "$host_plugin" ] ||
        fail "this host has $host_plugin (an installed kvxfer), which the root's library would try: remove it to run this test"
    verbs_check "$work/verbs-without.out"
    grep -qx 'result: KVX_ENOTSUP' "$work/verbs-without.out" || fail "backend=verbs did not fail with KVX_ENOTSUP"
    grep -q 'libkvxfer-verbs\.so' "$work/verbs-without.out.msg" ||
        fail "backend=verbs failed without naming libkvxfer-verbs.so"
    grep -qF "$libdir/kvxfer-0" "$work/verbs-without.out.msg" ||
        fail "the message does not say it searched $libdir/kvxfer-0"
    echo "ok: KVX_ENOTSUP, naming libkvxfer-verbs.so and the directories searched"

    step "backend=verbs with $verbs_pkg"
    unpack "$verbs_file"
    plugin=$libdir/kvxfer-0/libkvxfer-verbs.so
    [ -f "$plugin" ] || fail "missing /$rel_lib/kvxfer-0/libkvxfer-verbs.so"
    readelf -d "$plugin" | grep -E 'NEEDED|SONAME'
    readelf -d "$plugin" | grep -q '(SONAME)' && fail "the plugin has a SONAME"
    readelf -d "$plugin" | grep -Eq 'RPATH|RUNPATH' && fail "the plugin has an RPATH/RUNPATH"
    for l in libkvxfer.so.0 libibverbs.so.1 librdmacm.so.1; do
        readelf -d "$plugin" | grep -q "NEEDED.*\[$l\]" || fail "the plugin does not link $l"
    done
    file -L "$plugin" | grep -q ', stripped' || fail "$plugin is not stripped"
    [ "$(nm -D --defined-only "$plugin" | awk '{ print $3 }')" = kvx_plugin_entry ] ||
        fail "the plugin exports more than kvx_plugin_entry: $(nm -D --defined-only "$plugin" | awk '{ print $3 }' | tr '\n' ' ')"
    verbs_check "$work/verbs-with.out"
    grep -qF "info: verbs: plugin $plugin loaded" "$work/verbs-with.out" ||
        fail "the root's plugin was not loaded (no 'verbs: plugin $plugin loaded' at KVX_LOG=info)"
    grep -q 'libkvxfer-verbs\.so' "$work/verbs-with.out.msg" &&
        fail "backend=verbs still fails because of the plugin"
    if grep -qx 'result: ok' "$work/verbs-with.out"; then
        echo "ok: the plugin loaded from the root, and this host has an RDMA device: verbs works"
    else
        echo "ok: the plugin loaded from the root; verbs fails for its own reason (no RDMA device here): $(cat "$work/verbs-with.out.msg")"
    fi
fi

step "all passed"
