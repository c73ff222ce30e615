// Lines of /proc/self/maps and /proc/self/smaps: which mappings cover an
// address range, and what smaps says of them.
#pragma once

#include <cstdint>
#include <string>

namespace kvx {

// One mapping (a line of /proc/self/maps, or the header line of an entry of
// /proc/self/smaps).
struct MapLine {
    uintptr_t start = 0, end = 0;
    char perms[5] = {};
    uint64_t offset = 0;
    unsigned maj = 0, min = 0;
    uint64_t inode = 0;
    std::string path;
    bool anonymous_private() const { return inode == 0 && perms[3] == 'p'; }
};

// Parses a maps line; false when it is not one (an smaps "Key: value" line).
bool parse_map_line(const char *line, MapLine *m);

}  // namespace kvx
