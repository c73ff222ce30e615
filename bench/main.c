/*
 * kvxfer-bench: measure and verify kvxfer block transfers.
 * main.c: command line, roles (local / --serve / --connect), local target spawn.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "ctl.h"

/* Split in parts: ISO C only promises 4095-character string literals. */
static const char usage_text[] =
    "Usage: kvxfer-bench [OPTIONS]                      local: spawn a target, measure\n"
    "       kvxfer-bench --serve [HOST:]PORT [OPTIONS]  target of a two-host run\n"
    "       kvxfer-bench --connect HOST:PORT [OPTIONS]  initiator of a two-host run\n"
    "\n"
    "Moves blocks with kvx_write_blocks from an initiator's region into a target's\n"
    "region and prints one line per block size: GB/s (10^9 bytes/s of block data),\n"
    "transfers/s (write_blocks calls completed per second), p50/p99 latency in us\n"
    "(from just before kvx_write_blocks to the kvx_poll call that reports the id)\n"
    "and whether the data verified (yes/no/off); next to it the library's own\n"
    "view of the same phase (kvx_get_stats: GB/s, p50, p99) and whether the two\n"
    "agree. Exit status 0 only if every transfer completed, every verification\n"
    "passed and the views agree; 1 on failure, 2 on bad usage.\n"
    "\n"
    "Without --serve/--connect the program starts its own target process\n"
    "(itself with --serve 127.0.0.1:0) and connects to it: the same path as a\n"
    "two-host run, over loopback.\n"
    "\n"
    "Transfer options:\n"
    "  --backend auto|LIST        kvxfer backends, LIST e.g. tcp or verbs,tcp (default auto: every backend\n"
    "                             usable here, one picked per peer; kvx_options_set(3))\n"
    "  --block-size N[,N...]      block sizes, e.g. 4K,64K,1M (binary suffixes K M G;\n"
    "                             repeatable; default 4K,64K,1M)\n"
    "  --blocks N                 blocks in the region of each side (default: 256 MiB\n"
    "                             worth, at most 1Mi blocks, at least 2 x batch)\n"
    "  --batch N                  blocks per kvx_write_blocks call (default: enough\n"
    "                             for 64 KiB per call, at most 256: 16 for 4K, 1 for\n"
    "                             >= 64K)\n"
    "  --inflight N               max outstanding transfers (default: enough for\n"
    "                             8 MiB outstanding, 8..128: 128 for 64K, 8 for 1M)\n"
    "  --idle wait|spin           what the initiator does while nothing can be\n"
    "                             submitted: wait (default: sleep in kvx_wait()\n"
    "                             until a transfer finishes) or spin (kvx_poll()\n"
    "                             in a loop, yielding the CPU, as before 0.4: it\n"
    "                             takes CPU from the library's threads)\n"
    "  --pattern seq|random       seq (default): each call writes consecutive local\n"
    "                             and consecutive remote blocks, so runs coalesce;\n"
    "                             random: distinct random remote blocks, random\n"
    "                             local blocks (the scattered KV-cache case)\n"
    "  --duration SECS            measured time per block size (default 3)\n"
    "  --total BYTES              measure this many bytes per size instead (4G, ...)\n"
    "  --warmup SECS              unmeasured transfers before each size (default 0.2)\n"
    "  --cold BYTES               also measure the first BYTES right after the peer\n"
    "                             is added (before the warmup): cold GB/s and its\n"
    "                             ratio to the steady rate that follows\n"
    "  --verify / --no-verify     check the data (default on), see below\n"
    "  --option KEY=VALUE[ ...]   kvx_options_parse() options, repeatable, e.g.\n"
    "                             --option tcp.streams=2 (local mode: both sides;\n"
    "                             the backend is --backend's)\n"
    "  --target-region private|shared|thp  the target's region: private (default;\n"
    "                             anonymous memory), shared (kvx_region_alloc: a\n"
    "                             sealed memfd, so shm peers map it; vLLM's /dev/shm\n"
    "                             files take the same path) or thp (anonymous,\n"
    "                             MADV_HUGEPAGE: transparent huge pages); private\n"
    "                             is advised MADV_NOHUGEPAGE (4 KiB pages). Two-host\n"
    "                             runs: give it to --serve\n"
    "  --config JSON              model config JSON for the config fingerprint,\n"
    "                             used by both sides\n"
    "  --seed N                   seed of data pattern and random indexes\n"
    "  --json                     one JSON object per block size on stdout, keys:\n"
    "                             backend block_size batch pattern bytes seconds\n"
    "                             gb_per_s xfers_per_s p50_us p99_us verified, and\n"
    "                             blocks inflight transfers failed p999_us max_us,\n"
    "                             lib_transfers lib_bytes lib_failed lib_p50_us\n"
    "                             lib_p99_us lib_agrees (yes/no/n/a), and\n"
    "                             submit_p50_us submit_p99_us submit_max_us\n"
    "                             submit_cpu_p50_us submit_cpu_p99_us (time and\n"
    "                             CPU time inside kvx_write_blocks per call)\n"
    "                             submit_validate_us (checking the lists alone)\n"
    "  --no-progress              no progress line (shown only if stderr is a tty)\n"
    "\n";

