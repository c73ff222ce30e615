#!/usr/bin/python3
"""Generate the config-fingerprint conformance corpus.

Each case is a JSON text (bytes) and the result vLLM's Python gives for it:

    config_fields = json.loads(text)
    if not config_fields: return ""
    canonical = json.dumps(config_fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]

plus kvxfer's documented rejections (see src/core/fingerprint.h): texts that
Python cannot load, and the inputs kvxfer refuses instead of hashing (a top
level that is not an object or null, NaN/Infinity literals, lone surrogates,
nesting deeper than 256) are expected to fail with KVX_ECONFIG.

The corpus is deterministic (seeded). check_corpus.py builds it in memory
(make_cases()); this script writes it to a file as JSON lines, for
inspection or for check_corpus.py --corpus:
    {"id": N, "cat": "...", "b64": <base64 of the text bytes>,
     "expect": "<16 hex>" | "" | "ERROR", "why": <reason for ERROR>}

Usage: gen_corpus.py [--seed S] [--count N] [--out PATH]   (default PATH:
fingerprint_corpus.jsonl in the current directory). Needs CPython >= 3.11 (the
4300-digit integer limit); standard library only.
"""

import argparse
import base64
import decimal
import hashlib
import json
import math
import random
import struct
import sys

MAX_DEPTH = 256          # kvx::kMaxConfigDepth
ECONFIG = "ERROR"

# --------------------------------------------------------------- reference


def _reject_constant(name):
    raise ValueError("non-standard literal %s (kvxfer rejects it)" % name)


