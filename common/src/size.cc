#include "rackhub/common/size.h"

#include <fmt/format.h>

#include <charconv>

namespace rackhub {

Result<uint64_t> ParseSize(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t n = 0;
  if (digits == 0) {
    return InvalidArgument(fmt::format("'{}' is not a size (e.g. 32768, 32KiB, 4GiB)", text));
  }
  if (std::from_chars(text.data(), text.data() + digits, n).ec != std::errc()) {
    return InvalidArgument(fmt::format("'{}' is too large", text));
  }
  std::string_view suffix = text.substr(digits);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
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
    return InvalidArgument(fmt::format(
        "'{}' has an unknown unit '{}' (use B, K, KiB, M, MiB, G, GiB, T or TiB)", text, suffix));
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) {
    return InvalidArgument(fmt::format("'{}' is too large", text));
  }
  return n << shift;
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u == 0 || v == static_cast<double>(static_cast<uint64_t>(v))) {
    return fmt::format("{:.0f} {}", v, kUnits[u]);
  }
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

}  // namespace rackhub
