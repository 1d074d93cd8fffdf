// Unit tests for rackhubd configuration (TOML file + flags + validation).
// The size syntax itself (ParseSize / FormatSize) is tested in common_test.cc.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config.h"
#include "process.h"
#include "test_pki.h"

namespace rackhub::server {
namespace {

// A file under the test temp dir, removed when the object goes away.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::path(::testing::TempDir()) /
             ("rackhub_config_test_" + std::to_string(getpid()) + "_" +
              std::to_string(counter++)))
                .string();
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> Parse(const std::string& text, Config* config) {
  std::vector<std::string> errors;
  ParseConfigText(text, "test.toml", config, &errors);
  return errors;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Asserts exactly one error, starting with `field` and mentioning `needle`.
void ExpectOneError(const std::vector<std::string>& errors, const std::string& field,
                    const std::string& needle = "") {
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_TRUE(StartsWith(errors[0], field + ": ")) << errors[0];
  EXPECT_NE(errors[0].find(needle), std::string::npos) << errors[0];
}

bool AnyStartsWith(const std::vector<std::string>& errors, const std::string& prefix) {
  for (const auto& e : errors)
    if (StartsWith(e, prefix)) return true;
  return false;
}

// ---------------------------------------------------------------------------
// ParseConfigText

TEST(ParseConfigTextTest, EmptyTextKeepsDefaults) {
  Config c;
  EXPECT_TRUE(Parse("", &c).empty());
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.admin.listen.ToString(), "127.0.0.1:7701");
  EXPECT_EQ(c.data.listen.ToString(), "127.0.0.1:7700");
  EXPECT_EQ(c.lanes.count, 0u);
  EXPECT_TRUE(c.lanes.pin);
  EXPECT_EQ(c.tenants.chunk_bytes, 32u * 1024);
}

TEST(ParseConfigTextTest, FullFileSetsEveryField) {
  const std::string text = R"(
log_level = "debug"
ready_file = "/run/rackhub/ready"

[admin]
listen = "0.0.0.0:9001"
token_file = "/etc/rackhub/admin.token"
readonly_token_file = "/etc/rackhub/ro.token"
tls_cert_file = "/etc/rackhub/cert.pem"
tls_key_file = "/etc/rackhub/key.pem"
tls_client_ca_file = "/etc/rackhub/ca.pem"
max_message_bytes = "8MiB"

[data]
listen = "[::1]:9000"
straggler_timeout_ms = 1500
hello_timeout_ms = 2500

[lanes]
count = 6
pin = false

[tenants]
default_chunk_bytes = "64KiB"
default_max_parameter_bytes = "2GiB"
default_max_keys = 1000
default_max_workers = 32
max_tenants = 7
)";
  Config c;
  const auto errors = Parse(text, &c);
  ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.ready_file, "/run/rackhub/ready");
  EXPECT_EQ(c.admin.listen.host, "0.0.0.0");
  EXPECT_EQ(c.admin.listen.port, 9001);
  EXPECT_EQ(c.admin.token_file, "/etc/rackhub/admin.token");
  EXPECT_EQ(c.admin.readonly_token_file, "/etc/rackhub/ro.token");
  EXPECT_EQ(c.admin.tls_cert_file, "/etc/rackhub/cert.pem");
  EXPECT_EQ(c.admin.tls_key_file, "/etc/rackhub/key.pem");
  EXPECT_EQ(c.admin.tls_client_ca_file, "/etc/rackhub/ca.pem");
  EXPECT_EQ(c.admin.max_message_bytes, 8u << 20);
  EXPECT_EQ(c.data.listen.host, "::1");
  EXPECT_EQ(c.data.listen.port, 9000);
  EXPECT_EQ(c.data.straggler_timeout_ms, 1500u);
  EXPECT_EQ(c.data.hello_timeout_ms, 2500u);
  EXPECT_EQ(c.lanes.count, 6u);
  EXPECT_FALSE(c.lanes.pin);
  EXPECT_EQ(c.tenants.chunk_bytes, 64u * 1024);
  EXPECT_EQ(c.tenants.max_parameter_bytes, 2ull << 30);
  EXPECT_EQ(c.tenants.max_keys, 1000u);
  EXPECT_EQ(c.tenants.max_workers, 32u);
  EXPECT_EQ(c.tenants.max_tenants, 7u);
}

