// Config fingerprint: Python-canonical JSON (json.dumps(sort_keys=True,
// separators=(",", ":")) of json.loads(text)) and its truncated SHA-256.
// See fingerprint.h for exactly what is reproduced and what is rejected.
//
// Pipeline:
//  1. Number pre-pass. nlohmann's parser aborts on numbers that overflow a
//     double (406 "number overflow"), but Python reads 1e400 as inf and a
//     400-digit integer as an int. So before parsing, every number token
//     outside strings is recorded (original text) and replaced in a working
//     copy by a harmless number of the same length (positions in error
//     messages stay right). The SAX number events then take the recorded
//     tokens in document order (for a valid document the n-th number event
//     is the n-th recorded token; see scan_numbers()).
//  2. nlohmann SAX parse (validates JSON syntax, UTF-8, escapes) into a small
//     arena tree: scalars pre-serialized, objects sorted by key bytes
//     (= code point order) with duplicate keys collapsed to the last value.
//  3. Iterative printer (no recursion), numbers formatted the Python way.
#include "core/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <locale.h>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "util/error.h"

namespace kvx {
namespace {

// CPython 3.11 sys.int_info.default_max_str_digits: json.loads raises
// ValueError for an integer literal with more digits than this.
constexpr std::size_t kMaxIntDigits = 4300;

// ------------------------------------------------------------------ helpers

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Printable excerpt of `text` around byte `pos` for error messages.
std::string excerpt(std::string_view text, std::size_t pos) {
    constexpr std::size_t kBefore = 24, kAfter = 8;
    if (pos > text.size()) pos = text.size();
    std::size_t b = pos > kBefore ? pos - kBefore : 0;
    std::size_t e = std::min(text.size(), pos + kAfter);
    std::string out;
    if (b > 0) out += "...";
    for (std::size_t i = b; i < e; ++i) {
        auto c = static_cast<unsigned char>(text[i]);
        if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (e < text.size()) out += "...";
    return out;
}

// JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
    std::size_t i = 0, n = s.size();
    if (i < n && s[i] == '-') ++i;
    if (i >= n) return false;
    if (s[i] == '0') {
        ++i;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && is_digit(s[i])) ++i;
    } else {
        return false;
    }
    if (i < n && s[i] == '.') {
        ++i;
        std::size_t d = i;
        while (i < n && is_digit(s[i])) ++i;
        if (i == d) return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
        std::size_t d = i;
        while (i < n && is_digit(s[i])) ++i;
        if (i == d) return false;
    }
    return i == n;
}

bool is_number_char(char c) {
    return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

// Step 1 (see top of file). Outside strings, every maximal run of number
// characters [0-9+-.eE] that is a valid JSON number is recorded in `tokens`
// and overwritten in `work` by a finite number of the same length ("0",
// "10", "0.0", "0.00", ...). Runs that are not valid numbers are left alone
// for the parser to reject. In a valid document a number token is always
// preceded and followed by a non-number character (structural character,
// whitespace, or the text boundary), so number tokens and recorded runs
// correspond one to one and in order. In an invalid document the parser
// stops at the first error; every replacement maps a valid number token to
// another valid number token, so it cannot make an invalid document valid.
void scan_numbers(std::string &work, std::vector<std::string> &tokens) {
    const std::size_t n = work.size();
    std::size_t i = 0;
    while (i < n) {
        char c = work[i];
        if (c == '"') {  // skip a string, honouring backslash escapes
            ++i;
            while (i < n && work[i] != '"') i += (work[i] == '\\') ? 2 : 1;
            ++i;
            continue;
        }
        if (!is_number_char(c)) {
            ++i;
            continue;
        }
        std::size_t b = i;
        while (i < n && is_number_char(work[i])) ++i;
        std::string_view run(work.data() + b, i - b);
        if (!is_json_number(run)) continue;
        tokens.emplace_back(run);
        std::size_t len = i - b;
        if (len == 1) {
            work[b] = '0';
        } else if (len == 2) {
            work[b] = '1';
            work[b + 1] = '0';
        } else {
            work[b] = '0';
            work[b + 1] = '.';
            std::fill(work.begin() + static_cast<std::ptrdiff_t>(b + 2),
                      work.begin() + static_cast<std::ptrdiff_t>(i), '0');
        }
    }
}

// Python json.dumps(ensure_ascii=True) string literal. `s` must be valid
// UTF-8 (guaranteed by the parser); returns false if it is not.
bool append_py_string(std::string &out, std::string_view s) {
    static const char hex[] = "0123456789abcdef";
    auto u4 = [&out](unsigned v) {
        out += "\\u";
        out += hex[(v >> 12) & 0xf];
        out += hex[(v >> 8) & 0xf];
        out += hex[(v >> 4) & 0xf];
        out += hex[v & 0xf];
    };
    out += '"';
    const std::size_t n = s.size();
    std::size_t i = 0;
    while (i < n) {
        auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x80) {
            switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c >= 0x20 && c <= 0x7e)
                    out += static_cast<char>(c);
                else
                    u4(c);
            }
            ++i;
            continue;
        }
        // Decode one multi-byte UTF-8 sequence, strictly (RFC 3629).
        unsigned cp;
        std::size_t len;
        unsigned min;
        if (c >= 0xc2 && c <= 0xdf) {
            cp = c & 0x1f, len = 2, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            cp = c & 0x0f, len = 3, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            cp = c & 0x07, len = 4, min = 0x10000;
        } else {
            return false;
        }
        if (n - i < len) return false;
        for (std::size_t k = 1; k < len; ++k) {
            auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        if (cp >= 0x10000) {
            unsigned v = cp - 0x10000;
            u4(0xd800 | (v >> 10));
            u4(0xdc00 | (v & 0x3ff));
        } else {
            u4(cp);
        }
        i += len;
    }
    out += '"';
    return true;
}

