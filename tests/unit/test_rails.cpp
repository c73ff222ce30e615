// Rails without a device: the split of a transfer into weighted shares
// (backend_api/ops), and, with the verbs backend built, its metadata
// section of several rails (version 1) beside version 0 (one rail, as
// transports before 0.7 write it), verbs.devices, and the pairing of rails
// by subnet.
#include <arpa/inet.h>

#include <map>
#include <memory>
#include <vector>

#include "backend_api/ops.h"
#ifdef KVX_TEST_HAVE_VERBS
#include "backends/verbs/verbs.h"
#endif
#include "unit_util.h"

using namespace kvx;
using namespace kvx::testing;

namespace {

constexpr uint64_t kBl = 4096;

Op make_op(const std::vector<Run> &runs) {
    Op op;
    op.state = OpRef::make();
    for (const Run &r : runs) {
        op.runs.push_back(r);
        op.bytes += r.len;
    }
    return op;
}

// Every byte of op lands once, local and remote offsets moving together.
void check_cover(const std::vector<Part> &parts, const std::vector<Run> &runs) {
    std::map<uint64_t, uint64_t> seen;  // local offset of each block -> remote
    for (const Part &p : parts)
        for (const Run &r : p.runs) {
            assert_int_equal(r.len % kBl, 0);
            for (uint64_t o = 0; o < r.len; o += kBl) {
                assert_true(seen.emplace(r.local_off + o, r.remote_off + o).second);
            }
        }
    uint64_t want = 0;
    for (const Run &r : runs) {
        want += r.len / kBl;
        for (uint64_t o = 0; o < r.len; o += kBl) assert_int_equal(seen.at(r.local_off + o), r.remote_off + o);
    }
    assert_int_equal(seen.size(), want);
}

void test_split_shares_weighted(void **) {
    const std::vector<Run> runs = {{0, 100 * kBl, 30 * kBl}, {64 * kBl, 0, 10 * kBl}};
    Op op = make_op(runs);
    OpRef st = op.state;
    std::vector<size_t> which;
    std::vector<Part> parts = split_shares(std::move(op), {3.0, 1.0}, kBl, &which);
    assert_int_equal(parts.size(), 2);
    assert_int_equal(which[0], 0);
    assert_int_equal(which[1], 1);
    assert_int_equal(parts[0].bytes(), 30 * kBl);  // 3/4 of 40 blocks
    assert_int_equal(parts[1].bytes(), 10 * kBl);
    assert_int_equal(st->parts_left.load(), 2);
    check_cover(parts, runs);
}

void test_split_shares_rounding(void **) {
    // 10 blocks over 3 equal shares: 4 3 3 (largest remainder), all covered
    const std::vector<Run> runs = {{0, 0, 10 * kBl}};
    std::vector<size_t> which;
    std::vector<Part> parts = split_shares(make_op(runs), {1, 1, 1}, kBl, &which);
    assert_int_equal(parts.size(), 3);
    uint64_t total = 0;
    for (const Part &p : parts) {
        assert_true(p.bytes() == 3 * kBl || p.bytes() == 4 * kBl);
        total += p.bytes();
    }
    assert_int_equal(total, 10 * kBl);
    check_cover(parts, runs);
    // a share too small for a block gets no part; which[] names the rest
    parts = split_shares(make_op(runs), {100, 0.01, 100}, kBl, &which);
    assert_int_equal(parts.size(), 2);
    assert_int_equal(which[0], 0);
    assert_int_equal(which[1], 2);
    check_cover(parts, runs);
    // no weight at all: one part, everything
    parts = split_shares(make_op(runs), {0, 0}, kBl, &which);
    assert_int_equal(parts.size(), 1);
    check_cover(parts, runs);
}

#ifdef KVX_TEST_HAVE_VERBS
wire::AgentMetadata meta_of(uint64_t nb, uint64_t bl) {
    wire::AgentMetadata m;
    m.num_blocks = nb;
    m.block_len = bl;
    return m;
}

net::Endpoint ep(const char *ip, uint16_t port) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    inet_pton(AF_INET, ip, &sin.sin_addr);
    sockaddr_storage ss{};
    memcpy(&ss, &sin, sizeof sin);
    return net::to_endpoint(ss);
}

