#!/usr/bin/python3
"""kvxfer-info against the host it runs on.

  test_info.py host KVXFER_INFO LIBKVXFER   this host (no RDMA stack expected:
                                           verbs must say why not)
  test_info.py vm KVXFER_INFO              inside tests/rdma-vm (KVX_VM_DEV set;
                                           exits 77 elsewhere): the Soft-RoCE
                                           device is listed ACTIVE, verbs usable
"""
import ctypes
import ipaddress
import json
import os
import re
import resource
import subprocess
import tempfile
import sys

HINT = "; run kvxfer-info for this host's RDMA devices"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(tool, *args):
    p = subprocess.run([tool, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def info_json(tool, *args):
    rc, out, err = run(tool, "--json", *args)
    check(rc == 0, f"kvxfer-info --json {' '.join(args)} exits 0 (got {rc}; stderr: {err.strip()!r})")
    return json.loads(out)


def rdma_stack_here():
    d = "/sys/class/infiniband"
    return os.path.isdir(d) and bool(os.listdir(d))


def check_layout(j):
    check(j.get("kvxfer_info") == 1, "layout version kvxfer_info is 1")
    check(re.fullmatch(r"\d+\.\d+\.\d+.*", j.get("version", "")) is not None, f"version {j.get('version')!r}")
    for key in ("version_number", "build", "host", "auto", "backends", "rdma"):
        check(key in j, f"top-level key {key!r}")
    check("tcp" in j["build"]["backends"] and "OpenSSL" in j["build"]["aead_codes"], "build facts: tcp, OpenSSL")
    check(list(j["backends"]) == ["shm", "verbs", "tcp"], f"backends in order of preference: {list(j['backends'])}")
    for name, b in j["backends"].items():
        for key in ("built", "usable", "reason", "create_error", "hints"):
            check(key in b, f"backends.{name}.{key} present")
        check(b["usable"] or (isinstance(b["reason"], str) and b["reason"] != ""),
              f"backends.{name}: usable, or a reason why not")


def check_tcp(j, tool):
    t = j["backends"]["tcp"]
    check(t["usable"] is True and t["reason"] is None and t["create_error"] is None, "tcp usable")
    check(t["aead"]["in_use"] in ("OpenSSL", "ipsec-mb", "ipsec-mb (VAES)"), f"tcp AEAD in use: {t['aead']['in_use']}")
    check(t["aead"]["codes"]["openssl"]["available"] is True, "the OpenSSL code is available")
    check("tcp" in j["auto"]["backends"] and j["auto"]["error"] is None, f"auto serves on tcp: {j['auto']}")
    o = info_json(tool, "--option", "tcp.aead_impl=openssl")
    check(o["backends"]["tcp"]["aead"]["option"] == "openssl" and o["backends"]["tcp"]["aead"]["in_use"] == "OpenSSL",
          "--option tcp.aead_impl=openssl: OpenSSL in use")


def check_shm(j):
    s = j["backends"]["shm"]
    check(s["usable"] is True, f"shm usable ({s['reason']})")
    scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip() if os.path.exists(
        "/proc/sys/kernel/yama/ptrace_scope") else None
    check(s["ptrace_scope"] == (int(scope) if scope is not None else None),
          f"ptrace_scope {s['ptrace_scope']} as /proc says ({scope})")
    check(isinstance(s["ptrace_scope_meaning"], str) and "process_vm_writev" in s["ptrace_scope_meaning"],
          "ptrace_scope's meaning for process_vm_writev")
    check(isinstance(s["process_vm_writev"]["allowed"], bool), "process_vm_writev tried")
    d = s["dev_shm"]
    check(d["present"] == os.path.isdir("/dev/shm") and isinstance(d["tmpfs"], bool), f"/dev/shm facts: {d}")
    check(isinstance(s["hugetlbfs"], list) and isinstance(s["hugepages"], list), "hugetlbfs and huge page pools")
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(thp):
        want = re.search(r"\[(\w+)\]", open(thp).read()).group(1)
        check(s["thp"]["enabled"] == want, f"THP enabled {s['thp']['enabled']} as sysfs says ({want})")
    check(isinstance(s["region_alloc"]["plain"]["ok"], bool), "kvx_region_alloc tried")


def check_verbs_host(j, tool, lib):
    v = j["backends"]["verbs"]
    if not v["built"]:
        check(v["usable"] is False and "not available in this build" in v["reason"], "verbs not built: says so")
        return
    check_plugin(v, tool)
    if rdma_stack_here():
        print("note: this host has an RDMA stack: 'verbs not usable' is not asserted")
    else:
        check(v["usable"] is False, "verbs not usable on a host without an RDMA stack")
        check(isinstance(v["reason"], str) and v["reason"] and HINT not in v["reason"],
              f"verbs: the library's reason, without the pointer to kvxfer-info: {v['reason']!r}")
        check(len(v["hints"]) > 0 and "rdma_rxe" in " ".join(v["hints"]), "verbs: a hint names rdma_rxe")
        check(j["rdma"]["devices"] == [], "no RDMA device listed")
        check("verbs" not in j["auto"]["backends"], "auto does not serve on verbs")
        check_library_hint(lib)
    # the memlock check against --region-size (each rail registers the region)
    big = info_json(tool, "--region-size", "1T")["backends"]["verbs"]["memlock"]
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    check(big["needed"] >= 1 << 40 and big["limit"] == (None if soft == resource.RLIM_INFINITY else soft),
          f"--region-size 1T: memlock {big}")
    check(big["sufficient"] == (big["cap_ipc_lock"] or big["limit"] is None or big["limit"] >= big["needed"]),
          "memlock sufficient exactly when the limit covers it or CAP_IPC_LOCK")
    check_memlock_low(tool)


def check_plugin(v, tool):
    """A build with plugins: the verbs plugin beside the library, loaded; one that does not load makes verbs
    unusable with its reason, and a hint says what to install."""
    p = v["plugin"]
    if p is None:
        print("note: verbs is built into this libkvxfer (KVX_PLUGINS=OFF): no plugin to check")
        return
    check(p["loaded"] is True and p["file"].endswith("/kvxfer-0/libkvxfer-verbs.so") and p["error"] is None,
          f"the verbs plugin found and loaded: {p}")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "libkvxfer-verbs.so"), "w") as f:
            f.write("not a shared object\n")
        env = dict(os.environ, KVX_PLUGIN_PATH=d)
        out = subprocess.run([tool, "--json"], stdout=subprocess.PIPE, text=True, env=env, timeout=60)
        b = json.loads(out.stdout)["backends"]["verbs"]
        q = b["plugin"]
        check(q["loaded"] is False and q["file"] == os.path.join(d, "libkvxfer-verbs.so") and
              q["searched"][0] == d and "cannot load" in q["error"], f"a broken plugin first in KVX_PLUGIN_PATH: {q}")
        check(b["usable"] is False and b["reason"] == q["error"] and "libkvxfer0-verbs" in b["hints"][0],
              f"verbs not usable, the plugin's error the reason, a hint to install it: {b['reason']!r}")


