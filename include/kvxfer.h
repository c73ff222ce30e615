/*
 * kvxfer - one-sided KV-cache block transfer between hosts.
 *
 * This is the whole public API: one C99 header (with the two parts it
 * includes, kvxfer/stats.h and kvxfer/log.h), opaque handles, one error
 * convention. It implements the data-plane contract of vLLM's DataTransport:
 * a transport owns (but never frees) one local region of num_blocks x block_len
 * bytes, hands out opaque agent metadata, registers remote peers from theirs,
 * and writes local blocks into a peer's blocks with one-sided semantics (the
 * target never has to call anything for bytes to land).
 *
 * Sections: export macros, version, error codes, opaque types, options,
 * lifecycle, properties, peers, transfers, completion and cancel,
 * introspection (stats, in kvxfer/stats.h), utilities, logging (in
 * kvxfer/log.h).
 *
 * Conventions (true for every function unless its comment says otherwise):
 *  - Functions return int: 0 on success, a negative KVX_E* code on failure.
 *    Codes equal to -errno are used where an errno fits; the others lie at or
 *    below KVX_ERRNO_OFFSET. kvx_strerror() names a code and
 *    kvx_last_error_message() gives the context of the calling thread's last
 *    failure ("peer 'p1': remote index 70000 >= 65536 blocks").
 *  - Out-parameters that receive one result come first and are named out*.
 *    On failure they are left unchanged.
 *  - Destructors return void and accept NULL.
 *  - Thread safety: every function taking a kvx_transport may be called from
 *    several threads at once on the same transport, except
 *    kvx_transport_destroy(), which must be the last call on the handle.
 *    A kvx_options object is not thread-safe; it is only read by
 *    kvx_transport_create() and may be destroyed right after.
 *  - No function throws, aborts or writes to stdout on bad input.
 */
#ifndef KVXFER_H
#define KVXFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- export */

#if defined(KVX_BUILDING_LIBRARY) && defined(__GNUC__)
#define KVX_API __attribute__((visibility("default")))
#else
#define KVX_API
#endif

/* ---------------------------------------------------------------- version */

#define KVX_VERSION_MAJOR 0
#define KVX_VERSION_MINOR 14
#define KVX_VERSION_PATCH 0
/** MAJOR*10000 + MINOR*100 + PATCH, comparable with '<'. */
#define KVX_VERSION_NUMBER \
    (KVX_VERSION_MAJOR * 10000 + KVX_VERSION_MINOR * 100 + KVX_VERSION_PATCH)

/** @return KVX_VERSION_NUMBER of the library actually loaded at run time. */
KVX_API unsigned kvx_version_number(void);

/** @return "MAJOR.MINOR.PATCH" of the loaded library; static storage. */
KVX_API const char *kvx_version_string(void);

/* ---------------------------------------------------------------- errors */

/**
 * Error codes. Every failure is one of these, negated errno values first.
 * Scope (see kvx_error_scope_of()) tells the caller what recovery fits:
 * REQUEST - fix the arguments and retry; PEER - remove and re-add the peer;
 * TRANSPORT - the transport is unusable, destroy it and create a new one.
 */
typedef enum kvx_error {
    KVX_OK = 0,
    KVX_EPERM = -1,         /**< operation not permitted (TRANSPORT)         */
    KVX_ENOENT = -2,        /**< unknown peer id (REQUEST)                   */
    KVX_ENOMEM = -12,       /**< out of memory (TRANSPORT)                   */
    KVX_EBUSY = -16,        /**< resource busy (REQUEST)                     */
    KVX_EEXIST = -17,       /**< peer id already registered (REQUEST)        */
    KVX_EINVAL = -22,       /**< invalid argument (REQUEST)                  */
    KVX_ERANGE = -34,       /**< block index out of range (REQUEST)          */
    KVX_ENOBUFS = -105,     /**< caller's buffer too small (REQUEST)         */
    KVX_ENOTSUP = -95,      /**< backend or option not supported (REQUEST)   */
    KVX_EOVERFLOW = -75,    /**< size arithmetic overflows (REQUEST)         */
    KVX_ECONNREFUSED = -111,/**< peer refused the connection (PEER)          */
    KVX_ETIMEDOUT = -110,   /**< connect or transfer timed out (PEER)        */
    KVX_ECONNRESET = -104,  /**< peer connection lost (PEER)                 */
    KVX_EHOSTUNREACH = -113,/**< no route to any of the peer's endpoints (PEER) */
    KVX_ECANCELED = -125,   /**< cancelled: the peer was removed or re-added
                                 meanwhile (a registration, since 0.2; a
                                 transfer's kvx_result, since 0.9) (REQUEST) */

    KVX_ERRNO_OFFSET = -1000,
    KVX_ECLOSED = -1001,      /**< transport was closed (TRANSPORT)             */
    KVX_EBADMETA = -1002,     /**< agent metadata truncated, corrupt or forged (REQUEST) */
    KVX_EVERSION = -1003,     /**< metadata/wire major version unsupported (REQUEST) */
    KVX_EFINGERPRINT = -1004, /**< config fingerprints differ (REQUEST)         */
    KVX_EGEOMETRY = -1005,    /**< block_len/base_addr/num_blocks mismatch (REQUEST) */
    KVX_EPEERBROKEN = -1006,  /**< peer connection failed earlier; it reconnects (peer_redial_ms) or remove and re-add (PEER) */
    KVX_EAUTH = -1007,        /**< authentication of a connection failed (PEER) */
    KVX_ECONFIG = -1008,      /**< config JSON invalid or unsupported (REQUEST) */
    KVX_EBACKEND = -1009,     /**< backend failure (device, socket) (TRANSPORT) */
    KVX_EINTERNAL = -1010     /**< bug in kvxfer: please report (TRANSPORT)     */
} kvx_error;

