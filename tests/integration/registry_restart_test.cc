// The registry survives a crash of the real rackhubd: tenants, keys, quotas,
// optimizer settings and data-plane tokens made through rackhubctl read back
// identical after `kill -9` and a restart on the same state directory, and a
// worker authenticates with its old token. A corrupt registry database stops
// rackhubd with exit 78 and a message naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "process.h"
#include "raw_client.h"

namespace rackhub {
namespace {

using testing::BinPath;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::RunCommand;
using testing::WriteFile;

constexpr int kExitConfigError = 78;

std::string Describe(const CommandResult& r) {
  return "exit=" + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "--- stderr:\n" +
         r.err;
}

class RegistryRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{"--lanes", "2"});
    ASSERT_TRUE(daemon_->started());
  }

  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {BinPath("rackhubctl"), "--admin", daemon_->admin_address()});
    return RunCommand(args);
  }
  std::string Ok(std::vector<std::string> args) {
    const CommandResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    return r.out;
  }
  // Everything the admin API shows about the registry (human and JSON).
  std::string Snapshot() {
    std::string s;
    for (const std::vector<std::string>& cmd :
         std::vector<std::vector<std::string>>{{"--json", "tenant", "list"},
                                               {"tenant", "list"},
                                               {"--json", "tenant", "get", "acme"},
                                               {"tenant", "get", "beta"},
                                               {"--json", "key", "list", "acme"},
                                               {"key", "list", "acme"},
                                               {"--json", "key", "get", "acme", "w"},
                                               {"key", "get", "acme", "b"},
                                               {"key", "list", "beta"}}) {
      s += "$";
      for (const auto& a : cmd) s += " " + a;
      s += "\n" + Ok(cmd);
    }
    return s;
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(RegistryRestartTest, EverythingSurvivesKill9AndRestart) {
  CommandResult r = Ctl({"tenant", "create", "acme", "--workers", "4"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string token = testing::OutputField(r.out, "data-plane token");
  ASSERT_FALSE(token.empty()) << r.out;
  r = Ctl({"tenant", "create", "beta", "--workers", "1", "--chunk-bytes", "64KiB"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const std::string beta_token = testing::OutputField(r.out, "data-plane token");
  Ok({"tenant", "create", "gone", "--workers", "1"});
  Ok({"tenant", "update-quotas", "acme", "--max-keys", "7", "--max-param-bytes", "1GiB"});
  Ok({"key", "create", "acme", "w", "--elements", "20000", "--optimizer", "momentum", "--lr", "0.1",
      "--momentum", "0.9"});
  Ok({"key", "create", "acme", "tmp", "--elements", "100"});
  Ok({"key", "create", "acme", "b", "--elements", "10000", "--dtype", "bf16"});
  Ok({"key", "create", "beta", "x", "--elements", "3"});
  Ok({"key", "set-optimizer", "acme", "w", "--lr", "0.05"});
  Ok({"key", "delete", "acme", "tmp"});
  Ok({"tenant", "delete", "gone"});
  // A refused request is not stored either.
  EXPECT_NE(Ctl({"tenant", "create", "acme", "--workers", "1"}).exit_code, 0);
  // (Taken before any worker connects: live counters are not registry state.)
  const std::string before = Snapshot();
  uint32_t handle = 0;
  {
    testing::RawClient worker(daemon_->data_address());
    handle = worker.Hello("acme", token, 0, 0).tenant_handle();
    ASSERT_NE(handle, 0u);
  }
  ASSERT_NE(before.find("0.05"), std::string::npos) << before;

  EXPECT_EQ(daemon_->Kill(), 128 + 9);
  ASSERT_TRUE(daemon_->Restart());
  EXPECT_NE(daemon_->Log().find("2 tenants, 3 keys"), std::string::npos) << daemon_->Log();
  EXPECT_EQ(Snapshot(), before);
  EXPECT_NE(Ctl({"tenant", "get", "gone"}).exit_code, 0);
  EXPECT_NE(Ctl({"key", "get", "acme", "tmp"}).exit_code, 0);

  // Workers authenticate with the tokens they had; the handle is the same.
  {
    testing::RawClient worker(daemon_->data_address());
    EXPECT_EQ(worker.Hello("acme", token, 0, 0).tenant_handle(), handle);
  }
  {
    testing::RawClient worker(daemon_->data_address());
    EXPECT_NE(worker.Hello("beta", beta_token, 0, 0).tenant_handle(), 0u);
  }
  {
    testing::RawClient worker(daemon_->data_address());
    EXPECT_EQ(worker.Hello("acme", beta_token, 0, 0).tenant_handle(), 0u);
  }

  // New objects get fresh ids; a graceful restart keeps them too.
  Ok({"tenant", "create", "gamma", "--workers", "1"});
  Ok({"key", "create", "acme", "later", "--elements", "10"});
  const std::string after_more = Snapshot();
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon_->Restart());
  EXPECT_EQ(Snapshot(), after_more);
  EXPECT_EQ(testing::OutputField(Ok({"tenant", "get", "gamma"}), "name"), "gamma");
}

TEST(RegistryStartUpTest, CorruptOrUnusableStateStopsTheDaemonWithExit78) {
  const std::string dir = MakeTempDir();
  const std::string db = dir + "/registry.db";
  const std::string garbage(4096, 'g');
  WriteFile(db, garbage);
  CommandResult r = RunCommand({BinPath("rackhubd"), "--admin-listen", "127.0.0.1:0",
                                "--data-listen", "127.0.0.1:0", "--no-metrics", "--state-dir", dir});
  EXPECT_EQ(r.exit_code, kExitConfigError) << Describe(r);
  EXPECT_NE(r.err.find("state.dir: " + db + ": file is not a database"), std::string::npos)
      << Describe(r);
  EXPECT_EQ(ReadFile(db), garbage) << "the bad file must be kept as it was";

  // A state directory that cannot be created.
  r = RunCommand({BinPath("rackhubd"), "--admin-listen", "127.0.0.1:0", "--data-listen",
                  "127.0.0.1:0", "--state-dir", db + "/state"});
  EXPECT_EQ(r.exit_code, kExitConfigError) << Describe(r);
  EXPECT_NE(r.err.find("state.dir: cannot create " + db + "/state"), std::string::npos)
      << Describe(r);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Two daemons on one state directory would write the same database and
// checkpoints: the second one refuses to start (exit 78) naming the first.
TEST(RegistryStartUpTest, OneDaemonPerStateDirectory) {
  DaemonProcess first({"--lanes", "1"});
  ASSERT_TRUE(first.started());
  CommandResult r = RunCommand({BinPath("rackhubd"), "--admin-listen", "127.0.0.1:0",
                                "--data-listen", "127.0.0.1:0", "--no-metrics", "--state-dir",
                                first.state_dir()});
  EXPECT_EQ(r.exit_code, kExitConfigError) << Describe(r);
  EXPECT_NE(r.err.find("state.dir: " + first.state_dir() + " is in use by another rackhubd (pid " +
                       std::to_string(first.pid()) + ")"),
            std::string::npos)
      << Describe(r);
  // After a crash the lock goes with the process: a restart is not refused.
  EXPECT_EQ(first.Kill(), 128 + 9);
  EXPECT_TRUE(first.Restart());
}

}  // namespace
}  // namespace rackhub