// Python float.__repr__ (and json.dumps' Infinity / -Infinity).
void append_py_float(std::string &out, double v) {
    if (std::isinf(v)) {
        out += v > 0 ? "Infinity" : "-Infinity";
        return;
    }
    if (std::isnan(v)) {  // unreachable: no JSON number text parses to NaN
        out += "NaN";
        return;
    }
    if (v == 0.0) {
        out += std::signbit(v) ? "-0.0" : "0.0";
        return;
    }
    // Shortest round-trip digits, "d[.ddd]e[+-]XX".
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    if (res.ec != std::errc()) fail(KVX_EINTERNAL, "config JSON: cannot format float");
    std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
    bool neg = false;
    if (!sci.empty() && sci.front() == '-') {
        neg = true;
        sci.remove_prefix(1);
    }
    std::size_t epos = sci.find('e');
    if (epos == std::string_view::npos) fail(KVX_EINTERNAL, "config JSON: cannot format float");
    std::string digits;
    for (char ch : sci.substr(0, epos))
        if (ch != '.') digits += ch;
    int exp10 = 0;
    {
        std::string_view es = sci.substr(epos + 1);
        bool eneg = false;
        if (!es.empty() && (es.front() == '+' || es.front() == '-')) {
            eneg = es.front() == '-';
            es.remove_prefix(1);
        }
        std::from_chars(es.data(), es.data() + es.size(), exp10);
        if (eneg) exp10 = -exp10;
    }
    // Python: value = 0.DIGITS x 10^decpt; exponent form iff decpt <= -4 or decpt > 16.
    const int decpt = exp10 + 1;
    const int nd = static_cast<int>(digits.size());
    if (neg) out += '-';
    if (decpt <= -4 || decpt > 16) {
        out += digits[0];
        if (nd > 1) {
            out += '.';
            out.append(digits, 1, std::string::npos);
        }
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        out += eb;
    } else if (decpt <= 0) {
        out += "0.";
        out.append(static_cast<std::size_t>(-decpt), '0');
        out += digits;
    } else if (decpt >= nd) {
        out += digits;
        out.append(static_cast<std::size_t>(decpt - nd), '0');
        out += ".0";
    } else {
        out.append(digits, 0, static_cast<std::size_t>(decpt));
        out += '.';
        out.append(digits, static_cast<std::size_t>(decpt), std::string::npos);
    }
}

