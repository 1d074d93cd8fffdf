// `rackhubd --doctor` as a process on this host: the table's rows, a port
// the test holds, state directories that cannot work, a running rackhubd on
// the same state directory, data.transport = rdma without a verbs device,
// a locked-memory limit below what RDMA registers, and the exit codes.
#include <netinet/in.h>
#include <signal.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"

namespace rackhub {
namespace {

using testing::BinPath;
using testing::RunCommand;

constexpr int kExitConfigError = 78;

struct DoctorRow {
  std::string verdict;
  std::string text;  // detail and fix lines, joined by newlines
};

// Rows of the table by check name. A row starts at column 0 with the check
// name, its verdict in the RESULT column; lines that start with spaces
// continue the row above; a blank line ends the table.
std::map<std::string, DoctorRow> ParseTable(const std::string& out) {
  std::map<std::string, DoctorRow> rows;
  std::istringstream in(out);
  std::string line;
  size_t result_col = std::string::npos;
  std::string current;
  while (std::getline(in, line)) {
    if (line.rfind("CHECK ", 0) == 0) {
      result_col = line.find("RESULT");
      continue;
    }
    if (result_col == std::string::npos) continue;
    if (line.empty()) break;  // the summary follows the table after a blank line
    if (line[0] != ' ' && line.size() > result_col + 4) {
      std::string name = line.substr(0, result_col);
      name.erase(name.find_last_not_of(' ') + 1);
      current = name;
      rows[current] = {line.substr(result_col, 4), line.substr(result_col + 8)};
    } else if (!current.empty() && line[0] == ' ') {
      rows[current].text += '\n';
      rows[current].text += line.substr(line.find_first_not_of(' '));
    }
  }
  return rows;
}

// Every check of a single-rack hub, in the order printed.
const std::vector<std::string> kChecks = {
    "config",     "verbs devices", "memlock",     "data port",   "admin port",     "metrics port",
    "rdma port",  "state dir",     "state lock",  "registry db", "lanes vs cores", "NUMA"};

void ExpectEveryCheckWithFixes(const std::map<std::string, DoctorRow>& rows,
                               const std::string& out) {
  for (const auto& check : kChecks) EXPECT_EQ(rows.count(check), 1u) << check << "\n" << out;
  for (const auto& [check, row] : rows) {
    EXPECT_TRUE(row.verdict == "PASS" || row.verdict == "WARN" || row.verdict == "FAIL" ||
                row.verdict == "SKIP")
        << check << ": " << row.verdict;
    if (row.verdict == "WARN" || row.verdict == "FAIL") {
      EXPECT_NE(row.text.find("\nfix: "), std::string::npos) << check << " has no fix:\n" << out;
    }
  }
}

// A TCP socket bound to 127.0.0.1 on a kernel-chosen port and listening.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~HeldPort() { close(fd_); }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Loopback ephemeral ports and a state directory that does not exist yet.
std::vector<std::string> Args(const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {BinPath("rackhubd"),  "--doctor",
                                   "--data-listen",      "127.0.0.1:0",
                                   "--admin-listen",     "127.0.0.1:0",
                                   "--metrics-listen",   "127.0.0.1:0",
                                   "--state-dir",        dir + "/state"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

size_t AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  return static_cast<size_t>(CPU_COUNT(&set));
}

bool HostHasVerbsDevice() {
  std::error_code ec;
  return std::filesystem::exists("/sys/class/infiniband", ec) &&
         !std::filesystem::is_empty("/sys/class/infiniband", ec);
}

TEST(DoctorTest, EveryCheckRunsOnThisHost) {
  const std::string dir = testing::MakeTempDir();
  const auto r = RunCommand(Args(dir, {"--transport", "tcp", "--lanes", "0"}), "",
                            std::chrono::seconds(10));
  const auto rows = ParseTable(r.out);
  ExpectEveryCheckWithFixes(rows, r.out);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("0 FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("config").verdict, "PASS");
  EXPECT_EQ(rows.at("data port").verdict, "PASS") << r.out;
  EXPECT_EQ(rows.at("admin port").verdict, "PASS") << r.out;
  EXPECT_EQ(rows.at("metrics port").verdict, "PASS") << r.out;
  // data.transport = tcp: nothing of RDMA applies.
  EXPECT_EQ(rows.at("verbs devices").verdict, "SKIP") << r.out;
  EXPECT_EQ(rows.at("memlock").verdict, "SKIP") << r.out;
  EXPECT_EQ(rows.at("rdma port").verdict, "SKIP") << r.out;
  // The state directory does not exist: creatable, and --doctor left it so.
  EXPECT_EQ(rows.at("state dir").verdict, "PASS") << r.out;
  EXPECT_NE(rows.at("state dir").text.find("does not exist; rackhubd creates it"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/state"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            0)
      << "no probe left behind";
  // One lane per available cpu.
  EXPECT_EQ(rows.at("lanes vs cores").verdict, "PASS") << r.out;
  EXPECT_NE(rows.at("lanes vs cores").text.find(std::to_string(AvailableCpus()) + " lanes"),
            std::string::npos)
      << r.out;
  EXPECT_NE(rows.at("NUMA").text.find("NUMA node"), std::string::npos) << r.out;
  // Port 0 is always free.
  EXPECT_NE(rows.at("data port").text.find("port 0"), std::string::npos) << r.out;
}

TEST(DoctorTest, PortsInUseFailWithTheCommandThatNamesTheHolder) {
  const std::string dir = testing::MakeTempDir();
  HeldPort data, admin;
  const auto r = RunCommand(Args(dir, {"--transport", "tcp", "--data-listen", data.address(),
                                       "--admin-listen", admin.address()}),
                            "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto rows = ParseTable(r.out);
  ExpectEveryCheckWithFixes(rows, r.out);  // every check ran despite the failures
  ASSERT_EQ(rows.count("data port"), 1u) << r.out;
  EXPECT_EQ(rows.at("data port").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("data port").text.find(data.address() + ": in use"), std::string::npos)
      << r.out;
  EXPECT_NE(rows.at("data port").text.find("`ss -ltnp 'sport = :" + std::to_string(data.port()) +
                                           "'`"),
            std::string::npos)
      << r.out;
  EXPECT_NE(rows.at("data port").text.find("change data.listen"), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("admin port").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("admin port").text.find("change admin.listen"), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("metrics port").verdict, "PASS") << r.out;
  EXPECT_NE(r.out.find("2 FAIL"), std::string::npos) << r.out;
}

TEST(DoctorTest, StateDirectoriesThatCannotWorkFail) {
  const std::string dir = testing::MakeTempDir();
  testing::WriteFile(dir + "/file", "not a directory\n");
  // Under a regular file: cannot be created.
  auto r = RunCommand(Args(dir, {"--transport", "tcp", "--state-dir", dir + "/file/state"}), "",
                      std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  auto rows = ParseTable(r.out);
  ExpectEveryCheckWithFixes(rows, r.out);
  EXPECT_EQ(rows.at("state dir").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("state dir").text.find(dir + "/file/state"), std::string::npos) << r.out;
  // A file where the directory should be.
  r = RunCommand(Args(dir, {"--transport", "tcp", "--state-dir", dir + "/file"}), "",
                 std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("state dir").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("state dir").text.find("is not a directory"), std::string::npos) << r.out;
  // A registry file that is not an SQLite database.
  std::filesystem::create_directory(dir + "/state");
  testing::WriteFile(dir + "/state/registry.db", std::string(200, 'x'));
  r = RunCommand(Args(dir, {"--transport", "tcp"}), "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("state dir").verdict, "PASS") << r.out;
  EXPECT_EQ(rows.at("registry db").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("registry db").text.find("not an SQLite 3 database"), std::string::npos)
      << r.out;
}

// A running rackhubd: its lock, its ports and its registry, read without
// disturbing it; once it stopped, the same directory passes.
TEST(DoctorTest, RunningDaemonIsReportedAndLeftAlone) {
  testing::DaemonProcess d({"--lanes", "1", "--no-metrics", "--transport", "tcp"});
  ASSERT_TRUE(d.started());
  const std::string pid = std::to_string(d.pid());
  auto r = RunCommand({BinPath("rackhubd"), "--doctor", "--transport", "tcp", "--no-metrics",
                       "--state-dir", d.state_dir(), "--data-listen", d.data_address(),
                       "--admin-listen", d.admin_address()},
                      "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  auto rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("state lock").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("state lock").text.find("held by pid " + pid), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("data port").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("data port").text.find("pid " + pid + " holds the state directory's lock"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(rows.at("registry db").verdict, "PASS") << r.out;
  EXPECT_NE(rows.at("registry db").text.find("SQLite 3 database"), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("metrics port").verdict, "SKIP") << r.out;
  EXPECT_EQ(d.Stop(SIGTERM), 0) << d.Log();
  r = RunCommand({BinPath("rackhubd"), "--doctor", "--transport", "tcp", "--no-metrics",
                  "--state-dir", d.state_dir(), "--data-listen", d.data_address(),
                  "--admin-listen", d.admin_address()},
                 "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("state lock").verdict, "PASS") << r.out;
  EXPECT_NE(rows.at("state lock").text.find("last one was pid " + pid), std::string::npos)
      << r.out;
  EXPECT_EQ(rows.at("data port").verdict, "PASS") << r.out;
}

TEST(DoctorTest, TransportWithoutVerbsDevice) {
  if (HostHasVerbsDevice()) GTEST_SKIP() << "this host has verbs devices";
  const std::string dir = testing::MakeTempDir();
  auto r = RunCommand(Args(dir, {"--transport", "rdma"}), "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  auto rows = ParseTable(r.out);
  ExpectEveryCheckWithFixes(rows, r.out);
  EXPECT_EQ(rows.at("verbs devices").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("verbs devices").text.find("no verbs device"), std::string::npos) << r.out;
  EXPECT_NE(rows.at("verbs devices").text.find("data.transport = auto"), std::string::npos)
      << "the fix offers auto: " << r.out;
  r = RunCommand(Args(dir, {"--transport", "auto"}), "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("verbs devices").verdict, "WARN") << r.out;
  EXPECT_NE(rows.at("verbs devices").text.find("TCP only"), std::string::npos) << r.out;
  EXPECT_EQ(rows.at("memlock").verdict, "SKIP") << r.out;
}

// RLIMIT_MEMLOCK below what RDMA registers, without CAP_IPC_LOCK (root has
// it: setpriv drops it); the shell lowers the limit to 1 MiB.
std::string LowMemlockCommand(const std::vector<std::string>& argv) {
  std::string command = "ulimit -l 1024 && exec";
  if (geteuid() == 0) command += " /usr/bin/setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock";
  for (const auto& a : argv) command += " '" + a + "'";
  return command;
}

TEST(DoctorTest, MemlockBelowWhatRdmaRegistersFails) {
  if (geteuid() == 0 && access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "root without setpriv (util-linux): cannot drop CAP_IPC_LOCK";
  }
  const std::string dir = testing::MakeTempDir();
  // 2 lanes x (4 MiB receive + 4 MiB staging ring) = 16 MiB > 1 MiB.
  auto r = RunCommand(
      {"/bin/sh", "-c", LowMemlockCommand(Args(dir, {"--transport", "rdma", "--lanes", "2"}))},
      "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  auto rows = ParseTable(r.out);
  ASSERT_EQ(rows.count("memlock"), 1u) << r.out << r.err;
  EXPECT_EQ(rows.at("memlock").verdict, "FAIL") << r.out;
  EXPECT_NE(rows.at("memlock").text.find("RLIMIT_MEMLOCK 1 MiB"), std::string::npos) << r.out;
  EXPECT_NE(rows.at("memlock").text.find("start-up needs 16 MiB"), std::string::npos) << r.out;
  EXPECT_NE(rows.at("memlock").text.find("LimitMEMLOCK=infinity"), std::string::npos) << r.out;
  EXPECT_NE(rows.at("memlock").text.find("ulimit -l unlimited"), std::string::npos) << r.out;
  // 64 KiB rings: 128 KiB per connection, 8 fit in 1 MiB = 4 workers on 2
  // lanes: enough to start, not for a tenant of 256 workers: WARN.
  testing::WriteFile(dir + "/small_rings.toml", "[data]\nrdma_ring_bytes = \"64KiB\"\n");
  r = RunCommand({"/bin/sh", "-c",
                  LowMemlockCommand(Args(dir, {"--config", dir + "/small_rings.toml",
                                               "--transport", "rdma", "--lanes", "2"}))},
                 "", std::chrono::seconds(10));
  rows = ParseTable(r.out);
  ASSERT_EQ(rows.count("memlock"), 1u) << r.out << r.err;
  EXPECT_EQ(rows.at("memlock").verdict, "WARN") << r.out;
  EXPECT_NE(rows.at("memlock").text.find("room for 8 connections = 4 workers"), std::string::npos)
      << r.out;
  EXPECT_NE(rows.at("memlock").text.find("tenants.default_max_workers = 256"), std::string::npos)
      << r.out;
}

TEST(DoctorTest, LanesBeyondTheCpusWarn) {
  const std::string dir = testing::MakeTempDir();
  const size_t cpus = AvailableCpus();
  const auto r = RunCommand(Args(dir, {"--transport", "tcp", "--lanes", std::to_string(cpus + 2)}),
                            "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 0) << "a WARN is not a failure: " << r.out << r.err;
  const auto rows = ParseTable(r.out);
  EXPECT_EQ(rows.at("lanes vs cores").verdict, "WARN") << r.out;
  EXPECT_NE(rows.at("lanes vs cores").text.find("set lanes.count = " + std::to_string(cpus)),
            std::string::npos)
      << r.out;
}

// The config comes as for a start: --config FILE, flags, or `--doctor FILE`.
TEST(DoctorTest, ConfigFileAndExitCodes) {
  const std::string dir = testing::MakeTempDir();
  HeldPort held;
  testing::WriteFile(dir + "/rackhubd.toml",
                     "[data]\nlisten = \"" + held.address() + "\"\ntransport = \"tcp\"\n"
                     "[admin]\nlisten = \"127.0.0.1:0\"\n[metrics]\nenabled = false\n"
                     "[state]\ndir = \"" + dir + "/state\"\n");
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{BinPath("rackhubd"), "--doctor", dir + "/rackhubd.toml"},
        std::vector<std::string>{BinPath("rackhubd"), "--doctor", "--config",
                                 dir + "/rackhubd.toml"}}) {
    const auto r = RunCommand(argv, "", std::chrono::seconds(10));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    const auto rows = ParseTable(r.out);
    ASSERT_EQ(rows.count("data port"), 1u) << r.out;
    EXPECT_EQ(rows.at("data port").verdict, "FAIL") << r.out;
    EXPECT_NE(rows.at("config").text.find(dir + "/rackhubd.toml"), std::string::npos) << r.out;
  }
  // A flag overrides the file, as for a start.
  auto r = RunCommand({BinPath("rackhubd"), "--doctor", dir + "/rackhubd.toml", "--data-listen",
                       "127.0.0.1:0"},
                      "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // A configuration that does not parse: 78 and the error, no table.
  testing::WriteFile(dir + "/bad.toml", "[lanes]\ncount = \"many\"\n");
  r = RunCommand({BinPath("rackhubd"), "--doctor", dir + "/bad.toml"}, "",
                 std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.out << r.err;
  EXPECT_NE(r.err.find("config error: lanes.count"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("RESULT"), std::string::npos) << r.out;
  r = RunCommand({BinPath("rackhubd"), "--doctor", dir + "/rackhubd.toml", "--config",
                  dir + "/bad.toml"},
                 "", std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, kExitConfigError) << r.out << r.err;
  EXPECT_NE(r.err.find("--doctor: '" + dir + "/rackhubd.toml' is not the file --config names"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace rackhub
