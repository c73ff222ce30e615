// Internal error type: every failure inside the library is a kvx::Error
// carrying a public KVX_E* code and a message naming the bad value. The C ABI
// layer (src/capi) turns it into the return code and the thread-local message.
#pragma once

#include <cstdarg>
#include <stdexcept>
#include <string>

#include "kvxfer.h"

namespace kvx {

class Error : public std::runtime_error {
public:
    Error(int code, std::string msg) : std::runtime_error(std::move(msg)), code_(code) {}
    int code() const noexcept { return code_; }

private:
    int code_;
};

// printf-style formatting into a std::string.
std::string strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char *fmt, va_list ap);

// The text of a KVX_E* code (kvx_strerror() is this, exported): the layers
// below the C API use it for messages.
const char *error_name(int code);

// Throw Error(code, formatted message).
[[noreturn]] void fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace kvx
