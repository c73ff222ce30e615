// The plain text form: the JSON object, rendered for a terminal. Everything
// shown here is in the JSON too (kvxfer-info(1) documents its keys).
#include <cstdio>
#include <string>

#include "info/info.h"

namespace kvx::info {

namespace {

constexpr int kLabel = 20;  // width of the label column

void line(int indent, const std::string &label, const std::string &text) {
    printf("%*s%-*s %s\n", indent, "", kLabel - indent, label.c_str(), text.c_str());
}

std::string join(const Json &list, const char *sep = ", ") {
    std::string out;
    for (const Json &v : list) {
        if (!out.empty()) out += sep;
        out += v.is_string() ? v.get<std::string>() : v.dump();
    }
    return out;
}

std::string str(const Json &v, const char *none = "unknown") {
    if (v.is_null()) return none;
    return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string limit(const Json &v) { return v.is_null() ? "unlimited" : human_bytes(v.get<uint64_t>()); }

void header(const Json &all) {
    const Json &b = all["build"], &h = all["host"], &m = h["memlock"];
    printf("kvxfer %s\n", all["version"].get<std::string>().c_str());
    line(0, "build", "backends " + join(b["backends"], ",") + "; tcp AEAD codes " + join(b["aead_codes"]) +
                         "; telemetry " + (b["telemetry"].get<bool>() ? "on" : "off") +
                         (b.contains("compiler") ? "; " + str(b["compiler"]) : ""));
    line(0, "host", "Linux " + str(h["kernel"]) + " " + str(h["machine"]) +
                        (h["cpu"]["model"].is_string() ? ", " + str(h["cpu"]["model"]) : ""));
    line(0, "memlock", limit(m["soft"]) + " (hard " + limit(m["hard"]) + ")" +
                           (m["cap_ipc_lock"].get<bool>() ? ", CAP_IPC_LOCK (no limit applies)" : "") +
                           "; region size checked: " + human_bytes(h["region_size"].get<uint64_t>()));
    const Json &a = all["auto"];
    line(0, "backend=auto", a["error"].is_null() ? "serves on " + join(a["backends"], ",") : str(a["error"]));
    printf("\n");
}

void status(const std::string &name, const Json &b) {
    if (b["usable"].get<bool>()) line(0, name, "usable");
    else line(0, name, "NOT usable: " + str(b["reason"]));
}

void hints(const Json &b) {
    for (const Json &h : b["hints"]) line(2, "hint", h.get<std::string>());
}

std::string pools(const Json &list) {
    std::string out;
    for (const Json &p : list)
        out += (out.empty() ? "" : "; ") + human_bytes(p["page_size"].get<uint64_t>()) + ": " + str(p["free"]) +
               " free of " + str(p["total"]);
    return out.empty() ? "none" : out;
}

void shm(const Json &b) {
    status("shm", b);
    const Json &d = b["dev_shm"], &pv = b["process_vm_writev"], &t = b["thp"];
    line(2, "ptrace_scope", (b["ptrace_scope"].is_null() ? std::string("absent") : str(b["ptrace_scope"])) + ": " +
                                str(b["ptrace_scope_meaning"]));
    line(2, "process_vm_writev",
         std::string(pv["allowed"].is_null() ? "unknown" : pv["allowed"].get<bool>() ? "allowed" : "refused") + ": " +
             str(pv["detail"]));
    if (!d["present"].get<bool>()) line(2, "/dev/shm", "absent");
    else
        line(2, "/dev/shm", std::string(d["tmpfs"].get<bool>() ? "tmpfs" : "NOT tmpfs") +
                                (d["writable"].get<bool>() ? ", writable, " : ", NOT writable, ") +
                                human_bytes(d["free"].get<uint64_t>()) + " free of " +
                                human_bytes(d["size"].get<uint64_t>()));
    std::string mounts;
    for (const Json &m : b["hugetlbfs"])
        mounts += (mounts.empty() ? "" : ", ") + str(m["mount"]) + " (" + human_bytes(m["page_size"].get<uint64_t>()) +
                  " pages)";
    line(2, "hugetlbfs", mounts.empty() ? "none mounted" : mounts);
    line(2, "huge pages", pools(b["hugepages"]));
    line(2, "THP", "enabled " + str(t["enabled"]) + ", defrag " + str(t["defrag"]) + ", shmem " +
                       str(t["shmem_enabled"]));
    const Json &ra = b["region_alloc"];
    auto tried = [](const Json &r) { return r["ok"].get<bool>() ? std::string("ok") : str(r["error"]); };
    line(2, "kvx_region_alloc", "plain " + tried(ra["plain"]) + "; huge pages " + tried(ra["huge_pages"]));
    hints(b);
}

void verbs(const Json &b) {
    status("verbs", b);
    if (const Json &p = b["plugin"]; p.is_object())
        line(2, "plugin", p["loaded"].get<bool>() ? str(p["file"]) + ": loaded" : "NOT loaded: " + str(p["error"]));
    std::string rails;
    for (const Json &r : b["rails"])
        rails += (rails.empty() ? "" : "; ") + str(r["device"]) + " port " + str(r["port"]) + " " + str(r["address"]) +
                 "/" + str(r["prefix"]) + (r["netdev"].is_null() ? "" : " on " + str(r["netdev"])) +
                 (r["gid_index"].is_null() ? "" : ", GID " + str(r["gid_index"]));
    line(2, "rails", rails.empty() ? "none: " + str(b["rails_error"]) : rails);
    const Json &m = b["memlock"];
    line(2, "memlock", limit(m["limit"]) + ", " + human_bytes(m["needed"].get<uint64_t>()) + " needed" +
                           (m["cap_ipc_lock"].get<bool>() ? " (CAP_IPC_LOCK: no limit applies)" : "") +
                           (m["sufficient"].get<bool>() ? ": enough" : ": TOO LOW"));
    hints(b);
}

void tcp(const Json &b) {
    status("tcp", b);
    const Json &a = b["aead"];
    std::string use = a["protection"] == "none" ? std::string("tcp.protection=none: cleartext records") :
                      a["in_use"].is_null() ? "none: " + str(a["error"]) :
                                              "AES-128-GCM by " + str(a["in_use"]);
    std::string codes;
    for (const auto &[name, c] : a["codes"].items())
        codes += (codes.empty() ? "" : ", ") +
                 (c["available"].get<bool>() ? str(c["name"]) + " available" : name + " NOT available");
    line(2, "AEAD", use + " (tcp.aead_impl=" + str(a["option"]) + "); " + codes);
    for (const auto &[name, c] : a["codes"].items())
        if (!c["available"].get<bool>()) line(4, name, str(c["error"]));
    std::string addrs;
    for (const Json &a4 : b["ipv4_addresses"])
        addrs += (addrs.empty() ? "" : ", ") + str(a4["address"]) + " (" + str(a4["interface"]) + ")";
    line(2, "IPv4", addrs.empty() ? "none but loopback" : addrs);
    hints(b);
}

void port(const Json &p) {
    const std::string label = "port " + str(p["port"]);
    if (p.contains("error")) {
        line(2, label, str(p["error"]));
        return;
    }
    line(2, label, str(p["state"]) + " (" + str(p["phys_state"]) + "), " + str(p["link_layer"]) + ", MTU " +
                       str(p["active_mtu"]) + " (max " + str(p["max_mtu"]) + "), " + str(p["rate_gbps"]) + " Gb/s" +
                       (p["lid"].is_null() ? "" : ", LID " + str(p["lid"])) +
                       (p["netdevs"].empty() ? "" : ", netdev " + join(p["netdevs"])));
    for (const Json &g : p["gids"])
        line(4, "GID " + str(g["index"]),
             str(g["gid"]) + " " + str(g["type"]) + (g["netdev"].is_null() ? "" : " " + str(g["netdev"])));
}

void rdma(const Json &r) {
    const Json &k = r["kernel"];
    std::string mods;
    for (const auto &[name, loaded] : k["modules"].items())
        if (loaded.get<bool>()) mods += (mods.empty() ? "" : ", ") + name;
    printf("\n");
    line(0, "RDMA devices", r["devices"].empty() ? "none: " + str(r["error"], "libibverbs lists no device") :
                                                   std::to_string(r["devices"].size()));
    line(2, "kernel", (r["sysfs"].get<bool>() ? "/sys/class/infiniband: " + (r["sysfs_devices"].empty() ?
                                                 std::string("empty") : join(r["sysfs_devices"])) :
                                                 std::string("no /sys/class/infiniband")) +
                          "; modules loaded: " + (mods.empty() ? "none" : mods) + "; /dev/infiniband: " +
                          (k["dev_infiniband"].empty() ? "absent" : join(k["dev_infiniband"])));
    for (const Json &d : r["devices"]) {
        line(0, str(d["name"]), "transport " + str(d["transport"]) + ", " + str(d["node_type"]) +
                                    (d.contains("fw_ver") ? ", fw " + str(d["fw_ver"]) + ", node GUID " +
                                                                str(d["node_guid"]) : "") +
                                    (d["error"].is_null() ? "" : ": " + str(d["error"])));
        for (const Json &p : d["ports"]) port(p);
    }
}

}  // namespace

void print_text(const Json &all) {
    header(all);
    for (const auto &[name, b] : all["backends"].items()) {
        if (name == "shm") shm(b);
        else if (name == "verbs") verbs(b);
        else if (name == "tcp") tcp(b);
        else status(name, b);
    }
    rdma(all["rdma"]);
}

}  // namespace kvx::info
