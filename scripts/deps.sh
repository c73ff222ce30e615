#!/bin/sh
# Installs the Debian 12 packages kvxfer needs to build and test, only those
# missing. Usage: scripts/deps.sh [build|test|all]   (default: all)
set -eu
build="cmake make g++ pkgconf libssl-dev nlohmann-json3-dev libibverbs-dev librdmacm-dev"
# Intel's ipsec-mb (tcp.aead_impl): packaged for amd64 only; optional elsewhere.
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then build="$build libipsec-mb-dev"; fi
test="libcmocka-dev python3 iperf3 clang libclang-rt-14-dev valgrind universal-ctags
  swig python3-dev python3-pytest python3-numpy python3-prometheus-client patchelf python3-setuptools python3-pip python3-wheel python3-venv
  golang-go bindgen libclang1-14 libclang-common-14-dev rustc cargo
  dpkg-dev file lintian rpm rpmlint abigail-tools
  qemu-system-x86 busybox-static kmod xz-utils iproute2 nftables ibverbs-providers ibverbs-utils rdmacm-utils perftest"
case "${1:-all}" in
    build) want=$build ;;
    test|all) want="$build $test" ;;
    *) echo "usage: $0 [build|test|all]" >&2; exit 2 ;;
esac
missing=""
for p in $want; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "kvxfer: missing Debian packages:$missing (run: sudo apt-get install$missing)" >&2
    exit 1
fi
echo "kvxfer: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing >/dev/null
