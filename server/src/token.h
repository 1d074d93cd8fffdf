// Data-plane tokens: generation and salted SHA-256 hashes (OpenSSL).
// Thread-safe (no shared state).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace rackhub::server {

using Sha256 = std::array<uint8_t, 32>;

struct TokenHash {
  std::array<uint8_t, 16> salt{};
  Sha256 hash{};
};

// "rhk_" followed by 64 hex digits of kernel randomness (getrandom(2)).
std::string GenerateToken();
TokenHash HashToken(const std::string& token);
// Constant-time comparison of `token` against `stored`.
bool TokenMatches(const std::string& token, const TokenHash& stored);
// Constant-time equality of two secrets of possibly different length.
bool SecretsEqual(const std::string& a, const std::string& b);

}  // namespace rackhub::server
