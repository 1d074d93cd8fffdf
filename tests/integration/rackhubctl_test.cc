// rackhubctl end to end: every test drives the real rackhubctl binary against
// a real rackhubd (started with --lanes 2 on ephemeral loopback ports) and
// checks exit codes, stdout and stderr.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process.h"

namespace rackhub {
namespace {

using testing::BinPath;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::RunCommand;
using testing::WriteFile;

// A MakeTempDir() directory, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() : path_(MakeTempDir()) {}
  ~TempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr int kExitRejected = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
constexpr int kExitAuth = 4;

std::string Describe(const CommandResult& r) {
  std::ostringstream ss;
  ss << "exit=" << r.exit_code << (r.timed_out ? " (timed out)" : "") << "\n--- stdout:\n"
     << r.out << "--- stderr:\n"
     << r.err;
  return ss.str();
}

std::string Trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The value of the first `label: value` line of `out` ("" if absent).
std::string Field(const std::string& out, const std::string& label) {
  for (const auto& line : Lines(out)) {
    const std::string t = Trim(line);
    if (t.rfind(label + ":", 0) == 0) return Trim(t.substr(label.size() + 1));
  }
  return "";
}

// The whitespace-separated cells of the first table row whose first cell is
// `first` (empty if none).
std::vector<std::string> Row(const std::string& out, const std::string& first) {
  for (const auto& line : Lines(out)) {
    auto words = Words(line);
    if (!words.empty() && words[0] == first) return words;
  }
  return {};
}

// Rows of the chunk layout table printed by `key get`.
std::vector<std::vector<std::string>> ChunkRows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  bool in_table = false;
  for (const auto& line : Lines(out)) {
    const auto words = Words(line);
    if (!in_table) {
      in_table = !words.empty() && words[0] == "CHUNK";
      continue;
    }
    if (words.empty()) break;
    rows.push_back(words);
  }
  return rows;
}

// A JSON object document: starts with '{', ends with '}', braces balance
// outside strings.
bool LooksLikeJsonObject(const std::string& text) {
  const std::string t = Trim(text.substr(0, text.find_last_not_of("\n") + 1));
  if (t.empty() || t.front() != '{' || t.back() != '}') return false;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth < 0) return false;
      if (depth == 0 && i + 1 != t.size()) return false;
    }
  }
  return depth == 0 && !in_string;
}

CommandResult Rackhubctl(std::vector<std::string> args) {
  args.insert(args.begin(), BinPath("rackhubctl"));
  return RunCommand(args);
}

class RackhubctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--lanes", "2"});
    ASSERT_TRUE(daemon_->started()) << "rackhubd did not start";
  }

  // rackhubctl against this test's daemon; `args` may hold global options too.
  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"--admin", daemon_->admin_address()});
    return Rackhubctl(std::move(args));
  }
  // Runs `args`, expecting success; returns stdout.
  std::string Ok(std::vector<std::string> args) {
    const CommandResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    return r.out;
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(RackhubctlTest, TenantLifecycle) {
  CommandResult r = Ctl({"tenant", "create", "acme", "--workers", "4"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string token = Field(r.out, "data-plane token");
  EXPECT_GE(token.size(), 16u) << "token must be printed:\n" << r.out;
  EXPECT_NE(r.out.find("shown only once"), std::string::npos) << r.out;
  EXPECT_EQ(Field(r.out, "name"), "acme");
  EXPECT_EQ(Field(r.out, "workers per rack"), "4");
  EXPECT_EQ(Field(r.out, "chunk bytes"), "32768 (32 KiB)");

  // A second tenant gets its own token.
  r = Ctl({"tenant", "create", "beta", "--workers", "1", "--chunk-bytes", "64KiB"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(Field(r.out, "data-plane token"), token);
  EXPECT_EQ(Field(r.out, "chunk bytes"), "65536 (64 KiB)");

  std::string out = Ok({"tenant", "list"});
  const auto acme = Row(out, "acme");
  ASSERT_FALSE(acme.empty()) << out;
  EXPECT_EQ(Words(Lines(out)[0])[0], "NAME") << "header row first:\n" << out;
  EXPECT_FALSE(Row(out, "beta").empty()) << out;
  // The token is never shown again.
  EXPECT_EQ(out.find(token), std::string::npos);

  out = Ok({"tenant", "get", "acme"});
  EXPECT_EQ(Field(out, "name"), "acme");
  EXPECT_EQ(Field(out, "workers per rack"), "4");
  EXPECT_EQ(Field(out, "keys"), "0");
  EXPECT_EQ(out.find(token), std::string::npos);

  out = Ok({"tenant", "update-quotas", "acme", "--max-keys", "7", "--max-param-bytes", "1GiB"});
  EXPECT_EQ(Field(out, "max keys"), "7") << out;
  out = Ok({"tenant", "get", "acme"});
  EXPECT_EQ(Field(out, "max keys"), "7") << out;
  EXPECT_EQ(Field(out, "max parameter bytes"), "1073741824 (1 GiB)") << out;

  out = Ok({"tenant", "delete", "acme"});
  EXPECT_NE(out.find("acme"), std::string::npos);
  out = Ok({"tenant", "list"});
  EXPECT_TRUE(Row(out, "acme").empty()) << out;
  EXPECT_FALSE(Row(out, "beta").empty()) << out;
  r = Ctl({"tenant", "get", "acme"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << Describe(r);
}

TEST_F(RackhubctlTest, KeyLifecycleAndChunkLayout) {
  ASSERT_EQ(Ctl({"tenant", "create", "ml", "--workers", "2", "--chunk-bytes", "32K"}).exit_code, 0);
  CommandResult r = Ctl({"key", "create", "ml", "w", "--elements", "20000", "--optimizer",
                         "momentum", "--lr", "0.1", "--momentum", "0.9"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(Field(r.out, "elements"), "20000");
  EXPECT_EQ(Field(r.out, "dtype"), "fp32");

  std::string out = Ok({"key", "list", "ml"});
  const auto row = Row(out, "w");
  ASSERT_FALSE(row.empty()) << out;
  EXPECT_NE(std::find(row.begin(), row.end(), "20000"), row.end()) << out;

  // 20000 fp32 elements in 32 KiB (8192-element) chunks: 8192 + 8192 + 3616,
  // chunk g on lane g % 2.
  out = Ok({"key", "get", "ml", "w"});
  EXPECT_EQ(Field(out, "chunk elements"), "8192") << out;
  EXPECT_EQ(Field(out, "parameter bytes"), "80000 (78.1 KiB)") << out;
  auto chunks = ChunkRows(out);
  ASSERT_EQ(chunks.size(), 3u) << out;
  const uint64_t first = std::stoull(chunks[0][0]);
  const uint64_t expected_elements[] = {8192, 8192, 3616};
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(chunks[i].size(), 4u) << out;
    EXPECT_EQ(std::stoull(chunks[i][0]), first + i) << out;
    EXPECT_EQ(std::stoull(chunks[i][1]), (first + i) % 2) << out;
    EXPECT_EQ(std::stoull(chunks[i][2]), 8192 * i) << out;
    EXPECT_EQ(std::stoull(chunks[i][3]), expected_elements[i]) << out;
  }

  // A second key continues the tenant's chunk numbering (and the lanes).
  ASSERT_EQ(Ctl({"key", "create", "ml", "b", "--elements", "10000", "--dtype", "bf16"}).exit_code,
            0);
  out = Ok({"key", "get", "ml", "b"});
  EXPECT_EQ(Field(out, "dtype"), "bf16");
  chunks = ChunkRows(out);
  ASSERT_EQ(chunks.size(), 2u) << out;
  EXPECT_EQ(std::stoull(chunks[0][0]), first + 3) << out;
  EXPECT_EQ(std::stoull(chunks[0][1]), (first + 3) % 2) << out;
  EXPECT_EQ(chunks[1][3], "1808") << out;

  // set-optimizer keeps the options not given.
  out = Ok({"key", "set-optimizer", "ml", "w", "--lr", "0.05"});
  EXPECT_EQ(Field(out, "optimizer"), "momentum lr=0.05 momentum=0.9 reduction=mean") << out;
  out = Ok({"key", "get", "ml", "w"});
  EXPECT_EQ(Field(out, "optimizer"), "momentum lr=0.05 momentum=0.9 reduction=mean") << out;
  // The type cannot change.
  r = Ctl({"key", "set-optimizer", "ml", "w", "--optimizer", "adam", "--lr", "0.001"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: ", 0), 0u) << Describe(r);
  out = Ok({"key", "get", "ml", "w"});
  EXPECT_EQ(Field(out, "optimizer").rfind("momentum lr=0.05", 0), 0u) << out;

  out = Ok({"key", "delete", "ml", "w"});
  EXPECT_NE(out.find("deleted"), std::string::npos) << out;
  out = Ok({"key", "list", "ml"});
  EXPECT_TRUE(Row(out, "w").empty()) << out;
  EXPECT_FALSE(Row(out, "b").empty()) << out;
  r = Ctl({"key", "get", "ml", "w"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << Describe(r);
}

// key get of a key of 2^30 elements in 1 KiB chunks (4 Mi chunks): the
// chunks per lane, then one page of the layout and how to read the next.
TEST_F(RackhubctlTest, KeyGetOfAHugeKeyIsPaged) {
  ASSERT_EQ(Ctl({"tenant", "create", "huge", "--workers", "1", "--chunk-bytes", "1KiB",
                 "--max-param-bytes", "64GiB"})
                .exit_code,
            0);
  ASSERT_EQ(Ctl({"key", "create", "huge", "k", "--elements", "1073741824", "--optimizer",
                 "sum-only"})
                .exit_code,
            0);
  std::string out = Ok({"key", "get", "huge", "k"});
  EXPECT_EQ(Field(out, "chunks"), "4194304 (first index 0)") << out.substr(0, 2000);
  EXPECT_NE(out.find("chunk layout (chunks 0..1000 of 4194304)"), std::string::npos)
      << out.substr(0, 2000);
  EXPECT_EQ(ChunkRows(out).size(), 1000u);
  EXPECT_NE(out.find("(4193304 more chunks: --chunk-offset 1000)"), std::string::npos);
  // Chunk g on lane g % 2: 2097152 chunks of 256 elements each.
  const auto lane0 = Row(out, "0");
  ASSERT_EQ(lane0.size(), 3u) << out.substr(0, 2000);
  EXPECT_EQ(lane0[1], "2097152");
  EXPECT_EQ(lane0[2], "536870912");

  out = Ok({"key", "get", "huge", "k", "--chunk-offset", "4194300", "--chunk-limit", "10"});
  const auto rows = ChunkRows(out);
  ASSERT_EQ(rows.size(), 4u) << out;
  EXPECT_EQ(rows[3][0], "4194303");
  EXPECT_EQ(rows[3][2], std::to_string((uint64_t{1} << 30) - 256));
  EXPECT_EQ(out.find("more chunks"), std::string::npos) << out;

  CommandResult r = Ctl({"key", "get", "huge", "k", "--chunk-offset", "4194305"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("chunk_offset: 4194305 is past the 4194304 chunks"), std::string::npos)
      << Describe(r);
  r = Ctl({"key", "get", "huge", "k", "--chunk-limit", "10001"});
  EXPECT_EQ(r.exit_code, 2) << Describe(r);
}

TEST_F(RackhubctlTest, QuotaOverrunRefused) {
  ASSERT_EQ(Ctl({"tenant", "create", "small", "--workers", "1", "--max-keys", "1"}).exit_code, 0);
  ASSERT_EQ(Ctl({"key", "create", "small", "a", "--elements", "10"}).exit_code, 0);
  CommandResult r = Ctl({"key", "create", "small", "b", "--elements", "10"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("rackhubctl: RESOURCE_EXHAUSTED: "), std::string::npos) << Describe(r);
  std::string out = Ok({"key", "list", "small"});
  EXPECT_FALSE(Row(out, "a").empty()) << out;
  EXPECT_TRUE(Row(out, "b").empty()) << out;

  // Raising the quota lets the key in.
  Ok({"tenant", "update-quotas", "small", "--max-keys", "2"});
  r = Ctl({"key", "create", "small", "b", "--elements", "10"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Row(Ok({"key", "list", "small"}), "b").empty());

  // Parameter bytes: 20000 fp32 elements are 80000 bytes > 64 KiB.
  ASSERT_EQ(Ctl({"tenant", "create", "tiny", "--workers", "1", "--max-param-bytes", "64KiB"})
                .exit_code,
            0);
  r = Ctl({"key", "create", "tiny", "big", "--elements", "20000"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("RESOURCE_EXHAUSTED"), std::string::npos) << Describe(r);
  EXPECT_TRUE(Row(Ok({"key", "list", "tiny"}), "big").empty());
  // The quota counts hub memory, not only parameters: 24 KB of fp32
  // parameters hold two parameter buffers and an accumulator (> 64 KiB).
  r = Ctl({"key", "create", "tiny", "mid", "--elements", "6000"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("quotas.max_parameter_bytes: key 'mid' needs "), std::string::npos)
      << Describe(r);
  EXPECT_NE(r.err.find("of hub memory for 23.4 KiB of parameters"), std::string::npos)
      << Describe(r);
  r = Ctl({"key", "create", "tiny", "small", "--elements", "4000"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string memory = Field(r.out, "memory bytes");
  EXPECT_GT(std::stoull(memory), 3u * 16000u) << r.out;
  EXPECT_EQ(Field(Ok({"tenant", "get", "tiny"}), "memory bytes"), memory);
}

TEST_F(RackhubctlTest, Stats) {
  Ok({"tenant", "create", "st", "--workers", "2"});
  Ok({"key", "create", "st", "k", "--elements", "1000"});
  std::string out = Ok({"stats"});
  EXPECT_EQ(Field(out, "lanes"), "2") << out;
  EXPECT_EQ(Field(out, "tenants"), "1") << out;
  EXPECT_EQ(Field(out, "admin listen"), daemon_->admin_address()) << out;
  const auto row = Row(out, "st");
  ASSERT_GE(row.size(), 2u) << out;
  EXPECT_EQ(row[1], "1") << "one key:\n" << out;

  out = Ok({"stats", "st"});
  EXPECT_FALSE(Row(out, "st").empty()) << out;

  out = Ok({"--json", "stats"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_NE(out.find("\"tenants\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"daemon\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"lanes\": 2"), std::string::npos) << out;
  EXPECT_NE(out.find("\"name\": \"st\""), std::string::npos) << out;
}

TEST_F(RackhubctlTest, JsonOutput) {
  // --json may come after the command words too.
  CommandResult r = Ctl({"tenant", "create", "js", "--workers", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(LooksLikeJsonObject(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"token\": \""), std::string::npos) << r.out;

  std::string out = Ok({"--json", "tenant", "get", "js"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_NE(out.find("\"name\": \"js\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"workers_per_rack\": 3"), std::string::npos) << out;
  // Zero-valued fields are printed too.
  EXPECT_NE(out.find("\"key_count\": 0"), std::string::npos) << out;

  out = Ok({"--json", "tenant", "list"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_NE(out.find("\"tenants\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"js\""), std::string::npos) << out;

  Ok({"key", "create", "js", "k", "--elements", "20000"});
  out = Ok({"key", "list", "js", "--json"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_NE(out.find("\"keys\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"name\": \"k\""), std::string::npos) << out;
  out = Ok({"key", "get", "js", "k", "--json"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_NE(out.find("\"chunks\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"first_element\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"dtype\": \"FP32\""), std::string::npos) << out;

  // Errors stay text on stderr.
  r = Ctl({"--json", "tenant", "get", "nope"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("rackhubctl: NOT_FOUND: "), std::string::npos) << Describe(r);
}

TEST_F(RackhubctlTest, ServerRejectionsExitOne) {
  CommandResult r = Ctl({"tenant", "get", "ghost"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: NOT_FOUND: ", 0), 0u) << Describe(r);
  EXPECT_NE(r.err.find("ghost"), std::string::npos) << Describe(r);

  r = Ctl({"key", "create", "ghost", "k", "--elements", "1"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << Describe(r);

  Ok({"tenant", "create", "dup", "--workers", "1"});
  r = Ctl({"tenant", "create", "dup", "--workers", "1"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: ALREADY_EXISTS: ", 0), 0u) << Describe(r);
  Ok({"key", "create", "dup", "k", "--elements", "5"});
  r = Ctl({"key", "create", "dup", "k", "--elements", "5"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("ALREADY_EXISTS"), std::string::npos) << Describe(r);

  // Well-formed on the command line, refused by the daemon's validation.
  r = Ctl({"tenant", "create", "zero", "--workers", "0"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << Describe(r);
  r = Ctl({"tenant", "create", "BAD NAME", "--workers", "1"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << Describe(r);
  EXPECT_TRUE(Row(Ok({"tenant", "list"}), "zero").empty());
}

// ---- checkpoint create|list|delete|restore --------------------------------

// Rows of the first table of `out` whose header row starts with `header`, up
// to the first empty line.
std::vector<std::vector<std::string>> TableRows(const std::string& out, const std::string& header) {
  std::vector<std::vector<std::string>> rows;
  bool in_table = false;
  for (const auto& line : Lines(out)) {
    const auto words = Words(line);
    if (!in_table) {
      in_table = !words.empty() && words[0] == header;
      continue;
    }
    if (words.empty()) break;
    rows.push_back(words);
  }
  return rows;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The daemon runs with a state directory (DaemonProcess's default), so
// checkpoints are on.
TEST_F(RackhubctlTest, CheckpointLifecycle) {
  Ok({"tenant", "create", "ck", "--workers", "1"});
  Ok({"key", "create", "ck", "w", "--elements", "20000"});
  Ok({"key", "create", "ck", "b", "--elements", "10", "--optimizer", "adam", "--lr", "0.001"});

  // An untrained tenant: every key at iteration 0.
  std::string out = Ok({"checkpoint", "create", "ck"});
  EXPECT_TRUE(Contains(out, "created checkpoint 1 of tenant 'ck'")) << out;
  EXPECT_EQ(Field(out, "sequence"), "1") << out;
  const std::string path1 = Field(out, "path");
  EXPECT_EQ(path1.rfind(daemon_->state_dir() + "/checkpoints/", 0), 0u) << out;
  EXPECT_EQ(std::filesystem::path(path1).filename(), "ckpt-00000000000000000001.rhc") << out;
  ASSERT_TRUE(std::filesystem::exists(path1)) << out;
  const uint64_t size1 = std::filesystem::file_size(path1);
  EXPECT_GT(size1, 80000u) << "w's 20000 fp32 parameters at least";
  EXPECT_EQ(Words(Field(out, "size"))[0], std::to_string(size1)) << out;
  EXPECT_EQ(Field(out, "keys"), "2") << out;
  auto keys = TableRows(out, "KEY");
  ASSERT_EQ(keys.size(), 2u) << out;
  for (const auto& row : keys) EXPECT_EQ(row[1], "0") << out;
  EXPECT_EQ(Row(out, "w").size(), 2u) << out;
  EXPECT_EQ(Row(out, "b").size(), 2u) << out;

  out = Ok({"checkpoint", "create", "ck", "--timeout-ms", "5000"});
  EXPECT_EQ(Field(out, "sequence"), "2") << out;
  const std::string path2 = Field(out, "path");
  EXPECT_EQ(std::filesystem::path(path2).filename(), "ckpt-00000000000000000002.rhc") << out;

  // Newest first, with sizes and the keys' iterations; nothing damaged.
  out = Ok({"checkpoint", "list", "ck"});
  EXPECT_EQ(Words(Lines(out)[0])[0], "SEQUENCE") << out;
  EXPECT_TRUE(Contains(Lines(out)[0], "PROBLEM")) << out;
  auto rows = TableRows(out, "SEQUENCE");
  ASSERT_EQ(rows.size(), 2u) << out;
  EXPECT_EQ(rows[0][0], "2") << out;
  EXPECT_EQ(rows[1][0], "1") << out;
  EXPECT_NE(std::find(rows[1].begin(), rows[1].end(), std::to_string(size1)), rows[1].end()) << out;
  const std::string size2 = std::to_string(std::filesystem::file_size(path2));
  EXPECT_NE(std::find(rows[0].begin(), rows[0].end(), size2), rows[0].end()) << out;
  EXPECT_TRUE(Contains(out, "w@0")) << out;
  EXPECT_TRUE(Contains(out, "b@0")) << out;
  EXPECT_FALSE(Contains(out, "DAMAGED")) << out;

  out = Ok({"--json", "checkpoint", "list", "ck"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_TRUE(Contains(out, "\"checkpoints\"")) << out;
  EXPECT_TRUE(Contains(out, "\"problem\": \"\"")) << out;
  EXPECT_TRUE(Contains(out, "\"key\": \"w\"")) << out;
  EXPECT_LT(out.find("ckpt-00000000000000000002.rhc"), out.find("ckpt-00000000000000000001.rhc"))
      << "newest first:\n" << out;

  out = Ok({"checkpoint", "delete", "ck", "1"});
  EXPECT_TRUE(Contains(out, "deleted checkpoint 1 of tenant 'ck'")) << out;
  EXPECT_FALSE(std::filesystem::exists(path1));
  rows = TableRows(Ok({"checkpoint", "list", "ck"}), "SEQUENCE");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], "2");
  CommandResult r = Ctl({"checkpoint", "delete", "ck", "1"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: NOT_FOUND: ", 0), 0u) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "ckpt-00000000000000000001.rhc")) << Describe(r);

  // Restore: the newest valid one by default, or the one named.
  out = Ok({"checkpoint", "restore", "ck"});
  EXPECT_TRUE(Contains(out, "restored tenant 'ck' to checkpoint 2")) << out;
  EXPECT_EQ(Field(out, "sequence"), "2") << out;
  EXPECT_EQ(TableRows(out, "KEY").size(), 2u) << out;
  out = Ok({"checkpoint", "restore", "ck", "2", "--json"});
  EXPECT_TRUE(LooksLikeJsonObject(out)) << out;
  EXPECT_TRUE(Contains(out, "\"sequence\": \"2\"")) << out;
  r = Ctl({"checkpoint", "restore", "ck", "99"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.out, "") << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: NOT_FOUND: ", 0), 0u) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "ckpt-00000000000000000099.rhc")) << Describe(r);
  // The keys are still there and usable after the restores.
  EXPECT_FALSE(Row(Ok({"key", "list", "ck"}), "w").empty());

  // An unknown tenant: the daemon's NOT_FOUND naming it, for every command.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"checkpoint", "create", "ghost"},
        {"checkpoint", "list", "ghost"},
        {"checkpoint", "delete", "ghost", "1"},
        {"checkpoint", "restore", "ghost"}}) {
    r = Ctl(args);
    SCOPED_TRACE(args[1]);
    EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
    EXPECT_EQ(r.err.rfind("rackhubctl: NOT_FOUND: ", 0), 0u) << Describe(r);
    EXPECT_TRUE(Contains(r.err, "ghost")) << Describe(r);
  }

  // A tenant without checkpoints.
  Ok({"tenant", "create", "fresh", "--workers", "1"});
  EXPECT_TRUE(Contains(Ok({"checkpoint", "list", "fresh"}), "no checkpoints of tenant 'fresh'"));
  r = Ctl({"checkpoint", "restore", "fresh"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "fresh")) << Describe(r);
}

TEST_F(RackhubctlTest, CheckpointDamagedFileListedNotRestored) {
  Ok({"tenant", "create", "dmg", "--workers", "1"});
  Ok({"key", "create", "dmg", "k", "--elements", "5000"});
  Ok({"checkpoint", "create", "dmg"});
  const std::string path = Field(Ok({"checkpoint", "create", "dmg"}), "path");
  ASSERT_FALSE(path.empty());
  // Overwrite 8 bytes in the middle of the 64-byte header (manifest checksum
  // field, covered by the header checksum).
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(24);
    f.write("XXXXXXXX", 8);
  }

  std::string out = Ok({"checkpoint", "list", "dmg"});
  const auto rows = TableRows(out, "SEQUENCE");
  ASSERT_EQ(rows.size(), 2u) << out;
  EXPECT_EQ(rows[0][0], "2") << out;
  EXPECT_TRUE(Contains(Lines(out)[1], "DAMAGED:")) << out;
  EXPECT_TRUE(Contains(Lines(out)[1], "header checksum mismatch")) << out;
  EXPECT_TRUE(Contains(Lines(out)[1], path)) << out;
  EXPECT_FALSE(Contains(Lines(out)[2], "DAMAGED")) << out;
  EXPECT_TRUE(Contains(Lines(out)[2], "k@0")) << out;
  EXPECT_TRUE(Contains(out, "checkpoint 2 is damaged")) << out;
  out = Ok({"--json", "checkpoint", "list", "dmg"});
  EXPECT_TRUE(Contains(out, "header checksum mismatch")) << out;

  // Restore skips it; naming it fails with the reason.
  out = Ok({"checkpoint", "restore", "dmg"});
  EXPECT_EQ(Field(out, "sequence"), "1") << out;
  CommandResult r = Ctl({"checkpoint", "restore", "dmg", "2"});
  EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
  EXPECT_EQ(r.err.rfind("rackhubctl: FAILED_PRECONDITION: ", 0), 0u) << Describe(r);
  EXPECT_TRUE(Contains(r.err, "header checksum mismatch")) << Describe(r);

  // A damaged file can be deleted like any other.
  Ok({"checkpoint", "delete", "dmg", "2"});
  EXPECT_EQ(TableRows(Ok({"checkpoint", "list", "dmg"}), "SEQUENCE").size(), 1u);
}

TEST_F(RackhubctlTest, TenantDeleteRemovesItsCheckpoints) {
  Ok({"tenant", "create", "gone", "--workers", "1"});
  Ok({"key", "create", "gone", "k", "--elements", "100"});
  Ok({"tenant", "create", "stays", "--workers", "1"});
  Ok({"key", "create", "stays", "k", "--elements", "100"});
  const std::string path = Field(Ok({"checkpoint", "create", "gone"}), "path");
  const std::string other = Field(Ok({"checkpoint", "create", "stays"}), "path");
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << path;
  EXPECT_EQ(dir.parent_path(), std::filesystem::path(daemon_->state_dir()) / "checkpoints");

  Ok({"tenant", "delete", "gone"});
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  EXPECT_TRUE(std::filesystem::exists(other)) << "another tenant's checkpoints stay";
  // A new tenant of the same name starts without checkpoints.
  Ok({"tenant", "create", "gone", "--workers", "1"});
  EXPECT_TRUE(Contains(Ok({"checkpoint", "list", "gone"}), "no checkpoints of tenant 'gone'"));
}

TEST(RackhubctlCheckpoint, InMemoryDaemonSaysWhy) {
  DaemonProcess daemon({"--lanes", "2", "--in-memory"});
  ASSERT_TRUE(daemon.started());
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--admin", daemon.admin_address()});
    return Rackhubctl(std::move(args));
  };
  ASSERT_EQ(ctl({"tenant", "create", "mem", "--workers", "1"}).exit_code, 0);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"checkpoint", "create", "mem"},
        {"checkpoint", "list", "mem"},
        {"checkpoint", "delete", "mem", "1"},
        {"checkpoint", "restore", "mem"}}) {
    const CommandResult r = ctl(args);
    SCOPED_TRACE(args[1]);
    EXPECT_EQ(r.exit_code, kExitRejected) << Describe(r);
    EXPECT_EQ(r.err.rfind("rackhubctl: FAILED_PRECONDITION: checkpoints need a state directory", 0),
              0u)
        << Describe(r);
  }
}

// Usage errors never reach a daemon: the address below is unreachable, so
// exit 2 (not 3) proves the command line was rejected first.
TEST(RackhubctlUsage, UsageErrorsExitTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"frobnicate"}, "frobnicate"},
      {{"tenant", "explode", "x"}, "tenant explode"},
      {{}, "command"},
      {{"tenant", "create", "t"}, "--workers"},
      {{"tenant", "create", "t", "--workers", "many"}, "many"},
      {{"key", "create", "t", "k", "--elements", "abc"}, "abc"},
      {{"key", "create", "t", "k"}, "--elements"},
      {{"tenant", "create", "t", "--workers", "1", "--chunk-bytes", "12XB"}, "12XB"},
      {{"tenant", "create", "t", "--workers", "1", "--max-param-bytes", "lots"}, "lots"},
      {{"tenant", "create", "t", "--workers", "1", "--no-such-flag"}, "--no-such-flag"},
      {{"tenant", "get"}, "NAME"},
      {{"key", "get", "t", "k", "extra"}, "extra"},
      {{"key", "create", "t", "k", "--elements", "1", "--dtype", "fp64"}, "fp64"},
      {{"key", "create", "t", "k", "--elements", "1", "--optimizer", "lion"}, "lion"},
      {{"key", "create", "t", "k", "--elements", "1", "--optimizer", "sgd", "--lr", "fast"}, "fast"},
      {{"tenant", "list", "--elements", "3"}, "--elements"},
      {{"tenant", "list", "--timeout", "soon"}, "soon"},
      {{"checkpoint"}, "checkpoint"},
      {{"checkpoint", "create"}, "TENANT"},
      {{"checkpoint", "create", "t", "--timeout-ms", "soon"}, "soon"},
      {{"checkpoint", "delete", "t"}, "SEQUENCE"},
      {{"checkpoint", "delete", "t", "0"}, "SEQUENCE: '0' is not a positive integer"},
      {{"checkpoint", "restore", "t", "newest"}, "SEQUENCE: 'newest' is not a positive integer"},
      {{"checkpoint", "restore", "t", "1", "2"}, "'2'"},
  };
  for (const auto& [args, needle] : cases) {
    std::vector<std::string> argv = {"--admin", "127.0.0.1:1"};
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = Rackhubctl(argv);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    SCOPED_TRACE("rackhubctl " + joined);
    EXPECT_EQ(r.exit_code, kExitUsage) << Describe(r);
    EXPECT_EQ(r.out, "") << Describe(r);
    EXPECT_NE(r.err.find(needle), std::string::npos) << "message should name '" << needle
                                                     << "'\n" << Describe(r);
    EXPECT_NE(r.err.find("--help"), std::string::npos) << Describe(r);
    EXPECT_EQ(Lines(r.err).size(), 1u) << "one line:\n" << Describe(r);
  }

  const CommandResult help = Rackhubctl({"--help"});
  EXPECT_EQ(help.exit_code, 0) << Describe(help);
  for (const char* word : {"tenant create", "update-quotas", "set-optimizer", "stats",
                           "checkpoint create", "checkpoint restore", "--admin",
                           "--token-file", "--tls-ca", "--json", "--timeout", "KiB"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << "help should mention " << word;
  }

  const TempDir temp;
  const std::string& dir = temp.path();
  const CommandResult r =
      Rackhubctl({"--admin", "127.0.0.1:1", "--token-file", dir + "/missing", "tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitUsage) << Describe(r);
  EXPECT_NE(r.err.find(dir + "/missing"), std::string::npos) << Describe(r);
}

TEST(RackhubctlUnreachable, RefusedConnectionExitsThreeQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = Rackhubctl({"--admin", "127.0.0.1:1", "--timeout", "5", "tenant", "list"});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, kExitUnreachable) << Describe(r);
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << Describe(r);
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << Describe(r);
  EXPECT_LT(elapsed, std::chrono::seconds(6));
}

TEST(RackhubctlUnreachable, SilentPeerHitsDeadline) {
  // A listening socket that never speaks HTTP/2: the call must give up at
  // --timeout.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = Rackhubctl({"--admin", address, "--timeout", "1", "stats"});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  close(fd);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, kExitUnreachable) << Describe(r);
  EXPECT_NE(r.err.find("DEADLINE_EXCEEDED"), std::string::npos) << Describe(r);
  EXPECT_NE(r.err.find(address), std::string::npos) << Describe(r);
  EXPECT_GE(elapsed, std::chrono::milliseconds(900));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
}

TEST(RackhubctlAuth, AdminTokenRequired) {
  const TempDir temp;
  const std::string& dir = temp.path();
  WriteFile(dir + "/admin.token", "s3cret-admin-token-0123456789\n");
  WriteFile(dir + "/readonly.token", "read-only-token-9876543210\n");
  DaemonProcess daemon({"--lanes", "2", "--admin-token-file", dir + "/admin.token",
                        "--admin-readonly-token-file", dir + "/readonly.token"});
  ASSERT_TRUE(daemon.started());
  // Client token files: whitespace around the token is trimmed.
  WriteFile(dir + "/client.token", "  s3cret-admin-token-0123456789 \n\n");
  WriteFile(dir + "/wrong.token", "not-the-token\n");
  WriteFile(dir + "/client-ro.token", "read-only-token-9876543210");
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--admin", daemon.admin_address()});
    return Rackhubctl(std::move(args));
  };

  CommandResult r = ctl({"tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitAuth) << Describe(r);
  EXPECT_NE(r.err.find("UNAUTHENTICATED"), std::string::npos) << Describe(r);

  r = ctl({"--token-file", dir + "/wrong.token", "tenant", "create", "a", "--workers", "1"});
  EXPECT_EQ(r.exit_code, kExitAuth) << Describe(r);
  EXPECT_NE(r.err.find("UNAUTHENTICATED"), std::string::npos) << Describe(r);

  r = ctl({"--token-file", dir + "/client.token", "tenant", "create", "a", "--workers", "1"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = ctl({"tenant", "list", "--token-file", dir + "/client.token"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Row(r.out, "a").empty()) << Describe(r);

  // The read-only token reads but cannot change anything.
  r = ctl({"--token-file", dir + "/client-ro.token", "tenant", "get", "a"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = ctl({"--token-file", dir + "/client-ro.token", "tenant", "delete", "a"});
  EXPECT_EQ(r.exit_code, kExitAuth) << Describe(r);
  EXPECT_NE(r.err.find("PERMISSION_DENIED"), std::string::npos) << Describe(r);
  r = ctl({"--token-file", dir + "/client.token", "tenant", "get", "a"});
  EXPECT_EQ(r.exit_code, 0) << "still there after the refused delete\n" << Describe(r);
}

// Runs openssl with `args` in `dir`; true on success.
bool OpenSsl(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  std::vector<std::string> argv = {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", dir};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult r = RunCommand(argv);
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  return r.exit_code == 0;
}

// Admin API over TLS with client certificates: a throwaway CA signs a server
// certificate for "rackhub.test" and a client certificate.
TEST(RackhubctlTls, MutualTls) {
  if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "no openssl command";
  const TempDir temp;
  const std::string& dir = temp.path();
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  const auto with = [&ec](std::vector<std::string> head, std::vector<std::string> tail) {
    head.insert(head.end(), ec.begin(), ec.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  };
  WriteFile(dir + "/server.ext", "subjectAltName=DNS:rackhub.test\n");
  ASSERT_TRUE(OpenSsl(dir, with({"req", "-x509"}, {"-keyout", "ca.key", "-out", "ca.pem", "-subj",
                                                   "/CN=rackhub-test-ca", "-days", "2"})));
  ASSERT_TRUE(OpenSsl(dir, with({"req"}, {"-keyout", "server.key", "-out", "server.csr", "-subj",
                                          "/CN=rackhub.test"})));
  ASSERT_TRUE(OpenSsl(dir, {"x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey",
                            "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2",
                            "-extfile", "server.ext"}));
  ASSERT_TRUE(OpenSsl(dir, with({"req"}, {"-keyout", "client.key", "-out", "client.csr", "-subj",
                                          "/CN=operator"})));
  ASSERT_TRUE(OpenSsl(dir, {"x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey",
                            "ca.key", "-CAcreateserial", "-out", "client.pem", "-days", "2"}));
  WriteFile(dir + "/rackhubd.toml", "[admin]\ntls_cert_file = \"" + dir +
                                        "/server.pem\"\ntls_key_file = \"" + dir +
                                        "/server.key\"\ntls_client_ca_file = \"" + dir +
                                        "/ca.pem\"\n");
  DaemonProcess daemon({"--lanes", "2", "--config", dir + "/rackhubd.toml"});
  ASSERT_TRUE(daemon.started());
  const std::vector<std::string> tls = {"--tls-ca",  dir + "/ca.pem",  "--tls-cert",
                                        dir + "/client.pem", "--tls-key", dir + "/client.key"};
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--admin", daemon.admin_address(), "--timeout", "5"});
    return Rackhubctl(std::move(args));
  };
  const auto concat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };

  CommandResult r = ctl(concat(concat(tls, {"--tls-server-name", "rackhub.test"}),
                               {"tenant", "create", "secure", "--workers", "1"}));
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  r = ctl(concat(concat(tls, {"--tls-server-name", "rackhub.test"}), {"tenant", "list"}));
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_FALSE(Row(r.out, "secure").empty()) << Describe(r);

  // Plaintext, no client certificate, or a name the certificate does not
  // carry (127.0.0.1): no connection.
  r = ctl({"tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitUnreachable) << Describe(r);
  r = ctl({"--tls-ca", dir + "/ca.pem", "--tls-server-name", "rackhub.test", "tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitUnreachable) << Describe(r);
  r = ctl(concat(tls, {"tenant", "list"}));
  EXPECT_EQ(r.exit_code, kExitUnreachable) << Describe(r);
  EXPECT_NE(r.err.find(daemon.admin_address()), std::string::npos) << Describe(r);

  // Unreadable TLS files and half a key pair are local errors.
  r = ctl({"--tls-ca", dir + "/missing.pem", "tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitUsage) << Describe(r);
  EXPECT_NE(r.err.find("missing.pem"), std::string::npos) << Describe(r);
  r = ctl({"--tls-ca", dir + "/ca.pem", "--tls-cert", dir + "/client.pem", "tenant", "list"});
  EXPECT_EQ(r.exit_code, kExitUsage) << Describe(r);
  EXPECT_NE(r.err.find("--tls-key"), std::string::npos) << Describe(r);
}

}  // namespace
}  // namespace rackhub
