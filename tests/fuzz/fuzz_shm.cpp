// libFuzzer target: the shm backend's bytes from another process
// (src/backends/shm/shm_wire.cpp): its metadata section (decode_section) and
// the control messages on its socket (decode_ctl).
// Input: byte 0 selects the parser (even: section, with byte 1 as the
// section's version; odd: control message), the rest is the input.
// Checks beyond "no crash": only kvx::Error escapes, with KVX_EBADMETA for
// the section and KVX_EINVAL for a control message; an accepted input
// re-encodes to exactly its bytes (nothing ignored, nothing invented; a
// section of a later version may carry appended bytes, which are ignored).
// Corpus: tests/fuzz/corpus/shm.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backends/shm/shm_wire.h"
#include "kvxfer.h"
#include "util/error.h"

using namespace kvx::shm;

namespace {

[[noreturn]] void bug(const char *what) {
    fprintf(stderr, "fuzz_shm: %s\n", what);
    abort();
}

void section(uint8_t version, const uint8_t *p, size_t n) {
    kvx::wire::Section s{kSectionId, version, std::vector<uint8_t>(p, p + n)};
    SectionInfo info;
    try {
        info = decode_section(s);
    } catch (const kvx::Error &e) {
        if (e.code() != KVX_EBADMETA) bug("section: an error other than KVX_EBADMETA");
        return;
    }
    const kvx::wire::Section again = encode_section(info);
    // Re-encoded as the current version: a version 1 section gains start_time (0).
    const size_t m = again.body.size() - (version < 2 ? 8 : 0);
    if (version < 2 && info.start_time != 0) bug("section: version 1 has a start time");
    if (m > n || memcmp(again.body.data(), p, m) != 0) bug("section: re-encoding differs");
    if (version <= kSectionVersion && m != n) bug("section: a known version accepted trailing bytes");
    if (info.socket_name.empty() || info.socket_name.size() > kMaxSocketName) bug("section: bad name length");
}

void control(const uint8_t *p, size_t n) {
    CtlMsg m;
    try {
        m = decode_ctl(p, n);
    } catch (const kvx::Error &e) {
        if (e.code() != KVX_EINVAL) bug("control: an error other than KVX_EINVAL");
        return;
    }
    uint8_t out[kCtlMaxLen];
    const size_t len = encode_ctl(m, out);
    if (len != n || memcmp(out, p, n) != 0) bug("control: re-encoding differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    if (data[0] % 2 == 0) section(data[1], data + 2, size - 2);
    else control(data + 1, size - 1);
    return 0;
}
