// Data-plane tokens: generation and salted SHA-256 hashes (OpenSSL); the
// hub secret of a multi-rack topology.
// Thread-safe (no shared state).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "rackhub/common/status.h"

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

// The secret the hubs of a multi-rack topology share (topology.secret_file):
// the file's text without surrounding whitespace, one word of at least
// kMinHubSecretBytes characters. FAILED_PRECONDITION naming
// topology.secret_file and the file otherwise. Every hub reads it the same
// way; hub links prove it without sending it (server/lanes/hub_handshake.h).
inline constexpr size_t kMinHubSecretBytes = 16;
Result<std::string> ReadHubSecret(const std::string& path);

}  // namespace rackhub::server
