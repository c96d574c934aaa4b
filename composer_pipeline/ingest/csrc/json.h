// JSON for the native ingest path: strict validation while scanning, string decoding, and the
// canonical re-serialization the Python reference produces (orjson.dumps of msgspec.json.decode).
//
// Strictness rule: this scanner may reject a line the Python reference accepts (the line is then
// handed back to Python, which decides), but never accepts a line the reference rejects. It is
// RFC 8259 JSON with: no lone UTF-16 surrogate escapes, nesting deeper than kMaxDepth rejected,
// numbers checked for grammar only (msgspec skips 1e400 in keys it does not read, so must we).
// The buffer is UTF-8-validated as a whole before any line is scanned (utf8_valid).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>
#include <algorithm>
#include <charconv>
#include <system_error>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace cp {

enum class Kind : uint8_t { Absent = 0, Null, False, True, Number, String, Array, Object };

// One scanned value. Strings: p/n span the content between the quotes (escapes undecoded);
// every other kind: the value's text. ``truthy`` is Python truthiness of the decoded value.
struct JVal {
  const char* p = nullptr;
  uint32_t n = 0;
  Kind kind = Kind::Absent;
  bool esc = false;         // String: contains backslash escapes
  bool canon = true;        // String: every escape is already in orjson's form (\n, \", \u001f...)
  bool simple_int = false;  // Number: integer syntax (no fraction, no exponent)
  bool truthy = false;

  bool present() const { return kind != Kind::Absent; }
  bool is_str() const { return kind == Kind::String; }
  bool is_true() const { return kind == Kind::True; }
  bool is_none() const { return kind == Kind::Absent || kind == Kind::Null; }
};

// ---------------------------------------------------------------------------------------------
// UTF-8 validation (the same acceptance as Arrow's validator / Python's strict decode).
inline bool utf8_valid(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
#if defined(__SSE2__)
    while (i + 64 <= n) {  // ASCII fast path: 64 bytes per test
      const __m128i* q = reinterpret_cast<const __m128i*>(s + i);
      __m128i x = _mm_or_si128(_mm_or_si128(_mm_loadu_si128(q), _mm_loadu_si128(q + 1)),
                               _mm_or_si128(_mm_loadu_si128(q + 2), _mm_loadu_si128(q + 3)));
      if (_mm_movemask_epi8(x)) break;
      i += 64;
    }
    while (i + 16 <= n) {
      __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      int m = _mm_movemask_epi8(x);
      if (m) {  // straight to the first non-ASCII byte (text with scattered accents: one test per character)
        i += size_t(__builtin_ctz(unsigned(m)));
        break;
      }
      i += 16;
    }
#endif
    if (i >= n) break;
    unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else return false;
    if (i + need >= n) return false;  // truncated sequence
    unsigned char c1 = s[i + 1];
    if (c1 < lo || c1 > hi) return false;
    for (size_t k = 2; k <= need; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return false;
    i += need + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
inline int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline bool hex4(const char* p, const char* end, unsigned& out) {
  if (end - p < 4) return false;
  unsigned v = 0;
  for (int i = 0; i < 4; ++i) {
    int h = hexval(p[i]);
    if (h < 0) return false;
    v = (v << 4) | unsigned(h);
  }
  out = v;
  return true;
}

inline void put_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) out.push_back(char(cp));
  else if (cp < 0x800) { out.push_back(char(0xC0 | (cp >> 6))); out.push_back(char(0x80 | (cp & 0x3F))); }
  else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12))); out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18))); out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F))); out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Cursor over one JSON text. Every method leaves ``p`` just past what it consumed; a false return
// means "not valid JSON as far as this scanner is concerned" (the line goes back to Python).
struct Scanner {
  static constexpr int kMaxDepth = 200;

  const char* p;
  const char* end;
  int depth = 0;

  Scanner(const char* b, const char* e) : p(b), end(e) {}

