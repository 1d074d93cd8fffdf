// rackhubd as a process: config checking, start-up refusals, signals, and the
// systemd notify protocol (READY / WATCHDOG / STOPPING) on a real socket.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "process.h"
#include "raw_client.h"

namespace rackhub {
namespace {

using testing::BinPath;
using testing::DaemonProcess;
using testing::RunCommand;

constexpr int kExitConfigError = 78;

std::string WriteConfig(const std::string& text) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/rackhubd.toml", text);
  return dir + "/rackhubd.toml";
}

TEST(DaemonConfigTest, ShippedConfigIsValid) {
  const auto r = RunCommand({BinPath("rackhubd"), "--check-config", "--config",
                             std::string(RACKHUB_SOURCE_DIR) + "/deploy/rackhubd.toml"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("configuration OK"), std::string::npos) << r.out;
}

TEST(DaemonConfigTest, MisspelledKeyIsNamed) {
  const auto path = WriteConfig("[admin]\nlisten = \"127.0.0.1:7701\"\ntoken_fiel = \"x\"\n");
  const auto r = RunCommand({BinPath("rackhubd"), "--check-config", "--config", path});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("admin.token_fiel: unknown key"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(":3"), std::string::npos) << "the line is named: " << r.err;
}

TEST(DaemonConfigTest, BadValuesAreNamed) {
  struct Case {
    std::string toml, field;
  } cases[] = {
      {"[lanes]\ncount = \"many\"\n", "lanes.count"},
      {"[lanes]\npin = 3\n", "lanes.pin"},
      {"[data]\nlisten = \"127.0.0.1:99999\"\n", "data.listen"},
      {"log_level = \"loud\"\n", "log_level"},
      {"[tenants]\ndefault_chunk_bytes = 1000\n", "tenants.default_chunk_bytes"},
      {"[admin]\ntls_cert_file = \"/etc/hostname\"\n", "admin.tls"},
      {"[bogus]\nx = 1\n", "bogus"},
      {"[admin\nlisten = 1\n", "TOML syntax error"},
  };
  for (const auto& c : cases) {
    const auto r = RunCommand({BinPath("rackhubd"), "--check-config", "--config",
                               WriteConfig(c.toml)});
    EXPECT_EQ(r.exit_code, kExitConfigError) << c.toml;
    EXPECT_NE(r.err.find(c.field), std::string::npos) << c.toml << " -> " << r.err;
  }
}

TEST(DaemonConfigTest, FlagsOverrideTheFile) {
  const auto path = WriteConfig("[lanes]\ncount = 3\n[admin]\nlisten = \"127.0.0.1:7811\"\n");
  auto r = RunCommand({BinPath("rackhubd"), "--check-config", "--config", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 lanes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("127.0.0.1:7811"), std::string::npos) << r.out;
  r = RunCommand({BinPath("rackhubd"), "--check-config", "--config", path, "--lanes", "5",
                  "--admin-listen=127.0.0.1:7812"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("5 lanes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("127.0.0.1:7812"), std::string::npos) << r.out;
  r = RunCommand({BinPath("rackhubd"), "--check-config", "--lanes"});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("--lanes: missing value"), std::string::npos) << r.err;
  r = RunCommand({BinPath("rackhubd"), "--check-config", "--config", "/nonexistent.toml"});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("/nonexistent.toml"), std::string::npos) << r.err;
}

TEST(DaemonConfigTest, NonLoopbackAdminWithoutAuthIsRefusedAtStartup) {
  auto r = RunCommand({BinPath("rackhubd"), "--admin-listen", "0.0.0.0:0", "--data-listen",
                       "127.0.0.1:0"},
                      "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, kExitConfigError) << "must refuse, not start";
  EXPECT_NE(r.err.find("admin.listen: refusing to listen on 0.0.0.0:0"), std::string::npos)
      << r.err;
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/token", "t0ken\n");
  r = RunCommand({BinPath("rackhubd"), "--check-config", "--admin-listen", "0.0.0.0:0",
                  "--admin-token-file", dir + "/token"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(DaemonConfigTest, HelpAndVersion) {
  auto r = RunCommand({BinPath("rackhubd"), "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--check-config"), std::string::npos);
  r = RunCommand({BinPath("rackhubd"), "--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("rackhubd ", 0), 0u);
  r = RunCommand({BinPath("rackhubd"), "--frobnicate"});
  EXPECT_EQ(r.exit_code, kExitConfigError);
  EXPECT_NE(r.err.find("--frobnicate: unknown option"), std::string::npos);
}

TEST(DaemonLifecycleTest, SigtermAndSigintStopGracefully) {
  for (int sig : {SIGTERM, SIGINT}) {
    DaemonProcess d({"--lanes", "2"});
    ASSERT_TRUE(d.started());
    EXPECT_EQ(d.Stop(sig), 0) << d.Log();
    const std::string log = d.Log();
    EXPECT_NE(log.find("draining"), std::string::npos) << log;
    EXPECT_NE(log.find("stopped"), std::string::npos) << log;
  }
}

// A HELLO whose token is not UTF-8 is refused as MALFORMED like any payload
// that does not parse; the daemon logs the refusal its own way and nothing
// comes from libprotobuf, which printed an ERROR line per such HELLO raw to
// stderr (found by fuzz/control/control_fuzz).
TEST(DaemonLifecycleTest, HelloWithInvalidUtf8IsRefusedInTheDaemonsLog) {
  DaemonProcess d({"--lanes", "1"});
  ASSERT_TRUE(d.started());
  for (int i = 0; i < 3; ++i) {
    testing::RawClient c(d.data_address());
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    c.Send(h, std::string("\x0a\x03job\x12\x02\xff\xfe", 9));  // tenant "job", token ff fe
    testing::ExpectError(c.Receive(), net::WireError::kMalformed, "HELLO is not a Hello message");
  }
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  const std::string log = d.Log();
  EXPECT_NE(log.find("refused connection"), std::string::npos) << log;
  EXPECT_EQ(log.find("libprotobuf"), std::string::npos) << log;
}

TEST(DaemonLifecycleTest, BusyPortsFailStartupWithTheFieldNamed) {
  DaemonProcess first;
  ASSERT_TRUE(first.started());
  auto r = RunCommand({BinPath("rackhubd"), "--in-memory", "--admin-listen", "127.0.0.1:0",
                       "--data-listen", first.data_address()},
                      "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("data.listen: cannot listen on " + first.data_address()),
            std::string::npos)
      << r.err;
  r = RunCommand({BinPath("rackhubd"), "--in-memory", "--admin-listen", first.admin_address(),
                  "--data-listen", "127.0.0.1:0"},
                 "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("admin.listen: cannot listen on " + first.admin_address()),
            std::string::npos)
      << r.err;
}

// A fake systemd: a unix datagram socket named by NOTIFY_SOCKET.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = testing::MakeTempDir() + "/notify";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{0, 200 * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~NotifySocket() { close(fd_); }
  const std::string& path() const { return path_; }
  // Collects messages until one contains `what` or `timeout` passes.
  bool WaitFor(const std::string& what, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        received_.append(buf, static_cast<size_t>(n)).push_back('\n');
        if (std::string(buf, static_cast<size_t>(n)).find(what) != std::string::npos) return true;
      }
    }
    return false;
  }
  const std::string& received() const { return received_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string received_;
};

TEST(DaemonLifecycleTest, SystemdNotifyReadyWatchdogStopping) {
  NotifySocket notify;
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);  // ping expected every 100 ms
  DaemonProcess d({"--lanes", "2"});
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(d.started());
  ASSERT_TRUE(notify.WaitFor("READY=1", std::chrono::seconds(5))) << notify.received();
  EXPECT_NE(notify.received().find(d.admin_address()), std::string::npos)
      << "STATUS names the admin address: " << notify.received();
  // Several watchdog pings arrive while the lanes run.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(notify.WaitFor("WATCHDOG=1", std::chrono::seconds(2))) << notify.received();
  }
  kill(d.pid(), SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", std::chrono::seconds(5))) << notify.received();
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace rackhub
