#!/usr/bin/env bash
# Test the Rust bindings against a CMake build of libkvxfer.
#
#   bindings/rust/test.sh [BUILD_DIR]        (default: <repo>/build)
#
# 1. installs missing Debian packages (bindgen libclang1-14
#    libclang-common-14-dev rustfmt rustc cargo pkg-config; apt-get needs root),
# 2. stages the C library: cmake --install BUILD_DIR --prefix BUILD_DIR/stage,
# 3. checks that kvxfer-sys/src/bindings.rs is fresh (regen.sh --check),
# 4. runs `cargo test --offline --locked` with rustup's toolchain (when there
#    is one) and with Debian's rustc 1.63 / cargo 1.65, each with its own
#    CARGO_HOME and CARGO_TARGET_DIR under BUILD_DIR/rust,
# 5. runs the examples (quickstart; interop target + initiator, two processes).
# Exits non-zero on the first failure. Nothing is written into the source tree.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_arg=${1:-$repo/build}
[ -d "$build_arg" ] || { echo "rust test: build dir $build_arg does not exist (build the C library first)" >&2; exit 2; }
build=$(cd "$build_arg" && pwd)
stage=$build/stage
work=$build/rust

say() { echo "=== rust: $*"; }

# ---------------------------------------------------------------- packages
. "$repo/scripts/need-packages.sh"
kvx_need_packages "rust test" bindgen libclang1-14 libclang-common-14-dev rustfmt rustc cargo pkg-config

# ---------------------------------------------------------------- stage the C library
say "staging $build into $stage"
cmake --install "$build" --prefix "$stage" >/dev/null
pc=$(find "$stage" -name kvxfer.pc -print -quit)
lib=$(find "$stage" -name 'libkvxfer.so' -print -quit)
[ -n "$pc" ] && [ -n "$lib" ] || { echo "rust test: no kvxfer.pc / libkvxfer.so under $stage" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset KVXFER_LIB_DIR
pkg-config --exists kvxfer || { echo "rust test: pkg-config cannot find kvxfer via $PKG_CONFIG_PATH" >&2; exit 1; }

# ---------------------------------------------------------------- bindings
say "bindings freshness"
"$here/kvxfer-sys/regen.sh" --check

# ---------------------------------------------------------------- toolchains
# name:cargo:rustc:rustdoc
toolchains=()
rustup_cargo=""
for c in "$(command -v cargo || true)" "${CARGO_HOME:-$HOME/.cargo}/bin/cargo"; do
    if [ -n "$c" ] && [ -x "$c" ] && [ "$(readlink -f "$c")" != /usr/bin/cargo ]; then
        rustup_cargo=$c
        break
    fi
done
if [ -n "$rustup_cargo" ]; then
    d=$(dirname "$rustup_cargo")
    toolchains+=("rustup:$rustup_cargo:$d/rustc:$d/rustdoc")
else
    say "no rustup toolchain found: testing with Debian's only"
fi
toolchains+=("debian:/usr/bin/cargo:/usr/bin/rustc:/usr/bin/rustdoc")

run_examples() { # target dir
    local bin=$1/debug/examples tmp out_t out_i pid rc=0
    "$bin/quickstart"
    tmp=$(mktemp -d "$work/interop.XXXXXX")
    timeout 120 "$bin/interop" target "$tmp" >"$tmp/target.out" 2>&1 &
    pid=$!
    timeout 120 "$bin/interop" initiator "$tmp" >"$tmp/initiator.out" 2>&1 || rc=$?
    wait "$pid" || rc=$?
    out_t=$(cat "$tmp/target.out")
    out_i=$(cat "$tmp/initiator.out")
    echo "interop target:    $(echo "$out_t" | tr '\n' ' ')"
    echo "interop initiator: $(echo "$out_i" | tr '\n' ' ')"
    rm -rf "$tmp"
    [ "$rc" -eq 0 ] && [ "$(echo "$out_t" | tail -n1)" = verified ] && [ "$(echo "$out_i" | tail -n1)" = sent ] \
        && [ "$(echo "$out_t" | head -n1)" = "$(echo "$out_i" | head -n1)" ] || {
        echo "rust test: interop example failed (rc $rc)" >&2
        return 1
    }
}

mkdir -p "$work"
for tc in "${toolchains[@]}"; do
    IFS=: read -r name cargo rustc rustdoc <<<"$tc"
    say "toolchain $name: $("$cargo" --version), $("$rustc" --version)"
    (
        export CARGO_HOME=$work/cargo-home-$name
        export CARGO_TARGET_DIR=$work/target-$name
        export RUSTC=$rustc RUSTDOC=$rustdoc
        export KVXFER_REQUIRE_BINDGEN=1 KVXFER_REQUIRE_EXAMPLES=1 RUST_BACKTRACE=1
        cd "$here"
        "$cargo" test --offline --locked
        "$cargo" build --offline --locked --examples
        run_examples "$CARGO_TARGET_DIR"
    )
    say "toolchain $name: OK"
done
# ---------------------------------------------------------------- KVXFER_LIB_DIR
# The alternative to pkg-config: link straight from the CMake build tree.
libdir=$(dirname "$(find "$build" -maxdepth 3 -name libkvxfer.so -not -path "$stage/*" -print -quit)")
say "KVXFER_LIB_DIR=$libdir (no pkg-config), Debian toolchain"
(
    unset PKG_CONFIG_PATH
    export KVXFER_LIB_DIR=$libdir LD_LIBRARY_PATH=$libdir
    export CARGO_HOME=$work/cargo-home-debian CARGO_TARGET_DIR=$work/target-libdir
    export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
    cd "$here"
    /usr/bin/cargo test --offline --locked -p kvxfer-sys --test link
)
# For tests/interop/run.sh (the examples need LD_LIBRARY_PATH, not an rpath).
interop_cmd="env LD_LIBRARY_PATH=$(dirname "$lib") $work/target-debian/debug/examples/interop"
echo "$interop_cmd" >"$work/KVX_INTEROP_RS"
say "interop command (also in $work/KVX_INTEROP_RS): KVX_INTEROP_RS=\"$interop_cmd\""
say "all passed"
