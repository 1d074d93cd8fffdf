// Byte sizes as people write them: "32768", "32KiB", "4 GiB", "1M".
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>

namespace rackhub::server {

// Accepts an integer with an optional suffix B, K/KiB, M/MiB, G/GiB, T/TiB
// (all powers of 1024). Returns false with *error set on bad input or overflow.
bool ParseSize(const std::string& text, uint64_t* out, std::string* error);
// "32 KiB", "1.5 GiB", "100 B".
std::string FormatSize(uint64_t bytes);

}  // namespace rackhub::server
