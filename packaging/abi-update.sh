#!/bin/sh
# Regenerate the ABI baseline that packaging/abi-check.sh compares against:
# abi/libkvxfer.so.0.abi (abidw, without the KVXFER_PRIVATE internals of a
# plugin build: packaging/abi/kvxfer-private.suppr) and abi/kvxfer.h.constants,
# from the library in BUILD_DIR (with debug info), and the plugin interface's
# record abi/plugin-entry.txt (kPluginAbi and struct PluginEntry of
# src/registry/plugin.h). Shows what changed against the old baseline.
#
#   packaging/abi-update.sh [BUILD_DIR]     default BUILD_DIR: build
#
# Run it when a release adds functions (after adding their version node to
# src/kvxfer.map), or after bumping kPluginAbi for a changed struct
# PluginEntry, and commit the result with that change. Never to make an
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
    abidiff --suppressions "$kvx_abi_suppr" "$kvx_abi_baseline" "$work/new.abi" || rc=$?
    [ $((rc & 8)) -eq 0 ] || echo "abi-update: WARNING: this is an incompatible change (ABIDIFF_ABI_INCOMPATIBLE_CHANGE)" >&2
fi
[ -f "$kvx_abi_constants" ] && { diff -u "$kvx_abi_constants" "$work/new.constants" || true; }
if grep -q "version='KVXFER_PRIVATE'" "$work/new.abi"; then
    kvx_die "KVXFER_PRIVATE symbols left in the ABI file (packaging/abi/kvxfer-private.suppr): not written"
fi

# The plugin interface.
kvx_plugin_entry_text "$kvx_plugin_header" >"$work/plugin-entry.body" || kvx_die "cannot read src/registry/plugin.h"
{
    echo "# The plugin interface (src/registry/plugin.h): kPluginAbi and struct"
    echo "# PluginEntry, comments and blank lines removed, white space squeezed."
    echo "# packaging/abi-check.sh (f) fails when the struct changes and kPluginAbi"
    echo "# does not. Written by packaging/abi-update.sh."
    cat "$work/plugin-entry.body"
} >"$work/plugin-entry.txt"
if [ -f "$kvx_plugin_record" ]; then
    old_abi=$(sed -n 's/^kPluginAbi //p' "$kvx_plugin_record")
    new_abi=$(sed -n 's/^kPluginAbi //p' "$work/plugin-entry.body")
    sed 1d "$work/plugin-entry.body" >"$work/new.struct"
    grep -v '^#' "$kvx_plugin_record" | sed 1d >"$work/old.struct"
    diff -u "$kvx_plugin_record" "$work/plugin-entry.txt" || true
    if ! cmp -s "$work/old.struct" "$work/new.struct" && [ "$old_abi" = "$new_abi" ]; then
        kvx_die "struct PluginEntry changed but kPluginAbi is still $new_abi: bump kPluginAbi in src/registry/plugin.h first (abi/plugin-entry.txt not written)"
    fi
    [ "$new_abi" -ge "$old_abi" ] || kvx_die "kPluginAbi went down from $old_abi to $new_abi (abi/plugin-entry.txt not written)"
fi

cp "$work/new.abi" "$kvx_abi_baseline"
cp "$work/new.constants" "$kvx_abi_constants"
cp "$work/plugin-entry.txt" "$kvx_plugin_record"
echo "abi-update: wrote abi/libkvxfer.so.0.abi and abi/kvxfer.h.constants from $lib, abi/plugin-entry.txt from src/registry/plugin.h"
