// The C ABI: argument checks, handle to object, C++ exception to error code
// and thread-local message. No C++ type or exception crosses this file's
// exported functions.
#include <array>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <string>

#include "registry/registry.h"
#include "core/fingerprint.h"
#include "core/metrics.h"
#include "core/options.h"
#include "core/telemetry.h"
#include "core/transport.h"
#include "kvxfer.h"
#include "util/error.h"
#include "util/log.h"
#include "util/shared_region.h"

struct kvx_transport {
    kvx::Transport impl;
    template <class... A>
    explicit kvx_transport(A &&...a) : impl(std::forward<A>(a)...) {}
};

struct kvx_options {
    kvx::OptionBag bag;
};

namespace {

thread_local std::string t_last_error;

int set_error(int code, const char *msg) {
    t_last_error = msg;
    return code;
}

template <class F>
int guard(F &&f) noexcept {
    try {
        f();
        return KVX_OK;
    } catch (const kvx::Error &e) {
        return set_error(e.code(), e.what());
    } catch (const std::bad_alloc &) {
        return set_error(KVX_ENOMEM, "out of memory");
    } catch (const std::exception &e) {
        return set_error(KVX_EINTERNAL, e.what());
    } catch (...) {
        return set_error(KVX_EINTERNAL, "unknown internal error");
    }
}

#define KVX_REQUIRE(cond, ...)                             \
    do {                                                   \
        if (!(cond)) kvx::fail(KVX_EINVAL, __VA_ARGS__);   \
    } while (0)

std::string peer_id_arg(const char *peer_id) {
    KVX_REQUIRE(peer_id != nullptr, "peer_id is NULL");
    size_t len = strnlen(peer_id, KVX_PEER_ID_MAX + 1);
    KVX_REQUIRE(len > 0, "peer_id is empty");
    KVX_REQUIRE(len <= KVX_PEER_ID_MAX, "peer_id '%.32s...' is longer than %d bytes", peer_id, KVX_PEER_ID_MAX);
    return std::string(peer_id, len);
}

}  // namespace

extern "C" {

KVX_API unsigned kvx_version_number(void) { return KVX_VERSION_NUMBER; }

#define KVX_STR2(x) #x
#define KVX_STR(x) KVX_STR2(x)
KVX_API const char *kvx_version_string(void) {
    return KVX_STR(KVX_VERSION_MAJOR) "." KVX_STR(KVX_VERSION_MINOR) "." KVX_STR(KVX_VERSION_PATCH);
}

KVX_API const char *kvx_strerror(int code) { return kvx::error_name(code); }

KVX_API kvx_error_scope kvx_error_scope_of(int code) {
    switch (code) {
    case KVX_OK: return KVX_SCOPE_NONE;
    case KVX_ENOENT: case KVX_EBUSY: case KVX_EEXIST: case KVX_EINVAL: case KVX_ERANGE: case KVX_ENOBUFS:
    case KVX_ENOTSUP: case KVX_EOVERFLOW: case KVX_EBADMETA: case KVX_EVERSION: case KVX_EFINGERPRINT:
    case KVX_EGEOMETRY: case KVX_ECONFIG: case KVX_ECANCELED:
        return KVX_SCOPE_REQUEST;
    case KVX_ECONNREFUSED: case KVX_ETIMEDOUT: case KVX_ECONNRESET: case KVX_EHOSTUNREACH: case KVX_EPEERBROKEN:
    case KVX_EAUTH:
        return KVX_SCOPE_PEER;
    default: return KVX_SCOPE_TRANSPORT;
    }
}

KVX_API const char *kvx_last_error_message(void) { return t_last_error.c_str(); }

KVX_API int kvx_options_create(kvx_options **out) {
    return guard([&] {
        KVX_REQUIRE(out != nullptr, "out is NULL");
        *out = new kvx_options();
    });
}

KVX_API void kvx_options_destroy(kvx_options *opts) { delete opts; }

KVX_API int kvx_options_set(kvx_options *opts, const char *key, const char *value) {
    return guard([&] {
        KVX_REQUIRE(opts != nullptr, "options is NULL");
        KVX_REQUIRE(key != nullptr, "option key is NULL");
        KVX_REQUIRE(value != nullptr, "value of option '%s' is NULL", key);
        kvx::validate_option(key, value);
        opts->bag.kv[key] = value;
    });
}

// All pairs or none: the bag changes only once every pair is valid.
KVX_API int kvx_options_parse(kvx_options *opts, const char *text) {
    return guard([&] {
        KVX_REQUIRE(opts != nullptr, "options is NULL");
        KVX_REQUIRE(text != nullptr, "options text is NULL");
        kvx::OptionBag next = opts->bag;
        for (const auto &[key, value] : kvx::split_option_list(text)) {
            kvx::validate_option(key, value);
            next.kv[key] = value;
        }
        opts->bag = std::move(next);
    });
}

KVX_API int kvx_transport_create(kvx_transport **out, void *base, uint64_t num_blocks, uint64_t block_len,
                                 const char *config_json, const kvx_options *opts) {
    return guard([&] {
        KVX_REQUIRE(out != nullptr, "out is NULL");
        *out = new kvx_transport(base, num_blocks, block_len, config_json, opts ? &opts->bag : nullptr);
    });
}

KVX_API int kvx_transport_close(kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(t != nullptr, "transport is NULL");
        t->impl.close();
    });
}

