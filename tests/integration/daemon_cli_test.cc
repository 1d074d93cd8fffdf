// rackhubd's command line as a process: `--check-config FILE` beside
// `--check-config --config FILE`, and the log in the journal's form
// ("<N>message", sd-daemon(3)) when JOURNAL_STREAM names its stderr, as
// systemd sets it (systemd.exec(5)).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "process.h"

namespace rackhub {
namespace {

using testing::BinPath;
using testing::RunCommand;

constexpr int kExitConfigError = 78;

const std::string kShippedConfig = std::string(RACKHUB_SOURCE_DIR) + "/deploy/rackhubd.toml";

TEST(CheckConfigFileTest, PositionalFileIsTheConfig) {
  auto r = RunCommand({BinPath("rackhubd"), "--check-config", kShippedConfig});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("configuration OK"), std::string::npos) << r.out;
  r = RunCommand({BinPath("rackhubd"), "--check-config=" + kShippedConfig});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The same file both ways is fine.
  r = RunCommand({BinPath("rackhubd"), "--check-config", kShippedConfig, "--config",
                  kShippedConfig});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Flags still override it.
  r = RunCommand({BinPath("rackhubd"), "--check-config", kShippedConfig, "--lanes", "7"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("7 lanes"), std::string::npos) << r.out;
}

TEST(CheckConfigFileTest, BadFilesAreNamed) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/bad.toml", "[admin]\nlisten = \"127.0.0.1:7701\"\ntoken_fiel = \"x\"\n");
  auto r = RunCommand({BinPath("rackhubd"), "--check-config", dir + "/bad.toml"});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("admin.token_fiel: unknown key (" + dir + "/bad.toml:3)"),
            std::string::npos)
      << r.err;
  r = RunCommand({BinPath("rackhubd"), "--check-config", dir + "/missing.toml"});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("rackhubd: config error: --check-config: cannot read '" + dir +
                       "/missing.toml'"),
            std::string::npos)
      << r.err;
  r = RunCommand({BinPath("rackhubd"), "--check-config", dir + "/bad.toml", "--config",
                  kShippedConfig});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("--check-config: '" + dir + "/bad.toml' is not the file --config names ('" +
                       kShippedConfig + "'); give the file once"),
            std::string::npos)
      << r.err;
}

// Runs rackhubd with stderr on a file and JOURNAL_STREAM set to
// `journal_stream(dev, inode of that file)`; returns its log once it
// exited (after SIGTERM once ready when `ready_file` is not empty).
struct JournalRun {
  int exit_code = -1;
  std::string log;
};
JournalRun RunWithJournalStream(std::vector<std::string> args, const std::string& dir,
                                bool matching, bool wait_ready) {
  const std::string log_path = dir + "/stderr.log";
  testing::WriteFile(log_path, "");
  struct stat st {};
  EXPECT_EQ(stat(log_path.c_str(), &st), 0);
  // The child opens the same file with O_TRUNC: the same device and inode.
  const std::string value = std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
                            std::to_string(static_cast<unsigned long long>(st.st_ino) +
                                           (matching ? 0 : 1));
  const std::string ready = dir + "/ready";
  args.insert(args.begin(), BinPath("rackhubd"));
  if (wait_ready) args.insert(args.end(), {"--ready-file", ready});
  setenv("JOURNAL_STREAM", value.c_str(), 1);
  testing::ChildProcess child(args, log_path);
  unsetenv("JOURNAL_STREAM");
  JournalRun run;
  if (wait_ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!std::filesystem::exists(ready) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(std::filesystem::exists(ready)) << testing::ReadFile(log_path);
    child.Kill(SIGTERM);
  }
  run.exit_code = child.Wait(std::chrono::seconds(10));
  run.log = testing::ReadFile(log_path);
  return run;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JournalLogTest, PriorityPrefixesWhenStderrIsTheJournal) {
  const std::string dir = testing::MakeTempDir();
  const JournalRun run = RunWithJournalStream(
      {"--in-memory", "--lanes", "1", "--transport", "tcp", "--no-metrics", "--admin-listen",
       "127.0.0.1:0", "--data-listen", "127.0.0.1:0"},
      dir, true, true);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  const auto lines = Lines(run.log);
  ASSERT_FALSE(lines.empty());
  // Every line: "<N>" and the message; no timestamp, no level name.
  const std::regex form("<[0-7]>[^<].*");
  for (const auto& line : lines) EXPECT_TRUE(std::regex_match(line, form)) << line;
  EXPECT_NE(run.log.find("<6>rackhubd "), std::string::npos) << run.log;  // info: "starting"
  EXPECT_NE(run.log.find("<4>state.in_memory: tenants and keys are not stored"),
            std::string::npos)
      << run.log;  // warn
  EXPECT_NE(run.log.find("<6>received Terminated, draining"), std::string::npos) << run.log;
  EXPECT_EQ(run.log.find(" info "), std::string::npos) << run.log;
}

TEST(JournalLogTest, CriticalIsPriorityTwo) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/not_a_dir", "x");
  const JournalRun run = RunWithJournalStream(
      {"--state-dir", dir + "/not_a_dir", "--lanes", "1", "--transport", "tcp", "--no-metrics",
       "--admin-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"},
      dir, true, false);
  EXPECT_EQ(run.exit_code, kExitConfigError) << run.log;
  EXPECT_NE(run.log.find("<2>state.dir: " + dir + "/not_a_dir is not a directory"),
            std::string::npos)
      << run.log;
}

// JOURNAL_STREAM inherited by a process whose stderr went elsewhere (a file,
// a terminal): the usual timestamped lines, with the same messages.
TEST(JournalLogTest, OtherStderrKeepsTheUsualForm) {
  const std::string dir = testing::MakeTempDir();
  const JournalRun run = RunWithJournalStream(
      {"--in-memory", "--lanes", "1", "--transport", "tcp", "--no-metrics", "--admin-listen",
       "127.0.0.1:0", "--data-listen", "127.0.0.1:0"},
      dir, false, true);
  EXPECT_EQ(run.exit_code, 0) << run.log;
  EXPECT_EQ(run.log.find("<6>"), std::string::npos) << run.log;
  const std::regex form(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (trace|debug|info|warning|error|critical) .*)");
  for (const auto& line : Lines(run.log)) EXPECT_TRUE(std::regex_match(line, form)) << line;
  EXPECT_NE(run.log.find(" warning state.in_memory: tenants and keys are not stored"),
            std::string::npos)
      << run.log;
}

}  // namespace
}  // namespace rackhub
