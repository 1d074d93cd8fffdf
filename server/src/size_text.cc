#include "size_text.h"

#include <cctype>
#include <charconv>
#include <cstdio>

namespace rackhub::server {

bool ParseSize(const std::string& text, uint64_t* out, std::string* error) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  uint64_t n = 0;
  if (i == 0 || std::from_chars(text.data(), text.data() + i, n).ec != std::errc()) {
    *error = "'" + text + "' is not a size (e.g. 32768, 32KiB, 4GiB)";
    return false;
  }
  std::string suffix = text.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.erase(0, 1);
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GiB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TiB") {
    shift = 40;
  } else {
    *error = "'" + text + "' has an unknown unit '" + suffix + "' (use B, KiB, MiB, GiB, TiB)";
    return false;
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) {
    *error = "'" + text + "' is too large";
    return false;
  }
  *out = n << shift;
  return true;
}

std::string FormatSize(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v == static_cast<double>(static_cast<uint64_t>(v))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace rackhub::server
