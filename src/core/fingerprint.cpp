// Config fingerprint: Python-canonical JSON (json.dumps(sort_keys=True,
// separators=(",", ":")) of json.loads(text)) and its truncated SHA-256.
// See fingerprint.h for exactly what is reproduced and what is rejected.
//
// Pipeline:
//  1. Number pre-pass. nlohmann's parser aborts on numbers that overflow a
//     double (406 "number overflow"), but Python reads 1e400 as inf and a
//     400-digit integer as an int. So the parser runs on a working copy in
//     which every number token outside strings is replaced by a harmless
//     number of the same length (positions in error messages stay right),
//     and each SAX number event takes the next token of the original text
//     instead (for a valid document the n-th number event is the n-th token;
//     see NumberRuns).
//  2. nlohmann SAX parse (validates JSON syntax, UTF-8, escapes) driving a
//     bottom-up serializer (Canonicalizer): every finished value is written
//     in Python's form straight into its parent; an object's members are
//     sorted by key bytes (= code point order) and duplicate keys collapsed
//     to the last value when it closes. No tree, no recursion; memory stays
//     proportional to the text; nesting is bounded by kMaxConfigDepth.
//  3. SHA-256 (OpenSSL) of the canonical text, first 8 bytes in hex.
#include "core/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
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
// characters [0-9+-.eE] that is a valid JSON number is a number token. Runs
// that are not valid numbers are skipped (left for the parser to reject). In
// a valid document a number token is always preceded and followed by a
// non-number character (structural character, whitespace, or the text
// boundary), so the parser's number events and these runs correspond one to
// one and in order. In an invalid document the parser stops at the first
// error; each replacement (neutralize()) maps a valid number token to another
// valid number token, so it cannot make an invalid document valid.
class NumberRuns {
public:
    explicit NumberRuns(std::string_view text) : text_(text) {}

    // The next number token [off, off + len); false at the end.
    bool next(std::size_t &off, std::size_t &len) {
        const std::size_t n = text_.size();
        std::size_t &i = pos_;
        while (i < n) {
            char c = text_[i];
            if (c == '"') {  // skip a string, honouring backslash escapes
                ++i;
                while (i < n && text_[i] != '"') i += (text_[i] == '\\') ? 2u : 1u;
                ++i;
                continue;
            }
            if (!is_number_char(c)) {
                ++i;
                continue;
            }
            std::size_t b = i;
            while (i < n && is_number_char(text_[i])) ++i;
            if (is_json_number(text_.substr(b, i - b))) {
                off = b;
                len = i - b;
                return true;
            }
        }
        return false;
    }

private:
    std::string_view text_;
    std::size_t pos_ = 0;
};