typedef enum kvx_error_scope {
    KVX_SCOPE_NONE = 0,      /**< KVX_OK                                        */
    KVX_SCOPE_REQUEST = 1,   /**< this call was wrong; nothing else is affected */
    KVX_SCOPE_PEER = 2,      /**< one peer is unusable until removed and re-added */
    KVX_SCOPE_TRANSPORT = 3  /**< the whole transport is unusable               */
} kvx_error_scope;

/**
 * @return a short static English description of code ("unknown peer");
 *         never NULL, also for codes this version does not know.
 * Thread safety: any thread.
 */
KVX_API const char *kvx_strerror(int code);

/** @return the scope of code (KVX_SCOPE_NONE for KVX_OK, TRANSPORT for unknown codes). */
KVX_API kvx_error_scope kvx_error_scope_of(int code);

/**
 * @return the message of the calling thread's most recent failed kvxfer call,
 *         naming the bad value ("peer 'p1': remote index 70000 >= 65536 blocks"),
 *         or "" if none failed yet. Successful calls, destructors and getters
 *         never change it, with one documented exception:
 *         kvx_registration_status() reporting a FAILED registration sets it
 *         to that registration's message.
 * Ownership: thread-local storage, valid until the next kvxfer call on this
 * thread that fails.
 */
KVX_API const char *kvx_last_error_message(void);

/* ---------------------------------------------------------------- types */

/** A transport: one local region, its peers and transfers. Opaque. */
typedef struct kvx_transport kvx_transport;

/** String key/value options for kvx_transport_create(). Opaque. */
typedef struct kvx_options kvx_options;

/** Largest peer id accepted, in bytes, excluding the terminating NUL. */
#define KVX_PEER_ID_MAX 255

/** Length of a config fingerprint in hex characters (buffers need +1 for NUL). */
#define KVX_FINGERPRINT_LEN 16

/* ---------------------------------------------------------------- options */

/**
 * Create an empty options object (all defaults).
 * @param out receives the object; free it with kvx_options_destroy().
 * @return 0, KVX_EINVAL (out NULL), KVX_ENOMEM.
 */
KVX_API int kvx_options_create(kvx_options **out);

/** Free an options object. NULL is a no-op. */
KVX_API void kvx_options_destroy(kvx_options *opts);

/**
 * Set option key to value (both copied). Setting a key again replaces it.
 * Keys and values are strings, checked against the option tables of the
 * library (the core's and each built-in backend's): here their syntax and
 * range, and the whole set again at kvx_transport_create(). A backend's keys
 * ("tcp.*", "shm.*", "verbs.*") exist only in builds with that backend.
 * Every key with its values, default and meaning: kvx_options_set(3) (and
 * the README's table), generated from those tables.
 * @return 0, KVX_EINVAL (NULL argument, unknown key, malformed or out of
 *         range value: the message names the key and value), KVX_ENOMEM.
 */
KVX_API int kvx_options_set(kvx_options *opts, const char *key, const char *value);

/**
 * Set every option of a "KEY=VALUE KEY=VALUE ..." list (since 0.6), as
 * kvx_options_set() would one after the other: items are separated by
 * whitespace; each is split at its first '=' into a non-empty key and a
 * value that may be empty and may hold '=' and commas ("backend=shm,tcp")
 * but no whitespace (set such a value with kvx_options_set()). No quoting,
 * no comments; an empty or all-whitespace text sets nothing. A key listed
 * twice takes its last value. All or nothing: on failure opts holds what it
 * held before. text is not retained.
 * @return 0, KVX_EINVAL (NULL argument; an item without '=' or with an
 *         empty key: the message quotes it; an unknown key or a bad value:
 *         the message names the key and value, as kvx_options_set()'s),
 *         KVX_ENOMEM.
 * Thread safety: as kvx_options_set() (not on the same opts at once).
 */
KVX_API int kvx_options_parse(kvx_options *opts, const char *text);

/* ---------------------------------------------------------------- lifecycle */

/**
 * Create a transport over the caller's region [base, base + num_blocks*block_len).
 *
 * @param out         receives the transport.
 * @param base        the region; owned by the caller, never freed by kvxfer,
 *                    and must stay valid and unmoved until kvx_transport_destroy()
 *                    (remote peers write into it at any time until close).
 * @param num_blocks  number of blocks, >= 1.
 * @param block_len   bytes per block, >= 1.
 * @param config_json model config as a JSON object text, or NULL. The
 *                    fingerprint is sha256 of Python's
 *                    json.dumps(fields, sort_keys=True, separators=(",", ":")),
 *                    first 16 hex chars; NULL, "null" or "{}" give "" (compatible
 *                    with every peer).
 * @param opts        options, or NULL for defaults; not retained.
 * @return 0; KVX_EINVAL (NULL out/base, zero size, bad option value, a
 *         region that region_prewarm cannot read);
 *         KVX_EOVERFLOW (num_blocks*block_len overflows); KVX_ECONFIG (invalid
 *         JSON or not an object); KVX_ENOTSUP (backend not available here;
 *         region_hugepages=1 on a kernel without transparent huge pages);
 *         KVX_EBACKEND (listen/device failure; no pipe for
 *         region_prewarm; madvise for region_hugepages); KVX_ENOMEM.
 * Thread safety: any thread.
 */
KVX_API int kvx_transport_create(kvx_transport **out, void *base, uint64_t num_blocks,
                                 uint64_t block_len, const char *config_json,
                                 const kvx_options *opts);

