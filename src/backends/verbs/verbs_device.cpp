// Device discovery, the device and the registration of the region.
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "backends/verbs/verbs.h"
#include "util/error.h"
#include "util/log.h"

namespace kvx::verbs {

// ------------------------------------------------------------------ Device

Device::~Device() {
    deregister();
    if (pd) ibv_dealloc_pd(pd);
}

bool Device::open(ibv_context *c, uint8_t p, std::string *why) {
    ctx = c;
    port = p;
    name = ibv_get_device_name(ctx->device);
    if (ibv_query_device(ctx, &attr) != 0 || ibv_query_port(ctx, port, &port_attr) != 0) {
        *why = strfmt("cannot query %s port %u: %s", name.c_str(), port, strerror(errno));
        return false;
    }
    if (port_attr.state != IBV_PORT_ACTIVE) {
        *why = strfmt("%s port %u is %s", name.c_str(), port, ibv_port_state_str(port_attr.state));
        return false;
    }
    // One WR carries at most max_msg_sz bytes (and an SGE length is 32-bit).
    max_msg = std::min<uint64_t>(port_attr.max_msg_sz ? port_attr.max_msg_sz : (1u << 30), 1u << 30);
    return true;
}

bool Device::port_down() const {
    ibv_port_attr pa{};
    return ibv_query_port(ctx, port, &pa) == 0 && pa.state != IBV_PORT_ACTIVE;
}

bool Device::has_addr_gid() const {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, port, &pa) != 0 || pa.link_layer != IBV_LINK_LAYER_ETHERNET) return true;
    uint8_t want[16] = {};
    if (addr.ss_family == AF_INET) {  // ::ffff:a.b.c.d
        want[10] = want[11] = 0xff;
        memcpy(want + 12, &reinterpret_cast<const sockaddr_in &>(addr).sin_addr, 4);
    } else if (addr.ss_family == AF_INET6) {
        memcpy(want, &reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr, 16);
    } else {
        return true;
    }
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        ibv_gid g{};
        if (ibv_query_gid(ctx, port, i, &g) == 0 && memcmp(g.raw, want, 16) == 0) return true;
    }
    return false;
}