// Correctly rounded, locale-independent strtod of a JSON number token.
double parse_double(const std::string &tok) {
    static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
    if (c_locale == static_cast<locale_t>(nullptr))
        fail(KVX_ENOMEM, "config JSON: cannot create the C locale to parse numbers");
    char *end = nullptr;
    double v = strtod_l(tok.c_str(), &end, c_locale);  // ERANGE: inf or (sub)normal/0, as Python
    if (end != tok.c_str() + tok.size())
        fail(KVX_EINTERNAL, "config JSON: cannot parse number '%s'", excerpt(tok, 0).c_str());
    return v;
}

// ------------------------------------------------------------------ tree

struct Node {
    enum Kind : std::uint8_t { Scalar, Number, Array, Object } kind;
    std::size_t num = 0;    // Number: index into the token list
    std::string text;       // Scalar: serialized text
    std::vector<std::size_t> items;                             // Array
    std::vector<std::pair<std::string, std::size_t>> members;  // Object: raw UTF-8 key, node
};

class TreeBuilder {
public:
    using json = nlohmann::json;

    TreeBuilder(std::string_view original, std::size_t num_tokens)
        : original_(original), num_tokens_(num_tokens) {}

    std::vector<Node> nodes;
    std::size_t root = SIZE_MAX;
    std::string error;  // set when a callback returns false

    // --- SAX interface
    bool null() { return scalar("null", "null"); }
    bool boolean(bool b) { return scalar(b ? "true" : "false", "a boolean"); }
    bool number_integer(json::number_integer_t) { return number(); }
    bool number_unsigned(json::number_unsigned_t) { return number(); }
    bool number_float(json::number_float_t, const json::string_t &) { return number(); }
    bool string(json::string_t &s) {
        std::string text;
        text.reserve(s.size() + 2);
        if (!append_py_string(text, s)) return set_error("config JSON: invalid UTF-8 in a string at " + path());
        if (!top_ok("a string")) return false;
        Node &n = new_node(Node::Scalar);
        n.text = std::move(text);
        attach(nodes.size() - 1);
        return true;
    }
    bool binary(json::binary_t &) { return set_error("config JSON: unexpected binary value"); }
    bool start_object(std::size_t) { return open(Node::Object, "an object"); }
    bool key(json::string_t &k) {
        nodes[stack_.back()].members.emplace_back(std::move(k), SIZE_MAX);
        return true;
    }
    bool end_object() {
        finish_object(nodes[stack_.back()]);
        stack_.pop_back();
        return true;
    }
    bool start_array(std::size_t) { return open(Node::Array, "an array"); }
    bool end_array() {
        stack_.pop_back();
        return true;
    }
    bool parse_error(std::size_t position, const std::string &, const nlohmann::detail::exception &ex) {
        // ex.what(): "[json.exception.parse_error.101] parse error at line 1, column 5:
        // syntax error while parsing value - invalid literal; last read: 'tru'". Drop the
        // tag and the "last read" part (it would show our number substitutes) and
        // quote the original text instead.
        std::string msg = ex.what();
        if (!msg.empty() && msg[0] == '[') {
            std::size_t p = msg.find("] ");
            if (p != std::string::npos) msg.erase(0, p + 2);
        }
        std::size_t lr = msg.find("; last read:");
        if (lr != std::string::npos) msg.erase(lr);
        return set_error("config JSON: " + msg + " (at byte " + std::to_string(position) + ": '" +
                         excerpt(original_, position) + "')");
    }

private:
    std::string_view original_;
    std::size_t num_tokens_;
    std::size_t next_token_ = 0;
    std::vector<std::size_t> stack_;  // open containers

    bool set_error(std::string msg) {
        if (error.empty()) error = std::move(msg);
        return false;
    }

