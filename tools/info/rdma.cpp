// "rdma": the RDMA devices libibverbs lists, with their ports and GIDs (as
// ibv_devinfo -v shows them), and what the kernel offers underneath
// (/sys/class/infiniband, /dev/infiniband, the RDMA modules).
#include <arpa/inet.h>
#include <dirent.h>
#include <net/if.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "info/info.h"

#ifdef KVX_INFO_VERBS
#include <infiniband/verbs.h>
#endif

namespace kvx::info {

namespace {

std::vector<std::string> dir_entries(const std::string &path, bool *present) {
    std::vector<std::string> out;
    DIR *d = opendir(path.c_str());
    if (present) *present = d != nullptr;
    if (!d) return out;
    while (dirent *e = readdir(d))
        if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
}

// Whether this kernel ships rdma_rxe (Soft-RoCE), from modules.dep or
// modules.builtin; null when neither can be read.
Json rxe_available() {
    utsname u{};
    uname(&u);
    const std::string dir = std::string("/lib/modules/") + u.release + "/";
    bool any = false;
    for (const char *f : {"modules.dep", "modules.builtin"}) {
        std::ifstream in(dir + f);
        if (!in) continue;
        any = true;
        std::string line;
        while (std::getline(in, line))
            if (line.find("/rdma_rxe.ko") != std::string::npos) return true;
    }
    return any ? Json(false) : Json(nullptr);
}

Json kernel_facts() {
    Json mods = Json::object();
    for (const char *m : {"ib_core", "ib_uverbs", "rdma_ucm", "rdma_rxe", "siw"})
        mods[m] = !dir_entries(std::string("/sys/module/") + m, nullptr).empty();
    bool dev_present = false;
    const std::vector<std::string> dev = dir_entries("/dev/infiniband", &dev_present);
    return Json{{"modules", mods}, {"dev_infiniband", dev}, {"rdma_rxe_available", rxe_available()}};
}

#ifdef KVX_INFO_VERBS
// As ibv_devinfo names them, without its PORT_ prefix (ibv_port_state_str()
// says "active").
const char *port_state(ibv_port_state s) {
    switch (s) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    }
    return "unknown";
}

const char *phys_state(uint8_t s) {
    static const char *const names[] = {"NOP", "SLEEP", "POLLING", "DISABLED", "PORT_CONFIGURATION_TRAINING",
                                        "LINK_UP", "LINK_ERROR_RECOVERY", "PHY_TEST"};
    return s < sizeof names / sizeof *names ? names[s] : "unknown";
}

Json mtu_bytes(int mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? Json(128 << mtu) : Json(nullptr); }

// Gb/s of the link: lanes times the lane rate (ibv_devinfo's speed codes).
double rate_gbps(uint8_t width, uint8_t speed) {
    int lanes = 0;
    switch (width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    }
    double lane = 0;
    switch (speed) {
    case 1: lane = 2.5; break;
    case 2: lane = 5; break;
    case 4: case 8: lane = 10; break;
    case 16: lane = 14; break;
    case 32: lane = 25; break;
    case 64: lane = 50; break;
    case 128: lane = 100; break;
    }
    return lanes * lane;
}

std::string gid_text(const uint8_t raw[16]) {
    char b[INET6_ADDRSTRLEN] = "";
    inet_ntop(AF_INET6, raw, b, sizeof b);
    return b;
}

const char *gid_type(uint32_t t) {
    switch (t) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    }
    return "unknown";
}

std::string ifname(uint32_t index) {
    char b[IF_NAMESIZE] = "";
    return index && if_indextoname(index, b) ? b : "";
}

// The port's GIDs: from ibv_query_gid_table (rdma-core 32 and later), else
// one by one with their type and netdev from sysfs.
Json port_gids(ibv_context *c, const std::string &dev, int port, int table_len,
               const std::vector<ibv_gid_entry> *table) {
    Json out = Json::array();
    if (table) {
        for (const ibv_gid_entry &g : *table)
            if (g.port_num == static_cast<uint32_t>(port)) {
                const std::string nd = ifname(g.ndev_ifindex);
                out.push_back(Json{{"index", g.gid_index}, {"gid", gid_text(g.gid.raw)}, {"type", gid_type(g.gid_type)},
                                   {"netdev", nd.empty() ? Json(nullptr) : Json(nd)}});
            }
        return out;
    }
    const std::string attrs = "/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/gid_attrs/";
    for (int i = 0; i < table_len; i++) {
        ibv_gid g{};
        static const uint8_t zero[16] = {};
        if (ibv_query_gid(c, static_cast<uint8_t>(port), i, &g) != 0 || memcmp(g.raw, zero, 16) == 0) continue;
        const std::string type = read_line(attrs + "types/" + std::to_string(i));
        const std::string nd = read_line(attrs + "ndevs/" + std::to_string(i));
        out.push_back(Json{{"index", i}, {"gid", gid_text(g.raw)},
                           {"type", type.empty() ? "IB" : type == "IB/RoCE v1" ? "RoCE v1" : type},
                           {"netdev", nd.empty() ? Json(nullptr) : Json(nd)}});
    }
    return out;
}

