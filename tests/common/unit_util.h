// Helpers shared by the unit tests of internal modules: run a callable and
// report the kvx::Error code it threw, and assert that a message mentions a
// value. Include after the project headers (cmocka.h defines a fail() macro
// that clashes with kvx::fail()).
#pragma once

#include <functional>
#include <string>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include "util/error.h"

namespace kvx::testing {


constexpr int kNoError = 0;
constexpr int kForeignException = 1;  // something other than kvx::Error escaped

// Runs f; returns 0 if it returned, the kvx::Error code if it threw one.
inline int code_of(const std::function<void()> &f, std::string *msg = nullptr) {
    try {
        f();
        return kNoError;
    } catch (const Error &e) {
        if (msg) *msg = e.what();
        return e.code();
    } catch (const std::exception &e) {
        if (msg) *msg = std::string("foreign exception: ") + e.what();
        return kForeignException;
    }
}

inline bool contains(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

#define assert_contains(s, needle)                                                                   \
    do {                                                                                             \
        if (!contains((s), (needle)))                                                                \
            fail_msg("message \"%s\" does not mention \"%s\"", std::string(s).c_str(), (needle));    \
    } while (0)


}  // namespace kvx::testing