bool Device::register_region(const Region &r, uint64_t slice, std::string *why) {
    region = r;
    slice_len = std::min(slice, r.size());
    pd = ibv_alloc_pd(ctx);
    if (!pd) {
        *why = strfmt("ibv_alloc_pd on %s: %s", name.c_str(), strerror(errno));
        return false;
    }
    // Exactly the region, writable by peers; nothing else is registered in this PD.
    for (uint64_t off = 0; off < r.size(); off += slice_len) {
        const uint64_t len = std::min(slice_len, r.size() - off);
        ibv_mr *mr = ibv_reg_mr(pd, r.base + off, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (mr) {
            mrs.push_back(mr);
            lkeys.push_back(mr->lkey);
            continue;
        }
        int e = errno;
        rlimit rl{};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        *why = strfmt("cannot register the %llu byte region with %s%s: %s%s", (unsigned long long)r.size(),
                      name.c_str(),
                      slice_len < r.size() ? strfmt(" (its slice at byte %llu, %llu bytes)", (unsigned long long)off,
                                                    (unsigned long long)len).c_str()
                                           : "",
                      strerror(e),
                      rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < r.size()
                          ? strfmt(" (RLIMIT_MEMLOCK is %llu bytes)", (unsigned long long)rl.rlim_cur).c_str()
                          : "");
        KVX_LOG(warn, "verbs: %s", why->c_str());
        deregister();
        lkeys.clear();
        return false;
    }
    return true;
}

void Device::deregister() {
    for (ibv_mr *mr : mrs) {
        int rc = ibv_dereg_mr(mr);
        if (rc != 0) KVX_LOG(error, "verbs: ibv_dereg_mr: %s", strerror(rc));
    }
    mrs.clear();
}

PeerConfig peer_config(const std::vector<std::shared_ptr<Device>> &rails, const Options &o) {
    PeerConfig c;
    c.qps = static_cast<uint32_t>(o.uint("verbs.qps_per_peer"));
    // 1024 WRs per QP: deep enough to keep a link busy with 4 KiB blocks,
    // small enough that big transfers exercise the software queue.
    uint32_t depth = 1024;
    for (const auto &dev : rails) {
        depth = std::min<uint32_t>(depth, static_cast<uint32_t>(std::max(dev->attr.max_qp_wr, 2)) - 1);  // +1: drain marker
        // One CQ per peer and rail holds a completion for every WR (flushes
        // complete unsignalled WRs too), and for the receives kept for probes.
        uint32_t cqe = static_cast<uint32_t>(std::max(dev->attr.max_cqe, 2));
        depth = std::min<uint32_t>(depth, cqe / c.qps > kProbeRecvs + 1 ? cqe / c.qps - 1 - kProbeRecvs : 0);
        if (depth < 2) fail(KVX_EBACKEND, "verbs: device %s allows only %u WRs per queue", dev->name.c_str(), depth);
    }
    c.sq_depth = depth;
    // As UCX's tx moderation: one CQE per 64 WRs. <= depth/2 guarantees a
    // signalled WR is in flight whenever the queue is full.
    c.signal_every = std::max<uint32_t>(1, std::min<uint32_t>(64, depth / 2));
    c.post_batch_bytes = o.uint("verbs.post_batch_bytes");
    c.redial_ms = o.uint("peer_redial_ms");
    c.connect_timeout_ms = o.uint("connect_timeout_ms");
    c.rail_map = parse_rail_map(o.str("verbs.rail_map"));
    for (const RailMapEntry &e : c.rail_map) {
        bool served = false;
        for (const auto &dev : rails) served |= dev->name == e.device && (e.port == 0 || dev->port == e.port);
        if (!served)
            fail(KVX_EINVAL, "option verbs.rail_map: %s%s is not a rail of this transport", e.device.c_str(),
                 e.port ? strfmt(":%d", e.port).c_str() : "");
    }
    return c;
}

// ------------------------------------------------------------------ discovery

namespace {

std::string read_line(const std::string &path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

// IPv4 addresses (in order) of the named interfaces that are up.
std::vector<sockaddr_storage> ipv4_of(const std::vector<std::string> &ifnames) {
    std::vector<sockaddr_storage> out;
    ifaddrs *ifa = nullptr;
    if (getifaddrs(&ifa) != 0) return out;
    for (const std::string &want : ifnames)
        for (ifaddrs *i = ifa; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
            if (want != i->ifa_name) continue;
            sockaddr_storage ss{};
            memcpy(&ss, i->ifa_addr, sizeof(sockaddr_in));
            out.push_back(ss);
        }
    freeifaddrs(ifa);
    return out;
}

// Netdevs bound to device port p: from the GID table, then sysfs (IPoIB/iWARP).
std::vector<std::string> netdevs_of(const std::string &dev, int port, const std::vector<ibv_gid_entry> &gids) {
    std::vector<std::string> out;
    auto add = [&](const std::string &n) {
        if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    };
    for (const auto &g : gids) {
        char name[IF_NAMESIZE] = {};
        if (g.port_num == static_cast<uint32_t>(port) && g.ndev_ifindex && if_indextoname(g.ndev_ifindex, name))
            add(name);
    }
    std::string dir = "/sys/class/infiniband/" + dev + "/device/net";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d)) {
            if (e->d_name[0] == '.') continue;
            std::string n = e->d_name;
            // multi-port HCAs: dev_port is the 0-based port of the netdev
            std::string dp = read_line("/sys/class/net/" + n + "/dev_port");
            if (!dp.empty() && dp != std::to_string(port - 1)) continue;
            add(n);
        }
        closedir(d);
    }
    return out;
}

}  // namespace