Json port_json(ibv_context *c, const std::string &dev, int p, const std::vector<ibv_gid_entry> *table) {
    Json out;
    out["port"] = p;
    ibv_port_attr pa{};
    if (ibv_query_port(c, static_cast<uint8_t>(p), &pa) != 0) {
        out["error"] = std::string("ibv_query_port: ") + strerror(errno);
        return out;
    }
    const bool eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    out["state"] = port_state(pa.state);
    out["phys_state"] = phys_state(pa.phys_state);
    out["link_layer"] = eth ? "Ethernet" : "InfiniBand";
    out["active_mtu"] = mtu_bytes(pa.active_mtu);
    out["max_mtu"] = mtu_bytes(pa.max_mtu);
    out["rate_gbps"] = rate_gbps(pa.active_width, pa.active_speed);
    out["lid"] = eth ? Json(nullptr) : Json(pa.lid);
    out["gid_table_len"] = pa.gid_tbl_len;
    Json gids = port_gids(c, dev, p, pa.gid_tbl_len, table);
    std::vector<std::string> netdevs;
    for (const Json &g : gids)
        if (g["netdev"].is_string() && std::find(netdevs.begin(), netdevs.end(), g["netdev"]) == netdevs.end())
            netdevs.push_back(g["netdev"]);
    out["netdevs"] = netdevs;
    out["gids"] = std::move(gids);
    return out;
}

std::string guid_text(__be64 guid) {
    const uint64_t g = be64toh(guid);
    char b[24];
    snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48) & 0xffff,
             static_cast<unsigned>(g >> 32) & 0xffff, static_cast<unsigned>(g >> 16) & 0xffff,
             static_cast<unsigned>(g) & 0xffff);
    return b;
}

const char *transport_name(ibv_transport_type t) {
    switch (t) {
    case IBV_TRANSPORT_IB: return "InfiniBand";
    case IBV_TRANSPORT_IWARP: return "iWARP";
    case IBV_TRANSPORT_USNIC: return "usNIC";
    case IBV_TRANSPORT_USNIC_UDP: return "usNIC UDP";
    case IBV_TRANSPORT_UNSPECIFIED: return "unspecified";
    default: return "unknown";
    }
}

// The attributes of an opened device, its ports and their GIDs into *out.
void query_device(ibv_context *c, const std::string &name, Json *out) {
    ibv_device_attr da{};
    if (ibv_query_device(c, &da) != 0) {
        (*out)["error"] = std::string("ibv_query_device: ") + strerror(errno);
        return;
    }
    (*out)["fw_ver"] = da.fw_ver;
    (*out)["node_guid"] = guid_text(da.node_guid);
    (*out)["vendor_id"] = da.vendor_id;
    (*out)["vendor_part_id"] = da.vendor_part_id;
    (*out)["max_mr_size"] = da.max_mr_size;
    (*out)["max_qp"] = da.max_qp;
    (*out)["max_qp_wr"] = da.max_qp_wr;
    size_t total = 0;
    for (int p = 1; p <= da.phys_port_cnt; p++) {
        ibv_port_attr pa{};
        if (ibv_query_port(c, static_cast<uint8_t>(p), &pa) == 0) total += pa.gid_tbl_len;
    }
    std::vector<ibv_gid_entry> table(total);
    const ssize_t n = total ? ibv_query_gid_table(c, table.data(), table.size(), 0) : 0;
    table.resize(n > 0 ? static_cast<size_t>(n) : 0);
    Json ports = Json::array();
    for (int p = 1; p <= da.phys_port_cnt; p++) ports.push_back(port_json(c, name, p, n >= 0 ? &table : nullptr));
    (*out)["ports"] = std::move(ports);
}

Json device_json(ibv_device *d) {
    Json out;
    const std::string name = ibv_get_device_name(d);
    out["name"] = name;
    out["node_type"] = ibv_node_type_str(d->node_type);
    out["transport"] = transport_name(d->transport_type);
    out["error"] = nullptr;
    ibv_context *c = ibv_open_device(d);
    if (!c) {
        out["error"] = std::string("cannot open: ") + strerror(errno);
        out["ports"] = Json::array();
        return out;
    }
    query_device(c, name, &out);
    ibv_close_device(c);
    return out;
}
#endif

}  // namespace

std::vector<std::string> sysfs_rdma_devices(bool *present) { return dir_entries("/sys/class/infiniband", present); }

Json rdma_facts() {
    Json out;
    Json devices = Json::array();
#ifdef KVX_INFO_VERBS
    out["built"] = true;
    int n = 0;
    errno = 0;
    ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        out["error"] = std::string("libibverbs cannot list RDMA devices: ") + strerror(errno ? errno : ENODEV);
    } else {
        out["error"] = nullptr;
        for (int i = 0; i < n; i++) devices.push_back(device_json(list[i]));
        ibv_free_device_list(list);
    }
#else
    out["built"] = false;
    out["error"] = "this kvxfer was built without the verbs backend (KVX_VERBS=OFF): devices not queried";
#endif
    out["devices"] = std::move(devices);
    bool present = false;
    const std::vector<std::string> names = sysfs_rdma_devices(&present);
    out["sysfs"] = present;
    out["sysfs_devices"] = names;
    out["kernel"] = kernel_facts();
    return out;
}

}  // namespace kvx::info
