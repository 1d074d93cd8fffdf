#include "token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rackhub::server {
namespace {

void FillRandom(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = getrandom(out + done, n - done, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::perror("getrandom");
      std::abort();  // no randomness: refusing to mint guessable tokens
    }
    done += static_cast<size_t>(r);
  }
}

Sha256 Digest(const std::array<uint8_t, 16>& salt, const std::string& token) {
  Sha256 out{};
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  unsigned len = 0;
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx, salt.data(), salt.size()) != 1 ||
      EVP_DigestUpdate(ctx, token.data(), token.size()) != 1 ||
      EVP_DigestFinal_ex(ctx, out.data(), &len) != 1 || len != out.size()) {
    std::fprintf(stderr, "SHA-256 failed\n");
    std::abort();
  }
  EVP_MD_CTX_free(ctx);
  return out;
}

}  // namespace

std::string GenerateToken() {
  uint8_t bytes[32];
  FillRandom(bytes, sizeof bytes);
  static const char* hex = "0123456789abcdef";
  std::string token = "rhk_";
  for (uint8_t b : bytes) {
    token.push_back(hex[b >> 4]);
    token.push_back(hex[b & 15]);
  }
  return token;
}

TokenHash HashToken(const std::string& token) {
  TokenHash h;
  FillRandom(h.salt.data(), h.salt.size());
  h.hash = Digest(h.salt, token);
  return h;
}

bool TokenMatches(const std::string& token, const TokenHash& stored) {
  const Sha256 d = Digest(stored.salt, token);
  return CRYPTO_memcmp(d.data(), stored.hash.data(), d.size()) == 0;
}

bool SecretsEqual(const std::string& a, const std::string& b) {
  // Hash both so the comparison time does not depend on the length or content.
  const std::array<uint8_t, 16> salt{};
  const Sha256 da = Digest(salt, a), db = Digest(salt, b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

Result<std::string> ReadHubSecret(const std::string& path) {
  const std::string field = "topology.secret_file: ";
  std::ifstream f(path, std::ios::binary);
  if (!f) return FailedPrecondition(field + "cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  const auto first = s.find_first_not_of(" \t\r\n");
  const auto last = s.find_last_not_of(" \t\r\n");
  const std::string secret = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  if (secret.find_first_of(" \t\r\n") != std::string::npos) {
    return FailedPrecondition(field + "'" + path +
                              "' must hold the secret as one word on one line");
  }
  if (secret.size() < kMinHubSecretBytes) {
    return FailedPrecondition(field + "'" + path + "' holds " + std::to_string(secret.size()) +
                              " characters; a hub secret needs at least " +
                              std::to_string(kMinHubSecretBytes) +
                              " (e.g. openssl rand -hex 32 > FILE)");
  }
  return secret;
}

}  // namespace rackhub::server