TEST(ParseConfigTextTest, DottedKeysAndPlainIntegersForSizes) {
  Config c;
  const auto errors =
      Parse("tenants.default_chunk_bytes = 4096\nadmin.max_message_bytes = 65536\n", &c);
  ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(c.tenants.chunk_bytes, 4096u);
  EXPECT_EQ(c.admin.max_message_bytes, 65536u);
}

TEST(ParseConfigTextTest, UnknownKeyNamesDottedFieldAndLine) {
  Config c;
  const auto errors = Parse("log_level = \"warn\"\n[admin]\ntokn_file = \"/x\"\n", &c);
  ExpectOneError(errors, "admin.tokn_file", "unknown key");
  EXPECT_NE(errors[0].find("test.toml:3"), std::string::npos) << errors[0];
  EXPECT_EQ(c.log_level, "warn");  // the valid field is still applied
}

TEST(ParseConfigTextTest, TopologyRacks) {
  Config c;
  auto errors = Parse(
      "[topology]\nrack = 1\nmode = \"flat\"\n"
      "racks = [ { data = \"10.0.0.1:7700\", interhub = \"10.0.0.1:7703\" },\n"
      "          { data = \"10.0.0.2:7700\", interhub = \"10.0.0.2:7703\" } ]\n",
      &c);
  ASSERT_TRUE(errors.empty()) << errors[0];
  ASSERT_EQ(c.topology.racks.size(), 2u);
  EXPECT_EQ(c.topology.rack, 1u);
  EXPECT_EQ(c.topology.racks[1].data.ToString(), "10.0.0.2:7700");
  EXPECT_EQ(c.topology.racks[1].interhub.port, 7703);
  EXPECT_EQ(c.topology.rack_count(), 2u);
  EXPECT_FALSE(c.topology.multi_rack_exchange()) << "flat mode exchanges nothing";

  Config bad;
  errors = Parse("[topology]\nracks = [ { data = \"10.0.0.1:7700\" } ]\n", &bad);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("topology.racks: rack 0: needs data and interhub"), std::string::npos)
      << errors[0];
  errors = Parse("[topology]\nmode = \"mesh\"\n", &bad);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("topology.mode"), std::string::npos) << errors[0];
}

