#!/usr/bin/env bash
# Regenerate kvxfer-sys/src/bindings.rs from include/kvxfer.h with bindgen.
#
#   regen.sh           rewrite src/bindings.rs
#   regen.sh --check   exit 1 (and show a diff) when the committed file differs
#                      from what the header generates now
#
# The output is byte-for-byte reproducible: bindgen 0.60 (Debian 12 package
# `bindgen`, needs libclang1-14 and libclang-common-14-dev) with pinned flags,
# without doc comments (the header is the documentation; a comment edit in it
# changes nothing here) and without its own rustfmt call, then formatted by
# rustfmt with an empty configuration (edition 2021): one item per line.
# rustfmt 1.5 (Debian 12 package `rustfmt`) and 1.9 (rustup) give the same
# file.
# Environment: BINDGEN (bindgen binary, default `bindgen`), RUSTFMT (rustfmt
# binary, default the first of /usr/bin/rustfmt, `rustfmt` on PATH,
# ~/.cargo/bin/rustfmt), KVXFER_HEADER (header, default the repository's
# include/kvxfer.h).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
header=${KVXFER_HEADER:-$here/../../../include/kvxfer.h}
bindgen=${BINDGEN:-bindgen}
out=$here/src/bindings.rs
want_version=0.60.

mode=write
case "${1:-}" in
    --check) mode=check ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

if ! command -v "$bindgen" >/dev/null 2>&1; then
    echo "regen.sh: '$bindgen' not found (apt-get install bindgen libclang1-14 libclang-common-14-dev)" >&2
    exit 3
fi
version=$("$bindgen" --version | awk '{print $2}')
case "$version" in
    "$want_version"*) ;;
    *) echo "regen.sh: bindgen $version found, the committed bindings are pinned to ${want_version}x" >&2
       exit 3 ;;
esac
rustfmt=${RUSTFMT:-}
if [ -z "$rustfmt" ]; then
    for r in /usr/bin/rustfmt "$(command -v rustfmt || true)" "$HOME/.cargo/bin/rustfmt"; do
        if [ -n "$r" ] && [ -x "$r" ] && "$r" --version >/dev/null 2>&1; then rustfmt=$r; break; fi
    done
fi
if [ -z "$rustfmt" ]; then
    echo "regen.sh: rustfmt not found (apt-get install rustfmt, or set RUSTFMT)" >&2
    exit 3
fi
[ -r "$header" ] || { echo "regen.sh: header $header not readable" >&2; exit 3; }
header=$(cd "$(dirname "$header")" && pwd)/$(basename "$header")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tmp=$work/bindings.rs
: >"$work/rustfmt.toml" # rustfmt's defaults, whatever configuration surrounds the caller
export LC_ALL=C
"$bindgen" \
    --no-rustfmt-bindings \
    --no-doc-comments \
    --rust-target 1.47 \
    --allowlist-function 'kvx_.*' \
    --allowlist-type 'kvx_.*' \
    --allowlist-var 'KVX_.*' \
    --size_t-is-usize \
    --no-prepend-enum-name \
    --default-enum-style consts \
    --no-layout-tests \
    -o "$work/raw.rs" \
    "$header" -- -std=c99
"$rustfmt" --edition 2021 --config-path "$work/rustfmt.toml" --emit stdout <"$work/raw.rs" >"$tmp"

if [ "$mode" = check ]; then
    if cmp -s "$tmp" "$out"; then
        echo "regen.sh: $out is up to date with $header"
        exit 0
    fi
    echo "regen.sh: $out is STALE relative to $header; run $0 and commit the result" >&2
    diff -u "$out" "$tmp" | head -n 40 >&2 || true
    exit 1
fi
cat "$tmp" >"$out" # keeps the file's mode (mktemp's is 0600)
echo "regen.sh: wrote $out"