  bool ws() {  // skip whitespace; false at end of input
    if (p < end && static_cast<unsigned char>(*p) > ' ') return true;  // the common case: none
    while (p < end) {
      char c = *p;
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') ++p;
      else return true;
    }
    return false;
  }

  bool expect(char c) {
    if (!ws() || *p != c) return false;
    ++p;
    return true;
  }

  // At the opening quote.
  bool string(JVal& v) {
    const char* s = ++p;
    bool esc = false, canon = true;
    for (;;) {
#if defined(__SSE2__)
      const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
      while (end - p >= 16) {
        __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                   _mm_cmpeq_epi8(_mm_max_epu8(x, ctl), ctl));  // x <= 0x1F
        int m = _mm_movemask_epi8(hit);
        if (m) { p += __builtin_ctz(unsigned(m)); break; }
        p += 16;
      }
#endif
      if (p >= end) return false;
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"') {
        v.p = s;
        v.n = uint32_t(p - s);
        v.kind = Kind::String;
        v.esc = esc;
        v.canon = canon;
        v.simple_int = false;
        v.truthy = v.n > 0;  // any escape decodes to at least one character
        ++p;
        return true;
      }
      if (c == '\\') {
        esc = true;
        if (++p >= end) return false;
        switch (*p) {
          case '"': case '\\': case 'b': case 'f': case 'n': case 'r': case 't': ++p; break;
          case '/': ++p; canon = false; break;
          case 'u': {
            unsigned u;
            if (!hex4(p + 1, end, u)) return false;
            // orjson writes \u00xx (lower-case hex) only for control characters without a short form
            if (canon && !(u < 0x20 && u != 0x08 && u != 0x09 && u != 0x0A && u != 0x0C && u != 0x0D &&
                           !(p[3] >= 'A' && p[3] <= 'F') && !(p[4] >= 'A' && p[4] <= 'F')))
              canon = false;
            p += 5;
            if (u >= 0xD800 && u <= 0xDBFF) {  // needs a low surrogate escape right after
              unsigned lo;
              if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, end, lo) || lo < 0xDC00 || lo > 0xDFFF)
                return false;
              p += 6;
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
              return false;
            }
            break;
          }
          default: return false;
        }
        continue;
      }
      if (c < 0x20) return false;
      ++p;
    }
  }

  // Grammar, plus the one value check the reference makes on every number: orjson rejects a line
  // holding a number that overflows a double (msgspec skips such a number in keys it does not read,
  // so the reference may still keep the record: such a line goes back to Python to decide).
  bool number(JVal& v) {
    const char* s = p;
    bool nonzero = false, simple = true;
    size_t int_digits = 0;
    if (*p == '-') ++p;
    if (p >= end) return false;
    if (*p == '0') {
      ++p;
      int_digits = 1;
    } else if (*p >= '1' && *p <= '9') {
      nonzero = true;
      while (p < end && *p >= '0' && *p <= '9') { ++p; ++int_digits; }
    } else {
      return false;
    }
    if (p < end && *p == '.') {
      simple = false;
      ++p;
      if (p >= end || *p < '0' || *p > '9') return false;
      while (p < end && *p >= '0' && *p <= '9') { if (*p != '0') nonzero = true; ++p; }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      simple = false;
      ++p;
      if (p < end && (*p == '+' || *p == '-')) ++p;
      if (p >= end || *p < '0' || *p > '9') return false;
      while (p < end && *p >= '0' && *p <= '9') ++p;
    }
    v.p = s;
    v.n = uint32_t(p - s);
    v.kind = Kind::Number;
    v.esc = false;
    v.simple_int = simple;
    v.truthy = nonzero;
    if ((!simple || int_digits > 18) && nonzero) {
      int r = double_range(s, p);
      if (r > 0) return false;       // overflows: orjson rejects the line
      if (r < 0) v.truthy = false;   // underflows to 0.0: falsy in Python
    }
    return true;
  }

  // 1: |x| overflows a double; -1: a non-zero literal that rounds to 0.0; 0: in range.
  static int double_range(const char* s, const char* e) {
    double d = 0;
    auto res = std::from_chars(s, e, d);
    if (res.ec == std::errc()) return d == 0.0 ? -1 : 0;
    if (res.ec != std::errc::result_out_of_range) return 0;
    // Out of range: overflow or underflow, told apart by the decimal exponent of the first
    // significant digit (digits.fraction e exp: 10^(exp + int_len - 1 - leading zeros)).
    const char* m = (*s == '-') ? s + 1 : s;
    const char* mant_end = m;
    while (mant_end < e && *mant_end != 'e' && *mant_end != 'E') ++mant_end;
    long exp = 0;
    if (mant_end < e) {
      const char* q = mant_end + 1;
      bool neg = false;
      if (*q == '+' || *q == '-') { neg = *q == '-'; ++q; }
      for (; q < e; ++q)
        if (exp < 100000000) exp = exp * 10 + (*q - '0');
      if (neg) exp = -exp;
    }
    const char* dot = static_cast<const char*>(std::memchr(m, '.', size_t(mant_end - m)));
    long int_len = long((dot ? dot : mant_end) - m);
    long zeros = 0;  // leading zero digits (the point skipped)
    for (const char* t = m; t < mant_end; ++t) {
      if (*t == '.') continue;
      if (*t != '0') return exp + int_len - 1 - zeros >= 0 ? 1 : -1;
      ++zeros;
    }
    return -1;  // all zeros (not reached: callers pass non-zero literals)
  }

  bool literal(const char* lit, size_t n, Kind k, JVal& v) {
    if (size_t(end - p) < n || std::memcmp(p, lit, n) != 0) return false;
    v.p = p;
    v.n = uint32_t(n);
    v.kind = k;
    v.esc = false;
    v.simple_int = false;
    v.truthy = (k == Kind::True);
    p += n;
    return true;
  }

  // Any value (containers validated and skipped); ws already skipped.
  bool value(JVal& v) {
    if (p >= end) return false;
    switch (*p) {
      case '"': return string(v);
      case '{': case '[': {
        const char* s = p;
        bool nonempty;
        if (!container(nonempty)) return false;
        v.p = s;
        v.n = uint32_t(p - s);
        v.kind = (*s == '{') ? Kind::Object : Kind::Array;
        v.esc = false;
        v.simple_int = false;
        v.truthy = nonempty;
        return true;
      }
      case 't': return literal("true", 4, Kind::True, v);
      case 'f': return literal("false", 5, Kind::False, v);
      case 'n': return literal("null", 4, Kind::Null, v);
      default: return number(v);
    }
  }

  // Object/array iteration. ``members(f)`` at '{' calls ``f(key)`` with the cursor at each member's
  // value; ``elements(f)`` at '[' calls ``f()`` at each element. ``f`` consumes the value and returns
  // false when it is invalid; both return false on invalid JSON.
  template <class F>
  bool members(F&& f) {
    if (!begin('{')) return false;
    bool first = true;
    JVal key;
    for (;;) {
      int r = next('}', first);
      if (r <= 0) return r == 0;
      if (*p != '"' || !string(key) || !expect(':') || !ws() || !f(key)) return false;
    }
  }
  template <class F>
  bool elements(F&& f) {
    if (!begin('[')) return false;
    bool first = true;
    for (;;) {
      int r = next(']', first);
      if (r <= 0) return r == 0;
      if (!f()) return false;
    }
  }

  // A container skipped (validated); ``nonempty``: it has an item.
  bool container(bool& nonempty) {
    nonempty = false;
    JVal item;
    auto skip = [&](auto&&...) {
      nonempty = true;
      return value(item);
    };
    return *p == '{' ? members(skip) : elements(skip);
  }

 private:
  bool begin(char open) {
    if (p >= end || *p != open) return false;
    if (++depth > kMaxDepth) return false;
    ++p;
    return true;
  }
  // 0: the container closed; 1: the cursor at the next item (after a ',' but the first); -1: invalid.
  int next(char close, bool& first) {
    if (!ws()) return -1;
    if (*p == close) {
      ++p;
      --depth;
      return 0;
    }
    if (!first) {
      if (*p != ',') return -1;
      ++p;
      if (!ws()) return -1;
    }
    first = false;
    return 1;
  }
};