// Issue 12, hole 4: a multi-rack topology always needs the hub secret.
TEST(ValidateConfigTest, TopologyNeedsItsRackASecretAndFixedPorts) {
  Config c;
  ASSERT_TRUE(Parse("[topology]\nrack = 2\n"
                    "racks = [ { data = \"10.0.0.1:7700\", interhub = \"10.0.0.1:7703\" },\n"
                    "          { data = \"10.0.0.2:7700\", interhub = \"10.0.0.2:0\" } ]\n",
                    &c)
                  .empty());
  std::vector<std::string> errors;
  ValidateConfig(c, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("topology.rack: 2 is not one of the 2 racks"), std::string::npos);
  c.topology.rack = 0;
  errors.clear();
  ValidateConfig(c, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("topology.secret_file"), std::string::npos) << errors[0];
  c.topology.rack = 1;  // its interhub port is 0
  c.topology.racks[1].interhub.host = "127.0.0.1";
  errors.clear();
  ValidateConfig(c, &errors);
  ASSERT_EQ(errors.size(), 2u);
  // Loopback is no trust boundary on a shared host (issue 12, hole 4).
  EXPECT_EQ(errors[0].rfind("topology.secret_file: required with 2 racks: the hubs authenticate "
                            "their links (127.0.0.1:0) with a shared secret",
                            0),
            0u)
      << errors[0];
  EXPECT_NE(errors[1].find("needs a fixed interhub port"), std::string::npos) << errors[1];

  // The secret: one word of at least 16 characters.
  c.topology.racks[1].interhub.port = 7703;
  const TempFile short_secret("s3cret\n");
  c.topology.secret_file = short_secret.path();
  errors.clear();
  ValidateConfig(c, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("topology.secret_file: '" + short_secret.path() +
                           "' holds 6 characters; a hub secret needs at least 16"),
            std::string::npos)
      << errors[0];
  const TempFile empty_secret("");
  c.topology.secret_file = empty_secret.path();
  errors.clear();
  ValidateConfig(c, &errors);
  ASSERT_EQ(errors.size(), 1u) << "one error for an empty file, not two";
  EXPECT_NE(errors[0].find("is empty"), std::string::npos) << errors[0];
  const TempFile good_secret(std::string(32, 'f') + "\n");
  c.topology.secret_file = good_secret.path();
  errors.clear();
  ValidateConfig(c, &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
  // Flat mode opens no hub links: no secret needed.
  c.topology.secret_file.clear();
  c.topology.mode = "flat";
  errors.clear();
  ValidateConfig(c, &errors);
  EXPECT_TRUE(errors.empty()) << errors[0];
}

TEST(ParseConfigTextTest, UnknownSection) {
  Config c;
  const auto errors = Parse("[storage]\npath = \"/x\"\n", &c);
  ExpectOneError(errors, "storage", "unknown section");
  // A table named like a leaf field is not a section either.
  ExpectOneError(Parse("[admin.listen]\nhost = \"x\"\n", &c), "admin.listen", "unknown section");
  ExpectOneError(Parse("\n\nloglevel = \"info\"\n", &c), "loglevel", "test.toml:3");
}

TEST(ParseConfigTextTest, StringWhereIntegerExpected) {
  Config c;
  const auto errors = Parse("[lanes]\ncount = \"4\"\n", &c);
  ExpectOneError(errors, "lanes.count", "expected an integer");
  EXPECT_NE(errors[0].find("test.toml:2"), std::string::npos) << errors[0];
  EXPECT_EQ(c.lanes.count, 0u);
}

TEST(ParseConfigTextTest, IntegerWhereBoolOrStringExpected) {
  Config c;
  ExpectOneError(Parse("[lanes]\npin = 1\n", &c), "lanes.pin", "true or false");
  EXPECT_TRUE(c.lanes.pin);
  ExpectOneError(Parse("log_level = 3\n", &c), "log_level", "expected a string");
  ExpectOneError(Parse("[data]\nlisten = 7700\n", &c), "data.listen", "expected a string");
}

TEST(ParseConfigTextTest, FloatForSizeIsRejected) {
  Config c;
  ExpectOneError(Parse("[admin]\nmax_message_bytes = 1.5\n", &c), "admin.max_message_bytes",
                 "size string");
}

TEST(ParseConfigTextTest, NegativeInteger) {
  Config c;
  ExpectOneError(Parse("[tenants]\ndefault_max_keys = -5\n", &c), "tenants.default_max_keys",
                 "negative");
  ExpectOneError(Parse("[admin]\nmax_message_bytes = -1\n", &c), "admin.max_message_bytes",
                 "negative");
  EXPECT_EQ(c.tenants.max_keys, 65536u);
}

TEST(ParseConfigTextTest, IntegerTooLargeForField) {
  Config c;
  ExpectOneError(Parse("[lanes]\ncount = 5000000000\n", &c), "lanes.count", "too large");
  ExpectOneError(Parse("[tenants]\ndefault_chunk_bytes = \"4GiB\"\n", &c),
                 "tenants.default_chunk_bytes", "too large");
  EXPECT_EQ(c.lanes.count, 0u);
  EXPECT_EQ(c.tenants.chunk_bytes, 32u * 1024);
}

TEST(ParseConfigTextTest, BadEndpoint) {
  Config c;
  ExpectOneError(Parse("[admin]\nlisten = \"0.0.0.0\"\n", &c), "admin.listen", "HOST:PORT");
  ExpectOneError(Parse("[data]\nlisten = \"host:99999\"\n", &c), "data.listen", "99999");
  EXPECT_EQ(c.admin.listen.ToString(), "127.0.0.1:7701");
}

TEST(ParseConfigTextTest, BadLogLevel) {
  Config c;
  ExpectOneError(Parse("log_level = \"verbose\"\n", &c), "log_level", "verbose");
  EXPECT_EQ(c.log_level, "info");
  for (const char* level : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    EXPECT_TRUE(Parse(std::string("log_level = \"") + level + "\"\n", &c).empty()) << level;
    EXPECT_EQ(c.log_level, level);
  }
}

TEST(ParseConfigTextTest, SizeStringsWithUnits) {
  Config c;
  ASSERT_TRUE(Parse("[tenants]\ndefault_chunk_bytes = \"64KiB\"\n"
                    "default_max_parameter_bytes = \"1 TiB\"\n",
                    &c)
                  .empty());
  EXPECT_EQ(c.tenants.chunk_bytes, 65536u);
  EXPECT_EQ(c.tenants.max_parameter_bytes, 1ull << 40);
  ExpectOneError(Parse("[tenants]\ndefault_chunk_bytes = \"64KB\"\n", &c),
                 "tenants.default_chunk_bytes", "unknown unit");
  // Size strings are only for size fields.
  ExpectOneError(Parse("[tenants]\ndefault_max_keys = \"1K\"\n", &c), "tenants.default_max_keys",
                 "expected an integer");
}

TEST(ParseConfigTextTest, MultipleErrorsAreAllReported) {
  Config c;
  const auto errors = Parse("log_level = \"loud\"\n[lanes]\ncount = -1\npin = \"yes\"\n", &c);
  EXPECT_EQ(errors.size(), 3u) << ::testing::PrintToString(errors);
  EXPECT_TRUE(AnyStartsWith(errors, "log_level: "));
  EXPECT_TRUE(AnyStartsWith(errors, "lanes.count: "));
  EXPECT_TRUE(AnyStartsWith(errors, "lanes.pin: "));
}

TEST(ParseConfigTextTest, SyntaxErrorMentionsLine) {
  Config c;
  const auto errors = Parse("log_level = \"info\"\n\n[admin\nlisten = \"x\"\n", &c);
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_TRUE(StartsWith(errors[0], "test.toml:3:")) << errors[0];
  EXPECT_NE(errors[0].find("TOML syntax error"), std::string::npos) << errors[0];
}

// ---------------------------------------------------------------------------
// ParseCommandLine

ParseResult ParseArgs(std::vector<std::string> args) {
  args.insert(args.begin(), "rackhubd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(ParseCommandLineTest, NoArgumentsGivesValidDefaults) {
  const ParseResult r = ParseArgs({});
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.config.admin.listen.ToString(), "127.0.0.1:7701");
  EXPECT_FALSE(r.command_line.help);
  EXPECT_FALSE(r.command_line.check_config);
  EXPECT_TRUE(r.command_line.config_file.empty());
}

TEST(ParseCommandLineTest, FlagsOverrideFile) {
  TempFile file("log_level = \"warn\"\n[lanes]\ncount = 4\n[data]\nlisten = \"127.0.0.1:9100\"\n");
  const ParseResult r =
      ParseArgs({"--lanes", "2", "--config", file.path(), "--log-level=error"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.command_line.config_file, file.path());
  EXPECT_EQ(r.config.lanes.count, 2u);          // flag beats file (even if given first)
  EXPECT_EQ(r.config.log_level, "error");       // --flag=value form
  EXPECT_EQ(r.config.data.listen.port, 9100);   // file value kept
}

TEST(ParseCommandLineTest, EqualsFormAndShortConfig) {
  TempFile file("[lanes]\npin = true\n");
  const ParseResult r = ParseArgs({"-c", file.path(), "--admin-listen=[::1]:7801",
                                   "--data-listen=127.0.0.1:7800", "--ready-file=/tmp/r"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.config.admin.listen.host, "::1");
  EXPECT_EQ(r.config.admin.listen.port, 7801);
  EXPECT_EQ(r.config.data.listen.port, 7800);
  EXPECT_EQ(r.config.ready_file, "/tmp/r");
  EXPECT_EQ(r.command_line.config_file, file.path());
}

TEST(ParseCommandLineTest, UnknownFlag) {
  const ParseResult r = ParseArgs({"--frobnicate", "3"});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(AnyStartsWith(r.errors, "--frobnicate: unknown option"))
      << ::testing::PrintToString(r.errors);
}

TEST(ParseCommandLineTest, MissingValue) {
  ParseResult r = ParseArgs({"--lanes"});
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.errors[0], "--lanes: missing value");
  r = ParseArgs({"--check-config", "--config"});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--config: missing value"));
}

TEST(ParseCommandLineTest, BadFlagValueNamesFlagAndField) {
  const ParseResult r = ParseArgs({"--lanes=many"});
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(StartsWith(r.errors[0], "--lanes (lanes.count): ")) << r.errors[0];
  EXPECT_NE(r.errors[0].find("many"), std::string::npos);
}

TEST(ParseCommandLineTest, ActionFlags) {
  ParseResult r = ParseArgs({"--check-config"});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.command_line.check_config);
  EXPECT_FALSE(r.command_line.help);
  r = ParseArgs({"--help"});
  EXPECT_TRUE(r.command_line.help);
  EXPECT_FALSE(r.command_line.check_config);
  EXPECT_TRUE(ParseArgs({"-h"}).command_line.help);
  EXPECT_TRUE(ParseArgs({"--version"}).command_line.version);
}

// `--check-config FILE` and `--doctor FILE` (or "=FILE") name the config
// file like --config FILE; both forms together must name one file.
TEST(ParseCommandLineTest, ActionFlagsTakeTheConfigFile) {
  TempFile file("[lanes]\ncount = 3\n");
  for (const char* action : {"--check-config", "--doctor"}) {
    SCOPED_TRACE(action);
    ParseResult r = ParseArgs({action, file.path()});
    ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
    EXPECT_EQ(r.command_line.config_file, file.path());
    EXPECT_EQ(r.command_line.config_option, action);
    EXPECT_EQ(r.config.lanes.count, 3u);
    EXPECT_EQ(r.command_line.check_config, std::string(action) == "--check-config");
    EXPECT_EQ(r.command_line.doctor, std::string(action) == "--doctor");

    r = ParseArgs({std::string(action) + "=" + file.path(), "--lanes", "5"});
    ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
    EXPECT_EQ(r.config.lanes.count, 5u);  // flags still override the file

    // The same file twice (also spelled differently) is fine.
    r = ParseArgs({action, file.path(), "--config",
                   std::filesystem::path(file.path()).parent_path().string() + "/./" +
                       std::filesystem::path(file.path()).filename().string()});
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
    r = ParseArgs({"--config", file.path(), action, file.path()});
    EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);

    // The argument after the action is its FILE only when it is not an option.
    r = ParseArgs({action, "--lanes", "2"});
    ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
    EXPECT_TRUE(r.command_line.config_file.empty());
    EXPECT_EQ(r.config.lanes.count, 2u);
  }
}