KVX_API void kvx_transport_destroy(kvx_transport *t) {
    if (!t) return;
    guard([&] { t->impl.close(); });
    delete t;
}

KVX_API int kvx_transport_base_addr(uint64_t *out, const kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        *out = reinterpret_cast<uintptr_t>(t->impl.region().base);
    });
}

KVX_API int kvx_transport_num_blocks(uint64_t *out, const kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        *out = t->impl.region().num_blocks;
    });
}

KVX_API int kvx_transport_block_len(uint64_t *out, const kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        *out = t->impl.region().block_len;
    });
}

KVX_API int kvx_transport_config_fingerprint(char *out, const kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        const std::string &fp = t->impl.fingerprint();
        memcpy(out, fp.c_str(), fp.size() + 1);
    });
}

KVX_API const char *kvx_transport_backend(const kvx_transport *t) { return t ? t->impl.backend_name() : ""; }

KVX_API const char *kvx_transport_backends(const kvx_transport *t) {
    return t ? t->impl.backend_names().c_str() : "";
}

KVX_API int kvx_get_agent_metadata(size_t *out_len, kvx_transport *t, void *buf, size_t cap) {
    return guard([&] {
        KVX_REQUIRE(out_len && t, "NULL argument");
        KVX_REQUIRE(buf != nullptr || cap == 0, "buf is NULL with cap %zu", cap);
        const std::vector<uint8_t> &m = t->impl.metadata();
        *out_len = m.size();
        if (buf == nullptr) return;  // size query
        if (cap < m.size()) kvx::fail(KVX_ENOBUFS, "metadata needs %zu bytes, the buffer has %zu", m.size(), cap);
        memcpy(buf, m.data(), m.size());
    });
}

KVX_API int kvx_add_remote_peer(kvx_transport *t, const char *peer_id, const void *metadata, size_t metadata_len,
                                uint64_t base_addr, uint64_t num_blocks, uint64_t block_len) {
    return guard([&] {
        KVX_REQUIRE(t != nullptr, "transport is NULL");
        std::string id = peer_id_arg(peer_id);
        KVX_REQUIRE(metadata != nullptr || metadata_len == 0, "metadata is NULL");
        t->impl.add_peer(id, static_cast<const uint8_t *>(metadata), metadata_len, base_addr, num_blocks, block_len);
    });
}

KVX_API int kvx_add_remote_peer_async(uint64_t *out_reg, kvx_transport *t, const char *peer_id, const void *metadata,
                                      size_t metadata_len, uint64_t base_addr, uint64_t num_blocks,
                                      uint64_t block_len, unsigned flags) {
    return guard([&] {
        KVX_REQUIRE(out_reg && t, "NULL argument");
        std::string id = peer_id_arg(peer_id);
        KVX_REQUIRE(metadata != nullptr || metadata_len == 0, "metadata is NULL");
        *out_reg = t->impl.add_peer_async(id, static_cast<const uint8_t *>(metadata), metadata_len, base_addr,
                                          num_blocks, block_len, flags);
    });
}

KVX_API int kvx_registration_status(int *out_state, int *out_error, kvx_transport *t, uint64_t reg,
                                    int timeout_ms) {
    std::string message;
    int rc = guard([&] {
        KVX_REQUIRE(out_state && out_error && t, "NULL argument");
        KVX_REQUIRE(timeout_ms >= -1, "timeout_ms %d is below -1", timeout_ms);
        kvx::Registrations::Status s = t->impl.registration_status(reg, timeout_ms);
        *out_state = s.state;
        *out_error = s.error;
        message = std::move(s.message);
    });
    // The registration's failure becomes this thread's message: the thread
    // that connected is not the caller's.
    if (rc == 0 && *out_state == KVX_REGISTRATION_FAILED) t_last_error = message;
    return rc;
}

KVX_API int kvx_remove_remote_peer(kvx_transport *t, const char *peer_id) {
    return guard([&] {
        KVX_REQUIRE(t != nullptr, "transport is NULL");
        t->impl.remove_peer(peer_id_arg(peer_id));
    });
}