/**
 * Close the transport: every transfer in flight fails (and is reported by
 * nothing: poll returns KVX_ECLOSED afterwards), peers are disconnected,
 * threads stopped, sockets and registrations released. When it returns, no
 * byte will be written into the local region by kvxfer any more.
 * Registrations in progress (kvx_add_remote_peer_async(), and
 * kvx_add_remote_peer() in other threads) fail with KVX_ECLOSED at once;
 * close calls their connection attempts off and waits for them to end,
 * which takes tens of milliseconds, not connect_timeout_ms (since 0.3).
 * Idempotent: a second close returns 0, and, like kvx_transport_destroy(),
 * not before the first one finished: two threads closing at once both return
 * only once nothing lands any more. Every other call afterwards returns
 * KVX_ECLOSED (properties, kvx_registration_status() and kvx_get_stats()
 * stay usable).
 * @return 0, KVX_EINVAL (t NULL).
 */
KVX_API int kvx_transport_close(kvx_transport *t);

/** Close (if needed) and free the transport. NULL is a no-op. Must be the last call on t. */
KVX_API void kvx_transport_destroy(kvx_transport *t);

/* ---------------------------------------------------------------- properties */

/** *out = base address of the local region (as passed to create). @return 0, KVX_EINVAL. */
KVX_API int kvx_transport_base_addr(uint64_t *out, const kvx_transport *t);

/** *out = number of blocks of the local region. @return 0, KVX_EINVAL. */
KVX_API int kvx_transport_num_blocks(uint64_t *out, const kvx_transport *t);

/** *out = bytes per block. @return 0, KVX_EINVAL. */
KVX_API int kvx_transport_block_len(uint64_t *out, const kvx_transport *t);

/**
 * Copy the config fingerprint (16 lowercase hex chars, or "" for none) and a NUL
 * into out, which must hold KVX_FINGERPRINT_LEN + 1 bytes.
 * @return 0, KVX_EINVAL.
 */
KVX_API int kvx_transport_config_fingerprint(char *out, const kvx_transport *t);

/**
 * @return the name of the most preferred backend the transport serves on
 *         ("shm", "verbs", "tcp"; see option backend), static storage; "" for
 *         NULL. A transport may serve on several: kvx_peer_backend() says
 *         which one a given peer uses.
 */
KVX_API const char *kvx_transport_backend(const kvx_transport *t);

/**
 * Every backend the transport serves on, in order of preference, comma-
 * separated ("shm,verbs,tcp"; since 0.8): what its metadata offers, so the
 * paths its peers can take. With option backend=auto that is every backend
 * usable on this host; kvx_peer_backend() says which one a given peer uses.
 * @return a NUL-terminated string owned by the transport, valid until
 *         kvx_transport_destroy(); "" for NULL.
 * Thread safety: any thread.
 */
KVX_API const char *kvx_transport_backends(const kvx_transport *t);

/**
 * Copy the agent metadata (opaque bytes for the peer's kvx_add_remote_peer(),
 * format in docs/wire-format.md) into buf.
 * @param out_len  receives the metadata size, also when buf is too small.
 * @param buf      destination; NULL (with cap 0) asks for the size only and
 *                 returns 0.
 * @param cap      bytes available at buf.
 * @return 0; KVX_ENOBUFS (buf given but cap < size; *out_len says how much is
 *         needed); KVX_EINVAL; KVX_ECLOSED.
 * Security: the metadata contains the secret that lets a holder write into
 * this region. Hand it only to peers that may do so.
 */
KVX_API int kvx_get_agent_metadata(size_t *out_len, kvx_transport *t, void *buf, size_t cap);

/* ---------------------------------------------------------------- peers */

/**
 * Register a remote peer and connect to it (authenticated) within
 * connect_timeout_ms. On any failure nothing is registered.
 * @param peer_id     NUL-terminated, 1..KVX_PEER_ID_MAX bytes, copied.
 * @param metadata    the peer's kvx_get_agent_metadata() bytes; untrusted,
 *                    fully validated; not retained.
 * @param base_addr, num_blocks, block_len  the peer's region geometry; must
 *                    equal the metadata's, and block_len must equal ours.
 * @return 0; KVX_EINVAL (bad id or NULL); KVX_EEXIST (id registered, or a
 *         registration of it in progress); KVX_EBADMETA / KVX_EVERSION
 *         (metadata); KVX_EGEOMETRY; KVX_EFINGERPRINT; KVX_ENOTSUP (no backend
 *         in common, or the peer's tcp.protection differs from ours: one side
 *         requires AEAD, the other offers none); KVX_ECONNREFUSED /
 *         KVX_ETIMEDOUT / KVX_EHOSTUNREACH / KVX_EAUTH / KVX_ECONNRESET (the
 *         peer closed the connection during the handshake) (connection);
 *         KVX_ECLOSED. Of the first three, the one that says what the last
 *         attempt saw: KVX_ECONNREFUSED when every address refused (nothing
 *         listens: tcp retries a refusal 3 times, milliseconds, then fails),
 *         KVX_ETIMEDOUT when one did not answer in time; the message lists
 *         each address and its reason. tcp retries a reset or close during
 *         the handshake (a loaded target sheds) until connect_timeout_ms.
 * Blocks the calling thread up to connect_timeout_ms; other calls proceed.
 * kvx_add_remote_peer_async() is the non-blocking form, and the one that can
 * replace a registered peer (KVX_PEER_REPLACE).
 */
KVX_API int kvx_add_remote_peer(kvx_transport *t, const char *peer_id, const void *metadata,
                                size_t metadata_len, uint64_t base_addr, uint64_t num_blocks,
                                uint64_t block_len);

