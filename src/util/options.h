// Option tables: every tunable is stated once, in the table of the layer that
// owns it (core, or a backend), with its type, range, default and its
// documentation. kvx_options_set() validates against the tables; code reads
// typed values through Options, which falls back to the table's default.
// The option docs (kvx_options_set(3), the README's table) are generated from
// the tables: tools/kvxfer-options.cpp, scripts/gen-option-docs.py.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvx {

enum class OptType : uint8_t {
    uint,      // decimal integer in [lo, hi]
    string,    // free text of at most hi bytes
    hostport,  // HOST:PORT or [V6]:PORT (syntax checked at set, resolved at create)
    hostports, // comma-separated list of hostport, HOST may be empty (port only)
    choice,    // one of the comma-separated words in choices
};

struct OptionSpec {
    const char *key;
    OptType type;
    uint64_t lo, hi;
    const char *def;  // default as text; "" = unset (the owner derives one: doc says how)
    // The option's only documentation: one paragraph of plain text (no
    // newline; `backquotes` mark literal text), what the generated docs say
    // after the key, its values and its default.
    const char *doc;
    const char *choices = nullptr;
};

using OptionTable = std::span<const OptionSpec>;

// Throws Error(KVX_EINVAL) naming the key and the bad value.
void check_option_value(const OptionSpec &spec, const std::string &value);
// Parses a decimal integer within [lo, hi]; throws Error(KVX_EINVAL) naming key.
uint64_t parse_uint_option(const std::string &key, const std::string &value, uint64_t lo, uint64_t hi);

// The one KEY=VALUE list syntax (kvx_options_parse()): pairs separated by
// whitespace, each split at its first '='; a value holds no whitespace (and
// may hold commas: backend=shm,tcp). Keys are not looked up here. Throws
// Error(KVX_EINVAL) naming the item that has no '=' or an empty key.
std::vector<std::pair<std::string, std::string>> split_option_list(const std::string &text);

// What the caller set: string key/value pairs, validated at set.
struct OptionBag {
    std::map<std::string, std::string> kv;
};

// Typed read access to a bag through the tables that define its keys.
class Options {
public:
    Options() = default;
    Options(const OptionBag *bag, std::vector<OptionTable> tables);
    // The value set, else the table's default. Throws Error(KVX_EINTERNAL)
    // for a key no table defines (a programming error); uint() of a key
    // without default that is not set throws too: ask is_set() first.
    uint64_t uint(const char *key) const;
    std::string str(const char *key) const;
    bool is_set(const char *key) const { return kv_.count(key) != 0; }

private:
    const OptionSpec &spec(const char *key) const;
    std::map<std::string, std::string> kv_;
    std::vector<OptionTable> tables_;
};

}  // namespace kvx
