// Byte sizes as people write them, the one size syntax of every rackhub
// config file and command line: "32768", "100B", "32K", "32KiB", "4 GiB".
//
// Pure functions, no state: any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rackhub/common/status.h"

namespace rackhub {

// Digits, then optionally spaces and one unit (case-sensitive): B, K or KiB,
// M or MiB, G or GiB, T or TiB, all powers of 1024. No sign, no fraction, no
// leading space. INVALID_ARGUMENT on anything else or on overflow of 64 bits;
// the message starts with the quoted text (the caller adds the field name).
Result<uint64_t> ParseSize(std::string_view text);

// The largest unit that keeps the value >= 1, one decimal when it is not
// whole: "100 B", "32 KiB", "1.5 GiB". ParseSize accepts the whole-valued
// forms ("32 KiB").
std::string FormatSize(uint64_t bytes);

}  // namespace rackhub