uint8_t prefix_of(const sockaddr_storage &addr) {
    ifaddrs *ifa = nullptr;
    if (getifaddrs(&ifa) != 0) return 0;
    uint8_t prefix = 0;
    for (ifaddrs *i = ifa; i && !prefix; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != addr.ss_family) continue;
        const size_t len = addr.ss_family == AF_INET ? 4 : 16;
        const uint8_t *a, *m, *want;
        if (addr.ss_family == AF_INET) {
            a = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in *>(i->ifa_addr)->sin_addr);
            m = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in *>(i->ifa_netmask)->sin_addr);
            want = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in &>(addr).sin_addr);
        } else {
            a = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in6 *>(i->ifa_addr)->sin6_addr);
            m = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in6 *>(i->ifa_netmask)->sin6_addr);
            want = reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in6 &>(addr).sin6_addr);
        }
        if (memcmp(a, want, len) != 0) continue;
        for (size_t k = 0; k < len; k++) prefix = static_cast<uint8_t>(prefix + __builtin_popcount(m[k]));
    }
    freeifaddrs(ifa);
    return prefix;
}

namespace {

// Ends the reasons of find_placements() when it finds no port: the tool
// that shows what it looked at (kvxfer-info leaves it out of its output).
constexpr const char *kInfoHint = "; run kvxfer-info for this host's RDMA devices";

bool ipv4_mapped(const ibv_gid &g) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g.raw, prefix, 12) == 0;
}

const char *gid_type_name(uint32_t t) {
    switch (t) {
    case IBV_GID_TYPE_IB: return "IB";
    case IBV_GID_TYPE_ROCE_V1: return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    }
    return "?";
}

std::string addr_str(const sockaddr_storage &ss) {
    char b[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in &>(ss).sin_addr, b, sizeof b);
    else inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 &>(ss).sin6_addr, b, sizeof b);
    return b;
}

// Best address of one ACTIVE port; false if it has none.
bool place_port(const std::string &name, int port, const ibv_port_attr &pa,
                const std::vector<ibv_gid_entry> &gids, const Selection &sel, Placement *out) {
    // RoCE: the GID table holds the IP addresses rdma_cm will pick the GID by.
    const ibv_gid_entry *best = nullptr;
    int best_score = 99;
    for (const auto &g : gids) {
        if (g.port_num != static_cast<uint32_t>(port)) continue;
        if (sel.gid_index >= 0 && g.gid_index != static_cast<uint32_t>(sel.gid_index)) continue;
        int score;
        if (ipv4_mapped(g.gid)) score = g.gid_type == IBV_GID_TYPE_ROCE_V2 ? 0 : 1;
        else if (g.gid_type != IBV_GID_TYPE_IB && !(g.gid.raw[0] == 0xfe && (g.gid.raw[1] & 0xc0) == 0x80)) score = 4;
        else continue;  // IB GIDs and link-local ones carry no usable IP
        if (score < best_score) best = &g, best_score = score;
    }
    if (best && best_score < 4) {
        auto &sin = reinterpret_cast<sockaddr_in &>(out->addr);
        sin.sin_family = AF_INET;
        memcpy(&sin.sin_addr, best->gid.raw + 12, 4);
    } else {
        // IB (IPoIB) and iWARP: the address of the port's netdev.
        std::vector<std::string> nds = netdevs_of(name, port, gids);
        std::vector<sockaddr_storage> v4 = ipv4_of(nds);
        if (!v4.empty() && sel.gid_index < 0) {
            out->addr = v4.front();
            out->netdev = nds.front();
            for (const auto &n : nds)
                if (!ipv4_of({n}).empty()) {
                    out->netdev = n;
                    break;
                }
            best = nullptr;
        } else if (best) {
            auto &sin6 = reinterpret_cast<sockaddr_in6 &>(out->addr);
            sin6.sin6_family = AF_INET6;
            memcpy(&sin6.sin6_addr, best->gid.raw, 16);
        } else {
            return false;
        }
    }
    out->device = name;
    out->port = static_cast<uint8_t>(port);
    out->gid_index = best ? static_cast<int>(best->gid_index) : -1;
    if (best && best->ndev_ifindex) {
        char nd[IF_NAMESIZE] = {};
        if (if_indextoname(best->ndev_ifindex, nd)) out->netdev = nd;
    }
    out->prefix = prefix_of(out->addr);
    out->how = strfmt("%s port %d (%s, %s), %s/%u%s%s", name.c_str(), port,
                      pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
                      best ? strfmt("GID %d %s", out->gid_index, gid_type_name(best->gid_type)).c_str() : "netdev address",
                      addr_str(out->addr).c_str(), out->prefix, out->netdev.empty() ? "" : " on ", out->netdev.c_str());
    return true;
}

}  // namespace