// Overwrite every number token of `work` by a finite number of the same
// length ("0", "10", "0.0", "0.00", ...): error positions stay right.
void neutralize_numbers(std::string &work) {
    NumberRuns runs(work);  // tokens only grow to the right of what is overwritten
    std::size_t b, len;
    while (runs.next(b, len)) {
        if (len == 1) {
            work[b] = '0';
        } else if (len == 2) {
            work[b] = '1';
            work[b + 1] = '0';
        } else {
            work[b] = '0';
            work[b + 1] = '.';
            std::fill(work.begin() + static_cast<std::ptrdiff_t>(b + 2),
                      work.begin() + static_cast<std::ptrdiff_t>(b + len), '0');
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

// Append a number token as Python prints json.loads(token).
void append_py_number(std::string &out, std::string_view tok) {
    if (tok.find_first_of(".eE") != std::string_view::npos) {  // a float in Python
        append_py_float(out, parse_double(std::string(tok)));
        return;
    }
    std::size_t ndigits = tok.size() - (tok[0] == '-' ? 1 : 0);
    if (ndigits > kMaxIntDigits)
        fail(KVX_ECONFIG,
             "integer of %zu digits; Python's json.loads rejects integers over %zu digits",
             ndigits, kMaxIntDigits);
    if (tok == "-0")
        out += '0';
    else
        out += tok;  // JSON forbids leading zeros: the digits are Python's repr
}

// ------------------------------------------------------------------ canonicalizer

// Step 2+3: SAX handler that serializes bottom-up. Every finished value is
// appended to its parent at once: an open array keeps its text so far, an
// open object its (key, canonical value text) members, which are sorted and
// joined when it closes. Memory stays proportional to the text, and nothing
// recurses (the container stack is bounded by kMaxConfigDepth).
class Canonicalizer {
public:
    using json = nlohmann::json;

    explicit Canonicalizer(std::string_view original) : original_(original), runs_(original) {}

    bool have_root = false;
    std::string root;    // canonical text of the top-level value
    std::string error;   // why a callback returned false
    std::string pending; // first error found in a value; reported only if the
                         // document is otherwise valid (syntax errors win)

    // --- SAX interface
    bool null() { return value("null", "null"); }
    bool boolean(bool b) { return value(b ? "true" : "false", "a boolean"); }
    bool number_integer(json::number_integer_t) { return number(); }
    bool number_unsigned(json::number_unsigned_t) { return number(); }
    bool number_float(json::number_float_t, const json::string_t &) { return number(); }
    bool string(json::string_t &s) {
        if (!top_ok("a string")) return false;
        std::string text;
        text.reserve(s.size() + 2);
        if (!append_py_string(text, s)) {
            later("invalid UTF-8 in a string");  // the parser validates UTF-8 already
            text = "\"\"";
        }
        return value(std::move(text), "a string");
    }
    bool binary(json::binary_t &) { return set_error("config JSON: unexpected binary value"); }
    bool start_object(std::size_t) { return open(true, "an object"); }
    bool key(json::string_t &k) {
        stack_.back().members.emplace_back(std::move(k), std::string());
        return true;
    }
    bool end_object() {
        Frame &f = stack_.back();
        auto &m = f.members;
        // Sort by key bytes (UTF-8 byte order == code point order == Python's
        // str order); duplicate keys: Python's dict keeps the last value.
        std::stable_sort(m.begin(), m.end(),
                         [](const auto &a, const auto &b) { return a.first < b.first; });
        std::string text = "{";
        bool first = true;
        for (std::size_t i = 0; i < m.size(); ++i) {
            if (i + 1 < m.size() && m[i + 1].first == m[i].first) continue;  // a later one wins
            if (!first) text += ',';
            first = false;
            if (!append_py_string(text, m[i].first)) later("invalid UTF-8 in a key");
            text += ':';
            text += m[i].second;
        }
        text += '}';
        stack_.pop_back();
        return value(std::move(text), "an object");
    }
    bool start_array(std::size_t) { return open(false, "an array"); }
    bool end_array() {
        std::string text = std::move(stack_.back().text);
        text += ']';
        stack_.pop_back();
        return value(std::move(text), "an array");
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
        return set_error("config JSON: " + msg + " (near byte " + std::to_string(position) + ": '" +
                         excerpt(original_, position) + "')");
    }

private:
    struct Frame {
        bool is_object;
        std::size_t count = 0;  // array: values so far
        std::string text;       // array: "[v1,v2"
        std::vector<std::pair<std::string, std::string>> members;  // object: raw UTF-8 key, value text
    };

    std::string_view original_;
    NumberRuns runs_;  // the original number tokens, consumed in document order
    std::vector<Frame> stack_;  // open containers, at most kMaxConfigDepth

    bool set_error(std::string msg) {
        if (error.empty()) error = std::move(msg);
        return false;
    }

    void later(const std::string &what) {
        if (pending.empty()) pending = "config JSON: " + what + " at " + path();
    }

    // The top level must be an object or null (Python's `if not config_fields`).
    bool top_ok(const char *what) {
        if (!stack_.empty() || have_root) return true;
        if (std::strcmp(what, "an object") == 0 || std::strcmp(what, "null") == 0) return true;
        return set_error(std::string("config JSON: top-level value is ") + what +
                         "; a config must be a JSON object (or null)");
    }

    // A complete value: hand it to the enclosing container.
    bool value(std::string text, const char *what) {
        if (stack_.empty()) {
            if (!top_ok(what)) return false;
            root = std::move(text);
            have_root = true;
            return true;
        }
        Frame &f = stack_.back();
        if (f.is_object) {
            f.members.back().second = std::move(text);
        } else {
            if (f.count++ > 0) f.text += ',';
            f.text += text;
        }
        return true;
    }

    bool number() {
        if (!top_ok("a number")) return false;
        // Running out of tokens cannot happen for a valid document (see
        // NumberRuns); in an invalid one ("01", "1-2") the parser reports the
        // syntax error right after this event, so carry on and let it.
        std::string text;
        std::size_t off, len;
        if (!runs_.next(off, len)) {
            later("number without a token");
            text.assign(1, '0');  // not = "0": gcc 12 -O3 warns -Wrestrict (a false positive)
        } else {
            try {
                append_py_number(text, original_.substr(off, len));
            } catch (const Error &e) {
                later(e.what());
                text.assign(1, '0');  // not = "0": gcc 12 -O3 warns -Wrestrict (a false positive)
            }
        }
        return value(std::move(text), "a number");
    }

    bool open(bool is_object, const char *what) {
        if (!top_ok(what)) return false;
        if (stack_.size() >= kMaxConfigDepth)
            return set_error("config JSON: nesting deeper than " + std::to_string(kMaxConfigDepth) +
                             " levels at " + path());
        stack_.emplace_back();
        stack_.back().is_object = is_object;
        if (!is_object) stack_.back().text = "[";
        return true;
    }

    // JSONPath-like location of the value being read ("$["a"][3]"), for messages.
    std::string path() const {
        std::string p = "$";
        for (const Frame &f : stack_) {
            if (p.size() > 200) {
                p += "...";
                break;
            }
            if (!f.is_object) {
                p += "[" + std::to_string(f.count) + "]";
            } else if (!f.members.empty()) {
                std::string k;
                append_py_string(k, f.members.back().first);
                if (k.size() > 40) k = k.substr(0, 37) + "...";
                p += "[" + k + "]";
            }
        }
        return p;
    }
};

}  // namespace

std::string canonical_config_json(std::string_view json) {
    // Python's json.loads(str) rejects a BOM ("Unexpected UTF-8 BOM"); nlohmann skips it.
    if (json.size() >= 3 && std::memcmp(json.data(), "\xEF\xBB\xBF", 3) == 0)
        fail(KVX_ECONFIG, "config JSON: starts with a UTF-8 byte order mark, which Python's "
                          "json.loads rejects");

    std::string work(json);
    neutralize_numbers(work);

    Canonicalizer c(json);
    bool ok = nlohmann::json::sax_parse(work.begin(), work.end(), &c,
                                        nlohmann::json::input_format_t::json,
                                        /*strict=*/true, /*ignore_comments=*/false);
    if (!ok || !c.have_root)
        throw Error(KVX_ECONFIG, c.error.empty() ? "config JSON: invalid JSON" : c.error);
    if (!c.pending.empty()) throw Error(KVX_ECONFIG, c.pending);
    // Top level is an object or null (top_ok). json.loads gives None or a dict;
    // `if not config_fields` is true for None and {}.
    if (c.root == "null" || c.root == "{}") return "";
    return std::move(c.root);
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