static const char usage_text2[] =
    "Two hosts:\n"
    "  --serve [HOST:]PORT        be the target: listen on the bench's control port\n"
    "                             (PORT only: all interfaces), serve initiators one\n"
    "                             after another. It takes block size and count from\n"
    "                             the initiator, and backend and config too unless\n"
    "                             given on its own command line; --option applies\n"
    "                             to the process it is given to.\n"
    "  --once                     with --serve: exit after one session\n"
    "  --connect HOST:PORT        be the initiator against a --serve target\n"
    "  The control channel is the bench's own small TCP protocol (bench/ctl.h):\n"
    "  it carries agent metadata, which contains the secret that allows writing\n"
    "  into the target's region; use --serve only on a trusted network.\n"
    "  As in a vLLM deployment the metadata goes both ways: the target registers\n"
    "  the initiator as a peer too, so each host must reach the other's kvxfer\n"
    "  address (options tcp.listen / tcp.advertise).\n"
    "\n"
    "Examples:\n"
    "  kvxfer-bench\n"
    "  kvxfer-bench --backend tcp --block-size 4K --pattern random --json\n"
    "  host A: kvxfer-bench --serve 7400\n"
    "  host B: kvxfer-bench --connect A:7400 --backend verbs --duration 10\n"
    "\n"
    "What is verified: before a run the initiator fills local block i with a\n"
    "pattern derived from (run seed, i, byte offset), the target fills its blocks\n"
    "with a distinct poison pattern. No two outstanding transfers write the same\n"
    "remote block, so after the run the initiator knows which local block each\n"
    "remote block must hold; it sends that list, and the target checks every\n"
    "block of its region byte for byte: written blocks must hold exactly the\n"
    "expected local block, unwritten blocks must still hold their poison.\n"
    "The local run of a seq call starts half a region away from the remote run,\n"
    "so swapped local/remote indexes are caught too.\n"
    "\n"
    "  -h, --help                 this text\n"
    "  --version                  print library and bench version\n";

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void usage_error(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\nTry 'kvxfer-bench --help'.\n", g_prog, buf);
    exit(2);
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e6)
        return -1;
    *out = v;
    return 0;
}

/* Options that take a value: "--name VALUE" or "--name=VALUE". */
static const char *arg_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc)
        usage_error("%s needs a value", name);
    return argv[++*i];
}

/* ------------------------------------------------------------ options */

/* The command line being read: the options it fills, and what only the
 * checks after the last argument need. */
struct cli {
    struct bench_opts *o;
    bool have_duration;
};

static void opt_help(struct cli *c, const char *v)
{
    (void)c;
    (void)v;
    fputs(usage_text, stdout);
    fputs(usage_text2, stdout);
    exit(0);
}