void test_verbs_section_rails(void **) {
    const wire::AgentMetadata m = meta_of(16, kBl);
    verbs::SectionInfo v;
    v.mr_addr = 0x10000;
    v.mr_len = 16 * kBl;
    v.rails = {{ep("198.18.0.1", 20049), {0x11}}, {ep("198.18.1.1", 20049), {0x22}}, {ep("198.18.2.1", 7), {0x33}}};
    wire::Section s = verbs::encode_section(v);
    assert_int_equal(s.version, 1);
    verbs::SectionInfo d = verbs::decode_section(s, m);
    assert_int_equal(d.rails.size(), 3);
    assert_int_equal(d.rails[2].rkeys[0], 0x33);
    assert_string_equal(d.rails[1].cm.str().c_str(), "198.18.1.1:20049");
    assert_int_equal(d.mr_addr, 0x10000);

    // What a transport before 0.7 reads: version 0's 44 bytes, taken whole.
    wire::Section v0 = s;
    v0.version = 0;
    v0.body.resize(44);
    d = verbs::decode_section(v0, m);
    assert_int_equal(d.rails.size(), 1);
    assert_int_equal(d.rails[0].rkeys[0], 0x11);
    // ... and that older reader's rule accepts version 1: longer, newer.
    assert_true(s.body.size() > 44 && s.version > 0);

    std::string msg;
    wire::Section bad = s;  // a rail cut short
    bad.body.pop_back();
    assert_int_equal(code_of([&] { verbs::decode_section(bad, m); }, &msg), KVX_EBADMETA);
    bad = v0;  // version 0 with a tail
    bad.body.push_back(0);
    assert_int_equal(code_of([&] { verbs::decode_section(bad, m); }, &msg), KVX_EBADMETA);
    bad = s;  // more rails than allowed
    bad.body[44] = 0xff;
    assert_int_equal(code_of([&] { verbs::decode_section(bad, m); }, &msg), KVX_EBADMETA);
    assert_contains(msg, "rails");
}

