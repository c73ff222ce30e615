// kvxfer-options: prints the option tables (src/core/options.cpp and each
// backend's entry) as the README's markdown table or kvx_options_set(3)'s
// roff list. scripts/gen-option-docs.py puts its output between the marker
// lines of those files; the ctest option_docs fails when they differ.
//
//   kvxfer-options --markdown | --man
//
// In a doc string, `backquotes` mark literal text (code in markdown, bold in
// roff); everything else is plain text.
#include <cstdio>
#include <cstring>
#include <string>

#include "registry/registry.h"
#include "core/options.h"

using namespace kvx;

namespace {

// What holds for every key, said once before the keys.
constexpr const char *kNote =
    "Integers are decimal, without sign. A key `NAME.*` belongs to backend NAME: the other backends ignore it, and "
    "only a build with that backend knows it (a build without the verbs backend, KVX_VERBS=OFF, refuses `verbs.*` "
    "keys as unknown with KVX_EINVAL, while backend `verbs` is accepted there and fails `kvx_transport_create()` "
    "with KVX_ENOTSUP).";

enum class Format { markdown, man };

std::string markdown(const std::string &text) {
    std::string out;
    for (char c : text) {
        if (c == '|') out += '\\';
        out += c;
    }
    return out;
}

// One line of roff: `x` in bold, '-' a hyphen-minus, '\' escaped, and no
// leading '.' or '\'' that roff would take for a request.
std::string roff(const std::string &text) {
    std::string out = text.empty() || (text[0] != '.' && text[0] != '\'') ? "" : "\\&";
    bool code = false;
    for (char c : text) {
        if (c == '`') out += (code = !code) ? "\\fB" : "\\fP";
        else if (c == '-') out += "\\-";
        else if (c == '\\') out += "\\e";
        else out += c;
    }
    return out;
}

std::string text(Format f, const std::string &s) { return f == Format::man ? roff(s) : markdown(s); }

std::string values(const OptionSpec &s) {
    switch (s.type) {
    case OptType::uint: return std::to_string(s.lo) + ".." + std::to_string(s.hi);
    case OptType::string: return "text, up to " + std::to_string(s.hi) + " bytes";
    case OptType::hostport: return "`HOST:PORT`";
    case OptType::hostports: return "up to " + std::to_string(s.lo) + " `HOST:PORT`, comma-separated";
    case OptType::choice: break;
    }
    std::string out;
    for (const char *p = s.choices; *p; p++) {
        if (p == s.choices) out += '`';
        if (*p == ',') out += "`, `";
        else out += *p;
    }
    return out + '`';
}

std::string default_of(const OptionSpec &s) { return *s.def ? std::string("`") + s.def + "`" : "unset"; }

void print(Format f) {
    if (f == Format::markdown) {
        printf("%s\n\n| key | values | default | meaning |\n|---|---|---|---|\n", text(f, kNote).c_str());
    } else {
        printf("%s\n", text(f, kNote).c_str());
    }
    for (OptionTable t : all_option_tables())
        for (const OptionSpec &s : t) {
            if (f == Format::markdown)
                printf("| `%s` | %s | %s | %s |\n", s.key, text(f, values(s)).c_str(), text(f, default_of(s)).c_str(),
                       text(f, s.doc).c_str());
            else
                printf(".TP\n.B %s\nValues: %s; default: %s.\n%s\n", s.key, text(f, values(s)).c_str(),
                       text(f, default_of(s)).c_str(), text(f, s.doc).c_str());
        }
}

}  // namespace

int main(int argc, char **argv) {
    Format f;
    if (argc == 2 && strcmp(argv[1], "--markdown") == 0) f = Format::markdown;
    else if (argc == 2 && strcmp(argv[1], "--man") == 0) f = Format::man;
    else {
        fprintf(stderr, "usage: kvxfer-options --markdown | --man\n");
        return 2;
    }
    // The docs describe every backend's keys: a build without one cannot write them.
    for (const char *name : backend_names())
        if (!find_backend(name)) {
            fprintf(stderr, "kvxfer-options: this build has no %s backend, so not every option table (build with "
                            "every backend, e.g. KVX_VERBS=ON)\n", name);
            return 3;
        }
    print(f);
    return 0;
}