def check_memlock_low(tool):
    """RLIMIT_MEMLOCK of 1 MiB, no CAP_IPC_LOCK, a 2 MiB region: too low, and a hint says how to raise it."""
    def low():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (1 << 20, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
    drop = ["setpriv", "--bounding-set=-ipc_lock"] if os.geteuid() == 0 else []
    if drop and subprocess.run(["setpriv", "--bounding-set=-ipc_lock", "true"]).returncode != 0:
        print("note: setpriv cannot drop CAP_IPC_LOCK here: the low-memlock case is not checked")
        return
    p = subprocess.run(drop + [tool, "--json", "--region-size", "2M"], stdout=subprocess.PIPE, text=True,
                       preexec_fn=low, timeout=60)
    v = json.loads(p.stdout)["backends"]["verbs"]
    m = v["memlock"]
    check(p.returncode == 0 and m["limit"] == 1 << 20 and m["needed"] == 2 << 20 and not m["cap_ipc_lock"] and
          m["sufficient"] is False, f"memlock 1 MiB against a 2 MiB region: too low ({m})")
    check(v["usable"] is False and any("ulimit -l" in h for h in v["hints"]), "verbs not usable, a hint raises memlock")


def check_library_hint(lib):
    """The library's own message (backend=verbs, no device) points at kvxfer-info."""
    with open(lib, "rb") as f:
        if any(rt in f.read() for rt in (b"libasan.so", b"libtsan.so")):
            print("note: a sanitizer build: the library is not loaded into python3 (its runtime must come first)")
            return
    k = ctypes.CDLL(lib)
    k.kvx_last_error_message.restype = ctypes.c_char_p
    o = ctypes.c_void_p()
    check(k.kvx_options_create(ctypes.byref(o)) == 0, "kvx_options_create")
    k.kvx_options_set(o, b"backend", b"verbs")
    t = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(4 * 4096)
    rc = k.kvx_transport_create(ctypes.byref(t), buf, ctypes.c_uint64(4), ctypes.c_uint64(4096), None, o)
    msg = k.kvx_last_error_message().decode()
    k.kvx_options_destroy(o)
    check(rc == -95 and msg.endswith(HINT), f"backend=verbs without a device: KVX_ENOTSUP ({rc}), {msg!r}")


def check_usage(tool, version):
    rc, out, err = run(tool)
    check(rc == 0, f"plain text exits 0 (stderr: {err.strip()!r})")
    for pat in (r"^kvxfer " + re.escape(version) + r"$", r"^shm +(usable|NOT usable)", r"^verbs +(usable|NOT usable)",
                r"^tcp +usable$", r"^RDMA devices ", r"^ +AEAD +AES-128-GCM by ", r"^ +ptrace_scope ",
                r"^ +THP "):
        check(re.search(pat, out, re.M) is not None, f"text output has a line {pat!r}")
    check(not out.lstrip().startswith("{"), "text output is not JSON")
    for bad in (["--bogus"], ["--json", "extra"], ["--region-size"], ["--region-size", "12Q"], ["--region-size", "0"],
                ["--option", "no_such_key=1"], ["--option"]):
        rc, out, err = run(tool, *bad)
        check(rc == 2 and out == "" and "usage: kvxfer-info" in err, f"{bad}: exit 2 with usage (got {rc})")
    rc, out, _ = run(tool, "--help")
    check(rc == 0 and "--json" in out and "--region-size" in out, "--help exits 0 and lists the flags")
    rc, out, _ = run(tool, "--version")
    check(rc == 0 and version in out, f"--version: {out.strip()!r}")


def host(tool, lib):
    j = info_json(tool)
    check_layout(j)
    check_tcp(j, tool)
    check_shm(j)
    check_verbs_host(j, tool, lib)
    check_usage(tool, j["version"])


def check_against_ibv_devinfo(dev, port):
    """Port 1's state, MTU, link layer and GIDs as ibv_devinfo -v shows them."""
    try:
        text = subprocess.run(["ibv_devinfo", "-v", "-d", dev, "-i", "1"], stdout=subprocess.PIPE, text=True,
                              timeout=60).stdout
    except FileNotFoundError:
        print("note: no ibv_devinfo (ibverbs-utils): not compared")
        return

    def field(name):
        m = re.search(r"^\s*" + name + r":\s+(\S+)", text, re.M)
        return m.group(1) if m else None
    check(field("state") == "PORT_" + port["state"], f"state as ibv_devinfo says: {field('state')}")
    check(field("active_mtu") == str(port["active_mtu"]), f"active MTU as ibv_devinfo says: {field('active_mtu')}")
    check(field("link_layer") == port["link_layer"], f"link layer as ibv_devinfo says: {field('link_layer')}")
    theirs = {(int(i), ipaddress.IPv6Address(g), t)
              for i, g, t in re.findall(r"GID\[\s*(\d+)\]:\s+([0-9a-f:.]+), (RoCE v1|RoCE v2|IB)", text)}
    ours = {(g["index"], ipaddress.IPv6Address(g["gid"]), g["type"]) for g in port["gids"]}
    check(theirs and ours == theirs, f"GIDs as ibv_devinfo -v lists them: ours {sorted(ours)}, its {sorted(theirs)}")


def vm(tool):
    dev, addr = os.environ.get("KVX_VM_DEV"), os.environ.get("KVX_VM_ADDR")
    if not dev or not addr:
        print("SKIP: not inside tests/rdma-vm (KVX_VM_DEV, KVX_VM_ADDR unset)")
        sys.exit(77)
    j = info_json(tool)
    check_layout(j)
    devs = {d["name"]: d for d in j["rdma"]["devices"]}
    check(dev in devs, f"{dev} listed (devices: {sorted(devs)})")
    if dev in devs:
        p = devs[dev]["ports"][0]
        check(p["state"] == "ACTIVE" and p["link_layer"] == "Ethernet", f"{dev} port 1 ACTIVE, Ethernet: {p['state']}")
        check(p["active_mtu"] in (256, 512, 1024, 2048, 4096), f"{dev} port 1 active MTU {p['active_mtu']}")
        check(any(g["type"] == "RoCE v2" and g["gid"] == "::ffff:" + addr for g in p["gids"]),
              f"{dev} has the RoCE v2 GID of {addr}: {[(g['index'], g['gid'], g['type']) for g in p['gids']]}")
        check_against_ibv_devinfo(dev, p)
    v = j["backends"]["verbs"]
    check(v["plugin"] is None or v["plugin"]["loaded"] is True, f"the verbs plugin loaded: {v['plugin']}")
    check(v["usable"] is True and v["reason"] is None, f"verbs usable ({v['reason']})")
    check(any(r["device"] == dev and r["address"] == addr for r in v["rails"]), f"a rail on {dev} at {addr}")
    check(v["memlock"]["sufficient"] is True, "memlock sufficient (ulimit -l unlimited)")
    check("verbs" in j["auto"]["backends"], f"auto serves on verbs: {j['auto']['backends']}")
    one = info_json(tool, "--option", "verbs.devices=" + dev)["backends"]["verbs"]["rails"]
    check([r["device"] for r in one] == [dev], f"verbs.devices={dev}: that rail only ({one})")
    absent = info_json(tool, "--option", "verbs.device=nosuch9")["backends"]["verbs"]
    check(absent["usable"] is False and "nosuch9" in absent["reason"] and HINT not in absent["reason"],
          f"verbs.device=nosuch9: not usable, why: {absent['reason']!r}")
    check(any(dev + ":1" in h for h in absent["hints"]), f"verbs.device=nosuch9: a hint names {dev}:1: {absent['hints']}")
    rc, out, _ = run(tool)
    check(rc == 0 and re.search(r"^" + dev + r" ", out, re.M) and re.search(r"^ +port 1 +ACTIVE", out, re.M),
          f"text output lists {dev} with port 1 ACTIVE")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("host", "vm") or (sys.argv[1] == "host" and len(sys.argv) < 4):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "host":
        host(sys.argv[2], sys.argv[3])
    else:
        vm(sys.argv[2])
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