/**
 * Unregister a peer: its transfers still in flight fail (they surface in
 * kvx_poll()'s failed list), its connections are closed and its resources
 * released. The id may be registered again afterwards. Once this returns,
 * nothing more of those transfers lands in the peer's region (the connections
 * are reset before they are reported failed), within the per-backend bound of
 * docs/semantics.md: tcp at most the one chunk (256 KiB) the target is copying
 * as the reset reaches it; shm nothing; verbs only what the NIC had already
 * transmitted when its queue pairs went to the error state. On tcp, with
 * transfers in flight, it returns one round trip of the connection after the
 * reset (at least 1 ms, at most 200 ms): the reset travels behind the bytes
 * already sent and must reach the target before the failures are reported.
 * A registration of peer_id still in progress (kvx_add_remote_peer_async())
 * is cancelled too: it reports FAILED with KVX_ECANCELED and never publishes.
 * The peer's statistics (kvx_get_stats()) are forgotten.
 * @return 0; KVX_ENOENT (id neither registered nor being registered);
 *         KVX_EINVAL; KVX_ECLOSED.
 */
KVX_API int kvx_remove_remote_peer(kvx_transport *t, const char *peer_id);

/**
 * Which path a registered peer's transfers take (since 0.3).
 * @param out       receives the backend's name: "shm", "verbs" or "tcp";
 *                  static storage, never freed.
 * @param out_path  NULL, or receives how that backend moves the bytes, when
 *                  it has several ways: for shm "mapped" (the peer's region
 *                  is mapped here and copied into directly),
 *                  "process_vm_writev" (the kernel copies into the peer's
 *                  private memory) or "staged" (through the peer's staging
 *                  ring, see option shm.private); "" otherwise. Static storage.
 * @param t, peer_id  a transport and one of its registered peers.
 * The choice is made when the peer is added (option backend and
 * peer_backend_fallback) and again each time it reconnects after a failure
 * (kvx_get_peer_state()).
 * @return 0; KVX_ENOENT (peer_id not registered, or still connecting);
 *         KVX_EINVAL (NULL argument, bad peer_id); KVX_ECLOSED.
 * Thread safety: any thread.
 */
KVX_API int kvx_peer_backend(const char **out, const char **out_path, kvx_transport *t, const char *peer_id);

/** Most bytes of kvx_rail_stats.name, with its NUL. */
#define KVX_RAIL_NAME_LEN 96

/**
 * One rail of a peer (since 0.7): a local RDMA port paired with one of the
 * peer's (option verbs.devices), or (since 0.12) a local interface address
 * paired with one of a tcp peer's advertised addresses (option
 * tcp.interfaces). 136 bytes.
 */
typedef struct kvx_rail_stats {
    /** "rxe0:1 -> 198.18.0.1:20049": local device:port -> the peer's
     * rdma_cm address; tcp: "eth1 10.0.1.5 -> 10.0.1.7:4000", interface,
     * local address -> the peer's; NUL-terminated, cut at
     * KVX_RAIL_NAME_LEN - 1. */
    char name[KVX_RAIL_NAME_LEN];
    /** 1: the rail carries transfers; 0: taken out (failed, or never
     * connected). A verbs rail taken out does not come back for this
     * peer; a tcp rail is dialled again and comes back (1) when its path
     * does. */
    uint32_t up;
    uint32_t reserved; /**< 0 */
    uint64_t bytes;     /**< bytes of the parts of transfers it completed */
    uint64_t parts;     /**< parts of transfers it completed */
    /** Times it was taken out (verbs: 0 or 1; tcp: each time). */
    uint32_t failures;
    uint32_t reserved2; /**< 0 */
    /** When it last changed state (connected, taken out), in ns since
     * the epoch (CLOCK_REALTIME). */
    int64_t changed_ns;
} kvx_rail_stats;

/**
 * The rails a registered peer's transfers are striped over (since 0.7).
 * A verbs peer has rails, and a tcp peer of a writer with tcp.interfaces
 * (since 0.12); any other peer has none (*n = 0).
 * @param out      cap entries (may be NULL when cap is 0), filled in rail
 *                 order; the caller owns them.
 * @param n        receives the number of rails, also when it exceeds cap
 *                 (then only cap are written).
 * Counters are a snapshot; they never go back while the peer is registered.
 * @return 0; KVX_ENOENT (peer_id not registered, or still connecting);
 *         KVX_EINVAL (NULL argument, bad peer_id); KVX_ECLOSED.
 * Thread safety: any thread.
 */
KVX_API int kvx_peer_rails(kvx_transport *t, const char *peer_id, kvx_rail_stats *out, size_t cap, size_t *n);

/** Where a registered peer's connection stands (since 0.8). */
typedef enum kvx_peer_link {
    /** Connected: writes go out on kvx_peer_backend()'s path. */
    KVX_PEER_UP = 0,
    /** Its connection failed; it reconnects in the background (option
     *  peer_redial_ms). kvx_write_blocks() fails at once with
     *  KVX_EPEERBROKEN meanwhile. */
    KVX_PEER_RECONNECTING = 1,
    /** Its connection failed and it does not reconnect (peer_redial_ms=0):
     *  remove and re-add it. */
    KVX_PEER_BROKEN = 2,
    /** Being added (kvx_add_remote_peer() or _async() under way): only in
     *  kvx_list_peers(), since 0.10; kvx_get_peer_state() says KVX_ENOENT. */
    KVX_PEER_CONNECTING = 3
} kvx_peer_link;

/** Most bytes of kvx_peer_state.reason, with its NUL. */
#define KVX_PEER_REASON_LEN 160

/**
 * A registered peer's state (since 0.8). 256 bytes.
 */
