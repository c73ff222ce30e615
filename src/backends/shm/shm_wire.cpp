#include "backends/shm/shm_wire.h"

#include "util/bytes.h"
#include "util/error.h"

namespace kvx::shm {

wire::Section encode_section(const SectionInfo &s) {
    Writer w;
    w.bytes(s.boot_id.data(), s.boot_id.size());
    w.u64(s.netns);
    w.u32(s.pid);
    w.u8(static_cast<uint8_t>(s.mode));
    w.u8(static_cast<uint8_t>(s.socket_name.size()));
    w.bytes(s.socket_name.data(), s.socket_name.size());
    w.u64(s.start_time);
    return wire::Section{kSectionId, kSectionVersion, std::move(w.buf())};
}

SectionInfo decode_section(const wire::Section &sec) {
    if (sec.version < kSectionMinVersion) fail(KVX_EBADMETA, "shm section: version %u is unknown", sec.version);
    Reader r(sec.body.data(), sec.body.size(), KVX_EBADMETA, "shm section");
    SectionInfo s;
    const uint8_t *boot = r.bytes(s.boot_id.size(), "boot_id");
    std::copy(boot, boot + s.boot_id.size(), s.boot_id.begin());
    s.netns = r.u64("netns");
    s.pid = r.u32("pid");
    const uint8_t mode = r.u8("mode");
    if (mode > static_cast<uint8_t>(Mode::kernel)) fail(KVX_EBADMETA, "shm section: mode %u is unknown", mode);
    s.mode = static_cast<Mode>(mode);
    const uint8_t len = r.u8("socket_name_len");
    if (len == 0 || len > kMaxSocketName)
        fail(KVX_EBADMETA, "shm section: socket name of %u bytes is not 1..%zu", len, kMaxSocketName);
    const uint8_t *name = r.bytes(len, "socket_name");
    for (size_t i = 0; i < len; i++) {
        const uint8_t c = name[i];
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                        c == '_' || c == '-';
        if (!ok) fail(KVX_EBADMETA, "shm section: socket name byte %zu is 0x%02x", i, c);
    }
    s.socket_name.assign(reinterpret_cast<const char *>(name), len);
    if (sec.version >= 2) s.start_time = r.u64("start_time");
    if (sec.version <= kSectionVersion && r.remaining() != 0)
        fail(KVX_EBADMETA, "shm section: %zu trailing bytes", r.remaining());
    return s;
}

size_t encode_ctl(const CtlMsg &m, uint8_t out[kCtlMaxLen]) {
    put_le(out, kCtlMagic, 4);
    out[4] = static_cast<uint8_t>(m.kind);
    out[5] = m.kind == Ctl::grant ? static_cast<uint8_t>(m.mode) : 0;
    out[6] = out[7] = 0;
    switch (m.kind) {
    case Ctl::grant:
        put_le(out + 8, m.offset, 8);
        put_le(out + 16, m.size, 8);
        put_le(out + 24, 0, 8);
        return kGrantLen;
    case Ctl::staged:
        put_le(out + 8, m.slots, 4);
        put_le(out + 12, m.slot_len, 4);
        put_le(out + 16, m.size, 8);
        return kStagedLen;
    case Ctl::copy:
        put_le(out + 8, m.slot, 4);
        put_le(out + 12, m.nseg, 4);
        put_le(out + 16, m.ticket, 8);
        for (uint32_t i = 0; i < m.nseg; i++) {
            uint8_t *s = out + kCopyHeadLen + i * kCopySegLen;
            put_le(s, m.segs[i].dst_off, 8);
            put_le(s + 8, m.segs[i].len, 4);
            put_le(s + 12, 0, 4);
        }
        return kCopyHeadLen + m.nseg * kCopySegLen;
    case Ctl::copied:
        put_le(out + 8, m.slot, 4);
        put_le(out + 12, m.status, 4);
        put_le(out + 16, m.ticket, 8);
        return kCopiedLen;
    default:
        return kCtlHeaderLen;
    }
}

namespace {

// The length a message of this kind must have (COPY: from its segment count,
// n being what arrived; a count out of range gives 0, which no message has).
size_t ctl_len(Ctl k, const uint8_t *p, size_t n) {
    switch (k) {
    case Ctl::grant: return kGrantLen;
    case Ctl::staged: return kStagedLen;
    case Ctl::copied: return kCopiedLen;
    case Ctl::copy: {
        if (n < kCopyHeadLen) return kCopyHeadLen;
        const uint64_t nseg = get_le(p + 12, 4);
        if (nseg < 1 || nseg > kMaxCopySegs) fail(KVX_EINVAL, "shm copy: %llu segments is not 1..%u",
                                                  static_cast<unsigned long long>(nseg), kMaxCopySegs);
        return kCopyHeadLen + nseg * kCopySegLen;
    }
    default: return kCtlHeaderLen;
    }
}

uint64_t ticket_of(const uint8_t *p, const char *what) {
    const uint64_t t = get_le(p, 8);
    if (t == 0 || t >= kCopied) fail(KVX_EINVAL, "shm %s: ticket %llu is not 1..2^62-1", what, (unsigned long long)t);
    return t;
}

}  // namespace

CtlMsg decode_ctl(const uint8_t *p, size_t n) {
    if (n < kCtlHeaderLen) fail(KVX_EINVAL, "shm control message of %zu bytes is too short", n);
    if (get_le(p, 4) != kCtlMagic) fail(KVX_EINVAL, "shm control message: bad magic");
    CtlMsg m;
    const uint8_t kind = p[4];
    if (kind < 1 || kind > 7) fail(KVX_EINVAL, "shm control message: kind %u is unknown", kind);
    m.kind = static_cast<Ctl>(kind);
    if (p[6] != 0 || p[7] != 0) fail(KVX_EINVAL, "shm control message: reserved bytes set");
    const size_t want = ctl_len(m.kind, p, n);
    if (n != want) fail(KVX_EINVAL, "shm control message of kind %u has %zu bytes, not %zu", kind, n, want);
    if (m.kind != Ctl::grant && p[5] != 0) fail(KVX_EINVAL, "shm control message: reserved bytes set");
    switch (m.kind) {
    case Ctl::grant:
        if (p[5] != static_cast<uint8_t>(Mode::mapped) && p[5] != static_cast<uint8_t>(Mode::kernel) &&
            p[5] != static_cast<uint8_t>(Mode::staged))
            fail(KVX_EINVAL, "shm grant: mode %u is not granted", p[5]);
        m.mode = static_cast<Mode>(p[5]);
        m.offset = get_le(p + 8, 8);
        m.size = get_le(p + 16, 8);
        if (get_le(p + 24, 8) != 0) fail(KVX_EINVAL, "shm grant: reserved field set");
        if (m.mode != Mode::mapped && m.offset != 0) fail(KVX_EINVAL, "shm grant: offset without a mapping");
        break;
    case Ctl::staged:
        m.slots = static_cast<uint32_t>(get_le(p + 8, 4));
        m.slot_len = static_cast<uint32_t>(get_le(p + 12, 4));
        m.size = get_le(p + 16, 8);
        if (m.slots < 1 || m.slots > kMaxSlots) fail(KVX_EINVAL, "shm staged: %u slots is not 1..%u", m.slots, kMaxSlots);
        if (m.slot_len < kMinSlotLen || m.slot_len > kMaxSlotLen || m.slot_len % kMinSlotLen != 0)
            fail(KVX_EINVAL, "shm staged: slot_len %u is not a multiple of %u in %u..%u", m.slot_len, kMinSlotLen,
                 kMinSlotLen, kMaxSlotLen);
        if (m.size != ring_len(m.slots, m.slot_len))
            fail(KVX_EINVAL, "shm staged: ring of %llu bytes, %u slots of %u need %llu", (unsigned long long)m.size,
                 m.slots, m.slot_len, (unsigned long long)ring_len(m.slots, m.slot_len));
        break;
    case Ctl::copy: {
        m.slot = static_cast<uint32_t>(get_le(p + 8, 4));
        m.nseg = static_cast<uint32_t>(get_le(p + 12, 4));
        m.ticket = ticket_of(p + 16, "copy");
        if (m.slot >= kMaxSlots) fail(KVX_EINVAL, "shm copy: slot %u is not below %u", m.slot, kMaxSlots);
        uint64_t total = 0;
        for (uint32_t i = 0; i < m.nseg; i++) {
            const uint8_t *s = p + kCopyHeadLen + i * kCopySegLen;
            m.segs[i].dst_off = get_le(s, 8);
            m.segs[i].len = static_cast<uint32_t>(get_le(s + 8, 4));
            if (get_le(s + 12, 4) != 0) fail(KVX_EINVAL, "shm copy: segment %u: reserved field set", i);
            if (m.segs[i].len == 0) fail(KVX_EINVAL, "shm copy: segment %u has length 0", i);
            total += m.segs[i].len;
        }
        if (total > kMaxSlotLen)
            fail(KVX_EINVAL, "shm copy: %llu bytes are more than a slot can hold (%u)",
                 static_cast<unsigned long long>(total), kMaxSlotLen);
        break;
    }
    case Ctl::copied:
        m.slot = static_cast<uint32_t>(get_le(p + 8, 4));
        m.status = static_cast<uint32_t>(get_le(p + 12, 4));
        m.ticket = ticket_of(p + 16, "copied");
        if (m.slot >= kMaxSlots) fail(KVX_EINVAL, "shm copied: slot %u is not below %u", m.slot, kMaxSlots);
        if (m.status > 1) fail(KVX_EINVAL, "shm copied: status %u is not 0 or 1", m.status);
        break;
    default:
        break;
    }
    return m;
}

}  // namespace kvx::shm