std::vector<RailMapEntry> parse_rail_map(const std::string &text) {
    std::vector<RailMapEntry> out;
    size_t from = 0;
    while (!text.empty() && from <= text.size()) {
        const size_t comma = std::min(text.find(',', from), text.size());
        const std::string item = text.substr(from, comma - from);
        from = comma + 1;
        auto bad = [&](const char *why) {
            fail(KVX_EINVAL, "option verbs.rail_map: '%s' %s (expected DEV[:PORT]=ADDRESS[/PREFIX],...)", item.c_str(),
                 why);
        };
        const size_t eq = item.find('=');
        if (eq == std::string::npos) bad("has no '='");
        RailMapEntry e;
        std::vector<std::pair<std::string, int>> dev;
        try {
            dev = parse_devices(item.substr(0, eq));
        } catch (const Error &) {
            bad("names no device, or a bad port, before '='");
        }
        if (dev.size() != 1) bad("names no one device before '='");
        e.device = dev[0].first;
        e.port = dev[0].second;
        std::string addr = item.substr(eq + 1);
        const size_t slash = addr.find('/');
        std::string plen;
        if (slash != std::string::npos) {
            plen = addr.substr(slash + 1);
            addr.resize(slash);
        }
        in6_addr a6{};
        in_addr a4{};
        if (inet_pton(AF_INET, addr.c_str(), &a4) == 1) {
            e.addr.family = 4;
            memcpy(e.addr.addr.data(), &a4, 4);
        } else if (inet_pton(AF_INET6, addr.c_str(), &a6) == 1) {
            e.addr.family = 6;
            memcpy(e.addr.addr.data(), &a6, 16);
        } else {
            bad("has no numeric IPv4 or IPv6 address after '='");
        }
        const unsigned bits = e.addr.family == 4 ? 32 : 128;
        e.prefix = bits;
        if (slash != std::string::npos) {
            char *end = nullptr;
            const long v = plen.empty() ? -1 : strtol(plen.c_str(), &end, 10);
            if (plen.empty() || *end || v < 1 || v > static_cast<long>(bits)) bad("has a bad prefix length");
            e.prefix = static_cast<unsigned>(v);
        }
        if (out.size() == kMaxRails * 4) fail(KVX_EINVAL, "option verbs.rail_map: more than %zu entries", kMaxRails * 4);
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<std::pair<std::string, int>> parse_devices(const std::string &text) {
    std::vector<std::pair<std::string, int>> out;
    if (text == "all") return out;
    size_t from = 0;
    while (from <= text.size()) {
        const size_t comma = std::min(text.find(',', from), text.size());
        const std::string item = text.substr(from, comma - from);
        const size_t colon = item.find(':');
        const std::string name = item.substr(0, colon);
        int port = 0;
        if (colon != std::string::npos) {
            const std::string p = item.substr(colon + 1);
            char *end = nullptr;
            const long v = p.empty() ? 0 : strtol(p.c_str(), &end, 10);
            if (p.empty() || *end || v < 1 || v > 255)
                fail(KVX_EINVAL, "option verbs.devices: '%s' has a bad port '%s' (1-255)", item.c_str(), p.c_str());
            port = static_cast<int>(v);
        }
        if (name.empty() || name.size() > 64)
            fail(KVX_EINVAL, "option verbs.devices: '%s' in '%s' names no device (expected all or DEV[:PORT],...)",
                 item.c_str(), text.c_str());
        if (out.size() == kMaxRails)
            fail(KVX_EINVAL, "option verbs.devices: more than %zu entries in '%s'", kMaxRails, text.c_str());
        out.emplace_back(name, port);
        from = comma + 1;
    }
    return out;
}

namespace {

// The ACTIVE ports of one device that sel asks for, placed, into *out
// (notes on the others into *notes).
void place_device(ibv_device *d, const Selection &sel, std::vector<Placement> *out, std::string *notes) {
    const std::string name = ibv_get_device_name(d);
    std::vector<int> ports;  // 0: every port
    if (sel.devices.empty()) ports.push_back(sel.port);
    for (const auto &[dev, p] : sel.devices)
        if (dev == name) ports.push_back(p);
    if (ports.empty()) return;
    ibv_context *c = ibv_open_device(d);
    if (!c) {
        *notes += strfmt("; %s: cannot open: %s", name.c_str(), strerror(errno));
        return;
    }
    ibv_device_attr da{};
    if (ibv_query_device(c, &da) != 0) {
        *notes += strfmt("; %s: ibv_query_device failed", name.c_str());
        ibv_close_device(c);
        return;
    }
    size_t total = 0;
    std::vector<ibv_port_attr> pas(da.phys_port_cnt + 1);
    for (int p = 1; p <= da.phys_port_cnt; p++)
        if (ibv_query_port(c, static_cast<uint8_t>(p), &pas[p]) == 0) total += pas[p].gid_tbl_len;
    std::vector<ibv_gid_entry> gids(total);
    ssize_t ng = total ? ibv_query_gid_table(c, gids.data(), gids.size(), 0) : 0;
    gids.resize(ng > 0 ? static_cast<size_t>(ng) : 0);
    for (int want : ports)
        if (want > da.phys_port_cnt)
            *notes += strfmt("; %s has %u port(s), not port %d", name.c_str(), da.phys_port_cnt, want);
    for (int p = 1; p <= da.phys_port_cnt && !(sel.one && !out->empty()); p++) {
        if (std::find(ports.begin(), ports.end(), 0) == ports.end() &&
            std::find(ports.begin(), ports.end(), p) == ports.end())
            continue;
        if (pas[p].state != IBV_PORT_ACTIVE) {
            *notes += strfmt("; %s port %d is %s", name.c_str(), p, ibv_port_state_str(pas[p].state));
            continue;
        }
        Placement pl;
        if (place_port(name, p, pas[p], gids, sel, &pl)) out->push_back(pl);
        else
            *notes += strfmt("; %s port %d has no IP address%s", name.c_str(), p,
                             sel.gid_index >= 0 ? strfmt(" at GID index %d", sel.gid_index).c_str() : "");
    }
    ibv_close_device(c);
}

}  // namespace

std::vector<Placement> find_placements(const Selection &sel, std::string *why) {
    std::vector<Placement> out;
    int n = 0;
    errno = 0;
    ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        *why = strfmt("libibverbs cannot list RDMA devices: %s%s", strerror(errno ? errno : ENODEV), kInfoHint);
        return out;
    }
    std::string notes;
    for (int i = 0; i < n && !(sel.one && !out.empty()); i++) place_device(list[i], sel, &out, &notes);
    std::vector<std::string> missing;
    for (const auto &[dev, p] : sel.devices) {
        bool found = false;
        for (int i = 0; i < n; i++) found |= dev == ibv_get_device_name(list[i]);
        if (!found) missing.push_back(dev);
    }
    ibv_free_device_list(list);
    for (const std::string &m : missing)
        if (!out.empty()) KVX_LOG(warn, "verbs: verbs.devices names '%s', which does not exist here", m.c_str());
    if (!out.empty()) {
        if (!notes.empty()) KVX_LOG(info, "verbs: ports not served: %s", notes.c_str() + 2);
        return out;
    }
    if (n == 0) *why = strfmt("no RDMA device found%s", kInfoHint);
    else if (!missing.empty() && missing.size() == sel.devices.size())
        *why = strfmt("verbs.device%s '%s' not found%s", sel.one ? "" : "s entry", missing.front().c_str(), kInfoHint);
    else *why = "no ACTIVE RDMA port with an IP address" + notes + kInfoHint;
    return out;
}

}  // namespace kvx::verbs
