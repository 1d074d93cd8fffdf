#include "rackhub/common/log_safe.h"

#include <cstdint>

namespace rackhub {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (2..4), or 0 if the
// bytes there are not one (overlong forms, surrogates, > U+10FFFF and
// truncated sequences are invalid). *cp receives the code point.
size_t Utf8Sequence(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  size_t n;
  uint32_t v;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    v = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    v = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    v = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3f);
  }
  if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10ffff)) ||
      (v >= 0xd800 && v <= 0xdfff)) {
    return 0;
  }
  *cp = v;
  return n;
}

// Code points that are valid but move, hide or break text in a log viewer.
bool Disguises(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || cp == 0x200e ||
         cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) ||
         cp == 0xfeff;
}

void AppendEscaped(uint8_t byte, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[byte >> 4]);
  out->push_back(kHex[byte & 0xf]);
}

}  // namespace

std::string SafeForLog(std::string_view text, size_t max_bytes) {
  const bool truncated = text.size() > max_bytes;
  std::string_view head = text.substr(0, max_bytes);
  std::string out;
  out.reserve(head.size() + 8);
  for (size_t i = 0; i < head.size();) {
    const auto c = static_cast<uint8_t>(head[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = c >= 0x80 ? Utf8Sequence(head, i, &cp) : 0;
    if (n == 0) {
      AppendEscaped(c, &out);
      ++i;
      continue;
    }
    if (Disguises(cp)) {
      for (size_t k = 0; k < n; ++k) AppendEscaped(static_cast<uint8_t>(head[i + k]), &out);
    } else {
      out.append(head.substr(i, n));
    }
    i += n;
  }
  if (truncated) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string QuoteForLog(std::string_view text, size_t max_bytes) {
  return "'" + SafeForLog(text, max_bytes) + "'";
}

}  // namespace rackhub
