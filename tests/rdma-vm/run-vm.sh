#!/usr/bin/env bash
# run-vm.sh - run a shell command inside a throw-away QEMU (TCG) VM that has
# two real kernel Soft-RoCE devices (rdma_rxe, "rxe0" and "rxe1", one per
# rail), so kvxfer's verbs/rdma_cm code can be tested on a host without RDMA
# hardware, RDMA modules or KVM.
#
#   run-vm.sh [-t SECS] [-w DIR]... [--] 'shell command'
#   run-vm.sh --setup            install host packages + build the kernel/initramfs cache
#
# The guest boots Debian's own kernel (linux-image-<ver>-amd64, downloaded with
# apt-get, never installed), sees the host's / read-only through 9p with a
# tmpfs overlay on top (writes succeed but vanish at power-off) and each -w DIR
# read-write at the same path. The command runs as root under /bin/bash in the
# host's current directory, with `ulimit -l unlimited`, stdin /dev/null and
#   KVX_VM_DEV=rxe0   KVX_VM_NETDEV=kvxnet0   KVX_VM_ADDR=<IPv4 of kvxnet0>
#   KVX_VM_DEV2=rxe1  KVX_VM_NETDEV2=kvxnet1  KVX_VM_ADDR2=<IPv4 of kvxnet1>
#   KVX_VM_DEV3=rxe2  KVX_VM_NETDEV3=kvxnet2  KVX_VM_ADDR3=198.18.2.1/24 (a spare
#                     rail: no address until a test adds this one)
# plus the host's PATH, HOME, LANG and every exported KVX_* variable.
# Each rxe sits on its own dummy netdev and subnet: the VM has no NIC, nothing
# leaves it. Use $KVX_VM_ADDR / $KVX_VM_ADDR2 (not 127.0.0.1) for rdma_cm; the
# RoCEv2 IPv4 GID is index 1.
#
# Output is streamed live. Exit status: the command's, or 124 (timeout) or
# 125 (host setup / VM boot / guest setup failure; the console tail is printed).
#
# Options / environment:
#   -t SECS    whole-run timeout including boot         KVX_VM_TIMEOUT (1800)
#   -w DIR     share DIR read-write (repeatable)        KVX_VM_RW ("dir1 dir2")
#   --setup    only install packages and build the cache
#   KVX_VM_CACHE    cache dir                  ($HOME/.cache/kvxfer-rxe-vm)
#   KVX_VM_MEM / KVX_VM_SMP      guest MiB / vCPUs          (2048 / nproc)
#   KVX_VM_IP / KVX_VM_NETMTU    rxe0 address / netdev MTU  (198.18.0.1/24 / 9000)
#   KVX_VM_IP2                   rxe1 address, own subnet   (198.18.1.1/24)
#   KVX_VM_KPKG     kernel package (default: what linux-image-amd64 depends on;
#                   remembered in the cache, KVX_VM_REFRESH=1 re-resolves it)
#   KVX_VM_KEEP=1   keep the job dir (guest console log) and print its path
#   KVX_VM_QUIET=1  no progress lines on stderr
set -euo pipefail

ME=${0##*/}
say()  { [ -n "${KVX_VM_QUIET:-}" ] || echo "$ME: $*" >&2; }
fail() { echo "$ME: error: $*" >&2; exit 125; }

timeout_s=${KVX_VM_TIMEOUT:-1800}
mem=${KVX_VM_MEM:-2048}
smp=${KVX_VM_SMP:-$(nproc)}
ip_cidr=${KVX_VM_IP:-198.18.0.1/24}
ip2_cidr=${KVX_VM_IP2:-198.18.1.1/24}
net_mtu=${KVX_VM_NETMTU:-9000}
cache=${KVX_VM_CACHE:-${HOME:-/root}/.cache/kvxfer-rxe-vm}
read -r -a shares <<< "${KVX_VM_RW:-}"
setup_only=

while [ $# -gt 0 ]; do
    case $1 in
        -t) [ $# -ge 2 ] || fail "-t needs a value"; timeout_s=$2; shift 2 ;;
        -w) [ $# -ge 2 ] || fail "-w needs a value"; shares+=("$2"); shift 2 ;;
        --setup) setup_only=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        --) shift; break ;;
        -*) fail "unknown option '$1' (try --help)" ;;
        *) break ;;
    esac
