// kvxfer-info: what this build of kvxfer and this host offer, backend by
// backend, and why not (issue 30, item 5; as ibv_devinfo, ucx_info -d or
// fi_info for their stacks). Each backend is created for real on a small
// region; the host's facts say why one cannot be and what to do about it.
//
//   kvxfer-info [--json] [--region-size SIZE] [--option 'KEY=VALUE ...']...
//
// Exit status: 0 when it ran (whatever is usable), 1 when the output could
// not be written, 2 on bad usage. The JSON keys: docs/man/kvxfer-info.1.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "info/info.h"
#include "kvxfer.h"

using kvx::info::Config;
using kvx::info::Json;

namespace {

constexpr const char *kUsage =
    "usage: kvxfer-info [--json] [--region-size SIZE] [--option 'KEY=VALUE ...']... [--verbose]\n"
    "       kvxfer-info --version | --help\n";

constexpr const char *kHelp =
    "Prints what this build of kvxfer and this host offer: the library version and the backends built in,\n"
    "then for each backend (shm, verbs, tcp) whether it is usable here -- a transport is created with\n"
    "backend=NAME on a small region -- and, when not, the library's reason and hints; the facts behind them\n"
    "(RLIMIT_MEMLOCK, Yama ptrace_scope, /dev/shm, huge pages, THP, the tcp AEAD code) and every RDMA device\n"
    "with its ports and GIDs.\n"
    "\n"
    "  --json               one JSON object instead of text (keys: man kvxfer-info)\n"
    "  --region-size SIZE   the region size RLIMIT_MEMLOCK and the huge pages are checked against\n"
    "                       (suffixes K, M, G, T: powers of 1024; default 1G)\n"
    "  --option 'K=V ...'   options for the transports created (kvx_options_parse syntax; e.g.\n"
    "                       verbs.devices=mlx5_0 or tcp.aead_impl=ipsec-mb); repeatable\n"
    "  -v, --verbose        the library's own log (KVX_LOG=info) on standard error\n"
    "  --version            print the version\n"
    "  -h, --help           print this help\n"
    "\n"
    "Exit status: 0 when it ran, whatever is usable; 1 when the output could not be written; 2 on bad usage.\n";

int usage_error(const std::string &msg) {
    fprintf(stderr, "kvxfer-info: %s\n%s", msg.c_str(), kUsage);
    return 2;
}

// "1G", "512M", "4096": binary suffixes; false when it is no size.
bool parse_size(const char *text, uint64_t *out) {
    char *end = nullptr;
    errno = 0;
    if (!*text || *text == '-') return false;
    const unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text) return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    case 't': case 'T': shift = 40; break;
    case 0: break;
    default: return false;
    }
    if (shift) {
        end++;
        if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) end += strlen(end);
    }
    if (*end || v == 0 || v > (UINT64_MAX >> shift)) return false;
    *out = static_cast<uint64_t>(v) << shift;
    return true;
}

// The options as the library takes them; false with its message if not.
bool check_options(const std::string &text, std::string *why) {
    kvx_options *o = nullptr;
    if (kvx_options_create(&o) != 0) return *why = "out of memory", false;
    const int rc = kvx_options_parse(o, text.c_str());
    if (rc != 0) *why = kvx_last_error_message();
    kvx_options_destroy(o);
    return rc == 0;
}

// Parses argv into *c; returns -1 to go on, else the exit status.
int parse_args(int argc, char **argv, Config *c) {
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--json") c->json = true;
        else if (a == "-v" || a == "--verbose") setenv("KVX_LOG", "info", 1);
        else if (a == "-h" || a == "--help") return printf("%s\n%s", kUsage, kHelp) < 0 ? 1 : 0;
        else if (a == "--version") return printf("kvxfer-info (kvxfer) %s\n", kvx_version_string()) < 0 ? 1 : 0;
        else if (a == "--region-size") {
            if (!has_value || !parse_size(argv[++i], &c->region_size))
                return usage_error("--region-size needs a size of at least 1 byte, like 1G or 512M");
        } else if (a == "--option") {
            if (!has_value) return usage_error("--option needs 'KEY=VALUE ...'");
            if (!c->options.empty()) c->options += ' ';
            c->options += argv[++i];
        } else {
            return usage_error("unknown argument '" + a + "'");
        }
    }
    std::string why;
    if (!c->options.empty() && !check_options(c->options, &why)) return usage_error("--option: " + why);
    return -1;
}

}  // namespace

int main(int argc, char **argv) {
    // Quiet unless asked: the library's reasons come back through
    // kvx_last_error_message() (KVX_LOG set by the user still wins).
    setenv("KVX_LOG", "off", 0);
    Config c;
    const int done = parse_args(argc, argv, &c);
    if (done >= 0) return done;

    Json all;
    all["kvxfer_info"] = 1;  // the version of this object's layout
    all["version"] = kvx_version_string();
    all["version_number"] = kvx_version_number();
    all["build"] = kvx::info::build_facts();
    all["host"] = kvx::info::host_facts(c);
    const Json rdma = kvx::info::rdma_facts();
    all["auto"] = kvx::info::auto_facts(c);
    all["backends"] = kvx::info::backend_facts(c, rdma);
    all["rdma"] = rdma;

    if (c.json) printf("%s\n", all.dump(2).c_str());
    else kvx::info::print_text(all);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kvxfer-info: cannot write the output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