static void opt_version(struct cli *c, const char *v)
{
    (void)c;
    (void)v;
    printf("kvxfer-bench (library %s, built against %d.%d.%d)\n", kvx_version_string(),
           KVX_VERSION_MAJOR, KVX_VERSION_MINOR, KVX_VERSION_PATCH);
    exit(0);
}

static void opt_backend(struct cli *c, const char *v)
{
    /* the library's own check of the backend option: one list of names */
    kvx_options *probe = NULL;
    int rc = kvx_options_create(&probe);
    if (rc == 0) rc = kvx_options_set(probe, "backend", v);
    kvx_options_destroy(probe);
    if (rc) usage_error("--backend: %s", kvx_last_error_message());
    c->o->backend = v;
    c->o->backend_given = true;
}

static void opt_target_region(struct cli *c, const char *v)
{
    if (strcmp(v, "private") == 0)
        c->o->target_region = REGION_PRIVATE;
    else if (strcmp(v, "shared") == 0)
        c->o->target_region = REGION_SHARED;
    else if (strcmp(v, "thp") == 0)
        c->o->target_region = REGION_THP;
    else
        usage_error("--target-region: '%s' is not private, shared or thp", v);
}

static void opt_block_size(struct cli *c, const char *arg)
{
    struct bench_opts *o = c->o;
    char buf[512];
    if (strlen(arg) >= sizeof buf)
        usage_error("--block-size: list too long");
    strcpy(buf, arg);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (parse_size(tok, &v) < 0 || v == 0)
            usage_error("--block-size: '%s' is not a size like 4096, 4K, 1M", tok);
        if (o->n_sizes == BENCH_MAX_SIZES)
            usage_error("--block-size: at most %d sizes", BENCH_MAX_SIZES);
        o->block_sizes[o->n_sizes++] = v;
    }
}

static void opt_blocks(struct cli *c, const char *v)
{
    if (parse_size(v, &c->o->blocks) < 0 || c->o->blocks == 0)
        usage_error("--blocks: '%s' is not a positive count", v);
}

static void opt_batch(struct cli *c, const char *v)
{
    if (parse_u64(v, &c->o->batch) < 0 || c->o->batch == 0 || c->o->batch > (1u << 20))
        usage_error("--batch: '%s' is not a count in 1..1048576", v);
}

static void opt_inflight(struct cli *c, const char *v)
{
    if (parse_u64(v, &c->o->inflight) < 0 || c->o->inflight == 0 || c->o->inflight > (1u << 16))
        usage_error("--inflight: '%s' is not a count in 1..65536", v);
}

static void opt_idle(struct cli *c, const char *v)
{
    if (!strcmp(v, "spin"))
        c->o->idle_wait = false;
    else if (!strcmp(v, "wait"))
        c->o->idle_wait = true;
    else
        usage_error("--idle: '%s' is not spin or wait", v);
}

static void opt_pattern(struct cli *c, const char *v)
{
    if (!strcmp(v, "seq"))
        c->o->pattern = PATTERN_SEQ;
    else if (!strcmp(v, "random"))
        c->o->pattern = PATTERN_RANDOM;
    else
        usage_error("--pattern: '%s' is not seq or random", v);
}

static void opt_duration(struct cli *c, const char *v)
{
    if (parse_seconds(v, &c->o->duration) < 0 || c->o->duration <= 0)
        usage_error("--duration: '%s' is not a positive number of seconds", v);
    c->have_duration = true;
}

static void opt_cold(struct cli *c, const char *v)
{
    if (parse_size(v, &c->o->cold) < 0 || c->o->cold == 0)
        usage_error("--cold: '%s' is not a size like 512M", v);
}

static void opt_total(struct cli *c, const char *v)
{
    if (parse_size(v, &c->o->total) < 0 || c->o->total == 0)
        usage_error("--total: '%s' is not a size like 1G", v);
}

static void opt_warmup(struct cli *c, const char *v)
{
    if (parse_seconds(v, &c->o->warmup) < 0)
        usage_error("--warmup: '%s' is not a number of seconds", v);
}

