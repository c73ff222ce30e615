// Lines of /proc/self/maps and /proc/self/smaps: which mappings cover an
// address range, and what smaps says of them.
#pragma once

#include <cstdint>
#include <cstdio>
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

// Reads a /proc text file line by line, whole lines of any length (a path
// in maps may be longer than any fixed buffer).
class ProcLines {
public:
    explicit ProcLines(const char *path);
    ~ProcLines();
    ProcLines(const ProcLines &) = delete;
    ProcLines &operator=(const ProcLines &) = delete;
    bool ok() const { return f_ != nullptr; }
    int error() const { return err_; }  // errno of the open, when !ok()
    // The next line (its newline kept), or nullptr at the end.
    const char *next();

private:
    FILE *f_;
    int err_ = 0;
    char *buf_ = nullptr;
    size_t cap_ = 0;
};

}  // namespace kvx
