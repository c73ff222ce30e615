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

const char *error_name(int code) {
    switch (code) {
    case KVX_OK: return "success";
    case KVX_EPERM: return "operation not permitted";
    case KVX_ENOENT: return "unknown peer";
    case KVX_ENOMEM: return "out of memory";
    case KVX_EBUSY: return "resource busy";
    case KVX_EEXIST: return "peer already registered";
    case KVX_EINVAL: return "invalid argument";
    case KVX_ERANGE: return "block index out of range";
    case KVX_ENOBUFS: return "buffer too small";
    case KVX_ENOTSUP: return "not supported";
    case KVX_EOVERFLOW: return "size overflow";
    case KVX_ECONNREFUSED: return "connection refused";
    case KVX_ETIMEDOUT: return "timed out";
    case KVX_ECONNRESET: return "connection lost";
    case KVX_EHOSTUNREACH: return "peer unreachable";
    case KVX_ECANCELED: return "cancelled: the peer was removed or replaced";
    case KVX_ECLOSED: return "transport closed";
    case KVX_EBADMETA: return "invalid agent metadata";
    case KVX_EVERSION: return "unsupported protocol version";
    case KVX_EFINGERPRINT: return "config fingerprint mismatch";
    case KVX_EGEOMETRY: return "region geometry mismatch";
    case KVX_EPEERBROKEN: return "peer connection broken";
    case KVX_EAUTH: return "authentication failed";
    case KVX_ECONFIG: return "invalid config";
    case KVX_EBACKEND: return "backend failure";
    case KVX_EINTERNAL: return "internal error";
    default: return "unknown error code";
    }
}

}  // namespace kvx
