# Sourced by the scripts that need Debian packages beyond scripts/deps.sh's
# (bindings/*/test.sh, bindings/python/build-wheels.sh):
#   kvx_need_packages WHO PACKAGE...
# installs those not installed when run as root (apt-get, no recommends),
# else names them and exits 1. WHO prefixes the messages.
kvx_need_packages() {
    local who=$1 p missing=()
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "$who: missing Debian packages: ${missing[*]} (run: sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "=== $who: installing ${missing[*]} ==="
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