static void opt_verify(struct cli *c, const char *v) { (void)v; c->o->verify = true; }
static void opt_no_verify(struct cli *c, const char *v) { (void)v; c->o->verify = false; }
static void opt_json(struct cli *c, const char *v) { (void)v; c->o->json = true; }
static void opt_no_progress(struct cli *c, const char *v) { (void)v; c->o->progress = false; }

/* Checked with the library at the end (check_with_library). */
static void opt_option(struct cli *c, const char *v)
{
    if (!strncmp(v, "backend=", 8))
        usage_error("--option backend=...: use --backend");
    if (c->o->n_options == BENCH_MAX_OPTIONS)
        usage_error("--option: at most %d", BENCH_MAX_OPTIONS);
    c->o->options[c->o->n_options++] = v;
}

static void opt_config(struct cli *c, const char *v)
{
    c->o->config = v;
    c->o->config_given = true;
}

static void opt_seed(struct cli *c, const char *v)
{
    if (parse_u64(v, &c->o->seed) < 0)
        usage_error("--seed: '%s' is not a number", v);
    c->o->seed_given = true;
}

static void opt_serve(struct cli *c, const char *v) { c->o->serve = v; }
static void opt_connect(struct cli *c, const char *v) { c->o->connect = v; }
static void opt_once(struct cli *c, const char *v) { (void)v; c->o->once = true; }

/* Hidden: how a local-mode target tells its parent the port. */
static void opt_port_fd(struct cli *c, const char *v)
{
    uint64_t u;
    if (parse_u64(v, &u) < 0 || u < 3 || u > 1024)
        usage_error("--port-fd: bad descriptor '%s'", v);
    c->o->port_fd = (int)u;
}

struct cli_option {
    const char *name;
    bool takes_value; /* "--name VALUE" or "--name=VALUE"; else exactly "--name" */
    void (*apply)(struct cli *c, const char *value);
};

static const struct cli_option cli_options[] = {
    {"-h", false, opt_help},
    {"--help", false, opt_help},
    {"--version", false, opt_version},
    {"--backend", true, opt_backend},
    {"--block-size", true, opt_block_size},
    {"--blocks", true, opt_blocks},
    {"--batch", true, opt_batch},
    {"--inflight", true, opt_inflight},
    {"--idle", true, opt_idle},
    {"--pattern", true, opt_pattern},
    {"--duration", true, opt_duration},
    {"--total", true, opt_total},
    {"--cold", true, opt_cold},
    {"--warmup", true, opt_warmup},
    {"--verify", false, opt_verify},
    {"--no-verify", false, opt_no_verify},
    {"--json", false, opt_json},
    {"--no-progress", false, opt_no_progress},
    {"--option", true, opt_option},
    {"--target-region", true, opt_target_region},
    {"--config", true, opt_config},
    {"--seed", true, opt_seed},
    {"--serve", true, opt_serve},
    {"--connect", true, opt_connect},
    {"--once", false, opt_once},
    {"--port-fd", true, opt_port_fd},
};

/* The option argv[*i] names, its value in *value (argv[*i] moves on to a
 * separate value); NULL if it names none. */
static const struct cli_option *match_option(int argc, char **argv, int *i, const char **value)
{
    for (size_t k = 0; k < sizeof cli_options / sizeof cli_options[0]; k++) {
        const struct cli_option *opt = &cli_options[k];
        if (!opt->takes_value) {
            *value = NULL;
            if (!strcmp(argv[*i], opt->name))
                return opt;
        } else if ((*value = arg_value(argc, argv, i, opt->name)) != NULL) {
            return opt;
        }
    }
    return NULL;
}

static void set_defaults(struct bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->inflight = 0; /* auto, per block size */
    o->pattern = PATTERN_SEQ;
    o->duration = 3;
    o->warmup = 0.2;
    o->verify = true;
    o->idle_wait = true;
    o->progress = true;
    o->port_fd = -1;
}

