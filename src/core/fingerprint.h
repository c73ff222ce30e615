// Config fingerprint, byte-compatible with vLLM's Python:
//
//     config_fields = json.loads(config_json_text)
//     if not config_fields: return ""
//     canonical = json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
//     return hashlib.sha256(canonical.encode()).hexdigest()[:16]
//
// (CPython 3.11, json.dumps defaults: ensure_ascii=True, allow_nan=True.)
//
// What is reproduced exactly: key sorting by code point (recursively),
// duplicate keys (the last value wins), ensure_ascii escaping (lowercase
// \uXXXX, surrogate pairs for astral characters, 0x7f escaped, '/' not),
// integers of any size up to Python's 4300-digit limit ("-0" -> "0"), floats
// as Python's repr (shortest round-trip digits; exponent form iff the decimal
// exponent is < -4 or >= 16; "1.0", "-0.0", "1e-05", "1e+16"), numbers that
// overflow a double as Infinity / -Infinity, underflow as 0.0 / -0.0.
//
// Inputs Python accepts but that are rejected here with KVX_ECONFIG instead of
// producing a hash (never a silently different hash):
//  - a top level that is not an object or null (Python would hash a
//    non-empty list/str/number and return "" for [], "", 0, false);
//  - the non-standard literals NaN, Infinity, -Infinity;
//  - \u escapes that leave a lone surrogate ("\ud800");
//  - nesting deeper than kMaxConfigDepth (Python allows ~1000);
//  - (also rejected by Python) integers over 4300 digits, a leading UTF-8
//    BOM, invalid UTF-8, raw control characters in strings, trailing data.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvx {

// Deepest accepted nesting of arrays/objects (the top-level object is 1).
inline constexpr std::size_t kMaxConfigDepth = 256;

// Python-canonical JSON text (see above) of the JSON object text `json`.
// Returns "" for an empty object or "null" (surrounding whitespace allowed).
// Throws kvx::Error(KVX_ECONFIG, message saying where and what) for invalid
// JSON, a top level that is not an object/null, or anything Python would not
// produce identically. May throw std::bad_alloc.
std::string canonical_config_json(std::string_view json);

// "" for nullptr, "null" or "{}" (surrounding whitespace allowed), else the
// first 16 lowercase hex digits of sha256(canonical_config_json(json)).
// Throws like canonical_config_json().
std::string config_fingerprint(const char *json_or_null);

}  // namespace kvx
