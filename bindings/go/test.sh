#!/bin/bash
# Checks of the Go binding; `make test` calls it (through scripts/test.sh).
#
#   bindings/go/test.sh [BUILD_DIR]        BUILD_DIR defaults to ./build
#
# 1. Installs golang-go, swig and pkg-config with apt-get when missing.
# 2. Stages the C library: cmake --install BUILD_DIR --prefix BUILD_DIR/stage,
#    and points PKG_CONFIG_PATH, LD_LIBRARY_PATH and an rpath at it.
# 3. gofmt -l (must print nothing), go vet (the SWIG-generated internal/capi
#    with -unsafeptr=false: its generated code trips that one check),
#    go test ./... (with KVX_REQUIRE_SWIG=1: the generated files must be
#    fresh), go test -race ./... and GODEBUG=cgocheck=2 go test.
# 4. Builds the examples into BUILD_DIR/go/bin, runs the quickstart, and runs
#    tests/interop/run.sh over separate processes: go:go, plus go:c and c:go
#    when BUILD_DIR has the C interop program. BUILD_DIR/go/bin/interop is
#    the program for KVX_INTEROP_GO.
#
# Go's caches and GOPATH live under BUILD_DIR/go; nothing is written into the
# source tree or $HOME. No network: GOPROXY=off (the module has no
# dependencies). Exits non-zero on the first failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${1:-$REPO/build}
[ -d "$BUILD" ] || { echo "go: build directory '$BUILD' does not exist (build the C library first)" >&2; exit 1; }
BUILD=$(cd "$BUILD" && pwd)

step() { printf '== go: %s\n' "$*"; }

# -- 1. tools ---------------------------------------------------------------
missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v swig >/dev/null 2>&1 || missing+=(swig)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    SUDO=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "go: need ${missing[*]} (run as root or install them)" >&2; exit 1; }
        SUDO="sudo -n"
    fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
gover=$(go env GOVERSION)
case "$gover" in
    go1.1[0-8]|go1.1[0-8].*|go1.[0-9]|go1.[0-9].*)
        echo "go: $gover is too old, need go1.19 or newer" >&2; exit 1 ;;
esac
step "$gover, $(swig -version | awk '/SWIG Version/{print "swig " $3}')"

# -- 2. stage the C library ---------------------------------------------------
STAGE=$BUILD/stage
step "staging the C library into $STAGE"
cmake --install "$BUILD" --prefix "$STAGE" >/dev/null
PC=$(find "$STAGE" -name kvxfer.pc -path '*pkgconfig*' | head -n 1)
SO=$(find "$STAGE" -name 'libkvxfer.so' | head -n 1)
[ -n "$PC" ] && [ -n "$SO" ] || { echo "go: no kvxfer.pc or libkvxfer.so under $STAGE" >&2; exit 1; }
LIBDIR=$(dirname "$SO")

export PKG_CONFIG_PATH="$(dirname "$PC")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CGO_ENABLED=1
export CGO_LDFLAGS="-Wl,-rpath,$LIBDIR${CGO_LDFLAGS:+ $CGO_LDFLAGS}"
export GOPROXY=off GOFLAGS= GO111MODULE=on GOTOOLCHAIN=local GOTELEMETRY=off
export GOCACHE=$BUILD/go/cache GOPATH=$BUILD/go/path GOMODCACHE=$BUILD/go/path/pkg/mod
export GOENV=off
export KVX_REQUIRE_SWIG=1
BIN=$BUILD/go/bin
mkdir -p "$GOCACHE" "$GOPATH" "$BIN"

cd "$HERE"

# -- 3. format, vet, tests ----------------------------------------------------
step "gofmt -l"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
    echo "go: not gofmt-formatted:" >&2; echo "$unformatted" >&2; exit 1
fi

step "go vet"
go vet $(go list ./... | grep -v '/internal/capi$')
go vet -unsafeptr=false ./internal/capi

step "go test ./..."
go test -count=1 ./...

race_syso="$(go env GOROOT)/src/runtime/race/race_$(go env GOOS)_$(go env GOARCH).syso"
if [ -f "$race_syso" ]; then
    step "go test -race ./..."
    go test -race -count=1 ./...
else
    step "go test -race: skipped (no $race_syso)"
fi

step "GODEBUG=cgocheck=2 go test ./..."
GODEBUG=cgocheck=2 go test -count=1 ./...

# -- 4. examples ----------------------------------------------------------------
step "building the examples into $BIN"
go build -o "$BIN/quickstart" ./examples/quickstart
go build -o "$BIN/interop" ./examples/interop

step "running the quickstart"
(unset LD_LIBRARY_PATH; "$BIN/quickstart")   # the rpath alone must find the library

pairs="go:go"
C_INTEROP=${KVX_INTEROP_C:-$BUILD/tests/interop/interop}
if [ -x "$C_INTEROP" ]; then
    pairs="go:go go:c c:go"
else
    step "no C interop program at $C_INTEROP: running go:go only"
fi
step "interop between processes: $pairs"
KVX_INTEROP_C="$C_INTEROP" KVX_INTEROP_GO="$BIN/interop" KVX_INTEROP_PAIRS="$pairs" \
    bash "$REPO/tests/interop/run.sh" "$BUILD"

step "all checks passed (interop program: $BIN/interop)"
