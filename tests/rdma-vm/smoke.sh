#!/usr/bin/env bash
# smoke.sh - self-test of the rdma-vm harness. Runs INSIDE the VM:
#     tests/rdma-vm/run-vm.sh -- 'bash tests/rdma-vm/smoke.sh'
# Checks that rxe0 and rxe1 are PORT_ACTIVE, then runs real two-process RDMA
# WRITE bandwidth tests with perftest's ib_write_bw (server in the background,
# client connecting to $KVX_VM_ADDR): 4 KiB, 64 KiB and 1 MiB over rdma_cm
# (-R), plus 64 KiB with the TCP out-of-band exchange and RoCE GID index 1
# (-x 1); then 64 KiB over rdma_cm on the second rail (rxe1, $KVX_VM_ADDR2).
# Prints the BW lines; exit 0 on success, 1 on any failure.
set -u
dev=${KVX_VM_DEV:-rxe0}
addr=${KVX_VM_ADDR:?not inside the VM - run through tests/rdma-vm/run-vm.sh}
dev2=${KVX_VM_DEV2:-rxe1}
addr2=${KVX_VM_ADDR2:?no second rail - run through tests/rdma-vm/run-vm.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "smoke: FAIL: $*" >&2; exit 1; }
show() { for f; do echo "--- $f"; cat "$tmp/$f"; done >&2; }

for d in "$dev" "$dev2"; do
    echo "== ibv_devinfo -d $d"
    ibv_devinfo -d "$d" > "$tmp/devinfo.$d" 2>&1 || { show "devinfo.$d"; fail "ibv_devinfo -d $d failed"; }
    grep -E 'transport:|state:|active_mtu:|link_layer:' "$tmp/devinfo.$d"
    grep -q PORT_ACTIVE "$tmp/devinfo.$d" || fail "$d port is not PORT_ACTIVE"
done

# is the ib_write_bw server on port $2 accepting connections yet?
listening() {
    case $1 in
        cm)  rdma res show cm_id 2> /dev/null | grep -q "state LISTEN .*:$2 " ;;
        oob) [ -n "$(ss -Hltn "sport = :$2" 2> /dev/null)" ] ;;
    esac
}

# write_bw MODE SIZE ITERS PORT [DEV ADDR]: one server/client pair, prints the
# client's result line
write_bw() {
    local mode=$1 size=$2 iters=$3 port=$4 dev=${5:-$dev} addr=${6:-$addr} spid line i
    local args=(-d "$dev" -F -s "$size" -n "$iters" -p "$port")
    case $mode in
        cm)  args+=(-R) ;;      # connection setup through rdma_cm
        oob) args+=(-x 1) ;;    # TCP exchange of QP info, GID index 1 = IPv4 RoCEv2 GID
    esac
    timeout 120 ib_write_bw "${args[@]}" > "$tmp/server.$port" 2>&1 &
    spid=$!
    for i in $(seq 200); do
        listening "$mode" "$port" && break
        kill -0 "$spid" 2> /dev/null || break
        sleep 0.05
    done
    listening "$mode" "$port" || { show "server.$port"; fail "ib_write_bw server ($mode) did not start listening"; }
    if ! timeout 120 ib_write_bw "${args[@]}" "$addr" > "$tmp/client.$port" 2>&1; then
        kill "$spid" 2> /dev/null
        show "client.$port" "server.$port"
        fail "ib_write_bw client ($mode, $size B, $dev) failed"
    fi
    wait "$spid" || { show "server.$port"; fail "ib_write_bw server ($mode, $size B, $dev) failed"; }
    line=$(awk -v s="$size" '$1 == s && NF >= 5' "$tmp/client.$port")
    [ -n "$line" ] || { show "client.$port"; fail "no result line for $size B"; }
    printf '%-18s %s\n' "$mode" "$line"
}

echo "== ib_write_bw on $dev, $addr (MB/s = 10^6 B/s, TCG-emulated)"
printf '%-18s %s\n' "#connection" " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
write_bw cm  4096    1000 18515
write_bw cm  65536   500  18516
write_bw cm  1048576 100  18517
write_bw oob 65536   200  18518
echo "== ib_write_bw on $dev2, $addr2 (second rail)"
write_bw cm  65536   500  18519 "$dev2" "$addr2"
echo "smoke: PASS"
