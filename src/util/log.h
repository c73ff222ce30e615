// Diagnostics: warnings and errors to stderr by default, or to the
// application's handler (kvx_set_log_handler()). KVX_LOG=off|error|warn|
// info|debug sets the starting level. Each call site is rate-limited
// (LogSite), so a flood of one message cannot fill a disk.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace kvx {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

// One KVX_LOG call site: its token bucket (error, warn and info; debug is
// never limited) and what it dropped since it last passed.
struct LogSite {
    std::atomic<int64_t> next_ns{0};        // the bucket, as the time it is empty up to (GCRA)
    std::atomic<uint64_t> suppressed{0};
};

// The subsystem a source file belongs to, from its path: "shm", "tcp",
// "verbs" (src/backends/<name>/), "handshake", else "core".
constexpr const char *log_component(std::string_view file) {
    for (const char *b : {"shm", "tcp", "verbs"}) {
        std::string_view dir = b;
        size_t at = file.find("backends/");
        if (at != std::string_view::npos && file.substr(at + 9, dir.size()) == dir &&
            file.substr(at + 9 + dir.size(), 1) == "/")
            return b;
    }
    return file.find("handshake/") != std::string_view::npos ? "handshake" : "core";
}

bool log_enabled(LogLevel level);
void log_msg(LogSite &site, LogLevel level, const char *component, const char *peer_id, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Sets the level and handler (the C API's kvx_set_log_handler(): fn is a
// kvx_log_fn, NULL for stderr); waits for a handler call in progress.
void log_set_handler(void *fn, void *user, int level);
// Waits until what was logged before is delivered; false on timeout.
bool log_flush(int timeout_ms);
// True on the thread that calls the application's handler.
bool log_on_handler_thread();

#define KVX_LOG_AT(level, peer, ...)                                                                          \
    do {                                                                                                      \
        if (::kvx::log_enabled(::kvx::LogLevel::level)) {                                                    \
            static ::kvx::LogSite kvx_log_site_;                                                              \
            static constexpr const char *kvx_log_component_ = ::kvx::log_component(__FILE__);                 \
            ::kvx::log_msg(kvx_log_site_, ::kvx::LogLevel::level, kvx_log_component_, peer, __VA_ARGS__);      \
        }                                                                                                     \
    } while (0)

// KVX_LOG(warn, "fmt", ...): a message of the current component.
#define KVX_LOG(level, ...) KVX_LOG_AT(level, nullptr, __VA_ARGS__)
// KVX_LOG_PEER(warn, peer_id_cstr, "fmt", ...): a message about one peer.
#define KVX_LOG_PEER(level, peer, ...) KVX_LOG_AT(level, peer, __VA_ARGS__)

}  // namespace kvx