def reference(text):
    """(expect, why) for the text bytes: expect is 16 hex, "" or ERROR."""
    if b"\x00" in text:
        raise AssertionError("corpus texts are C strings: no NUL bytes")
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as e:
        return ECONFIG, "invalid UTF-8: %s" % e
    try:
        fields = json.loads(s, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        return ECONFIG, "json.loads: %s" % str(e)[:200]
    if fields is None:
        return "", ""
    if not isinstance(fields, dict):
        return ECONFIG, "top level is %s, not an object" % type(fields).__name__
    # Depth and lone surrogates apply to the whole text, including values that
    # a later duplicate key discards: walk a parse that keeps every pair
    # (objects become lists of (key, value) tuples), iteratively.
    full = json.loads(s, parse_constant=_reject_constant, object_pairs_hook=list)
    stack = [(full, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, list):
            if d > MAX_DEPTH:
                return ECONFIG, "nesting deeper than %d" % MAX_DEPTH
            for x in v:
                if isinstance(x, tuple):
                    if _has_surrogate(x[0]):
                        return ECONFIG, "lone surrogate in a key"
                    x = x[1]
                stack.append((x, d + 1))
        elif isinstance(v, str) and _has_surrogate(v):
            return ECONFIG, "lone surrogate in a string"
    if not fields:
        return "", ""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16], ""


def _has_surrogate(s):
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


# --------------------------------------------------------------- random text


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    # ----- whitespace
    def ws(self):
        r = self.r.random()
        if r < 0.55:
            return ""
        if r < 0.8:
            return " "
        return "".join(self.r.choice(" \t\n\r") for _ in range(self.r.randint(1, 4)))

    # ----- characters and strings
    def char(self):
        r = self.r.random()
        if r < 0.45:
            return chr(self.r.randint(0x20, 0x7E))
        if r < 0.52:
            return chr(self.r.randint(0x00, 0x1F))
        if r < 0.56:
            return chr(self.r.randint(0x7F, 0x9F))
        if r < 0.62:
            return self.r.choice('"\\/\b\f\n\r\t')
        if r < 0.70:
            return chr(self.r.randint(0xA0, 0xFF))
        if r < 0.80:
            return chr(self.r.randint(0x100, 0xD7FF))
        if r < 0.86:
            return chr(self.r.randint(0xE000, 0xFFFF))
        if r < 0.88:
            return self.r.choice("\u2028\u2029\ufeff\ufffe\uffff\u0800\u07ff")
        return chr(self.r.randint(0x10000, 0x10FFFF))

    def pystr(self, maxlen=12):
        return "".join(self.char() for _ in range(self.r.randint(0, maxlen)))

    def hex4(self, v):
        h = "%04x" % v
        if self.r.random() < 0.3:
            h = "".join(c.upper() if self.r.random() < 0.5 else c for c in h)
        return "\\u" + h

    def quote(self, s):
        """JSON string literal for s with randomly chosen escape spellings."""
        out = ['"']
        short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n",
                 "\r": "\\r", "\t": "\\t"}
        for c in s:
            o = ord(c)
            r = self.r.random()
            if c in short:
                out.append(short[c] if r < 0.7 else self.hex4(o))
            elif o < 0x20:
                out.append(self.hex4(o))
            elif c == "/":
                out.append("/" if r < 0.6 else ("\\/" if r < 0.85 else self.hex4(o)))
            elif o >= 0x10000:
                if r < 0.6:
                    out.append(c)
                else:
                    v = o - 0x10000
                    out.append(self.hex4(0xD800 | (v >> 10)) + self.hex4(0xDC00 | (v & 0x3FF)))
            else:
                out.append(c if r < 0.75 else self.hex4(o))
        out.append('"')
        return "".join(out)

    # ----- numbers (as JSON texts)
    def digits(self, n, lead_nonzero=True):
        d = [str(self.r.randint(0, 9)) for _ in range(n)]
        if lead_nonzero and n:
            d[0] = str(self.r.randint(1, 9))
        return "".join(d)

    def int_text(self):
        r = self.r.random()
        sign = "-" if self.r.random() < 0.4 else ""
        if r < 0.35:
            return sign + str(self.r.randint(0, 1000))
        if r < 0.45:
            return self.r.choice(["0", "-0", "1", "-1"])
        if r < 0.6:
            e = self.r.choice([2**31, 2**32, 2**53, 2**63, 2**64, 10**18, 10**19, 10**20])
            return str(self.r.choice([-1, 1]) * (e + self.r.randint(-2, 2)))
        if r < 0.9:
            return sign + self.digits(self.r.randint(1, 40))
        if r < 0.997:
            return sign + self.digits(self.r.randint(40, 400 if r < 0.95 else 1000))
        return sign + self.digits(self.r.randint(4290, 4300))

    def exp_text(self):
        e = self.r.choice("eE") + self.r.choice(["", "+", "-"])
        r = self.r.random()
        if r < 0.4:
            v = self.r.randint(0, 25)
        elif r < 0.7:
            v = self.r.randint(0, 400)
        elif r < 0.9:
            v = self.r.randint(280, 345)
        else:
            v = self.r.randint(0, 10**self.r.randint(3, 25))
        s = str(v)
        if self.r.random() < 0.1:
            s = "0" * self.r.randint(1, 3) + s
        return e + s

    def random_double(self):
        r = self.r.random()
        if r < 0.5:
            bits = self.r.getrandbits(64)
        elif r < 0.7:  # subnormal or tiny
            bits = (self.r.getrandbits(1) << 63) | self.r.getrandbits(52 if r < 0.6 else 56)
        else:  # "normal-looking" magnitudes
            return self.r.choice([-1, 1]) * self.r.random() * 10 ** self.r.randint(-30, 30)
        d = struct.unpack("<d", struct.pack("<Q", bits))[0]
        if math.isnan(d) or math.isinf(d):
            return 1.5
        return d

    def halfway(self):
        """Decimal text at (or next to) the midpoint of two adjacent doubles."""
        d = abs(self.random_double())
        if d == 0.0 or d >= sys.float_info.max:
            d = 1.0
        n = math.nextafter(d, math.inf)
        with decimal.localcontext() as ctx:
            ctx.prec = 1200
            mid = (decimal.Decimal(d) + decimal.Decimal(n)) / 2
            s = format(mid, "e")  # exact: e.g. "1.2345e-10"
        mant, exp = s.split("e")
        if self.r.random() < 0.4:
            # Nudge the last digit: just below / above the tie.
            last = int(mant[-1])
            if last in (0, 9):
                mant = mant + self.r.choice("19")
            else:
                mant = mant[:-1] + str(last + self.r.choice([-1, 1]))
        sign = "-" if self.r.random() < 0.3 else ""
        return sign + mant + "e" + str(int(exp))

    def float_text(self):
        r = self.r.random()
        if r < 0.25:
            d = self.random_double()
            form = self.r.random()
            if form < 0.5:
                return repr(d)
            if form < 0.75:
                return "%.17e" % d
            return "%.*e" % (self.r.randint(0, 30), d)
        if r < 0.35:
            return self.halfway()
        if r < 0.5:
            return self.r.choice([
                "0.0", "-0.0", "1.0", "-1.0", "0.1", "0.5", "1e16", "1e15", "1e-5", "1e-4",
                "0.0001", "0.00001", "1E16", "9999999999999998.0", "9999999999999999.0",
                "1e22", "1e23", "5e-324", "2.5e-324", "2.4703282292062327e-324",
                "2.4703282292062328e-324", "4.9406564584124654e-324",
                "2.2250738585072014e-308", "2.2250738585072011e-308",
                "1.7976931348623157e308", "1.7976931348623158e308",
                "1.7976931348623159e308", "1e308", "1e309", "-1e309", "1e400", "-1e400",
                "1e-400", "-1e-400", "123456789012345678.0", "0.30000000000000004",
                "100000000000000000000.0", "1.5e300", "-1.5e-300", "1e+16", "1e-07",
                "1234567890123456.7", "12345678901234567.0", "0e0", "-0e0", "0E+999999",
                "-0.0e-99999", "1e-99999999999999999999", "1e99999999999999999999"])
        # Constructed: int part, optional fraction, optional exponent.
        i = "0" if self.r.random() < 0.3 else self.digits(self.r.randint(1, 20 if self.r.random() < 0.95 else 400))
        frac = ""
        if self.r.random() < 0.7:
            frac = "." + self.digits(self.r.randint(1, 25 if self.r.random() < 0.95 else 800), False)
        exp = ""
        if not frac or self.r.random() < 0.5:
            exp = self.exp_text()
        sign = "-" if self.r.random() < 0.4 else ""
        return sign + i + frac + exp

    # ----- values
    def key(self, used):
        r = self.r.random()
        if used and r < 0.12:  # duplicate key (maybe spelled differently)
            return self.r.choice(used)
        if r < 0.5:
            return "".join(self.r.choice("abcdefg_") for _ in range(self.r.randint(0, 6)))
        if r < 0.6:  # keys that sort differently in UTF-16 vs code point order
            return self.r.choice(["\uffff", "\U00010000", "\ue000", "\U0010ffff", "\ud7ff",
                                  "a\uffff", "a\U0001f600", "", "A", "a", "aa", "a\x00", "a\x7f"])
        return self.pystr(8)

    def value(self, depth, budget):
        r = self.r.random()
        if depth < 7 and budget[0] > 0 and r < 0.3:
            return self.obj(depth + 1, budget)
        if depth < 7 and budget[0] > 0 and r < 0.42:
            return self.arr(depth + 1, budget)
        r = self.r.random()
        if r < 0.22:
            return self.quote(self.pystr())
        if r < 0.44:
            return self.int_text()
        if r < 0.8:
            return self.float_text()
        return self.r.choice(["true", "false", "null"])

    def obj(self, depth, budget):
        budget[0] -= 1
        n = self.r.choice([0, 1, 2, 3, 4, 5, 6, 8]) if depth > 1 else self.r.randint(1, 8)
        wide = self.r.random() < 0.04  # many members, many duplicate keys (sort stability)
        if wide:
            n = self.r.randint(17, 60)
        used, parts = [], []
        for _ in range(n):
            k = self.key(used) if not wide else "".join(self.r.choice("ab\u00e9") for _ in range(self.r.randint(0, 2)))
            used.append(k)
            parts.append(self.ws() + self.quote(k) + self.ws() + ":" + self.ws() +
                         self.value(7 if wide else depth, budget) + self.ws())
        return "{" + ",".join(parts) + (self.ws() if not parts else "") + "}"

    def arr(self, depth, budget):
        budget[0] -= 1
        n = self.r.choice([0, 1, 2, 3, 5, 8])
        parts = [self.ws() + self.value(depth, budget) + self.ws() for _ in range(n)]
        return "[" + ",".join(parts) + (self.ws() if not parts else "") + "]"

    def config(self):
        return self.ws() + self.obj(1, [self.r.randint(2, 16)]) + self.ws()

    def deep(self, total_depth):
        """An object nested total_depth levels (top-level object counts as 1)."""
        kinds = [self.r.choice("oa") for _ in range(total_depth - 1)]
        s, close = "{", ["}"]
        s += self.quote("k") + ":"
        for k in kinds:
            if k == "o":
                s += "{" + self.quote(self.r.choice(["x", "y", ""])) + ":"
                close.append("}")
            else:
                s += "[" + ("1," if self.r.random() < 0.5 else "")
                close.append("]")
        s += self.r.choice(["1", "1.5", '"s"', "null", "-0.0", "1e400"])
        return s + "".join(reversed(close))

    # ----- invalid / rejected
    def mutate(self, b):
        b = bytearray(b)
        op = self.r.random()
        if not b:
            return bytes(b"{")
        p = self.r.randrange(len(b))
        if op < 0.3:
            del b[p:]
        elif op < 0.55:
            del b[p]
        elif op < 0.8:
            b[p:p] = self.r.choice([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b" ", b"0",
                                    b"-", b"e", b".", b"1", b"t", b"n", b"\x01", b"\xff",
                                    b"\xc3", b"NaN", b"Infinity", b"-Infinity", b"01"])
        else:
            b[p] = self.r.choice(b'{}[],:"\\ 0123456789-+.eEtfn\x1f\x7f\x80\xbf\xc0\xed\xf5')
        return bytes(b)

    def rejected(self):
        c = self.r.randrange(14)
        if c == 0:
            return self.r.choice(["[]", "[1,2]", '"str"', "0", "1.5", "true", "false", '""',
                                  " [ {} ] ", "12345678901234567890123"])
        if c == 1:
            lit = self.r.choice(["NaN", "Infinity", "-Infinity"])
            return '{"a":%s}' % lit if self.r.random() < 0.7 else '{"a":[1,%s]}' % lit
        if c == 2:  # lone surrogates
            hi = self.hex4(self.r.randint(0xD800, 0xDBFF))
            lo = self.hex4(self.r.randint(0xDC00, 0xDFFF))
            return '{"a":"%s"}' % self.r.choice([hi, lo, hi + "x", lo + hi, hi + hi, "x" + lo])
        if c == 3:
            return self.deep(MAX_DEPTH + self.r.randint(1, 40))
        if c == 4:
            return "\ufeff" + self.config()
        if c == 5:
            return '{"a":%s%s}' % (self.r.choice(["", "-"]), self.digits(self.r.randint(4301, 4400)))
        if c == 6:
            return '{"a":"x%sy"}' % chr(self.r.randint(0x01, 0x1F))
        if c == 7:
            return self.config() + self.r.choice(["x", "{}", "1", ",", "]", "null"])
        if c == 8:
            return self.r.choice(["", " ", "\n", "nul", "{", "}", '{"a"}', '{"a":}', '{,}',
                                  '{"a":1,}', '[1,]', "{'a':1}", '{"a":01}', '{"a":1.}',
                                  '{"a":.5}', '{"a":+1}', '{"a":1e}', '{"a":0x10}',
                                  '{"a":"\\x41"}', '{"a":"\\u12"}', '{a:1}', '{"a":True}',
                                  '{"a":1 2}', '{"a":1-2}', '{"a":--1}', '{"a":1e5.5}',
                                  '{"a":[1-2]}', '{"a":-}', '{"a":1}/*c*/', '//c\n{"a":1}',
                                  '{"a":"\\ud800\\u0041"}', '{"a":"\\udc00\\ud800"}'])
        if c == 9:
            return self.deep(self.r.randint(MAX_DEPTH - 3, MAX_DEPTH))  # accepted
        if c == 10:  # the rejection also covers values a duplicate key discards
            hi = self.hex4(self.r.randint(0xD800, 0xDBFF))
            return '{"a":"%s","a":1}' % hi if self.r.random() < 0.5 else \
                '{"a":%s,"a":1}' % self.deep(MAX_DEPTH + 1)
        return None  # caller falls back to a mutation


