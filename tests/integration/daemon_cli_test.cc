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
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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


// A state directory given empty is an error, never replaced by a default
// (a script's unset variable must not land in the system's registry).
TEST(StateDirTest, AnEmptyStateDirIsAConfigurationError) {
  for (const auto& args : {std::vector<std::string>{"--state-dir="},
                           std::vector<std::string>{"--state-dir", ""}}) {
    std::vector<std::string> argv = {BinPath("rackhubd"), "--check-config"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, kExitConfigError) << r.out;
    EXPECT_TRUE(r.err.find("--state-dir: missing value") != std::string::npos ||
                r.err.find("state.dir: is empty") != std::string::npos)
        << r.err;
  }
  testing::CommandResult r;
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/empty.toml", "[state]\ndir = \"\"\n");
  r = RunCommand({BinPath("rackhubd"), "--check-config", dir + "/empty.toml"});
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.out;
  EXPECT_NE(r.err.find("state.dir: is empty"), std::string::npos) << r.err;
  // Given in the file, it is used as given.
  testing::WriteFile(dir + "/given.toml", "[state]\ndir = \"" + dir + "/s\"\n");
  r = RunCommand({BinPath("rackhubd"), "--check-config", dir + "/given.toml"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("state: " + dir + "/s\n"), std::string::npos) << r.out;
}

// rackhubd as a normal user, as a newcomer first runs it: without a state
// directory in the config or on the command line and without write access
// to /var/lib/rackhub, it uses a per-user one and says so; with no home to
// put it in, the error names the flags that fix it.
TEST(StateDirTest, AUserWhoCannotWriteTheSystemDirectoryGetsAPerUserOne) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run rackhubd as user nobody (setpriv)";
  ASSERT_EQ(access("/usr/bin/setpriv", X_OK), 0)
      << "/usr/bin/setpriv (util-linux, essential in Debian) is missing";
  const std::string home = testing::MakeTempDir();
  ASSERT_EQ(chown(home.c_str(), 65534, 65534), 0) << std::strerror(errno);
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534",
                                              "--regid=65534", "--clear-groups", "/usr/bin/env",
                                              "-i"};
  auto command = [&](std::vector<std::string> env, std::vector<std::string> args) {
    std::vector<std::string> argv = as_nobody;
    argv.insert(argv.end(), env.begin(), env.end());
    argv.push_back(BinPath("rackhubd"));
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
  // --check-config shows the choice.
  auto r = RunCommand(command({"HOME=" + home}, {"--check-config"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("state: " + home + "/.local/state/rackhub\n"), std::string::npos) << r.out;
  r = RunCommand(command({"HOME=" + home, "XDG_STATE_HOME=" + home + "/xdg"}, {"--check-config"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("state: " + home + "/xdg/rackhub\n"), std::string::npos) << r.out;
  // An explicit directory is used as given (and not replaced when unusable).
  r = RunCommand(command({"HOME=" + home}, {"--check-config", "--state-dir", "/var/lib/rackhub"}));
  EXPECT_NE(r.out.find("state: /var/lib/rackhub\n"), std::string::npos) << r.out;

  // The daemon starts, logs the choice and keeps its registry there.
  const std::string ready = home + "/ready";
  const std::string log_path = home + "/rackhubd.log";
  testing::ChildProcess daemon(
      command({"HOME=" + home}, {"--admin-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
                                 "--no-metrics", "--lanes", "1", "--ready-file", ready}),
      log_path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(ready) && daemon.running() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(ready)) << testing::ReadFile(log_path);
  daemon.Kill(SIGTERM);
  EXPECT_EQ(daemon.Wait(std::chrono::seconds(30)), 0) << testing::ReadFile(log_path);
  const std::string log = testing::ReadFile(log_path);
  EXPECT_NE(log.find("state.dir: not set and /var/lib/rackhub is not writable by this user: "
                     "using the per-user " + home + "/.local/state/rackhub (set --state-dir DIR, "
                     "or --in-memory to keep no state)"),
            std::string::npos)
      << log;
  EXPECT_TRUE(std::filesystem::exists(home + "/.local/state/rackhub/registry.db")) << log;

  // No home: the system directory stays, and its error says what to do.
  r = RunCommand(command({}, {"--admin-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0",
                              "--no-metrics", "--lanes", "1"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("state.dir: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/var/lib/rackhub"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(set --state-dir DIR, or --in-memory to keep no state)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace rackhub
