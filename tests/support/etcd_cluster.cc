#include "etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <thread>

#include "etcd/rpc.grpc.pb.h"
#include "process.h"

namespace rackhub::testing {

namespace {
constexpr const char* kEtcd = "/usr/bin/etcd";
}

// Ports for programs that cannot take port 0 and report the bound port (etcd;
// rackhubd's hub-link addresses, which the other hubs must know beforehand).
// A port the kernel assigned and this process closed again could be handed
// to anyone else before the program binds it (bind(0) and outgoing connects
// of the tests running in parallel under `ctest -j`), so the port is taken
// from below the kernel's ephemeral range (/proc/sys/net/ipv4/
// ip_local_port_range), which the kernel never assigns by itself, and
// reserved among concurrently running tests by an flock on
// /tmp/rackhub-test-ports/<port> held until this process exits. It must also
// bind right now (no other program holds it).
uint16_t FreeLoopbackPort(bool required) {
  int ephemeral_low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  const int low = 10000, high = ephemeral_low - 1;  // [low, high] is never assigned by the kernel
  const char* dir = "/tmp/rackhub-test-ports";
  mkdir(dir, 01777);
  std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  for (int attempt = 0; high > low && attempt < 2000; ++attempt) {
    const int port = std::uniform_int_distribution<int>(low, high)(rng);
    const std::string lock = std::string(dir) + "/" + std::to_string(port);
    const int lock_fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lock_fd < 0) continue;
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {  // another test process has it
      close(lock_fd);
      continue;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(fd);
    if (!free) {
      close(lock_fd);
      continue;
    }
    return static_cast<uint16_t>(port);  // lock_fd stays open: reserved until exit
  }
  if (required) {
    ADD_FAILURE() << "no free loopback port below the ephemeral range (" << ephemeral_low << ")";
  }
  return 0;
}

EtcdCluster::EtcdCluster(int members, std::vector<std::string> extra) : extra_(std::move(extra)) {
  for (const auto& a : extra_) tls_ = tls_ || a == "--cert-file";
  if (access(kEtcd, X_OK) != 0) {
    ADD_FAILURE() << kEtcd << " is missing: install Debian's etcd-server (deploy/bootstrap.sh does)";
    return;
  }
  dir_ = MakeTempDir();
  token_ = "rackhub-test-" + std::to_string(getpid()) + "-" + dir_.substr(dir_.rfind('/') + 1);
  for (int i = 0; i < members; ++i) {
    members_.push_back({FreeLoopbackPort(), FreeLoopbackPort(), -1});
  }
  for (int i = 0; i < members; ++i) Launch(i, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Writable(0, std::chrono::milliseconds(500))) {
      started_ = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "etcd did not accept a write within 30 s:\n" << Logs();
}

EtcdCluster::~EtcdCluster() {
  for (size_t i = 0; i < members_.size(); ++i) Stop(static_cast<int>(i));
  if (!dir_.empty()) RunCommand({"/bin/rm", "-rf", dir_});
}

std::string EtcdCluster::endpoint(int member) const {
  return "127.0.0.1:" + std::to_string(members_[member].client_port);
}

std::string EtcdCluster::endpoints() const {
  std::string s;
  for (size_t i = 0; i < members_.size(); ++i) {
    s += (i ? "," : "") + endpoint(static_cast<int>(i));
  }
  return s;
}

void EtcdCluster::Launch(int i, bool fresh) {
  std::string cluster;
  for (size_t m = 0; m < members_.size(); ++m) {
    cluster += (m ? "," : "") + std::string("m") + std::to_string(m) + "=http://127.0.0.1:" +
               std::to_string(members_[m].peer_port);
  }
  const Member& me = members_[i];
  const std::string client =
      (tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(me.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(me.peer_port);
  std::vector<std::string> argv = {kEtcd,
                                   "--name", "m" + std::to_string(i),
                                   "--data-dir", dir_ + "/m" + std::to_string(i),
                                   "--listen-client-urls", client,
                                   "--advertise-client-urls", client,
                                   "--listen-peer-urls", peer,
                                   "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", cluster,
                                   "--initial-cluster-token", token_,
                                   "--initial-cluster-state", fresh ? "new" : "existing",
                                   "--heartbeat-interval", "50",
                                   "--election-timeout", "500",
                                   "--log-level", "warn"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string log = dir_ + "/m" + std::to_string(i) + ".log";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // A test process that dies without running its destructors (a
    // sanitizer's abort, a crash) must not leave etcd behind: it dies with
    // the thread that started it (the test's main thread).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  members_[i].pid = pid;
}

void EtcdCluster::Stop(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return;
  kill(m.pid, SIGKILL);
  int status = 0;
  waitpid(m.pid, &status, 0);
  m.pid = -1;
}

bool EtcdCluster::Start(int i) {
  if (members_[i].pid > 0) return true;
  Launch(i, false);
  return members_[i].pid > 0;
}

bool EtcdCluster::Writable(int i, std::chrono::milliseconds timeout) const {
  if (tls_) {
    // No CA here: the member is up once its port accepts connections.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(members_[i].client_port);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    close(fd);
    if (!ok) std::this_thread::sleep_for(timeout / 5);
    return ok;
  }
  auto stub = etcdserverpb::KV::NewStub(
      grpc::CreateChannel(endpoint(i), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  etcdserverpb::PutRequest req;
  req.set_key("/rackhub-test/probe");
  req.set_value("x");
  etcdserverpb::PutResponse resp;
  return stub->Put(&ctx, req, &resp).ok();
}

std::string EtcdCluster::Logs() const {
  std::string out;
  for (size_t i = 0; i < members_.size(); ++i) {
    out += "--- etcd m" + std::to_string(i) + "\n" +
           ReadFile(dir_ + "/m" + std::to_string(i) + ".log");
  }
  return out;
}

}  // namespace rackhub::testing