// ---------------------------------------------------------------------------------------------
// Decoding. ``v`` must be a validated String.
inline void decode_string(const JVal& v, std::string& out) {
  const char* p = v.p;
  const char* e = v.p + v.n;
  if (!v.esc) { out.append(p, v.n); return; }
  while (p < e) {
    const char* bs = static_cast<const char*>(std::memchr(p, '\\', size_t(e - p)));
    if (!bs) { out.append(p, size_t(e - p)); break; }
    out.append(p, size_t(bs - p));
    p = bs + 1;
    char c = *p++;
    switch (c) {
      case '"': out.push_back('"'); break;
      case '\\': out.push_back('\\'); break;
      case '/': out.push_back('/'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        unsigned u = 0, lo = 0;
        hex4(p, e, u);
        p += 4;
        if (u >= 0xD800 && u <= 0xDBFF) {
          hex4(p + 2, e, lo);
          p += 6;
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        put_utf8(out, u);
        break;
      }
      default: break;  // unreachable: validated
    }
  }
}

inline std::string decoded(const JVal& v) {
  std::string s;
  decode_string(v, s);
  return s;
}

// First byte in [p, e) that JSON must escape ('"', '\\' or a control byte), or e.
inline const char* find_escape(const char* p, const char* e) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\'), ctl = _mm_set1_epi8(0x1F);
  while (e - p >= 16) {
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                               _mm_cmpeq_epi8(_mm_max_epu8(x, ctl), ctl));
    int m = _mm_movemask_epi8(hit);
    if (m) return p + __builtin_ctz(unsigned(m));
    p += 16;
  }