/* Options that only make sense together or apart; then the default sizes. */
static void check_combinations(const struct cli *c)
{
    struct bench_opts *o = c->o;
    if (o->serve && o->connect)
        usage_error("--serve and --connect exclude each other");
    if (o->once && !o->serve)
        usage_error("--once needs --serve");
    if (o->connect && o->target_region != REGION_PRIVATE)
        usage_error("--target-region is the target's: give it to the --serve side, not --connect");
    if (o->total && c->have_duration)
        usage_error("--duration and --total exclude each other");
    if (o->n_sizes == 0) {
        o->block_sizes[0] = 4u << 10;
        o->block_sizes[1] = 64u << 10;
        o->block_sizes[2] = 1u << 20;
        o->n_sizes = 3;
    }
}

/* Fail early, on this side, with the library's own message: --config, the
 * geometry of every size, and --option (kvx_options_set checks key and value). */
static void check_with_library(const struct bench_opts *o)
{
    char err[1024];
    if (o->config) {
        char fp[KVX_FINGERPRINT_LEN + 1];
        int rc = kvx_config_fingerprint(fp, o->config);
        if (rc) {
            fmt_kvx_error(err, sizeof err, "--config: kvx_config_fingerprint", rc);
            usage_error("%s", err);
        }
    }
    for (size_t i = 0; i < o->n_sizes && !o->serve; i++) {
        uint64_t batch, nblocks;
        if (plan_size(o, o->block_sizes[i], &batch, &nblocks, err, sizeof err) < 0)
            usage_error("%s", err);
    }
    kvx_options *opts = NULL;
    if (make_kvx_options(o, o->backend_given ? o->backend : NULL, &opts, err, sizeof err) < 0)
        usage_error("%s", err);
    kvx_options_destroy(opts);
}

static void parse_args(int argc, char **argv, struct bench_opts *o)
{
    struct cli c = {.o = o};
    set_defaults(o);
    for (int i = 1; i < argc; i++) {
        const char *v;
        const struct cli_option *opt = match_option(argc, argv, &i, &v);
        if (!opt)
            usage_error("unknown argument '%s'", argv[i]);
        opt->apply(&c, v);
    }
    check_combinations(&c);
    check_with_library(o);
}

/* ------------------------------------------------------------ local mode */

static pid_t g_child = -1;

static void kill_child(void)
{
    if (g_child > 0) {
        kill(g_child, SIGTERM);
        waitpid(g_child, NULL, 0);
        g_child = -1;
    }
}

/* Our own executable. The resolved path rather than /proc/self/exe itself,
 * so the target also starts under valgrind and similar wrappers. */
static void self_exe(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n <= 0 || (size_t)n >= cap - 1) {
        snprintf(buf, cap, "/proc/self/exe");
        return;
    }
    buf[n] = '\0';
    if (strstr(buf, " (deleted)") || access(buf, X_OK) != 0)
        snprintf(buf, cap, "/proc/self/exe"); /* rebuilt or removed meanwhile */
}

/* "kvxfer-bench --serve 127.0.0.1:0 --once --port-fd FD" plus what the
 * target must share with us: --backend, --config and every --option. */
static void target_args(const struct bench_opts *o, const char *fdarg, const char **args)
{
    size_t n = 0;
    args[n++] = "kvxfer-bench";
    args[n++] = "--serve";
    args[n++] = "127.0.0.1:0";
    args[n++] = "--once";
    args[n++] = "--port-fd";
    args[n++] = fdarg;
    if (o->backend_given) {
        args[n++] = "--backend";
        args[n++] = o->backend;
    }
    if (o->config_given) {
        args[n++] = "--config";
        args[n++] = o->config;
    }
    if (o->target_region != REGION_PRIVATE) {
        args[n++] = "--target-region";
        args[n++] = o->target_region == REGION_SHARED ? "shared" : "thp";
    }
    for (size_t i = 0; i < o->n_options; i++) {
        args[n++] = "--option";
        args[n++] = o->options[i];
    }
    args[n] = NULL;
}