typedef struct kvx_peer_state {
    /** A kvx_peer_link value. */
    int32_t link;
    /** The KVX_E* code of what took the connection down (KVX_ETIMEDOUT:
     *  the stall timeout; KVX_ECONNRESET: the connection failed), then of
     *  the last failed reconnection attempt; 0 while it never failed. */
    int32_t error;
    /** The path, as kvx_peer_backend() says: static strings, never freed. */
    const char *backend;
    const char *path;
    /** Its transfers in flight (submitted, not yet reported). */
    uint64_t in_flight;
    /** When it entered this state (CLOCK_REALTIME, ns since the epoch). */
    int64_t since_ns;
    /** RECONNECTING: when the next attempt starts (CLOCK_REALTIME, ns);
     *  0 while one runs or in the other states. */
    int64_t next_attempt_ns;
    /** Times it reconnected since it was added (a return to the preferred
     *  path, since 0.13, is no reconnection: not counted). */
    uint32_t reconnects;
    /** Failed attempts since it went down (0 when up). */
    uint32_t attempts;
    /** Why it is not up, NUL-terminated ("" when up); the message of error. */
    char reason[KVX_PEER_REASON_LEN];
    /** Since 0.10: when it last made progress (a transfer of it ended, or it
     *  got work while it had none in flight), CLOCK_REALTIME ns; 0 before
     *  its first transfer. The stall timeout counts from here. Like the
     *  other times here, kept on the monotonic clock and converted at each
     *  call: two calls may give it a few ns apart. */
    int64_t last_progress_ns;
    uint64_t reserved[4]; /**< 0 */
} kvx_peer_state;

/**
 * The state of a registered peer's connection (since 0.8): up, or
 * reconnecting after a failure (option peer_redial_ms), or broken.
 * A peer stays registered through a failure: only kvx_remove_remote_peer()
 * (or a replacing add) ends it. A reconnection authenticates anew and takes
 * the first path both sides offer that connects, so kvx_peer_backend() may
 * name another backend afterwards (verbs -> tcp when every RDMA rail is down;
 * since 0.13 the peer returns to verbs by itself once a rail connects again,
 * staying KVX_PEER_UP, reconnects not counting it: docs/semantics.md).
 * @param out  filled in; the caller owns it.
 * @return 0; KVX_ENOENT (peer_id not registered, or still connecting);
 *         KVX_EINVAL (NULL argument, bad peer_id); KVX_ECLOSED.
 * Thread safety: any thread. A snapshot: the state may change right after.
 */
KVX_API int kvx_get_peer_state(kvx_transport *t, const char *peer_id, kvx_peer_state *out);

/** One peer of kvx_list_peers() (since 0.10). 512 bytes. */
typedef struct kvx_peer_info {
    char peer_id[KVX_PEER_ID_MAX + 1]; /**< NUL-terminated */
    /** As kvx_get_peer_state() gives it, or, while the peer is being added,
     *  link KVX_PEER_CONNECTING with since_ns the add's start and every other
     *  field 0 or "". */
    kvx_peer_state state;
} kvx_peer_info;

/**
 * Every peer of a transport (since 0.10): the registered ones (up,
 * reconnecting or broken) and those being added (connecting), in byte order
 * of their ids. A removed peer is not listed (its counters are forgotten
 * too, kvx_get_stats()); a peer being replaced (KVX_PEER_REPLACE) is listed
 * once, connecting.
 * @param out_n  receives the number of peers, also when it exceeds cap (then
 *               only the first cap are written: call again with more room).
 * @param out    cap entries (may be NULL when cap is 0); the caller owns them.
 * A snapshot taken at one instant; peers may come and go right after.
 * @return 0; KVX_EINVAL (NULL argument); KVX_ECLOSED.
 * Thread safety: any thread.
 */
KVX_API int kvx_list_peers(size_t *out_n, kvx_transport *t, kvx_peer_info *out, size_t cap);

/** Flags of kvx_add_remote_peer_async(), or-ed together (since 0.2). */
typedef enum kvx_add_peer_flag {
    /** If peer_id is registered, or being registered, replace it instead of
     *  failing with KVX_EEXIST: the registered peer is removed at once (as by
     *  kvx_remove_remote_peer(): its transfers in flight fail) and a
     *  registration in progress is superseded (it reports KVX_ECANCELED and
     *  never publishes). This is vLLM's re-add semantics. */
    KVX_PEER_REPLACE = 1
} kvx_add_peer_flag;

/** The state of an asynchronous registration (since 0.2). */
typedef enum kvx_registration_state {
    KVX_REGISTRATION_PENDING = 0, /**< still connecting                          */
    KVX_REGISTRATION_DONE = 1,    /**< the peer is registered                     */
    KVX_REGISTRATION_FAILED = 2   /**< never registered; the error says why       */
} kvx_registration_state;

