// The shm backend's bytes: its metadata section and the control messages on
// its unix socket after the shared handshake (docs/wire-format.md, "shm").
// Both come from another process: the decoders are bounded, validate every
// field and are fuzzed (tests/fuzz/fuzz_shm.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/metadata.h"

namespace kvx::shm {

constexpr uint16_t kSectionId = 4;
constexpr uint8_t kSectionVersion = 2;     // written (2 since 0.9.0: start_time appended)
constexpr uint8_t kSectionMinVersion = 1;  // read
constexpr size_t kMaxSocketName = 100;  // abstract unix socket name, without its leading NUL

// How a writer puts bytes into this target's region.
enum class Mode : uint8_t {
    none = 0,    // private memory and shm.private=off: no shm path
    mapped = 1,  // the region lies in a shareable file: the writer maps it (fd over SCM_RIGHTS)
    kernel = 2,  // private memory: the writer uses process_vm_writev
    staged = 3,  // private memory: the writer fills a staging ring, the target's loop copies (grants only)
};

struct SectionInfo {
    std::array<uint8_t, 16> boot_id{};  // /proc/sys/kernel/random/boot_id
    uint64_t netns = 0;                 // inode of /proc/self/ns/net: where the abstract socket lives
    uint32_t pid = 0;                   // the target's pid (for the log; the socket's credentials decide)
    Mode mode = Mode::none;
    std::string socket_name;            // 1..kMaxSocketName bytes of [A-Za-z0-9._-]
    // Version 2: when the target process started (/proc/PID/stat starttime,
    // clock ticks since boot), so that a writer that pinned the socket's pid
    // with pidfd_open can tell the target from a process that got its pid
    // later; 0: not said (version 1, or unknown).
    uint64_t start_time = 0;
};

wire::Section encode_section(const SectionInfo &s);
// Throws Error(KVX_EBADMETA) naming the defect; a newer version may append fields.
SectionInfo decode_section(const wire::Section &s);

// Control messages, one SOCK_SEQPACKET datagram each, after ACCEPT:
//   target -> writer  GRANT {mode, offset, size} (+ the fd of the file for mapped)
//   target -> writer  REVOKE: unmap and stop now (the target closes or removes)
//   writer -> target  REVOKED: nothing of this writer touches the region any more
// Private memory the kernel will not let the writer reach (or a grant of
// mode staged): the writer asks for a staging ring and copies through it.
//   writer -> target  STAGE
//   target -> writer  STAGED {slots, slot_len, ring_len} (+ the fd of the ring, a sealed memfd)
//   writer -> target  COPY {slot, nseg, ticket, nseg x {dst_off, len}}: the slot holds the
//                     segments' bytes one after the other, each for region offset dst_off
//   target -> writer  COPIED {slot, status, ticket}: 0 copied, 1 withdrawn (not copied)
constexpr uint32_t kCtlMagic = 0x43585642u;  // "BVXC" in wire order
enum class Ctl : uint8_t { grant = 1, revoke = 2, revoked = 3, stage = 4, staged = 5, copy = 6, copied = 7 };
constexpr size_t kCtlHeaderLen = 8;
constexpr size_t kGrantLen = kCtlHeaderLen + 8 + 8 + 8;
constexpr size_t kStagedLen = kCtlHeaderLen + 4 + 4 + 8;
constexpr uint32_t kMaxCopySegs = 64;                 // segments per COPY (the runs of a transfer)
constexpr size_t kCopyHeadLen = kCtlHeaderLen + 4 + 4 + 8;  // slot, nseg, ticket
constexpr size_t kCopySegLen = 8 + 4 + 4;                  // dst_off, len, reserved
constexpr size_t kCopiedLen = kCtlHeaderLen + 4 + 4 + 8;
constexpr size_t kCtlMaxLen = kCopyHeadLen + kMaxCopySegs * kCopySegLen;

// The staging ring: a 64-byte line per slot holding its state word, then the
// slots' bytes from ring_data_off(). A state word is 0 (free or withdrawn),
// a ticket (posted by the writer), ticket | kTaken (the target copies it) or
// ticket | kCopied. Tickets are 1 .. kCopied - 1, never reused on a ring.
constexpr uint32_t kMaxSlots = 64;
constexpr uint32_t kMinSlotLen = 4096, kMaxSlotLen = 16u << 20;
constexpr uint64_t kTaken = uint64_t{1} << 63, kCopied = uint64_t{1} << 62;
constexpr uint64_t ring_data_off(uint32_t slots) { return (uint64_t{slots} * 64 + 4095) / 4096 * 4096; }
constexpr uint64_t ring_len(uint32_t slots, uint32_t slot_len) { return ring_data_off(slots) + uint64_t{slots} * slot_len; }

struct CtlMsg {
    Ctl kind = Ctl::revoke;
    Mode mode = Mode::none;  // grant
    uint64_t offset = 0;     // grant, mapped: where the region starts in the file
    uint64_t size = 0;       // grant: the region's bytes; staged: the ring's bytes
    uint32_t slots = 0, slot_len = 0;  // staged
    uint32_t slot = 0;                 // copy, copied
    uint32_t nseg = 0;                 // copy: segs[0..nseg)
    struct Seg {
        uint64_t dst_off = 0;
        uint32_t len = 0;
    };
    std::array<Seg, kMaxCopySegs> segs{};
    uint64_t ticket = 0;               // copy, copied
    uint32_t status = 0;               // copied
};
size_t encode_ctl(const CtlMsg &m, uint8_t out[kCtlMaxLen]);
// Throws Error(KVX_EINVAL) for anything but one well-formed message of exactly
// n bytes (fields in range; the receiver checks them against its own state).
CtlMsg decode_ctl(const uint8_t *p, size_t n);

}  // namespace kvx::shm