KVX_API int kvx_peer_backend(const char **out, const char **out_path, kvx_transport *t, const char *peer_id) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        const char *backend = "", *path = "";
        t->impl.peer_backend(peer_id_arg(peer_id), &backend, &path);
        *out = backend;
        if (out_path) *out_path = path;
    });
}

KVX_API int kvx_peer_rails(kvx_transport *t, const char *peer_id, kvx_rail_stats *out, size_t cap, size_t *n) {
    return guard([&] {
        KVX_REQUIRE(t && n, "NULL argument");
        KVX_REQUIRE(out || cap == 0, "out is NULL with cap = %zu", cap);
        std::vector<kvx::RailStats> rails;
        t->impl.peer_rails(peer_id_arg(peer_id), &rails);
        *n = rails.size();
        for (size_t i = 0; i < rails.size() && i < cap; i++) {
            kvx_rail_stats &o = out[i];
            o = kvx_rail_stats{};
            snprintf(o.name, sizeof o.name, "%s", rails[i].name.c_str());
            o.up = rails[i].up ? 1 : 0;
            o.bytes = rails[i].bytes;
            o.parts = rails[i].parts;
            o.failures = static_cast<uint32_t>(rails[i].failures);
            o.changed_ns = rails[i].changed_ns;
        }
    });
}

static_assert(sizeof(kvx_peer_state) == 256, "kvx_peer_state is 256 bytes (kvxfer.h)");

namespace {

// The C struct of a core peer state; times from steady-clock to CLOCK_REALTIME.
void to_c(kvx_peer_state *out, const kvx::Transport::PeerState &st) {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    const int64_t real_now = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
    const int64_t steady_now = kvx::Clock::now().time_since_epoch().count();
    auto real = [&](int64_t steady) { return steady == 0 ? 0 : real_now - (steady_now - steady); };
    *out = kvx_peer_state{};
    out->link = st.link;
    out->error = st.error;
    out->backend = st.backend;
    out->path = st.path;
    out->in_flight = st.in_flight;
    out->since_ns = real(st.since_ns);
    out->next_attempt_ns = real(st.next_attempt_ns);
    out->reconnects = st.reconnects;
    out->attempts = st.attempts;
    out->last_progress_ns = real(st.progress_ns);
    snprintf(out->reason, sizeof out->reason, "%s", st.reason.c_str());
}

}  // namespace

KVX_API int kvx_get_peer_state(kvx_transport *t, const char *peer_id, kvx_peer_state *out) {
    return guard([&] {
        KVX_REQUIRE(t && out, "NULL argument");
        to_c(out, t->impl.peer_state(peer_id_arg(peer_id)));
    });
}

static_assert(sizeof(kvx_peer_info) == 512, "kvx_peer_info is 512 bytes (kvxfer.h)");

KVX_API int kvx_list_peers(size_t *out_n, kvx_transport *t, kvx_peer_info *out, size_t cap) {
    return guard([&] {
        KVX_REQUIRE(out_n && t, "NULL argument");
        KVX_REQUIRE(out || cap == 0, "out is NULL with cap %zu", cap);
        const auto peers = t->impl.list_peers();
        for (size_t i = 0; i < peers.size() && i < cap; i++) {
            memset(out[i].peer_id, 0, sizeof out[i].peer_id);
            memcpy(out[i].peer_id, peers[i].first.data(), peers[i].first.size());
            to_c(&out[i].state, peers[i].second);
        }
        *out_n = peers.size();
    });
}

KVX_API int kvx_region_alloc(void **out, uint64_t size, unsigned flags) {
    return guard([&] {
        KVX_REQUIRE(out != nullptr, "out is NULL");
        KVX_REQUIRE((flags & ~static_cast<unsigned>(KVX_REGION_HUGE_PAGES)) == 0, "flags 0x%x has unknown bits", flags);
        *out = kvx::shared::alloc(size, flags & KVX_REGION_HUGE_PAGES);
    });
}

KVX_API void kvx_region_free(void *base) {
    if (base) kvx::shared::free(base);
}

KVX_API int kvx_write_blocks(uint64_t *out_id, kvx_transport *t, const char *peer_id, const uint64_t *local_idxs,
                             const uint64_t *remote_idxs, size_t n) {
    return guard([&] {
        KVX_REQUIRE(out_id && t, "NULL argument");
        uint64_t id = t->impl.write_blocks(peer_id_arg(peer_id), local_idxs, remote_idxs, n);
        *out_id = id;
    });
}

KVX_API int kvx_poll(size_t *out_n_done, size_t *out_n_failed, kvx_transport *t, const char *peer_id,
                     uint64_t *done, size_t done_cap, uint64_t *failed, size_t failed_cap) {
    return guard([&] {
        KVX_REQUIRE(out_n_done && out_n_failed && t, "NULL argument");
        t->impl.poll(peer_id, done, done_cap, out_n_done, failed, failed_cap, out_n_failed);
    });
}