def make_cases(seed, count):
    g = Gen(seed)
    texts = []
    for text in FIXED:
        texts.append(("fixed", text.encode("utf-8") if isinstance(text, str) else text))
    while len(texts) < count:
        r = g.r.random()
        if r < 0.75:
            texts.append(("random", g.config().encode("utf-8")))
        elif r < 0.88:
            base = g.config().encode("utf-8")
            for _ in range(g.r.randint(1, 2)):
                base = g.mutate(base)
            texts.append(("mutated", base.replace(b"\x00", b" ")))
        else:
            t = g.rejected()
            if t is None:
                t = g.mutate(g.config().encode("utf-8")).replace(b"\x00", b" ")
                texts.append(("mutated", t))
            else:
                texts.append(("edge", t.encode("utf-8", "surrogatepass")))
    cases = []
    for i, (cat, b) in enumerate(texts):
        expect, why = reference(b)
        cases.append({"id": i, "cat": cat, "b64": base64.b64encode(b).decode("ascii"),
                      "expect": expect, "why": why})
    return cases


# Hand-written cases, always first in the corpus.
FIXED = [
    "null", " null ", "{}", " { } ", "\t{\n}\r\n", '{"a":1}', '{"b":1,"a":2}',
    '{"a":{"c":[1,2,{"z":null,"y":true}],"b":false},"A":[]}',
    '{"a":1,"a":2}', '{"a":{"x":1},"a":[3]}', '{"a":1,"\\u0061":2}',
    '{"k":"\\u00e9\\u00E9é\\ud83d\\ude00😀\\/\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001F\\u007f"}',
    '{"\\uffff":1,"\\ud800\\udc00":2,"\\ue000":3}',
    '{"i":[0,-0,1,-1,9223372036854775807,9223372036854775808,-9223372036854775808,'
    '-9223372036854775809,18446744073709551615,18446744073709551616,'
    '123456789012345678901234567890,-123456789012345678901234567890]}',
    '{"f":[0.1,1e16,1e-5,-0.0,1.0,1e400,-1e400,1e-400,1E5,0.0001,1e15,5e-324,1.5e300]}',
    '{"f":[0.0,1e0,1.5E+2,2.5e-0,100.0,1e2,0.5e1]}',
    '{"model":"meta-llama/Llama-3.1-8B","dtype":"bfloat16","tensor_parallel_size":2,'
    '"block_size":16,"num_layers":32,"kv_heads":8,"head_dim":128,"rope_theta":500000.0}',
    '{"empty_obj":{},"empty_arr":[],"nested":[[[]],[{}]]}',
    '{"big":' + "9" * 4300 + "}", '{"big":-' + "1" * 4300 + "}",
    '{"s":"\u2028\u2029\ufeff"}',
]


def require_python():
    if sys.version_info < (3, 11):
        sys.exit("gen_corpus.py: needs CPython >= 3.11 (its json/int behaviour is the "
                 "reference), this is %s" % sys.version.split()[0])


SEED = 20240611
COUNT = 3000


def main():
    require_python()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--count", type=int, default=COUNT)
    ap.add_argument("--out", default="fingerprint_corpus.jsonl")
    a = ap.parse_args()
    cases = make_cases(a.seed, a.count)
    with open(a.out, "w", encoding="ascii") as f:
        f.write(json.dumps({"generator": "gen_corpus.py", "seed": a.seed, "count": a.count,
                            "python": sys.version.split()[0]}) + "\n")
        for c in cases:
            f.write(json.dumps(c) + "\n")
    n_err = sum(c["expect"] == ECONFIG for c in cases)
    n_empty = sum(c["expect"] == "" for c in cases)
    print("%s: %d cases (%d hashed, %d empty, %d ECONFIG)" %
          (a.out, len(cases), len(cases) - n_err - n_empty, n_empty, n_err))


if __name__ == "__main__":
    main()