    // The top level must be an object or null (Python's `if not config_fields`).
    bool top_ok(const char *what) {
        if (!stack_.empty() || root != SIZE_MAX) return true;
        if (std::strcmp(what, "an object") == 0 || std::strcmp(what, "null") == 0) return true;
        return set_error(std::string("config JSON: top-level value is ") + what +
                         "; a config must be a JSON object (or null)");
    }

    Node &new_node(Node::Kind k) {
        nodes.emplace_back();
        nodes.back().kind = k;
        return nodes.back();
    }

    void attach(std::size_t idx) {
        if (stack_.empty()) {
            root = idx;
            return;
        }
        Node &parent = nodes[stack_.back()];
        if (parent.kind == Node::Array)
            parent.items.push_back(idx);
        else
            parent.members.back().second = idx;
    }

    bool scalar(const char *text, const char *what) {
        if (!top_ok(what)) return false;
        new_node(Node::Scalar).text = text;
        attach(nodes.size() - 1);
        return true;
    }

    bool number() {
        if (!top_ok("a number")) return false;
        // Running out of tokens cannot happen for a valid document (see
        // scan_numbers); in an invalid one ("01", "1-2") the parser reports the
        // syntax error right after this event, so carry on and let it.
        new_node(Node::Number).num = next_token_ < num_tokens_ ? next_token_++ : SIZE_MAX;
        attach(nodes.size() - 1);
        return true;
    }

    bool open(Node::Kind k, const char *what) {
        if (!top_ok(what)) return false;
        if (stack_.size() >= kMaxConfigDepth)
            return set_error("config JSON: nesting deeper than " + std::to_string(kMaxConfigDepth) +
                             " levels at " + path());
        new_node(k);
        std::size_t idx = nodes.size() - 1;
        attach(idx);
        stack_.push_back(idx);
        return true;
    }

    // Sort by key bytes (UTF-8 byte order == code point order == Python's str
    // order); duplicate keys: Python's dict keeps the last value.
    static void finish_object(Node &obj) {
        auto &m = obj.members;
        std::stable_sort(m.begin(), m.end(),
                         [](const auto &a, const auto &b) { return a.first < b.first; });
        std::size_t w = 0;
        for (std::size_t r = 0; r < m.size(); ++r) {
            if (r + 1 < m.size() && m[r + 1].first == m[r].first) continue;  // a later one wins
            if (w != r) m[w] = std::move(m[r]);
            ++w;
        }
        m.resize(w);
    }

    // "$.a.b[3]" of the value being built, for messages.
    std::string path() const {
        std::string p = "$";
        for (std::size_t idx : stack_) {
            const Node &n = nodes[idx];
            if (p.size() > 200) {
                p += "...";
                break;
            }
            if (n.kind == Node::Array) {
                p += "[" + std::to_string(n.items.size()) + "]";
            } else if (!n.members.empty()) {
                std::string k;
                append_py_string(k, n.members.back().first);
                if (k.size() > 40) k = k.substr(0, 37) + "...";
                p += "[" + k + "]";
            }
        }
        return p;
    }
};

// Append a number token as Python prints json.loads(token).
void append_py_number(std::string &out, const std::string &tok, const std::string &where) {
    bool is_float = tok.find_first_of(".eE") != std::string::npos;
    if (is_float) {
        append_py_float(out, parse_double(tok));
        return;
    }
    std::size_t ndigits = tok.size() - (tok[0] == '-' ? 1 : 0);
    if (ndigits > kMaxIntDigits)
        fail(KVX_ECONFIG,
             "config JSON: integer at %s has %zu digits; Python's json.loads rejects integers "
             "over %zu digits",
             where.c_str(), ndigits, kMaxIntDigits);
    if (tok == "-0")
        out += '0';
    else
        out += tok;  // JSON forbids leading zeros: the digits are Python's repr
}

