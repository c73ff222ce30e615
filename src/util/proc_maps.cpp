#include "util/proc_maps.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace kvx {

bool parse_map_line(const char *line, MapLine *m) {
    int n = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %" SCNx64 " %x:%x %" SCNu64 " %n", &m->start, &m->end, m->perms,
               &m->offset, &m->maj, &m->min, &m->inode, &n) < 7)
        return false;
    m->path = line + n;
    while (!m->path.empty() && (m->path.back() == '\n' || m->path.back() == ' ')) m->path.pop_back();
    return true;
}

ProcLines::ProcLines(const char *path) : f_(fopen(path, "re")) {
    if (!f_) err_ = errno;
}

ProcLines::~ProcLines() {
    if (f_) fclose(f_);
    free(buf_);
}

const char *ProcLines::next() {
    if (!f_) return nullptr;
    return getline(&buf_, &cap_, f_) < 0 ? nullptr : buf_;
}

}  // namespace kvx
