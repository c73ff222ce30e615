#!/bin/sh
# Build the Debian packages (libkvxfer0, libkvxfer-dev, kvxfer-tools, and
# python3-kvxfer from bindings/python, see cmake/PythonPackage.cmake), then
# check them with lintian (errors fail the build; skipped if lintian is absent).
#
#   packaging/build-deb.sh [BUILD_DIR]     default BUILD_DIR: build-deb
#
# The .debs are left in BUILD_DIR/packages/. Needs cmake, dpkg-dev (for
# dpkg-shlibdeps), file, gzip, and for python3-kvxfer swig, python3-dev,
# python3-setuptools; fakeroot is not needed (CPack writes root-owned archives).
# KVX_CMAKE_ARGS adds configure arguments (e.g. -DKVX_PACKAGE_PYTHON=OFF).
set -eu
. "$(dirname "$0")/common.sh"
build=${1:-$kvx_src/build-deb}

version=$(kvx_version)
head -n 1 "$kvx_src/packaging/debian/changelog" | grep -q "^kvxfer ($version-" ||
    kvx_die "packaging/debian/changelog has no entry for $version (first line: $(head -n 1 "$kvx_src/packaging/debian/changelog")): add it to NEWS.md and run scripts/gen-changelogs.sh"
command -v dpkg-shlibdeps >/dev/null || kvx_die "dpkg-shlibdeps missing: apt-get install dpkg-dev"

# shellcheck disable=SC2086
kvx_configure "$build" DEB ${KVX_CMAKE_ARGS:-}
cmake --build "$build" -j "$kvx_jobs"
rm -rf "$build/packages"
(cd "$build" && cpack -G DEB)

debs=$(ls "$build"/packages/*.deb)

# CPack gives every package with a library under /usr/lib a postinst and a
# postrm that only run ldconfig. libkvxfer0's "activate-noawait ldconfig"
# trigger does that job (lintian: maintscript-calls-ldconfig), so such scripts
# are dropped and the package rebuilt; any other script stops the build.
for d in $debs; do
    t=$(mktemp -d)
    chmod 0755 "$t"  # the package root "./" (mktemp makes it 0700)
    dpkg-deb -R "$d" "$t"
    changed=
    for s in postinst postrm; do
        f=$t/DEBIAN/$s
        [ -f "$f" ] || continue
        if grep -v -x -e '#!/bin/sh' -e 'set -e' -e '' -e 'fi' -e '	ldconfig' \
                -e 'if \[ "\$1" = "configure" \]; then' -e 'if \[ "\$1" = "remove" \]; then' "$f"; then
            kvx_die "$d: $s does more than run ldconfig (lines above); not dropped"
        fi
        rm "$f"
        changed=1
    done
    if [ -n "$changed" ]; then
        dpkg-deb --root-owner-group -Zxz -b "$t" "$d" >/dev/null
    fi
    rm -rf "$t"
done
for d in $debs; do
    echo "== $d"
    dpkg-deb -f "$d" Package Version Architecture Depends
done
if command -v lintian >/dev/null; then
    # shellcheck disable=SC2086
    lintian --fail-on error --display-info $debs
else
    echo "$0: lintian not installed, packages not checked" >&2
fi
