// config_fuzz: rackhubd's TOML configuration (server/config/config.h): the text
// of a config file through ParseConfigText, then ValidateConfig and
// EffectiveLaneCount, as `rackhubd --config FILE` does at start-up.
// Input: the file's text.
//
// Contract checked: any text is parsed or refused with errors (no crash,
// leak, UB or exception escaping); every error names a field or the file
// (the source name); a refused file leaves the other fields usable.
// The files a config names (token, TLS, secret files) are replaced by fixture
// files of this process (ValidateConfig reads them; a fuzzed path must not
// make it read /dev/zero or a FIFO).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "config.h"

namespace {

namespace srv = rackhub::server;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config_fuzz: contract broken: %s\n", what);
    std::abort();
  }
}

// A secret file, an empty file and a missing one, in a directory of this process.
std::vector<std::string> MakeFixtures() {
  char dir[] = "/tmp/rackhub-config-fuzz-XXXXXX";
  Check(mkdtemp(dir) != nullptr, "mkdtemp");
  const std::string d = dir;
  std::ofstream(d + "/secret") << "0123456789abcdef0123456789abcdef\n";
  std::ofstream(d + "/empty");
  return {d + "/secret", d + "/empty", d + "/missing"};
}

void Pin(std::string* path) {
  static const std::vector<std::string> fixtures = MakeFixtures();
  if (!path->empty()) *path = fixtures[std::hash<std::string>()(*path) % fixtures.size()];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  srv::Config config;
  std::vector<std::string> errors;
  srv::ParseConfigText(text, "fuzz.toml", &config, &errors);
  for (const std::string& e : errors) {
    Check(!e.empty() && e.find(':') != std::string::npos, "an error names its field or file");
  }
  Pin(&config.admin.token_file);
  Pin(&config.admin.readonly_token_file);
  Pin(&config.admin.tls_cert_file);
  Pin(&config.admin.tls_key_file);
  Pin(&config.admin.tls_client_ca_file);
  Pin(&config.topology.secret_file);
  std::vector<std::string> invalid;
  srv::ValidateConfig(config, &invalid);
  for (const std::string& e : invalid) {
    Check(!e.empty() && e.find(':') != std::string::npos, "an error names its field");
  }
  if (errors.empty() && invalid.empty()) {
    const uint32_t lanes = srv::EffectiveLaneCount(config);
    Check(lanes >= 1 && lanes <= 1024, "a valid config runs 1..1024 lanes");
  }
  return 0;
}
