#include "rackhub/common/number.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace rackhub {

Result<uint64_t> ParseUnsigned(std::string_view text, uint64_t max) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return InvalidArgument(fmt::format("'{}' is not a non-negative integer", text));
  }
  if (ec == std::errc::result_out_of_range || value > max) {
    return InvalidArgument(fmt::format("'{}' is too large (at most {})", text, max));
  }
  return value;
}

Result<double> ParseDecimal(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    return InvalidArgument(fmt::format("'{}' is not a number", text));
  }
  return value;
}

}  // namespace rackhub