// Step 3: iterative printer.
std::string print_tree(const std::vector<Node> &nodes, std::size_t root,
                       const std::vector<std::string> &tokens) {
    struct Frame {
        std::size_t node;
        std::size_t next;
    };
    std::vector<Frame> stack;
    std::string out;

    auto where = [&]() {
        std::string p = "$";
        for (const Frame &f : stack) {
            if (p.size() > 200) {
                p += "...";
                break;
            }
            const Node &n = nodes[f.node];
            if (n.kind == Node::Array) {
                p += "[" + std::to_string(f.next - 1) + "]";
            } else {
                std::string k;
                append_py_string(k, n.members[f.next - 1].first);
                if (k.size() > 40) k = k.substr(0, 37) + "...";
                p += "[" + k + "]";
            }
        }
        return p;
    };

    auto emit = [&](std::size_t idx) {
        const Node &n = nodes[idx];
        switch (n.kind) {
        case Node::Scalar: out += n.text; break;
        case Node::Number:
            if (n.num >= tokens.size()) fail(KVX_EINTERNAL, "config JSON: lost number token");
            append_py_number(out, tokens[n.num], where());
            break;
        case Node::Array:
            out += '[';
            stack.push_back({idx, 0});
            break;
        case Node::Object:
            out += '{';
            stack.push_back({idx, 0});
            break;
        }
    };

    emit(root);
    while (!stack.empty()) {
        Frame &f = stack.back();
        const Node &n = nodes[f.node];
        if (n.kind == Node::Array) {
            if (f.next == n.items.size()) {
                out += ']';
                stack.pop_back();
                continue;
            }
            if (f.next > 0) out += ',';
            std::size_t child = n.items[f.next++];
            emit(child);  // may push: `f` is not used afterwards
        } else {
            if (f.next == n.members.size()) {
                out += '}';
                stack.pop_back();
                continue;
            }
            if (f.next > 0) out += ',';
            const auto &m = n.members[f.next++];
            if (!append_py_string(out, m.first))
                fail(KVX_ECONFIG, "config JSON: invalid UTF-8 in a key at %s", where().c_str());
            out += ':';
            emit(m.second);
        }
    }
    return out;
}

}  // namespace

std::string canonical_config_json(std::string_view json) {
    // Python's json.loads(str) rejects a BOM ("Unexpected UTF-8 BOM"); nlohmann skips it.
    if (json.size() >= 3 && std::memcmp(json.data(), "\xEF\xBB\xBF", 3) == 0)
        fail(KVX_ECONFIG, "config JSON: starts with a UTF-8 byte order mark, which Python's "
                          "json.loads rejects");

    std::string work(json);
    std::vector<std::string> tokens;
    scan_numbers(work, tokens);

    TreeBuilder tb(json, tokens.size());
    bool ok = nlohmann::json::sax_parse(work.begin(), work.end(), &tb,
                                        nlohmann::json::input_format_t::json,
                                        /*strict=*/true, /*ignore_comments=*/false);
    if (!ok || tb.root == SIZE_MAX) {
        if (tb.error.empty()) tb.error = "config JSON: invalid JSON";
        throw Error(KVX_ECONFIG, tb.error);
    }
    const Node &root = tb.nodes[tb.root];
    if (root.kind == Node::Scalar && root.text == "null") return "";  // json.loads -> None
    if (root.kind != Node::Object)  // top_ok() already refused these
        fail(KVX_ECONFIG, "config JSON: top-level value must be a JSON object");
    if (root.members.empty()) return "";  // `if not config_fields`
    return print_tree(tb.nodes, tb.root, tokens);
}

std::string config_fingerprint(const char *json_or_null) {
    if (json_or_null == nullptr) return "";
    std::string canonical = canonical_config_json(json_or_null);
    if (canonical.empty()) return "";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (EVP_Digest(canonical.data(), canonical.size(), md, &md_len, EVP_sha256(), nullptr) != 1 ||
        md_len < 8)
        fail(KVX_EINTERNAL, "config fingerprint: SHA-256 failed (OpenSSL EVP_Digest)");
    static const char hex[] = "0123456789abcdef";
    std::string out(16, '0');
    for (std::size_t i = 0; i < 8; ++i) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 0xf];
    }
    return out;
}

}  // namespace kvx
