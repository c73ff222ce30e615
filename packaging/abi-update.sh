#!/bin/sh
# Regenerate the ABI baseline that packaging/abi-check.sh compares against:
# abi/libkvxfer.so.0.abi (abidw) and abi/kvxfer.h.constants, from the library
# in BUILD_DIR (with debug info). Shows what changed against the old baseline.
#
#   packaging/abi-update.sh [BUILD_DIR]     default BUILD_DIR: build
#
# Run it when a release adds functions (after adding their version node to
# src/kvxfer.map), and commit the result with that change. Never to make an
# incompatible change pass: see docs/versioning.md.
set -eu
. "$(dirname "$0")/common.sh"
build=${1:-$kvx_src/build}
lib=$build/libkvxfer.so.0
[ -e "$lib" ] || kvx_die "no $lib: build the library first (make build)"
command -v abidiff >/dev/null || kvx_die "abidiff missing: apt-get install abigail-tools"

work=$(mktemp -d "${TMPDIR:-/tmp}/kvxfer-abi-update.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$kvx_src/abi"

kvx_abidw "$lib" "$work/new.abi"
kvx_constants "$work/new.constants" "$work"
if [ -f "$kvx_abi_baseline" ]; then
    rc=0
    abidiff "$kvx_abi_baseline" "$work/new.abi" || rc=$?
    [ $((rc & 8)) -eq 0 ] || echo "abi-update: WARNING: this is an incompatible change (ABIDIFF_ABI_INCOMPATIBLE_CHANGE)" >&2
fi
[ -f "$kvx_abi_constants" ] && { diff -u "$kvx_abi_constants" "$work/new.constants" || true; }
cp "$work/new.abi" "$kvx_abi_baseline"
cp "$work/new.constants" "$kvx_abi_constants"
echo "abi-update: wrote abi/libkvxfer.so.0.abi and abi/kvxfer.h.constants from $lib"
