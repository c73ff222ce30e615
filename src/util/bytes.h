// Little-endian fixed-width encoding helpers for the wire formats.
// Reader never reads past its end: every get checks the remaining length and
// throws Error(code) naming the field, so parsers of remote bytes stay bounded.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "util/error.h"

namespace kvx {

inline void put_le(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

class Writer {
public:
    void u8(uint8_t v) { buf_.push_back(v); }
    void u16(uint16_t v) { put(v, 2); }
    void u32(uint32_t v) { put(v, 4); }
    void u64(uint64_t v) { put(v, 8); }
    void bytes(const void *p, size_t n) {
        const auto *b = static_cast<const uint8_t *>(p);
        buf_.insert(buf_.end(), b, b + n);
    }
    size_t size() const { return buf_.size(); }
    void patch_u32(size_t at, uint32_t v) { put_le(buf_.data() + at, v, 4); }
    std::vector<uint8_t> &buf() { return buf_; }

private:
    void put(uint64_t v, size_t n) {
        size_t at = buf_.size();
        buf_.resize(at + n);
        put_le(buf_.data() + at, v, n);
    }
    std::vector<uint8_t> buf_;
};

class Reader {
public:
    Reader(const uint8_t *p, size_t n, int code, const char *what)
        : p_(p), n_(n), code_(code), what_(what) {}
    uint8_t u8(const char *field) { return static_cast<uint8_t>(get(1, field)); }
    uint16_t u16(const char *field) { return static_cast<uint16_t>(get(2, field)); }
    uint32_t u32(const char *field) { return static_cast<uint32_t>(get(4, field)); }
    uint64_t u64(const char *field) { return get(8, field); }
    const uint8_t *bytes(size_t n, const char *field) {
        need(n, field);
        const uint8_t *r = p_ + off_;
        off_ += n;
        return r;
    }
    size_t remaining() const { return n_ - off_; }
    size_t offset() const { return off_; }

private:
    void need(size_t n, const char *field) {
        if (n > n_ - off_)
            fail(code_, "%s truncated: field '%s' needs %zu bytes at offset %zu, %zu left", what_,
                 field, n, off_, n_ - off_);
    }
    uint64_t get(size_t n, const char *field) {
        need(n, field);
        uint64_t v = get_le(p_ + off_, n);
        off_ += n;
        return v;
    }
    const uint8_t *p_;
    size_t n_;
    size_t off_ = 0;
    int code_;
    const char *what_;
};

}  // namespace kvx
