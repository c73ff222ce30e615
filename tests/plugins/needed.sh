#!/bin/sh
# The libraries libkvxfer.so.0 and the verbs plugin name as NEEDED, against
# what each may need (tests/plugins/CMakeLists.txt).
# Usage: needed.sh libkvxfer.so.0 libkvxfer-verbs.so
set -eu
lib=$1 plugin=$2
allowed='libc.so.6 libstdc++.so.6 libgcc_s.so.1 libcrypto.so.3 libm.so.6 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1'
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
bad=0
echo "$lib needs: $(needed "$lib" | tr '\n' ' ')"
for n in $(needed "$lib"); do
    case " $allowed " in
        *" $n "*) ;;
        *) case $n in
               libasan.so.* | libubsan.so.* | libtsan.so.* | liblsan.so.*) continue ;;  # a sanitizer build's runtime
           esac
           echo "FAIL: $lib needs $n"; bad=1 ;;
    esac
done
# ldd resolves the whole tree: still nothing of rdma-core or ipsec-mb
if ldd "$lib" | grep -E 'libibverbs|librdmacm|libIPSec_MB'; then
    echo "FAIL: ldd $lib names a library of rdma-core or ipsec-mb"; bad=1
fi
echo "$plugin needs: $(needed "$plugin" | tr '\n' ' ')"
for n in libkvxfer.so.0 libibverbs.so.1 librdmacm.so.1; do
    needed "$plugin" | grep -qx "$n" || { echo "FAIL: $plugin does not need $n"; bad=1; }
done
# the library's classes have one typeinfo and vtable, exported for the plugins
for sym in 'typeinfo for kvx::Error' 'vtable for kvx::Error' 'kvx::plugin_report(char const*, char*, unsigned long)'; do
    nm -D -C --defined-only "$lib" | grep -qF " $sym" || { echo "FAIL: $lib does not export $sym"; bad=1; }
done
exports=$(nm -D --defined-only "$plugin" | awk '{print $3}' | tr '\n' ' ')
[ "$exports" = "kvx_plugin_entry " ] || { echo "FAIL: $plugin exports: $exports"; bad=1; }
[ $bad = 0 ] && echo "plugins_needed: ok"
exit $bad
