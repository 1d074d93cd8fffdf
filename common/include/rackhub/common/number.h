// Numbers as people write them on command lines: strict parsers that take
// the whole text (no sign, no surrounding spaces, no hex or octal), for
// every rackhub program's options, and Num() to write one into a message.
// Sizes with units are in size.h.
//
// Pure functions, no state: any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rackhub/common/status.h"

namespace rackhub {

// Decimal digits only, at most `max`. INVALID_ARGUMENT otherwise; the message
// starts with the quoted text: "'many' is not a non-negative integer",
// "'5000000000' is too large (at most 4294967295)".
Result<uint64_t> ParseUnsigned(std::string_view text, uint64_t max = UINT64_MAX);

// A finite decimal number ("0.01", "1e-3", "-2"). INVALID_ARGUMENT otherwise:
// "'fast' is not a number".
Result<double> ParseDecimal(std::string_view text);

// The decimal text of a count, id or size, for messages and log lines.
inline std::string Num(uint64_t v) { return std::to_string(v); }

}  // namespace rackhub