// A region registered in slices (verbs.mr_slice_bytes): version 2, which
// appends each rail's keys of the slices after its first. Its first-rail
// prefix gives the first slice's length as mr_len, so that a reader before
// 0.14 refuses it rather than write past that slice with its key.
void test_verbs_section_slices(void **) {
    const wire::AgentMetadata m = meta_of(16, kBl);
    verbs::SectionInfo v;
    v.mr_addr = 0x10000;
    v.mr_len = 16 * kBl;
    v.slice_len = 5 * kBl;  // 5 + 5 + 5 + 1 blocks
    v.rails = {{ep("198.18.0.1", 20049), {0x11, 0x12, 0x13, 0x14}}, {ep("198.18.1.1", 20049), {0x21, 0x22, 0x23, 0x24}}};
    const wire::Section s = verbs::encode_section(v);
    assert_int_equal(s.version, 2);
    const size_t v1_len = 44 + 4 + 24;
    assert_int_equal(s.body.size(), v1_len + 12 + 2 * 3 * 4);
    verbs::SectionInfo d = verbs::decode_section(s, m);
    assert_int_equal(d.slice_len, 5 * kBl);
    assert_int_equal(d.mr_len, 16 * kBl);
    assert_true(d.rails[0].rkeys == v.rails[0].rkeys);
    assert_true(d.rails[1].rkeys == v.rails[1].rkeys);

    // Not sliced (a slice as large as the region, or none): version 1, one key.
    v.slice_len = 16 * kBl;
    v.rails = {{ep("198.18.0.1", 20049), {0x11}}};
    assert_int_equal(verbs::encode_section(v).version, 1);
    assert_int_equal(verbs::decode_section(verbs::encode_section(v), m).slice_len, 16 * kBl);

    // What readers before 0.14 take of it (the version 0 and 1 prefixes, by
    // the rule that a later version may append): refused, naming the length.
    std::string msg;
    for (size_t len : {size_t{44}, v1_len}) {
        wire::Section old = s;
        old.version = len == 44 ? 0 : 1;
        old.body.resize(len);
        assert_int_equal(code_of([&] { verbs::decode_section(old, m); }, &msg), KVX_EBADMETA);
        assert_contains(msg, "MR length");
    }

    // Hostile slices: every defect refused, named.
    auto with = [&](size_t at, uint64_t val, int bytes) {
        wire::Section b = s;
        for (int i = 0; i < bytes; i++) b.body[at + i] = static_cast<uint8_t>(val >> (8 * i));  // little-endian
        return b;
    };
    const size_t at_len = v1_len, at_count = v1_len + 8;
    struct {
        wire::Section sec;
        const char *says;
    } bad[] = {
        {with(at_len, 5 * kBl + 1, 8), "slice length"},  // not whole blocks
        {with(at_len, 0, 8), "slice length"},
        {with(at_len, 16 * kBl, 8), "slices"},          // the whole region: one slice, the count says 4
        {with(at_len, 17 * kBl, 8), "slice length"},    // past the region
        {with(at_len, 3 * kBl, 8), "slices"},           // 6 slices, the count says 4
        {with(at_count, 3, 4), "slices"},
        {with(at_count, 0xffffffff, 4), "slices"},
        {with(20 + 8, 4 * kBl, 8), "MR length"},        // the prefix's mr_len is not the first slice's
    };
    for (auto &b : bad) {
        assert_int_equal(code_of([&] { verbs::decode_section(b.sec, m); }, &msg), KVX_EBADMETA);
        assert_contains(msg, b.says);
    }
    wire::Section cut = s;  // a key short
    cut.body.pop_back();
    assert_int_equal(code_of([&] { verbs::decode_section(cut, m); }, &msg), KVX_EBADMETA);
    wire::Section extra = s;  // a byte more: refused at version 2, a later version may append
    extra.body.push_back(7);
    assert_int_equal(code_of([&] { verbs::decode_section(extra, m); }, &msg), KVX_EBADMETA);
    extra.version = 3;
    assert_int_equal(verbs::decode_section(extra, m).rails[1].rkeys[3], 0x24);
    // A later version that appends must be able to say "one registration":
    // a slice as long as the region, one slice, no keys.
    wire::Section whole = with(at_count, 1, 4);
    for (int i = 0; i < 8; i++) whole.body[28 + i] = whole.body[at_len + i] = static_cast<uint8_t>((16 * kBl) >> (8 * i));
    whole.body.resize(v1_len + 12);
    d = verbs::decode_section(whole, m);
    assert_int_equal(d.slice_len, 16 * kBl);
    assert_int_equal(d.rails[1].rkeys.size(), 1);
    // Exactly kMaxSlices: 256 blocks, a slice each.
    v.mr_len = 256 * kBl;
    v.slice_len = kBl;
    v.rails = {{ep("198.18.0.1", 20049), std::vector<uint32_t>(256, 0x11)}};
    d = verbs::decode_section(verbs::encode_section(v), meta_of(256, kBl));
    assert_int_equal(d.rails[0].rkeys.size(), 256);
    // More slices than kMaxSlices: 1,000 blocks of one block each.
    const wire::AgentMetadata big = meta_of(1000, kBl);
    v.mr_len = 1000 * kBl;
    v.slice_len = kBl;
    v.rails[0].rkeys.assign(1000, 0x11);
    v.rails.resize(1);
    const wire::Section many = verbs::encode_section(v);
    assert_int_equal(many.version, 2);
    assert_int_equal(code_of([&] { verbs::decode_section(many, big); }, &msg), KVX_EBADMETA);
    assert_contains(msg, "at most 256");
}

void test_verbs_devices_option(void **) {
    assert_true(verbs::parse_devices("all").empty());
    auto d = verbs::parse_devices("mlx5_0,mlx5_2:1");
    assert_int_equal(d.size(), 2);
    assert_string_equal(d[0].first.c_str(), "mlx5_0");
    assert_int_equal(d[0].second, 0);
    assert_int_equal(d[1].second, 1);
    std::string msg;
    for (const char *bad : {"", ",", "mlx5_0,", "x:0", "x:256", "x:1a", ":1"}) {
        assert_int_equal(code_of([&] { verbs::parse_devices(bad); }, &msg), KVX_EINVAL);
        assert_contains(msg, "verbs.devices");
    }
}

std::shared_ptr<verbs::Device> dev(const char *ip, uint8_t prefix) {
    auto d = std::make_shared<verbs::Device>();
    socklen_t len = 0;
    d->addr = net::from_endpoint(ep(ip, 0), &len);
    d->prefix = prefix;
    return d;
}