/**
 * Start registering a remote peer without blocking (since 0.2). The arguments
 * and the metadata are checked now, exactly as by kvx_add_remote_peer(); the
 * connection is made on a thread of the library, and its outcome is learnt
 * from kvx_registration_status(). Connections are made by a small pool of
 * at most 16 connect threads per transport (started when registrations are
 * queued, gone again shortly after the last one ended), not by a thread per
 * registration, and in the order of the calls: a registration waits for a
 * free connect thread first, so one queued behind attempts that take long
 * (peers that do not answer, each bounded by connect_timeout_ms) starts, and
 * ends, correspondingly later: with k earlier registrations of t still
 * pending, it may take up to ceil((k + 1) / 16) x connect_timeout_ms.
 * While the registration is in progress
 * peer_id is reserved (kvx_add_remote_peer(), and this function without
 * KVX_PEER_REPLACE, fail with KVX_EEXIST) but not yet usable
 * (kvx_write_blocks() fails with KVX_ENOENT). When it succeeds the peer is
 * registered exactly as by kvx_add_remote_peer().
 *
 * @param out_reg   receives the registration id: unique for the transport's
 *                  lifetime, never 0 (a counter of its own, not a transfer id).
 * @param peer_id, metadata, metadata_len, base_addr, num_blocks, block_len
 *                  as for kvx_add_remote_peer(); all copied, none retained.
 * @param flags     0 or KVX_PEER_REPLACE.
 * Cancellation: kvx_remove_remote_peer(peer_id) cancels a registration in
 * progress, and a later add with KVX_PEER_REPLACE supersedes it: either way it
 * reports FAILED with KVX_ECANCELED at once, and the attempt is called off:
 * the connection it was making is closed within tens of milliseconds. kvx_transport_close() fails it with
 * KVX_ECLOSED. A registration that was cancelled or superseded never
 * publishes: a peer id is only ever registered by its latest add.
 * @return 0 (the registration is in progress); or at once, with nothing
 *         started and nothing changed: KVX_EINVAL (bad id, NULL, unknown
 *         flag); KVX_EEXIST; KVX_EBADMETA / KVX_EVERSION; KVX_EGEOMETRY;
 *         KVX_EFINGERPRINT; KVX_ENOTSUP (no backend in common); KVX_ECLOSED;
 *         KVX_ENOMEM. Failures of the connection (KVX_ECONNREFUSED,
 *         KVX_ETIMEDOUT, KVX_EHOSTUNREACH, KVX_EAUTH, KVX_ECONNRESET) are
 *         reported by kvx_registration_status(), within connect_timeout_ms
 *         of the attempt's start (see above for the wait before it).
 * Thread safety: any thread. Never blocks on the network.
 */
KVX_API int kvx_add_remote_peer_async(uint64_t *out_reg, kvx_transport *t, const char *peer_id,
                                      const void *metadata, size_t metadata_len, uint64_t base_addr,
                                      uint64_t num_blocks, uint64_t block_len, unsigned flags);

/**
 * The outcome of a kvx_add_remote_peer_async() registration, waiting up to
 * timeout_ms for it (since 0.2). A final outcome (DONE or FAILED) is reported
 * exactly once, then reg is forgotten, like a transfer id by kvx_poll();
 * outcomes nobody collects are kept until kvx_transport_destroy().
 * @param out_state  receives a kvx_registration_state value.
 * @param out_error  receives 0, or for FAILED why: a connection error
 *                   (KVX_ECONNREFUSED, KVX_ETIMEDOUT, ...), KVX_ECANCELED
 *                   (removed or superseded), KVX_ECLOSED, KVX_ENOMEM.
 * @param reg        an id kvx_add_remote_peer_async() returned for t.
 * @param timeout_ms 0: return at once; > 0: wait at most that long while
 *                   PENDING; -1: wait until the outcome is known.
 * For FAILED, the calling thread's kvx_last_error_message() is set to the
 * registration's own message ("peer 'p1': cannot connect (...)").
 * @return 0; KVX_ENOENT (reg unknown, or its outcome already reported);
 *         KVX_EINVAL (NULL argument, timeout_ms < -1).
 * Works after kvx_transport_close() too (registrations it cut short report
 * KVX_ECLOSED). Thread safety: any thread; threads may wait on different
 * registrations at once (two waiting on the same one: one gets the outcome,
 * the other KVX_ENOENT).
 */
KVX_API int kvx_registration_status(int *out_state, int *out_error, kvx_transport *t, uint64_t reg,
                                    int timeout_ms);

/* ---------------------------------------------------------------- transfers */

/**
 * Submit a WRITE: local block local_idxs[i] goes to the peer's block
 * remote_idxs[i], for i < n. Never blocks on the network: the transfer is
 * queued and the returned id surfaces exactly once in kvx_poll(), done (the
 * bytes are in the peer's region) or failed. For a peer on the shm backend
 * the calling thread may copy one small transfer (at most 64 KiB in at most
 * 16 runs: its own, or one queued before) itself before returning (see
 * shm.threads): a memory copy, never a wait for the peer; anything larger
 * is the backend's copy threads'. Runs of consecutive indexes
 * (local i..i+k to remote j..j+k) travel as one operation. n == 0 is a valid
 * transfer, done at the next poll.
 * The index arrays are read during the call only.
 * @param out_id   receives the transfer id, unique for the transport's lifetime, never 0.
 * @return 0; KVX_EINVAL (NULL arrays with n > 0, bad peer id); KVX_ERANGE
 *         (an index >= num_blocks on either side, message names it);
 *         KVX_EINVAL (a remote index repeated in one call, or n above
 *         4294967295); KVX_ENOENT
 *         (unknown peer, or removed while the call ran); KVX_EPEERBROKEN (peer's connection failed: it
 *         reconnects in the background, kvx_get_peer_state(); or remove and
 *         re-add it); KVX_ECLOSED; KVX_ENOMEM.
 * vLLM's DataTransport "None" result maps to any failure here.
 */
KVX_API int kvx_write_blocks(uint64_t *out_id, kvx_transport *t, const char *peer_id,
                             const uint64_t *local_idxs, const uint64_t *remote_idxs, size_t n);

/* ---------------------------------------------------------------- completion and cancel */