#endif
  for (; p < e; ++p) {
    unsigned char c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c == '"' || c == '\\') return p;
  }
  return e;
}

// orjson's escaping of a decoded UTF-8 string, quotes included.
inline void write_json_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out.push_back('"');
  const char* p = s.data();
  const char* e = p + s.size();
  for (;;) {
    const char* q = find_escape(p, e);
    out.append(p, size_t(q - p));
    if (q == e) break;
    unsigned char c = static_cast<unsigned char>(*q);
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\b': out.append("\\b"); break;
      case '\f': out.append("\\f"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default: {
        char buf[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        out.append(buf, 6);
      }
    }
    p = q + 1;
  }
  out.push_back('"');
}

// A String JVal re-serialized as orjson would (decode, then escape). Without escapes the raw
// content already is that output: valid JSON content holds no quote, backslash or control byte.
inline void write_json_string(std::string& out, const JVal& v) {
  if (v.canon) {
    out.push_back('"');
    out.append(v.p, v.n);
    out.push_back('"');
    return;
  }
  write_json_string(out, std::string_view(decoded(v)));
}

// Canonical JSON of a validated value: what ``orjson.dumps(msgspec.json.decode(text))`` gives.
// Returns false where only Python can say (floats, integers beyond 64 bits, duplicate keys); the
// caller then asks Python for that one value.
struct Canon {
  std::string& out;
  explicit Canon(std::string& o) : out(o) {}

  bool value(Scanner& s) {
    if (!s.ws()) return false;
    char c = *s.p;
    if (c == '"') {
      JVal v;
      if (!s.string(v)) return false;
      write_json_string(out, v);
      return true;
    }
    if (c == '{') return object(s);
    if (c == '[') return array(s);
    JVal v;
    if (!s.value(v)) return false;
    if (v.kind == Kind::Number) return integer(v);
    out.append(v.p, v.n);  // true / false / null
    return true;
  }

