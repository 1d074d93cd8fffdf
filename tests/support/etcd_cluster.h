// Test support: a real etcd (Debian's etcd-server) of 1 or 3 members on
// loopback ports, for the cluster tests (docs/cluster.md). Each member runs
// as a child process with its own data directory under a fresh temp dir;
// members can be stopped (SIGKILL, like a crash) and started again on the
// same ports and data. Fast elections (heartbeat 50 ms, election 500 ms) so
// a failover takes about a second. Single-threaded use from a test body.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rackhub::testing {

// A loopback TCP port free at the time of the call, below the kernel's
// ephemeral range and reserved for this process among concurrently running
// tests (so `ctest -j` cannot hand it to another test): for programs that
// cannot listen on port 0 and report the port (etcd, hub-link addresses).
// `required` false: 0 (no failure) when none is found, e.g. on a host
// whose ephemeral range starts low; the caller then listens on port 0.
uint16_t FreeLoopbackPort(bool required = true);

class EtcdCluster {
 public:
  // Starts `members` members and waits (up to 30 s) until a write goes
  // through; fails the current test (started() false) otherwise, or when
  // etcd is not installed (it names the package).
  // `extra`: more etcd flags for every member; with --cert-file the client
  // URLs are https (Writable then checks only that the port answers).
  explicit EtcdCluster(int members = 1, std::vector<std::string> extra = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  bool started() const { return started_; }
  // "127.0.0.1:P0,127.0.0.1:P1,..." (client URLs without the scheme).
  std::string endpoints() const;
  std::string endpoint(int member) const;
  // SIGKILLs member `i` (no-op if stopped).
  void Stop(int member);
  // Starts member `i` again with its data; true once it runs.
  bool Start(int member);
  // Whether a write through `member`'s endpoint succeeds within `timeout`
  // (needs a quorum).
  bool Writable(int member, std::chrono::milliseconds timeout) const;
  // The members' logs (for failure messages).
  std::string Logs() const;

 private:
  void Launch(int member, bool fresh);

  std::string dir_;
  std::string token_;
  std::vector<std::string> extra_;
  bool tls_ = false;
  struct Member {
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    pid_t pid = -1;
  };
  std::vector<Member> members_;
  bool started_ = false;
};

}  // namespace rackhub::testing