done
cmd="$*"
[ -n "$setup_only" ] || [ -n "$cmd" ] || fail "no command (usage: $ME [-t SECS] [-w DIR]... -- 'command')"
case $timeout_s in ''|*[!0-9]*) fail "-t: not a number of seconds: $timeout_s" ;; esac

# ------------------------------------------------------------------ host packages
host_pkgs="qemu-system-x86 busybox-static kmod xz-utils iproute2 ibverbs-providers ibverbs-utils
           rdmacm-utils perftest libibverbs-dev librdmacm-dev"
need=()
for p in $host_pkgs; do
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || need+=("$p")
done
apt_q() { apt-get -q -o DPkg::Lock::Timeout=600 "$@"; }
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || fail "missing host packages (run once as root): apt-get install ${need[*]}"
    say "installing host packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_q update > /dev/null || fail "apt-get update failed"
    apt_q install -y --no-install-recommends "${need[@]}" > /dev/null \
        || fail "apt-get install ${need[*]} failed"
    apt_updated=1
fi
[ -x /bin/busybox ] || fail "/bin/busybox is missing (busybox-static)"
for f in qemu-system-x86_64 modprobe depmod dpkg-deb xz rdma bash; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$f" > /dev/null || fail "$f is missing"
done

# ------------------------------------------------------------------ guest /init
# PID 1 of the guest. It stays in the busybox initramfs for the whole run:
# it loads the modules, builds the overlay root, creates rxe0 and rxe1, then
# chroots into the overlay to run the job and finally powers the VM off.
# Any change to this text (or to $modules / the kernel) rebuilds the initramfs.
read -r -d '' guest_init <<'GUEST_INIT' || true
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
t() { read -r up _ < /proc/uptime; echo "$up"; }
log() { echo "kvx-vm-init[$(t)]: $*" > /dev/ttyS0; }
off() { sync; poweroff -f; echo o > /proc/sysrq-trigger; sleep 30; }
die() { log "FATAL: $*"; off; }

log "loading modules"
while read -r ko arg; do
    insmod "/mods/$ko" $arg || die "insmod $ko failed"
done < /mods/load-order

# root: host / (9p, read-only) + tmpfs upper layer
R=/newroot
opt9p=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /lower /upper $R
mount -t 9p -o $opt9p,ro,cache=loose kvxroot /lower || die "9p mount of the host root failed"
mount -t tmpfs -o mode=0755 tmpfs /upper && mkdir /upper/data /upper/work || die "tmpfs failed"
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay $R \
    || die "overlay mount failed"
mount -t proc proc $R/proc && mount -t sysfs sysfs $R/sys && mount -t devtmpfs devtmpfs $R/dev \
    || die "cannot mount proc/sys/dev in the new root"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts && mount -t tmpfs tmpfs $R/dev/shm && mount -t tmpfs tmpfs $R/run \
    || die "cannot mount devpts/shm/run"
J=$R/run/kvx-vm
mkdir -p $J && mount -t 9p -o $opt9p,cache=none kvxjob $J || die "9p mount of the job dir failed"
n=0
while IFS= read -r d; do
    mkdir -p "$R$d" && mount -t 9p -o $opt9p,cache=none "kvxrw$n" "$R$d" || die "cannot mount -w $d"
    n=$((n+1))
done < $J/shares
. $J/net.conf

# libibverbs dlopen()s every provider listed in /etc/libibverbs.d; only rxe
# exists here, so hide the others (each verbs process starts faster)
for f in $R/etc/libibverbs.d/*.driver; do
    [ "${f##*/}" = rxe.driver ] || rm -f "$f"
done