/* fork + exec ourselves with args; only port_fd stays open across exec. */
static pid_t start_target(const char *const *args, int port_fd)
{
    char exe[4096];
    self_exe(exe, sizeof exe);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        /* The target must not outlive us, even if we are killed. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1)
            _exit(1);
        fcntl(port_fd, F_SETFD, 0);
        execv(exe, (char *const *)args);
        fprintf(stderr, "kvxfer-bench: exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    return pid;
}

/* The port line the target writes to fd once it listens (30 s at most). */
static int read_port(int fd)
{
    char buf[32];
    size_t got = 0;
    uint64_t deadline = now_ns() + 30ull * 1000000000u;
    while (got < sizeof buf - 1 && !memchr(buf, '\n', got)) {
        uint64_t now = now_ns();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = now < deadline ? (int)((deadline - now) / 1000000u) + 1 : 0;
        int r = poll(&p, 1, ms);
        if (r == 0)
            die("local target did not report its port within 30 s");
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("poll: %s", strerror(errno));
        }
        ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    buf[got] = '\0';
    uint64_t port;
    char *nl = strchr(buf, '\n');
    if (nl)
        *nl = '\0';
    if (!nl || parse_u64(buf, &port) < 0 || port == 0 || port > 65535)
        die("local target failed to start (see its message above)");
    return (int)port;
}

/* Start the local target and return its port; it is killed if we die. */
static int spawn_target(const struct bench_opts *o)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        die("pipe: %s", strerror(errno));
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", pfd[1]);
    const char *args[16 + 2 * BENCH_MAX_OPTIONS];
    target_args(o, fdarg, args);
    g_child = start_target(args, pfd[1]);
    g_die_hook = kill_child;
    close(pfd[1]);
    int port = read_port(pfd[0]);
    close(pfd[0]);
    return port;
}

/* Ctrl-C during a run: wipe the progress line so the shell prompt is clean,
 * then die of the signal as usual (the local target gets it too). */
static void on_interrupt(int sig)
{
    static const char clear[] = "\r\033[K";
    if (write(2, clear, sizeof clear - 1) < 0) {
        /* nothing to do: we are dying anyway */
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    signal(SIGPIPE, SIG_IGN); /* a dead peer is reported by send(), not a signal */
    if (kvx_version_number() / 10000 != KVX_VERSION_MAJOR)
        fprintf(stderr, "kvxfer-bench: warning: built against kvxfer %d.x, running with %s\n",
                KVX_VERSION_MAJOR, kvx_version_string());
    parse_args(argc, argv, &o);
    /* Short sleeps in the idle path should be short: 1 us timer slack. */
    prctl(PR_SET_TIMERSLACK, 1000UL);

    if (o.serve) {
        if (o.port_fd >= 0)
            g_prog = "kvxfer-bench target";
        return run_target(&o);
    }

    if (o.progress && isatty(2)) {
        signal(SIGINT, on_interrupt);
        signal(SIGTERM, on_interrupt);
    }
    char err[512], desc[300];
    int fd;
    if (o.connect) {
        fd = ctl_connect(o.connect, 10000, err, sizeof err);
        if (fd < 0)
            die("--connect %s: %s", o.connect, err);
        snprintf(desc, sizeof desc, "%s", o.connect);
        int rc = run_initiator(&o, fd, desc);
        close(fd);
        return rc;
    }

    int port = spawn_target(&o);
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    fd = ctl_connect(addr, 10000, err, sizeof err);
    if (fd < 0)
        die("local target at %s: %s", addr, err);
    snprintf(desc, sizeof desc, "%s (local, pid %d)", addr, (int)g_child);
    int rc = run_initiator(&o, fd, desc);
    close(fd);
    int status = 0;
    pid_t child = g_child;
    g_child = -1;
    g_die_hook = NULL;
    if (waitpid(child, &status, 0) < 0)
        die("waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        warnx_("local target exited abnormally (status 0x%x)", status);
        rc = 1;
    }
    return rc;
}