  bool integer(const JVal& v) {
    if (!v.simple_int) return false;
    const char* p = v.p;
    size_t n = v.n;
    bool neg = p[0] == '-';
    size_t digits = n - (neg ? 1 : 0);
    // orjson writes [-2^63, 2^64 - 1]: compare the digits (no leading zeros in JSON) with the bound's
    const std::string_view bound = neg ? "9223372036854775808" : "18446744073709551615";
    std::string_view d(p + (neg ? 1 : 0), digits);
    if (d.size() > bound.size() || (d.size() == bound.size() && d > bound)) return false;
    if (neg && digits == 1 && p[1] == '0') { out.push_back('0'); return true; }  // -0 -> 0
    out.append(p, n);
    return true;
  }

  bool array(Scanner& s) {
    out.push_back('[');
    bool any = false;
    if (!s.elements([&] {
          if (any) out.push_back(',');
          any = true;
          return value(s);
        }))
      return false;
    out.push_back(']');
    return true;
  }

  bool object(Scanner& s) {
    out.push_back('{');
    std::string_view small[16];
    std::vector<std::string_view> many;
    size_t n = 0;
    bool ok = s.members([&](const JVal& k) {
      if (k.esc) return false;  // an escaped key (rare): Python checks it for repeats
      if (n) out.push_back(',');
      write_json_string(out, k);
      std::string_view key(k.p, k.n);
      if (n < 16) small[n] = key;
      else many.push_back(key);
      ++n;
      out.push_back(':');
      return value(s);
    });
    if (!ok) return false;
    out.push_back('}');
    if (n > 1) {  // a repeated key: Python keeps the first position and the last value
      if (n <= 16) {
        std::sort(small, small + n);
        if (std::adjacent_find(small, small + n) != small + n) return false;
      } else {
        many.insert(many.end(), small, small + 16);
        std::sort(many.begin(), many.end());
        if (std::adjacent_find(many.begin(), many.end()) != many.end()) return false;
      }
    }
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Python ``str`` semantics on UTF-8 text.

// str.isspace() / str.strip() whitespace (checked against every code point in the tests).
inline bool py_space(unsigned cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Decode the code point at s[i] (valid UTF-8), set len.
inline unsigned cp_at(std::string_view s, size_t i, size_t& len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) { len = 1; return c; }
  if (c < 0xE0) { len = 2; return ((c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
  if (c < 0xF0) { len = 3; return ((c & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); }
  len = 4;
  return ((c & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

// Length of the code point that ends at s[j-1].
inline size_t cp_back(std::string_view s, size_t j) {
  size_t k = j - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return j - k;
}

inline std::string_view py_strip(std::string_view s) {
  size_t i = 0, j = s.size();
  while (i < j) {
    size_t len;
    unsigned cp = cp_at(s, i, len);
    if (!py_space(cp)) break;
    i += len;
  }
  while (j > i) {
    size_t len = cp_back(s, j);
    size_t l2;
    unsigned cp = cp_at(s, j - len, l2);
    if (!py_space(cp)) break;
    j -= len;
  }
  return s.substr(i, j - i);
}

inline bool py_isspace(std::string_view s) {  // non-empty and all whitespace
  if (s.empty()) return false;
  return py_strip(s).empty();
}

// s[:n] in code points.
inline std::string_view py_prefix(std::string_view s, size_t n) {
  size_t i = 0;
  while (n > 0 && i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    --n;
  }
  return s.substr(0, i);
}

// ``"error" in s.lower()``: no non-ASCII code point lower-cases to a string holding 'e', 'r' or
// 'o' (checked over every code point in the tests), so ASCII case folding gives the same answer.
inline bool contains_error_ci(std::string_view s) {
  static const char* w = "error";
  if (s.size() < 5) return false;
  for (size_t i = 0; i + 5 <= s.size(); ++i) {
    size_t k = 0;
    while (k < 5) {
      char c = s[i + k];
      if (c >= 'A' && c <= 'Z') c = char(c + 32);
      if (c != w[k]) break;
      ++k;
    }
    if (k == 5) return true;
  }
  return false;
}

}  // namespace cp
