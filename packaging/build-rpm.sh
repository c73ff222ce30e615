#!/bin/sh
# Build the RPM packages (kvxfer-libs, kvxfer-devel, kvxfer-tools, and
# python3-kvxfer for this machine's Python minor version) in their own build tree with the RPM
# layout (/usr/lib64), then check them with rpmlint: any error not explained
# in packaging/rpm/rpmlint.toml fails.
#
#   packaging/build-rpm.sh [BUILD_DIR]     default BUILD_DIR: build-rpm
#
# The .rpms are left in BUILD_DIR/packages/. Needs cmake, rpm (rpmbuild), file.
# KVX_CMAKE_ARGS adds configure arguments.
set -eu
. "$(dirname "$0")/common.sh"
build=${1:-$kvx_src/build-rpm}

version=$(kvx_version)
head -n 1 "$kvx_src/packaging/rpm/changelog" | grep -q -- "- $version-" ||
    kvx_die "packaging/rpm/changelog has no entry for $version (first line: $(head -n 1 "$kvx_src/packaging/rpm/changelog")): add it to NEWS.md and run scripts/gen-changelogs.sh"
command -v rpmbuild >/dev/null || kvx_die "rpmbuild missing: apt-get install rpm"

# A tree of its own: GNUInstallDirs would give the Debian multiarch libdir.
# RPM installs shared libraries executable (rpmlint: shared-library-not-executable).
# shellcheck disable=SC2086
kvx_configure "$build" RPM -DCMAKE_INSTALL_LIBDIR=lib64 -DCMAKE_INSTALL_SO_NO_EXE=OFF ${KVX_CMAKE_ARGS:-}
cmake --build "$build" -j "$kvx_jobs"
rm -rf "$build/packages"
(cd "$build" && cpack -G RPM)

rpms=$(ls "$build"/packages/*.rpm)
for r in $rpms; do
    echo "== $r"
    rpm -qp --qf '%{NAME}-%{VERSION}-%{RELEASE}.%{ARCH}\n' "$r"
    rpm -qp --requires "$r" | grep -v '^rpmlib(' | sed 's/^/  requires: /'
done
if command -v rpmlint >/dev/null; then
    # shellcheck disable=SC2086
    rpmlint -c "$kvx_src/packaging/rpm/rpmlint.toml" $rpms
else
    echo "$0: rpmlint not installed, packages not checked" >&2
fi
