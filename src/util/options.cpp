#include "util/options.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/net.h"

namespace kvx {

uint64_t parse_uint_option(const std::string &key, const std::string &value, uint64_t lo, uint64_t hi) {
    const char *s = value.c_str();
    if (*s < '0' || *s > '9') fail(KVX_EINVAL, "option %s: '%s' is not a non-negative integer", key.c_str(), s);
    errno = 0;
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') fail(KVX_EINVAL, "option %s: '%s' is not a non-negative integer", key.c_str(), s);
    if (v < lo || v > hi)
        fail(KVX_EINVAL, "option %s: %llu is out of range %llu..%llu", key.c_str(), v, (unsigned long long)lo,
             (unsigned long long)hi);
    return v;
}

namespace {

bool in_word_list(const char *list, const std::string &w) {
    size_t n = w.size();
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
        if (len == n && memcmp(p, w.data(), n) == 0) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

void check_hostports(const OptionSpec &s, const std::string &value) {
    std::string what = std::string("option ") + s.key;
    size_t start = 0, count = 0;
    for (;;) {
        size_t comma = value.find(',', start);
        std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        net::check_hostport_syntax(item, what.c_str(), false);
        if (++count > s.lo)
            fail(KVX_EINVAL, "option %s: more than %llu addresses", s.key, (unsigned long long)s.lo);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
}

}  // namespace

void check_option_value(const OptionSpec &s, const std::string &value) {
    if (value.size() > 1024) fail(KVX_EINVAL, "option %s: value of %zu bytes is too long", s.key, value.size());
    switch (s.type) {
    case OptType::uint: parse_uint_option(s.key, value, s.lo, s.hi); return;
    case OptType::string:
        if (value.size() > s.hi) fail(KVX_EINVAL, "option %s: value of %zu bytes is too long", s.key, value.size());
        return;
    case OptType::hostport: net::check_hostport_syntax(value, (std::string("option ") + s.key).c_str(), true); return;
    case OptType::hostports: check_hostports(s, value); return;
    case OptType::choice:
        if (!in_word_list(s.choices, value))
            fail(KVX_EINVAL, "option %s: '%s' is not one of %s", s.key, value.c_str(), s.choices);
        return;
    }
}

std::vector<std::pair<std::string, std::string>> split_option_list(const std::string &text) {
    std::vector<std::pair<std::string, std::string>> out;
    const char *const space = " \t\n\v\f\r";
    for (size_t at = text.find_first_not_of(space); at != std::string::npos; at = text.find_first_not_of(space, at)) {
        size_t end = text.find_first_of(space, at);
        std::string item = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
        size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0)
            fail(KVX_EINVAL, "option list: '%.200s' is not KEY=VALUE", item.c_str());
        out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
        at = end;
    }
    return out;
}

Options::Options(const OptionBag *bag, std::vector<OptionTable> tables) : tables_(std::move(tables)) {
    if (bag) kv_ = bag->kv;
}

const OptionSpec &Options::spec(const char *key) const {
    for (OptionTable t : tables_)
        for (const OptionSpec &s : t)
            if (strcmp(s.key, key) == 0) return s;
    fail(KVX_EINTERNAL, "option %s is in no option table", key);
}

uint64_t Options::uint(const char *key) const {
    const OptionSpec &s = spec(key);
    auto it = kv_.find(key);
    return parse_uint_option(key, it == kv_.end() ? s.def : it->second, s.lo, s.hi);
}

std::string Options::str(const char *key) const {
    const OptionSpec &s = spec(key);
    auto it = kv_.find(key);
    return it == kv_.end() ? s.def : it->second;
}

}  // namespace kvx