# net: lo + two rails, each a dummy netdev with its own RoCE address/subnet
# and an rxe device on top of it: kvxnet0/rxe0 and kvxnet1/rxe1
hostname kvx-vm
ip link set lo up || die "lo"
rail() {  # rail N [ADDR/PREFIX]: kvxnetN + rxeN (no address: a spare rail, see below)
    ip link add name kvxnet$1 type dummy && ip link set kvxnet$1 mtu "$NET_MTU" \
        && { [ -z "$2" ] || ip addr add "$2" dev kvxnet$1; } && ip link set kvxnet$1 up || die "cannot set up kvxnet$1"
    # iproute2's rdma tool is not in busybox: use the host's from the new root
    PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot $R rdma link add rxe$1 type rxe netdev kvxnet$1 \
        > /dev/ttyS0 2>&1 || die "rdma link add rxe$1 type rxe netdev kvxnet$1 failed"
}
rail 0 "$NET_ADDR"
rail 1 "$NET_ADDR2"
# A spare rail without an address: verbs.devices=all leaves it out, so the
# suites see two rails; a test that takes a rail down for good (Soft-RoCE
# wedges its rdma_cm, README) gives it an address and uses it alone.
rail 2 ""
n=0
until grep -q ACTIVE /sys/class/infiniband/rxe2/ports/1/state 2>/dev/null; do
    n=$((n+1)); [ $n -le 100 ] || die "rxe2 port not ACTIVE"
    sleep 0.1
done
for d in rxe0 rxe1; do
    n=0
    until grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state 2>/dev/null \
          && grep -q '^0000:0000:0000:0000:0000:ffff:' /sys/class/infiniband/$d/ports/1/gids/1 2>/dev/null; do
        n=$((n+1)); [ $n -le 100 ] || die "$d port not ACTIVE / no IPv4 GID at index 1"
        sleep 0.1
    done
done
log "rxe0 and rxe1 ready"

stty -F /dev/ttyS1 raw -echo
ulimit -l unlimited
t > $J/t-start
PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot $R /bin/bash /run/kvx-vm/job.sh < /dev/null > /dev/ttyS1 2>&1
rc=$?
t > $J/t-end
echo $rc > $J/rc
log "command exited with status $rc"
umount $J
off
GUEST_INIT

# modules for insmod, in dependency order (resolved with the host's kmod)
modules="virtio_pci 9pnet_virtio 9p overlay dummy crc32_generic crc32_pclmul rdma_rxe rdma_ucm"

# ------------------------------------------------------------------ kernel + initramfs cache
mkdir -p "$cache" || fail "cannot create cache dir $cache"
exec 9> "$cache/.lock"
flock 9                                  # parallel runs: one builds, the others wait

kpkg=${KVX_VM_KPKG:-}
if [ -z "$kpkg" ] && [ -z "${KVX_VM_REFRESH:-}" ] && [ -s "$cache/kernel-package" ]; then
    kpkg=$(cat "$cache/kernel-package")
    [ -s "$cache/$kpkg/kver" ] || kpkg=