TEST(ParseCommandLineTest, ActionFileErrors) {
  TempFile a("[lanes]\ncount = 3\n");
  TempFile b("[lanes]\ncount = 4\n");
  ParseResult r = ParseArgs({"--check-config", a.path(), "--config", b.path()});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(AnyStartsWith(r.errors, "--check-config: '" + a.path() + "' is not the file --config names ('" + b.path() + "')"))
      << ::testing::PrintToString(r.errors);
  r = ParseArgs({"--config", b.path(), "--doctor=" + a.path()});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--doctor: '" + a.path() + "' is not the file --config"))
      << ::testing::PrintToString(r.errors);
  r = ParseArgs({"--check-config", "/nonexistent/rackhubd.toml"});
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.errors[0], "--check-config: cannot read '/nonexistent/rackhubd.toml'");
  r = ParseArgs({"--check-config="});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--check-config: '=' without a file name"))
      << ::testing::PrintToString(r.errors);
  r = ParseArgs({"--doctor", "--check-config"});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--doctor: cannot be combined with --check-config"))
      << ::testing::PrintToString(r.errors);
}

TEST(ParseCommandLineTest, PinLanesFlags) {
  TempFile file("[lanes]\npin = true\n");
  ParseResult r = ParseArgs({"--config", file.path(), "--no-pin-lanes"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_FALSE(r.config.lanes.pin);
  r = ParseArgs({"--pin-lanes=false"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_FALSE(r.config.lanes.pin);
  r = ParseArgs({"--pin-lanes", "maybe"});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--pin-lanes (lanes.pin): "));
}

TEST(ParseCommandLineTest, UnreadableConfigFile) {
  const ParseResult r = ParseArgs({"--config", "/nonexistent/rackhub/none.toml"});
  EXPECT_TRUE(AnyStartsWith(r.errors, "--config: cannot read"))
      << ::testing::PrintToString(r.errors);
}

TEST(ParseCommandLineTest, FileErrorsCarryFileName) {
  TempFile file("[lanes]\ncount = \"x\"\n");
  const ParseResult r = ParseArgs({"--config", file.path()});
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(StartsWith(r.errors[0], "lanes.count: ")) << r.errors[0];
  EXPECT_NE(r.errors[0].find(file.path() + ":2"), std::string::npos) << r.errors[0];
}

TEST(ParseCommandLineTest, RunsValidation) {
  const ParseResult r = ParseArgs({"--admin-listen", "0.0.0.0:7701"});
  EXPECT_TRUE(AnyStartsWith(r.errors, "admin.listen: ")) << ::testing::PrintToString(r.errors);
}

// ---------------------------------------------------------------------------
// ValidateConfig

std::vector<std::string> Validate(const Config& c) {
  std::vector<std::string> errors;
  ValidateConfig(c, &errors);
  return errors;
}

TEST(ValidateConfigTest, DefaultsAreValid) {
  const Config c;
  EXPECT_TRUE(Validate(c).empty()) << ::testing::PrintToString(Validate(c));
}

TEST(ValidateConfigTest, NonLoopbackAdminNeedsToken) {
  Config c;
  c.admin.listen = {"0.0.0.0", 7701};
  const auto errors = Validate(c);
  ExpectOneError(errors, "admin.listen", "0.0.0.0:7701");

  TempFile token("s3cret-admin-token\n");
  c.admin.token_file = token.path();
  EXPECT_TRUE(Validate(c).empty()) << ::testing::PrintToString(Validate(c));
}

TEST(ValidateConfigTest, LoopbackAdminWithoutTokenIsFine) {
  Config c;
  c.admin.listen = {"::1", 7701};
  EXPECT_TRUE(Validate(c).empty());
  c.admin.listen = {"localhost", 7701};
  EXPECT_TRUE(Validate(c).empty());
}

TEST(ValidateConfigTest, TlsCertWithoutKey) {
  TempFile cert("-----BEGIN CERTIFICATE-----\n");
  Config c;
  c.admin.tls_cert_file = cert.path();
  ExpectOneError(Validate(c), "admin.tls_key_file", "both");
}

TEST(ValidateConfigTest, TlsKeyWithoutCert) {
  TempFile key("-----BEGIN PRIVATE KEY-----\n");
  Config c;
  c.admin.tls_key_file = key.path();
  ExpectOneError(Validate(c), "admin.tls_cert_file", "both");
}

TEST(ValidateConfigTest, ClientCaWithoutTls) {
  TempFile ca("-----BEGIN CERTIFICATE-----\n");
  Config c;
  c.admin.tls_client_ca_file = ca.path();
  ExpectOneError(Validate(c), "admin.tls_client_ca_file", "need TLS");
}

TEST(ValidateConfigTest, FullTlsWithClientCaIsAuthenticated) {
  TempFile cert("cert"), key("key"), ca("ca");
  Config c;
  c.admin.listen = {"0.0.0.0", 7701};
  c.admin.tls_cert_file = cert.path();
  c.admin.tls_key_file = key.path();
  c.admin.tls_client_ca_file = ca.path();
  EXPECT_TRUE(Validate(c).empty()) << ::testing::PrintToString(Validate(c));
}

TEST(ValidateConfigTest, UnreadableOrEmptyTokenFileIsNamed) {
  Config c;
  c.admin.token_file = "/nonexistent/rackhub/admin.token";
  const auto errors = Validate(c);
  ExpectOneError(errors, "admin.token_file", "cannot read");
  EXPECT_NE(errors[0].find("/nonexistent/rackhub/admin.token"), std::string::npos);

  TempFile empty("");
  c.admin.token_file = empty.path();
  ExpectOneError(Validate(c), "admin.token_file", "empty");
}

TEST(ValidateConfigTest, ReadonlyTokenNeedsAdminToken) {
  TempFile ro("read-only-token");
  Config c;
  c.admin.readonly_token_file = ro.path();
  ExpectOneError(Validate(c), "admin.readonly_token_file", "admin.token_file");
}

TEST(ValidateConfigTest, InvalidDefaultChunkBytes) {
  for (uint32_t bad : {0u, 1000u, 1024u + 32u, 128u << 20}) {
    Config c;
    c.tenants.chunk_bytes = bad;
    SCOPED_TRACE(bad);
    ExpectOneError(Validate(c), "tenants.default_chunk_bytes", std::to_string(bad));
  }
}

TEST(ValidateConfigTest, ZeroQuotasAndTooManyLanes) {
  Config c1, c2, c3, c4;
  c1.tenants.max_keys = 0;
  ExpectOneError(Validate(c1), "tenants.default_max_keys");
  c2.tenants.max_tenants = 0;
  ExpectOneError(Validate(c2), "tenants.max_tenants");
  c3.lanes.count = 100000;
  ExpectOneError(Validate(c3), "lanes.count");
  c4.admin.max_message_bytes = 100;
  ExpectOneError(Validate(c4), "admin.max_message_bytes");
}

TEST(ValidateConfigTest, SameAdminAndDataAddress) {
  Config c;
  c.data.listen = c.admin.listen;
  ExpectOneError(Validate(c), "data.listen", "same address");
  // Port 0 on both picks two different ephemeral ports: allowed.
  c.admin.listen.port = 0;
  c.data.listen.port = 0;
  EXPECT_TRUE(Validate(c).empty());
}

TEST(ParseConfigTextTest, StateAndCheckpointSections) {
  Config c;
  EXPECT_EQ(c.state.dir, "/var/lib/rackhub");
  EXPECT_FALSE(c.state.in_memory);
  EXPECT_EQ(c.checkpoint.every_iterations, 0u);
  EXPECT_EQ(c.checkpoint.every_seconds, 300u);
  EXPECT_EQ(c.checkpoint.keep, 3u);
  EXPECT_TRUE(c.checkpoint.on_shutdown);
  const auto errors = Parse(
      "[state]\ndir = \"/srv/rackhub\"\nin_memory = true\n"
      "[checkpoint]\nevery_iterations = 500\nevery_seconds = 60\nkeep = 5\n"
      "on_shutdown = false\n",
      &c);
  ASSERT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  EXPECT_EQ(c.state.dir, "/srv/rackhub");
  EXPECT_TRUE(c.state.in_memory);
  EXPECT_EQ(c.checkpoint.every_iterations, 500u);
  EXPECT_EQ(c.checkpoint.every_seconds, 60u);
  EXPECT_EQ(c.checkpoint.keep, 5u);
  EXPECT_FALSE(c.checkpoint.on_shutdown);
  Config bad;
  ExpectOneError(Parse("[state]\nin_memory = \"yes\"\n", &bad), "state.in_memory",
                 "true or false");
  ExpectOneError(Parse("[state]\ndir = 7\n", &bad), "state.dir", "expected a string");
  ExpectOneError(Parse("[checkpoint]\nkeep = -1\n", &bad), "checkpoint.keep", "negative");
  ExpectOneError(Parse("[checkpoint]\nevery_seconds = \"1m\"\n", &bad),
                 "checkpoint.every_seconds", "expected an integer");
  ExpectOneError(Parse("[checkpoint]\nevery_minutes = 1\n", &bad), "checkpoint.every_minutes",
                 "unknown key");
}

TEST(ParseCommandLineTest, StateAndCheckpointFlags) {
  ParseResult r = ParseArgs({"--state-dir", "/tmp/rh-state", "--checkpoint-every-iterations",
                             "100", "--checkpoint-every-seconds=30", "--checkpoint-keep", "2"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.config.state.dir, "/tmp/rh-state");
  EXPECT_FALSE(r.config.state.in_memory);
  EXPECT_EQ(r.config.checkpoint.every_iterations, 100u);
  EXPECT_EQ(r.config.checkpoint.every_seconds, 30u);
  EXPECT_EQ(r.config.checkpoint.keep, 2u);
  // --in-memory takes no value; it overrides the file.
  TempFile file("[state]\nin_memory = false\n");
  r = ParseArgs({"--config", file.path(), "--in-memory", "--lanes", "1"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(r.config.state.in_memory);
  EXPECT_EQ(r.config.lanes.count, 1u);
  r = ParseArgs({"--checkpoint-keep", "x"});
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_TRUE(StartsWith(r.errors[0], "--checkpoint-keep (checkpoint.keep): ")) << r.errors[0];
  r = ParseArgs({"--state-dir"});
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0], "--state-dir: missing value");
  EXPECT_NE(UsageText().find("--state-dir DIR"), std::string::npos);
  EXPECT_NE(UsageText().find("--in-memory"), std::string::npos);
  EXPECT_NE(UsageText().find("--checkpoint-keep N"), std::string::npos);
}

TEST(ValidateConfigTest, CheckpointKeepAndStateDir) {
  Config c;
  c.checkpoint.keep = 0;
  std::vector<std::string> errors;
  ValidateConfig(c, &errors);
  ExpectOneError(errors, "checkpoint.keep", ">= 1");
  Config d;
  d.state.dir = "";
  errors.clear();
  ValidateConfig(d, &errors);
  ExpectOneError(errors, "state.dir", "state.in_memory");
  d.state.in_memory = true;
  errors.clear();
  ValidateConfig(d, &errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
}

TEST(ValidateConfigTest, IntakeLeadAndReceiveBuffer) {
  Config c;
  c.data.intake_lead_bytes = 0;  // off
  c.data.tcp_receive_buffer = 0;  // the kernel's autotuning
  std::vector<std::string> errors;
  ValidateConfig(c, &errors);
  EXPECT_TRUE(errors.empty()) << ::testing::PrintToString(errors);
  c.data.intake_lead_bytes = 1000;
  ValidateConfig(c, &errors);
  ExpectOneError(errors, "data.intake_lead_bytes", "[64KiB, 1GiB]");
  Config d;
  d.data.tcp_receive_buffer = 1u << 30;
  errors.clear();
  ValidateConfig(d, &errors);
  ExpectOneError(errors, "data.tcp_receive_buffer", "[4KiB, 256MiB]");
}

TEST(EffectiveLaneCountTest, ZeroMeansCoresAndExplicitIsKept) {
  Config c;
  c.lanes.count = 0;
  EXPECT_GE(EffectiveLaneCount(c), 1u);
  c.lanes.count = 3;
  EXPECT_EQ(EffectiveLaneCount(c), 3u);
}

}  // namespace
}  // namespace rackhub::server

// ---------------------------------------------------------------------------
// topology.tls_*: mutual TLS for hub links (docs/cluster.md)

namespace rackhub::server {
namespace {

TEST(HubTlsConfigTest, KeysParseFromTheFileAndTheCommandLine) {
  Config c;
  EXPECT_TRUE(Parse("[topology]\ntls_cert_file = \"/c.pem\"\ntls_key_file = \"/k.pem\"\n"
                    "tls_ca_file = \"/ca.pem\"\n",
                    &c)
                  .empty());
  EXPECT_EQ(c.topology.tls_cert_file, "/c.pem");
  EXPECT_EQ(c.topology.tls_key_file, "/k.pem");
  EXPECT_EQ(c.topology.tls_ca_file, "/ca.pem");
  EXPECT_TRUE(c.topology.hub_tls());
  const ParseResult r =
      ParseArgs({"--hub-tls-cert", "/nonexistent/c.pem", "--hub-tls-key", "/nonexistent/k.pem",
                 "--hub-tls-ca", "/nonexistent/ca.pem"});
  EXPECT_EQ(r.config.topology.tls_cert_file, "/nonexistent/c.pem");
  EXPECT_EQ(r.config.topology.tls_ca_file, "/nonexistent/ca.pem");
  // Validation ran: the files do not exist, each is named.
  EXPECT_TRUE(AnyStartsWith(r.errors, "topology.tls_cert_file: cannot read '/nonexistent/c.pem'"))
      << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(AnyStartsWith(r.errors, "topology.tls_key_file: cannot read"));
  EXPECT_TRUE(AnyStartsWith(r.errors, "topology.tls_ca_file: cannot read"));
}

TEST(HubTlsConfigTest, AllThreeOrNone) {
  TempFile cert("-----BEGIN CERTIFICATE-----\n");
  Config c;
  c.topology.tls_cert_file = cert.path();
  const auto errors = Validate(c);
  ASSERT_EQ(errors.size(), 2u) << ::testing::PrintToString(errors);
  EXPECT_TRUE(AnyStartsWith(errors, "topology.tls_key_file: TLS for hub links needs all of"));
  EXPECT_TRUE(AnyStartsWith(errors, "topology.tls_ca_file: TLS for hub links needs all of"));
  Config only_ca;
  only_ca.topology.tls_ca_file = cert.path();
  EXPECT_EQ(Validate(only_ca).size(), 2u);
}

// A real CA and certificates (openssl, at run time), then each file spoiled
// in turn: the error names the key and what is wrong with its file.
TEST(HubTlsConfigTest, FilesAreCheckedAsTheHubLoadsThem) {
  const std::string dir = testing::MakeTempDir();
  ASSERT_EQ(testing::MakeTestPki(dir, {"hub", "other"}), "");
  Config c;
  c.topology.tls_cert_file = dir + "/hub.pem";
  c.topology.tls_key_file = dir + "/hub.key";
  c.topology.tls_ca_file = dir + "/ca.pem";
  EXPECT_TRUE(Validate(c).empty()) << ::testing::PrintToString(Validate(c));

  Config wrong_key = c;
  wrong_key.topology.tls_key_file = dir + "/other.key";
  ExpectOneError(Validate(wrong_key), "topology.tls_key_file",
                 "does not match the certificate in topology.tls_cert_file");

  TempFile text("just some text\n");
  Config not_pem = c;
  not_pem.topology.tls_ca_file = text.path();
  ExpectOneError(Validate(not_pem), "topology.tls_ca_file", "is not a PEM file");

  Config key_as_cert = c;
  key_as_cert.topology.tls_cert_file = dir + "/hub.key";
  ExpectOneError(Validate(key_as_cert), "topology.tls_cert_file", "holds no PEM certificate");

  TempFile empty("");
  Config empty_key = c;
  empty_key.topology.tls_key_file = empty.path();
  ExpectOneError(Validate(empty_key), "topology.tls_key_file", "is empty");

  Config missing = c;
  missing.topology.tls_cert_file = dir + "/nope.pem";
  ExpectOneError(Validate(missing), "topology.tls_cert_file", "cannot read");
}

}  // namespace
}  // namespace rackhub::server
