#include "util/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace kvx {

namespace {

int threshold() {
    static const int level = [] {
        const char *e = getenv("KVX_LOG");
        if (!e || !*e) return -1;
        static const char *names[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (strcmp(e, names[i]) == 0) return i;
        return 1;
    }();
    return level;
}

}  // namespace

bool log_enabled(LogLevel level) { return static_cast<int>(level) <= threshold(); }

void log_msg(LogLevel level, const char *fmt, ...) {
    static const char *tags[] = {"error", "warn", "info", "debug"};
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "kvxfer[%d] %s: ", static_cast<int>(getpid()), tags[static_cast<int>(level)]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n) - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    buf[len++] = '\n';
    fwrite(buf, 1, len, stderr);
}

}  // namespace kvx