/**
 * Collect finished transfers. Each id is reported exactly once, in done or
 * in failed, then forgotten. What does not fit the caller's arrays stays for
 * the next call (loop while *out_n_done == done_cap or *out_n_failed == failed_cap).
 * @param out_n_done    receives the number of ids written to done.
 * @param out_n_failed  receives the number of ids written to failed.
 * @param peer_id       NULL for all peers, or only that peer's transfers
 *                      (an unknown id yields nothing, not an error: the peer
 *                      may just have been removed).
 * @param done, done_cap, failed, failed_cap  caller-owned arrays (NULL when cap is 0).
 * @return 0; KVX_EINVAL; KVX_ECLOSED.
 * Progress never depends on how often poll is called: backends run on their
 * own threads. A failed transfer's requested blocks are undefined in the
 * peer's region (any mix of old bytes, new bytes and, with tcp.protection=aead,
 * bytes of a payload that failed its authentication tag); blocks outside the
 * transfer are never touched. Rewrite them, or do not read them. Once an id
 * is reported failed they no longer change: the backend stopped the transfer
 * before reporting it (tcp resets its connections, verbs moves its queue pairs
 * to the error state, shm's copy threads let go), within the per-backend bound
 * of docs/semantics.md (tcp: at most one 256 KiB chunk the target was copying
 * as the reset reached it; verbs: what the NIC had already transmitted).
 */
KVX_API int kvx_poll(size_t *out_n_done, size_t *out_n_failed, kvx_transport *t,
                     const char *peer_id, uint64_t *done, size_t done_cap, uint64_t *failed,
                     size_t failed_cap);

/** A finished transfer and how it ended (kvx_poll_results(), since 0.9). */
typedef struct kvx_result {
    uint64_t id;
    /** 0: done. Otherwise why it failed:
     *  KVX_ETIMEDOUT   its peer made no progress for transfer_timeout_ms
     *                  (the stall timeout);
     *  KVX_ECONNRESET  its peer's connection failed: a reset, the peer's
     *                  process or host gone, every rail lost, a shm target
     *                  that exited or revoked its grant;
     *  KVX_ECANCELED   its peer was removed (kvx_remove_remote_peer(), or
     *                  replaced by KVX_PEER_REPLACE) before it ended;
     *  another kvx_error code for a backend's own failure (KVX_EPERM: the
     *  kernel refused a shm copy; KVX_EBACKEND), named by the log.
     *  kvx_get_peer_state() tells what the peer went through meanwhile. */
    int32_t status;
    uint32_t reserved; /**< 0 */
} kvx_result;

/**
 * Collect finished transfers with the reason of each failure (since 0.9):
 * kvx_poll() with one array, each entry an id and its status. The two calls
 * take from the same queues: each id is reported exactly once, by one of
 * them. What does not fit stays for the next call (loop while *out_n == cap).
 * Order: peer by peer; within a peer's share of one call, its done ids
 * first, then its failed ones, each in the order they ended.
 * @param out_n    receives the number of entries written to out.
 * @param peer_id  NULL for all peers, or only that peer's transfers (an
 *                 unknown id yields nothing, as for kvx_poll()).
 * @param out, cap caller-owned array of cap entries (NULL when cap is 0).
 * @return 0; KVX_EINVAL (NULL out_n or t, NULL out with cap > 0); KVX_ECLOSED.
 * Failed transfers leave their blocks as kvx_poll() says. Each failure is
 * also counted by cause in kvx_stats (transfers_failed_timeout and the
 * fields after it).
 * Thread safety: any thread, as kvx_poll().
 */
KVX_API int kvx_poll_results(size_t *out_n, kvx_transport *t, const char *peer_id, kvx_result *out, size_t cap);

typedef enum kvx_cancel_mode {
    /** Forget the ids, including ids that finished but were not yet polled:
     *  they are never reported. Bytes of a transfer already on the wire may
     *  still land in the peer's region afterwards (vLLM's contract allows it;
     *  use KVX_CANCEL_WAIT, or remove the peer, for a bound). */
    KVX_CANCEL_IMMEDIATE = 0,
    /** Release what can be released: ids not started yet and ids finished
     *  but not yet polled are forgotten (never reported); ids on the wire are
     *  returned in inflight and surface in kvx_poll() exactly once as done or
     *  failed (vLLM's DataTransport "wait" mode); once failed, they land no
     *  more (see kvx_poll()). */
    KVX_CANCEL_WAIT = 1
} kvx_cancel_mode;

/**
 * Cancel transfers. Unknown or already reported ids are ignored; an id
 * given twice counts once. Thread-safe; may race kvx_poll() (an id is then
 * either reported by that poll or cancelled, never both).
 * @param out_n_inflight  receives how many ids were written to inflight
 *                        (always 0 for KVX_CANCEL_IMMEDIATE).
 * @param ids, n          ids to cancel (ids may be NULL when n is 0).
 * @param mode            a kvx_cancel_mode value (an int, so that any value a
 *                        caller passes is defined behaviour and gets KVX_EINVAL).
 * @param inflight        for KVX_CANCEL_WAIT: room for n ids (NULL allowed for
 *                        IMMEDIATE); receives the ids still in flight.
 * @return 0; KVX_EINVAL (bad mode, NULL arrays); KVX_ECLOSED.
 */
KVX_API int kvx_cancel(size_t *out_n_inflight, kvx_transport *t, const uint64_t *ids, size_t n,
                       int mode, uint64_t *inflight);

/* ---------------------------------------------------------------- waiting (since 0.4) */