void test_pair_rails(void **) {
    std::vector<std::shared_ptr<verbs::Device>> local = {dev("198.18.0.1", 24), dev("198.18.1.1", 24)};
    std::vector<verbs::RemoteRail> remote = {{ep("198.18.1.2", 1), {0}}, {ep("198.18.0.2", 1), {0}},
                                             {ep("10.0.0.2", 1), {0}}};
    std::string notes;
    auto pairs = verbs::pair_rails(local, remote, &notes);
    assert_int_equal(pairs.size(), 2);  // by subnet, never the one no rail of ours reaches
    assert_int_equal(pairs[0].first, 1);
    assert_int_equal(pairs[0].second, 0);
    assert_int_equal(pairs[1].first, 0);
    assert_int_equal(pairs[1].second, 1);
    assert_contains(notes, "10.0.0.2");
    // two remote rails on one subnet of ours: both there, the least used first
    remote = {{ep("198.18.0.2", 1), {0}}, {ep("198.18.0.3", 1), {0}}};
    local.push_back(dev("198.18.0.9", 24));
    pairs = verbs::pair_rails(local, remote, &notes);
    assert_int_equal(pairs.size(), 2);
    assert_int_equal(pairs[0].first, 0);
    assert_int_equal(pairs[1].first, 2);
    // no subnet in common (a routed fabric): rail 0 with rail 0, rdma_cm decides
    remote = {{ep("10.9.0.2", 1), {0}}};
    pairs = verbs::pair_rails(local, remote, &notes);
    assert_int_equal(pairs.size(), 1);
    assert_int_equal(pairs[0].first, 0);
    assert_int_equal(pairs[0].second, 0);
}

// verbs.rail_map: pairs by the map alone, first entry that holds the
// address; what no entry holds (or whose device we lack) is left out.
void test_rail_map(void **) {
    std::vector<std::shared_ptr<verbs::Device>> local = {dev("198.18.0.1", 24), dev("198.18.1.1", 24)};
    local[0]->name = "mlx5_0";
    local[0]->port = 1;
    local[1]->name = "mlx5_1";
    local[1]->port = 1;
    // crossed on purpose: the map, not the subnets, decides
    auto map = verbs::parse_rail_map("mlx5_1=198.18.0.0/24,mlx5_0:1=198.18.1.2,mlx5_0=10.0.0.0/8");
    assert_int_equal(map.size(), 3);
    assert_int_equal(map[1].port, 1);
    assert_int_equal(map[1].prefix, 32);
    std::vector<verbs::RemoteRail> remote = {{ep("198.18.0.2", 1), {0}}, {ep("198.18.1.2", 1), {0}},
                                             {ep("198.18.1.3", 1), {0}}, {ep("10.1.2.3", 1), {0}}};
    std::string notes;
    auto pairs = verbs::pair_rails(local, remote, &notes, map);
    assert_int_equal(pairs.size(), 3);
    assert_int_equal(pairs[0].first, 1);  // 198.18.0.2 -> mlx5_1
    assert_int_equal(pairs[0].second, 0);
    assert_int_equal(pairs[1].first, 0);  // 198.18.1.2 -> mlx5_0
    assert_int_equal(pairs[2].first, 0);  // 10.1.2.3 -> mlx5_0
    assert_int_equal(pairs[2].second, 3);
    assert_contains(notes, "198.18.1.3");  // in no entry: left out, not paired by subnet
    notes.clear();
    map = verbs::parse_rail_map("mlx5_9=198.18.0.0/16");
    pairs = verbs::pair_rails(local, remote, &notes, map);
    assert_int_equal(pairs.size(), 0);  // no fallback to rail 0 with a map
    assert_contains(notes, "names no rail of ours");
    assert_int_equal(verbs::parse_rail_map("").size(), 0);
    assert_int_equal(verbs::parse_rail_map("mlx5_0=fd00::/8")[0].addr.family, 6);
    const char *bad[] = {"mlx5_0", "mlx5_0=", "=10.0.0.1", "mlx5_0=10.0.0.1/33", "mlx5_0=10.0.0.1/0",
                         "mlx5_0=host.example", "mlx5_0:0=10.0.0.1", "mlx5_0=10.0.0.1,", "mlx5_0=10.0.0.1/x"};
    for (const char *b : bad) {
        int code = 0;
        std::string what;
        try {
            verbs::parse_rail_map(b);
        } catch (const kvx::Error &e) {
            code = e.code();
            what = e.what();
        }
        if (code != KVX_EINVAL) fail_msg("verbs.rail_map '%s' was accepted", b);
        assert_contains(what, "verbs.rail_map");
    }
}
#endif

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_shares_weighted),
        cmocka_unit_test(test_split_shares_rounding),
#ifdef KVX_TEST_HAVE_VERBS
        cmocka_unit_test(test_verbs_section_rails),
        cmocka_unit_test(test_verbs_section_slices),
        cmocka_unit_test(test_verbs_devices_option),
        cmocka_unit_test(test_pair_rails),
        cmocka_unit_test(test_rail_map),
#endif
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
