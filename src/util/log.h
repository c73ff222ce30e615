// Minimal diagnostics to stderr, off by default: KVX_LOG=error|warn|info|debug.
#pragma once

namespace kvx {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

bool log_enabled(LogLevel level);
void log_msg(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define KVX_LOG(level, ...)                                                    \
    do {                                                                       \
        if (::kvx::log_enabled(::kvx::LogLevel::level)) ::kvx::log_msg(::kvx::LogLevel::level, __VA_ARGS__); \
    } while (0)

}  // namespace kvx
