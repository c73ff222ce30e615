#include "util/proc_maps.h"

#include <cinttypes>
#include <cstdio>

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

}  // namespace kvx
