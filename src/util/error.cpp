#include "util/error.h"

#include <cstdio>
#include <vector>

namespace kvx {

std::string vstrfmt(const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    char small[256];
    int n = std::vsnprintf(small, sizeof small, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return fmt;
    }
    if (static_cast<size_t>(n) < sizeof small) {
        va_end(ap2);
        return std::string(small, static_cast<size_t>(n));
    }
    std::string out(static_cast<size_t>(n), '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

std::string strfmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return s;
}

void fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    throw Error(code, std::move(s));
}

}  // namespace kvx