KVX_API int kvx_poll_results(size_t *out_n, kvx_transport *t, const char *peer_id, kvx_result *out, size_t cap) {
    return guard([&] {
        KVX_REQUIRE(out_n && t, "NULL argument");
        *out_n = t->impl.poll_results(peer_id, out, cap);
    });
}

KVX_API int kvx_cancel(size_t *out_n_inflight, kvx_transport *t, const uint64_t *ids, size_t n, int mode,
                       uint64_t *inflight) {
    return guard([&] {
        KVX_REQUIRE(out_n_inflight && t, "NULL argument");
        *out_n_inflight = t->impl.cancel(ids, n, mode, inflight);
    });
}

KVX_API int kvx_wait(size_t *out_ready, kvx_transport *t, int timeout_ms) {
    return guard([&] {
        KVX_REQUIRE(out_ready && t, "NULL argument");
        *out_ready = t->impl.wait(timeout_ms);
    });
}

KVX_API int kvx_completion_fd(int *out_fd, kvx_transport *t) {
    return guard([&] {
        KVX_REQUIRE(out_fd && t, "NULL argument");
        *out_fd = t->impl.completion_fd();
    });
}

KVX_API int kvx_get_stats(kvx_stats *out, kvx_transport *t, const char *peer_id) {
    return guard([&] {
        KVX_REQUIRE(out && t, "NULL argument");
        KVX_REQUIRE(out->size >= sizeof out->size, "kvx_stats.size %llu is too small (set it with KVX_STATS_INIT)",
                    (unsigned long long)out->size);
        if (peer_id == nullptr) return t->impl.stats(out, nullptr);
        t->impl.stats(out, peer_id_arg(peer_id).c_str());
    });
}

KVX_API int kvx_config_fingerprint(char *out, const char *config_json) {
    return guard([&] {
        KVX_REQUIRE(out != nullptr, "out is NULL");
        std::string fp = kvx::config_fingerprint(config_json);
        memcpy(out, fp.c_str(), fp.size() + 1);
    });
}

KVX_API int kvx_metrics_text(size_t *out_len, kvx_transport *t, char *buf, size_t cap) {
    return guard([&] {
        KVX_REQUIRE(out_len && t, "NULL argument");
        KVX_REQUIRE(buf || cap == 0, "buf is NULL with cap %zu", cap);
        const std::string text = kvx::metrics_text(t->impl);
        *out_len = text.size() + 1;
        if (cap < text.size() + 1)
            kvx::fail(KVX_ENOBUFS, "the metrics text needs %zu bytes, the buffer has %zu", text.size() + 1, cap);
        memcpy(buf, text.c_str(), text.size() + 1);
    });
}

KVX_API uint64_t kvx_stats_bucket_lower_ns(size_t i) {
    return i < kvx::LatencyHistogram::kBuckets ? kvx::LatencyHistogram::lower_bound(i) : UINT64_MAX;
}

KVX_API int kvx_set_log_handler(kvx_log_fn fn, void *user, int level) {
    return guard([&] {
        KVX_REQUIRE(level >= KVX_LOG_OFF && level <= KVX_LOG_DEBUG,
                    "log level %d is not KVX_LOG_OFF (-1) to KVX_LOG_DEBUG (3)", level);
        kvx::log_set_handler(reinterpret_cast<void *>(fn), user, level);
    });
}

KVX_API int kvx_get_log_level(void) {
    for (int l = KVX_LOG_DEBUG; l >= KVX_LOG_ERROR; l--)
        if (kvx::log_enabled(static_cast<kvx::LogLevel>(l))) return l;
    return KVX_LOG_OFF;
}

KVX_API int kvx_log_flush(int timeout_ms) {
    return guard([&] {
        KVX_REQUIRE(timeout_ms >= -1, "timeout_ms %d is below -1", timeout_ms);
        if (kvx::log_on_handler_thread()) kvx::fail(KVX_EBUSY, "kvx_log_flush called from the log handler");
        if (!kvx::log_flush(timeout_ms))
            kvx::fail(KVX_ETIMEDOUT, "log messages still waiting for the handler after %d ms", timeout_ms);
    });
}

KVX_API const char *kvx_backends(void) {
    // Built once from the registry, without allocating (this call never fails).
    static const auto list = [] {
        std::array<char, 256> s{};
        size_t n = 0;
        for (const kvx::BackendDesc *b : kvx::backend_registry()) {
            const size_t len = strlen(b->name);
            if (n + len + 2 > s.size()) break;  // names are a few letters: never
            if (n) s[n++] = ',';
            memcpy(&s[n], b->name, len);
            n += len;
        }
        return s;
    }();
    return list.data();
}

}  // extern "C"