fi
if [ -z "$kpkg" ]; then
    resolve() { apt-cache depends linux-image-amd64 2>/dev/null | awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'; }
    kpkg=$(resolve || true)
    if { [ -z "$kpkg" ] || [ -n "${KVX_VM_REFRESH:-}" ]; } && [ -z "${apt_updated:-}" ] && [ "$(id -u)" = 0 ]; then
        apt_q update > /dev/null || say "warning: apt-get update failed"
        kpkg=$(resolve || true)
    fi
    [ -n "$kpkg" ] || fail "cannot resolve linux-image-amd64 -> linux-image-<ver>-amd64 (apt-get update?)"
fi
kdir=$cache/$kpkg
stamp=$(printf '%s\n' "$kpkg" "$modules" "$guest_init" | md5sum | cut -c1-16)
initrd=$kdir/initrd-$stamp.cpio.gz

if [ ! -s "$initrd" ] || [ ! -s "$kdir/kver" ]; then
    say "building VM cache for $kpkg in $kdir"
    mkdir -p "$kdir"
    tmp=$(mktemp -d "$cache/tmp.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    deb=$(ls "$kdir"/"$kpkg"_*.deb 2>/dev/null | head -n1 || true)
    if [ -z "$deb" ]; then
        say "downloading $kpkg (~70 MB)"
        (cd "$tmp" && apt-get -q download "$kpkg" > /dev/null 2>&1) \
            || { [ "$(id -u)" = 0 ] && apt_q update > /dev/null && (cd "$tmp" && apt-get -q download "$kpkg" > /dev/null 2>&1); } \
            || fail "apt-get download $kpkg failed"
        mv "$tmp"/"$kpkg"_*.deb "$kdir"/
        deb=$(ls "$kdir"/"$kpkg"_*.deb | head -n1)
    fi
    dpkg-deb -x "$deb" "$tmp/pkg" || fail "cannot unpack $deb"
    kver=$(ls "$tmp/pkg/lib/modules")
    [ -n "$kver" ] && [ -f "$tmp/pkg/boot/vmlinuz-$kver" ] || fail "unexpected layout of $deb"
    cp "$tmp/pkg/boot/vmlinuz-$kver" "$kdir/vmlinuz"
    # Under TCG the in-guest XZ decompression of the bzImage costs seconds at
    # every boot. With CONFIG_PVH=y QEMU can boot the plain ELF vmlinux
    # directly, so unpack it once here (bzImage stays as fallback). xz stops
    # after the first stream, so tail may die of SIGPIPE: ignore its status.
    rm -f "$kdir/vmlinux"
    if grep -qx 'CONFIG_PVH=y' "$tmp/pkg/boot/config-$kver"; then
        xzoff=$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$kdir/vmlinuz" | cut -d: -f1 || true)
        if [ -n "$xzoff" ] \
           && { tail -c "+$((xzoff + 1))" "$kdir/vmlinuz" || true; } | xz -dc --single-stream > "$tmp/vmlinux" 2>/dev/null \
           && [ "$(head -c4 "$tmp/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$tmp/vmlinux" "$kdir/vmlinux"
        fi
    fi
    depmod -b "$tmp/pkg" "$kver"
    root=$tmp/initramfs
    mkdir -p "$root/bin" "$root/mods" "$root/dev" "$root/proc" "$root/sys"
    cp /bin/busybox "$root/bin/busybox"
    for m in $modules; do
        modprobe -d "$tmp/pkg" -S "$kver" --show-depends "$m" || fail "module $m not found in $kpkg"
    done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' > "$tmp/ko-list"
    while read -r ko; do
        cp "$ko" "$root/mods/"
        b=${ko##*/}
        case $b in dummy.ko*) echo "$b numdummies=0" ;; *) echo "$b" ;; esac
    done < "$tmp/ko-list" > "$root/mods/load-order"
    printf '%s\n' "$guest_init" > "$root/init"
    chmod 755 "$root/init"
    (cd "$root" && find . | busybox cpio -o -H newc 2> /dev/null | gzip -1) > "$tmp/initrd" \
        || fail "cannot pack the initramfs"
    rm -f "$kdir"/initrd-*.cpio.gz
    mv "$tmp/initrd" "$initrd"
    echo "$kver" > "$kdir/kver"
    say "cache ready: kernel $kver, modules: $(cut -d' ' -f1 "$root/mods/load-order" | tr '\n' ' ')"
    rm -rf "$tmp"
    trap - EXIT
fi
echo "$kpkg" > "$cache/kernel-package"
flock -u 9
exec 9>&-
if [ -n "$setup_only" ]; then
    say "setup done: $kdir"
    exit 0
fi

# ------------------------------------------------------------------ job dir
job=$(mktemp -d "${TMPDIR:-/tmp}/kvx-vm.XXXXXX")
qpid=
cleanup() {
    [ -z "$qpid" ] || kill "$qpid" 2> /dev/null || true
    if [ -n "${KVX_VM_KEEP:-}" ]; then say "job dir kept: $job"; else rm -rf "$job"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

virtfs=(-virtfs "local,path=/,mount_tag=kvxroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$job,mount_tag=kvxjob,security_model=none,multidevs=remap")
: > "$job/shares"
n=0
for d in "${shares[@]}"; do
    [ -d "$d" ] || fail "-w $d: not a directory"
    d=$(cd "$d" && pwd -P)
    case $d in *,*) fail "-w $d: commas in paths are not supported by qemu -virtfs" ;; esac
    printf '%s\n' "$d" >> "$job/shares"
    virtfs+=(-virtfs "local,path=$d,mount_tag=kvxrw$n,security_model=none,multidevs=remap")
    n=$((n + 1))
done
printf 'NET_ADDR=%s\nNET_ADDR2=%s\nNET_MTU=%s\n' "$ip_cidr" "$ip2_cidr" "$net_mtu" > "$job/net.conf"
{
    echo "# written by $ME"
    for v in $(compgen -e | grep '^KVX_' || true); do printf 'export %s=%q\n' "$v" "${!v}"; done
    printf 'export PATH=%q HOME=%q LANG=%q TERM=dumb\n' "$PATH" "${HOME:-/root}" "${LANG:-C.UTF-8}"
    printf 'export KVX_VM_DEV=rxe0 KVX_VM_NETDEV=kvxnet0 KVX_VM_ADDR=%q\n' "${ip_cidr%/*}"
    printf 'export KVX_VM_DEV2=rxe1 KVX_VM_NETDEV2=kvxnet1 KVX_VM_ADDR2=%q\n' "${ip2_cidr%/*}"
    echo 'export KVX_VM_DEV3=rxe2 KVX_VM_NETDEV3=kvxnet2 KVX_VM_ADDR3=198.18.2.1/24'
    echo 'ulimit -l unlimited'
    printf 'cd %q || { echo "%s: cannot cd to %q in the guest" >&2; exit 125; }\n' "$PWD" "$ME" "$PWD"
    printf '%s\n' "$cmd"
} > "$job/job.sh"

kernel=$kdir/vmlinuz
[ -s "$kdir/vmlinux" ] && kernel=$kdir/vmlinux
qemu=(qemu-system-x86_64 -M pc -accel tcg -cpu max -smp "$smp" -m "$mem"
      -nodefaults -no-reboot -display none
      -kernel "$kernel" -initrd "$initrd"
      -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off nokaslr tsc=reliable"
      -serial "file:$job/console.log"
      -chardev stdio,id=kvxout,signal=off -serial chardev:kvxout
      "${virtfs[@]}")

say "booting $(cat "$kdir/kver") (TCG, $smp vCPU, $mem MiB, timeout ${timeout_s}s)"
t0=$(date +%s.%N)
timeout -k 10 "$timeout_s" "${qemu[@]}" < /dev/null 2> "$job/qemu.err" &
qpid=$!
set +e
wait "$qpid"
qrc=$?
set -e
qpid=
t1=$(date +%s.%N)

grep -v -e 'warning: host doesn.t support requested feature' -e 'Multiple devices detected' "$job/qemu.err" >&2 || true
console_tail() { echo "----- guest console (last ${1} lines) -----" >&2; tail -n "$1" "$job/console.log" >&2 || true; }
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    echo "$ME: timeout: VM killed after ${timeout_s}s" >&2
    console_tail 20
    exit 124
fi
if [ ! -s "$job/rc" ]; then
    echo "$ME: VM exited (qemu status $qrc) before the command finished" >&2
    console_tail 40
    exit 125
fi
rc=$(cat "$job/rc")
awk -v t0="$t0" -v t1="$t1" -v s="$(cat "$job/t-start")" -v e="$(cat "$job/t-end")" -v rc="$rc" -v me="$ME" \
    'BEGIN { if (ENVIRON["KVX_VM_QUIET"] == "") printf "%s: exit %d; wall %.1f s = command %.1f s + boot/shutdown %.1f s (guest uptime at command start %.1f s)\n", me, rc, t1 - t0, e - s, (t1 - t0) - (e - s), s > "/dev/stderr" }'
exit "$rc"