/**
 * Sleep until kvx_poll() has something to report (since 0.4): the blocking
 * alternative to calling kvx_poll() in a loop, which burns a core that the
 * backends' own threads may need.
 * Returns at once when ids are ready already.
 * @param out_ready  receives how many ids kvx_poll(t, NULL, ...) would report
 *                   now (done and failed, every peer): > 0, or 0 when
 *                   timeout_ms passed first. Another thread's kvx_poll() or
 *                   kvx_cancel() may take them before this thread polls.
 * @param timeout_ms 0: only look; > 0: wait at most that long; -1: no limit.
 * @return 0 (also on timeout); KVX_EINVAL (NULL argument, timeout_ms < -1);
 *         KVX_ECLOSED (closed before the call, or while waiting:
 *         kvx_transport_close() from another thread wakes every waiter and
 *         returns only once they have left).
 * Thread safety: any thread; several may wait at once, and all wake.
 * A wake-up costs the thread that completes a transfer one futex call, and
 * only while a thread waits and nothing was ready before.
 */
KVX_API int kvx_wait(size_t *out_ready, kvx_transport *t, int timeout_ms);

/**
 * A file descriptor that is readable while kvx_poll(t, NULL, ...) has
 * something to report (since 0.4), for event loops: epoll/poll/select,
 * asyncio's add_reader, tokio's AsyncFd, Go's netpoller. Level-triggered:
 * readable from the moment an id is ready until a kvx_poll() or kvx_cancel()
 * has taken every ready id (poll until the arrays are not filled, as always).
 * After kvx_transport_close() it is readable for good (kvx_poll() then says
 * KVX_ECLOSED), so a loop waiting on it notices the close.
 * @param out_fd  receives the descriptor: an eventfd, close-on-exec, made on
 *                the first call (later calls return the same one). Owned by
 *                t: never read, write or close it; kvx_transport_destroy()
 *                closes it.
 * @return 0; KVX_EINVAL (NULL argument); KVX_ECLOSED; KVX_EBACKEND (no
 *         descriptor could be made: the message says why, e.g. EMFILE).
 * Cost: none until the first call; afterwards, for the thread completing
 * transfers, one eventfd write when ids become ready and, for kvx_poll(),
 * one read when it takes the last of them.
 * Thread safety: any thread.
 */
KVX_API int kvx_completion_fd(int *out_fd, kvx_transport *t);

/* ---------------------------------------------------------------- introspection: kvxfer/stats.h */

#ifdef SWIG /* SWIG reads #include as nothing: the bindings take the part here, in order */
%include "kvxfer/stats.h"
#else
#include "kvxfer/stats.h"
#endif

/* ---------------------------------------------------------------- utilities */

/** Flags of kvx_region_alloc() (since 0.3). */
typedef enum kvx_region_flag {
    /** Back the region with huge pages (MFD_HUGETLB, the system's default
     *  huge page size); fails with KVX_ENOMEM when none are free. */
    KVX_REGION_HUGE_PAGES = 1
} kvx_region_flag;

/**
 * Allocate a region that same-host peers can map (since 0.3): zeroed,
 * page-aligned memory backed by an anonymous memory file (memfd) whose size
 * is sealed, so a peer mapping it never faults past its end. A transport
 * created over (part of) it lets a same-host peer's shm backend copy straight
 * into it ("mapped" in kvx_peer_backend()). Plain memory works with every
 * backend too; this only makes the shm path direct.
 * @param out    receives the base address.
 * @param size   bytes, >= 1 (rounded up to the page size internally).
 * @param flags  0 or KVX_REGION_HUGE_PAGES.
 * Ownership: the caller's; free it with kvx_region_free() after every
 * transport over it was destroyed.
 * @return 0; KVX_EINVAL (NULL out, size 0, unknown flag); KVX_ENOMEM (no
 *         memory or no huge pages); KVX_ENOTSUP (the kernel lacks memfd);
 *         KVX_EOVERFLOW (size too large).
 * Thread safety: any thread.
 */
KVX_API int kvx_region_alloc(void **out, uint64_t size, unsigned flags);

/**
 * Free a region of kvx_region_alloc() (since 0.3). NULL, and an address
 * kvx_region_alloc() did not return, are no-ops. Peers that mapped it keep
 * their mapping until they are removed or their transport closes (see
 * docs/security.md); the memory is returned when the last one lets go.
 * Thread safety: any thread, not concurrently with a transport over it.
 */
KVX_API void kvx_region_free(void *base);

/**
 * Compute the fingerprint of a config JSON text without a transport, exactly
 * as kvx_transport_create() does (see there).
 * @param out  receives 16 hex chars and NUL, or "" for no config; room for
 *             KVX_FINGERPRINT_LEN + 1 bytes.
 * @return 0; KVX_EINVAL (out NULL); KVX_ECONFIG (invalid JSON, not an object,
 *         or a value Python could not round-trip; the message says where).
 */
KVX_API int kvx_config_fingerprint(char *out, const char *config_json);

/**
 * The backends built into this library, in order of preference (since 0.6):
 * their names separated by commas, without spaces ("shm,verbs,tcp"), the
 * form the backend option takes (kvx_options_set()). A backend is listed
 * when this build has it, whether or not it is usable on this host (verbs
 * needs an RDMA device, and since 0.11 its plugin, libkvxfer-verbs.so, with
 * rdma-core's libraries: kvxfer(7), KVX_PLUGIN_PATH; a missing plugin does
 * not unlist it): backend "auto" serves on the listed ones that are
 * usable, and naming one that is not fails kvx_transport_create() with
 * KVX_ENOTSUP. A backend name that is not listed is not built in.
 * @return a NUL-terminated string in static storage, never NULL and the same
 *         for the life of the process; never free it. Never fails and never
 *         changes kvx_last_error_message().
 * Thread safety: any thread, at any time (no transport needed).
 */
KVX_API const char *kvx_backends(void);

/* ---------------------------------------------------------------- logging: kvxfer/log.h */

#ifdef SWIG /* SWIG reads #include as nothing: the bindings take the part here, in order */
%include "kvxfer/log.h"
#else
#include "kvxfer/log.h"
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVXFER_H */
