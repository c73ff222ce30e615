# Shared by the packaging scripts (sourced, POSIX sh).
kvx_src=$(cd "$(dirname "$0")/.." && pwd)
kvx_jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

kvx_die() { echo "$0: $*" >&2; exit 1; }

# The project version, from CMakeLists.txt's project() line.
kvx_version() {
    sed -n 's/^project(kvxfer VERSION \([0-9][0-9.]*\).*/\1/p' "$kvx_src/CMakeLists.txt"
}

# Hardened release flags (Debian's dpkg-buildflags when present). Run from the
# source root, so that -ffile-prefix-map maps it to "." in the debug info.
kvx_buildflags() {
    if command -v dpkg-buildflags >/dev/null 2>&1; then
        export DEB_BUILD_MAINT_OPTIONS=hardening=+all
        kvx_cflags="$(cd "$kvx_src" && dpkg-buildflags --get CFLAGS) $(cd "$kvx_src" && dpkg-buildflags --get CPPFLAGS)"
        kvx_cxxflags="$(cd "$kvx_src" && dpkg-buildflags --get CXXFLAGS) $(cd "$kvx_src" && dpkg-buildflags --get CPPFLAGS)"
        kvx_ldflags=$(cd "$kvx_src" && dpkg-buildflags --get LDFLAGS)
    else
        kvx_cflags="-g -O2 -fstack-protector-strong -D_FORTIFY_SOURCE=2 -ffile-prefix-map=$kvx_src=."
        kvx_cxxflags=$kvx_cflags
        kvx_ldflags="-Wl,-z,relro -Wl,-z,now"
    fi
}

# kvx_configure BUILD_DIR FORMAT [cmake args...]: a release tree for /usr.
kvx_configure() {
    b=$1 fmt=$2
    shift 2
    kvx_buildflags
    cmake -S "$kvx_src" -B "$b" \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
        -DKVX_PACKAGE="$fmt" -DBUILD_TESTING=OFF -DKVX_SANITIZE= -DKVX_FUZZ=OFF \
        -DCMAKE_C_FLAGS="$kvx_cflags" -DCMAKE_CXX_FLAGS="$kvx_cxxflags" \
        -DCMAKE_SHARED_LINKER_FLAGS="$kvx_ldflags" -DCMAKE_EXE_LINKER_FLAGS="$kvx_ldflags" \
        -DCMAKE_MODULE_LINKER_FLAGS="$kvx_ldflags" \
        -DCMAKE_STRIP="$kvx_src/packaging/strip.sh" \
        "$@"
}

# ---------------------------------------------------------------- ABI
# The ABI baseline: libabigail's view of the exported functions of
# libkvxfer.so.0 and of the public types they use (nothing else: the library
# is C++ inside). Locations, paths and DT_NEEDED are left out and type ids are
# hashes, so the same library gives the same file wherever it was built; the
# one path abidw writes (the translation unit of the C API) is made relative.
#
# In a plugin build (-DKVX_PLUGINS=ON) the library also exports its internals
# in the version node KVXFER_PRIVATE, for libkvxfer-verbs.so alone: not ABI,
# different in every build. packaging/abi/kvxfer-private.suppr leaves them
# out: abidw drops them (so a plugin build and a -DKVX_PLUGINS=OFF build give
# the same file), abidiff suppresses whatever is left. Translation units left
# empty by the drop are removed from the file.
kvx_abi_baseline=$kvx_src/abi/libkvxfer.so.0.abi
kvx_abi_constants=$kvx_src/abi/kvxfer.h.constants
kvx_abi_suppr=$kvx_src/packaging/abi/kvxfer-private.suppr
# The plugin interface's record: kPluginAbi and struct PluginEntry of
# src/registry/plugin.h (kvx_plugin_entry_text).
kvx_plugin_record=$kvx_src/abi/plugin-entry.txt
kvx_plugin_header=$kvx_src/src/registry/plugin.h

kvx_abidw() { # LIB OUT
    command -v abidw >/dev/null || kvx_die "abidw missing: apt-get install abigail-tools"
    readelf -S --wide "$1" | grep -q '\.debug_info' ||
        kvx_die "$1 has no debug info (build with CMAKE_BUILD_TYPE=RelWithDebInfo or Debug)"
    abidw --suppressions "$kvx_abi_suppr" \
        --headers-dir "$kvx_src/include" --drop-private-types --exported-interfaces-only \
        --no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed --type-id-style hash \
        --out-file "$2.tmp" "$1"
    sed -e "s|path='$kvx_src/|path='|" -e "s|path='\./|path='|" "$2.tmp" |
        awk '/^  <abi-instr .*[^\/]>$/ { held = $0; next }
             held != "" { if ($0 == "  </abi-instr>") { held = ""; next } print held; held = "" }
             { print }' >"$2"
    rm -f "$2.tmp"
}

# The plugin interface as recorded in abi/plugin-entry.txt: "kPluginAbi N",
# then the definition of struct PluginEntry with comments and blank lines
# removed and white space squeezed, one member per line. Fails (status 1,
# message on stderr) when the header has no such definition.
kvx_plugin_entry_text() { # HEADER
    _kvx_pabi=$(sed -n 's/^ *inline constexpr uint32_t kPluginAbi = \([0-9][0-9]*\);.*/\1/p' "$1")
    [ -n "$_kvx_pabi" ] || { echo "$1: no 'inline constexpr uint32_t kPluginAbi = N;'" >&2; return 1; }
    _kvx_pbody=$(sed -e 's|//.*||' -e 's|/\*.*\*/||g' "$1" |
           awk '/^struct PluginEntry *\{/ { on = 1 } on { print } on && /^\};/ { exit }' |
           tr -s ' \t' '  ' | sed -e 's/^ //' -e 's/ $//' -e '/^$/d')
    case $_kvx_pbody in *"};") ;; *) echo "$1: no 'struct PluginEntry { ... };' at the start of a line" >&2; return 1 ;; esac
    echo "kPluginAbi $_kvx_pabi"
    echo "$_kvx_pbody"
}

# The values of the public header's constants (enumerators and object-like
# macros with a scalar value: not the version macros, which change every
# release, nor initializers like KVX_STATS_INIT), one
# "NAME VALUE" per line, sorted: compiled, so a value is what a caller's
# compiler sees.
kvx_constants() { # OUT WORKDIR
    names=$(sed -n -e 's/^ *\(KVX_[A-Z0-9_]*\) *=.*/\1/p' \
                   -e 's/^#define \(KVX_[A-Z0-9_]*\)[ \t][ \t]*[^ \t{\\].*/\1/p' "$kvx_src/include/kvxfer.h" \
                   "$kvx_src"/include/kvxfer/*.h |
            grep -v -e '^KVX_VERSION_' -e '^KVX_API$' | sort -u)
    {
        echo '#include <stdio.h>'
        echo '#include <kvxfer.h>'
        echo 'int main(void) {'
        for n in $names; do
            printf '    printf("%%s %%lld\\n", "%s", (long long)(%s));\n' "$n" "$n"
        done
        echo '    return 0;'
        echo '}'
    } >"$2/constants.c"
    cc -std=c99 -I"$kvx_src/include" -o "$2/constants" "$2/constants.c"
    "$2/constants" | LC_ALL=C sort >"$1"
}
