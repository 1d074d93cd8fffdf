// Test support: one hub under test, whatever transport its workers use, so a
// suite runs the same scenarios over every transport (INSTANTIATE over
// AllTransports()):
//   kMemory: a Hub running in this process (server/daemon/hub.h); worker links
//            are in-memory connection pairs (net/testing) handed straight to
//            the lane after the same HELLO checks as TCP and RDMA.
//   kTcp:    a real rackhubd process; links are TCP sockets (RawClient).
//   kShm:    a real rackhubd process; links are shared-memory channels
//            (net/shm), dialed after asking the TCP port for the offer.
//   kRdma:   a real rackhubd process with data.transport = rdma; links are
//            RDMA connections on the host's verbs device (Soft-RoCE in the VM
//            of tests/rdma/run.sh). Not available without a device: Start
//            returns null with the reason (the test GTEST_SKIPs).
// The admin API is real gRPC on loopback in every case.
//
// Threading: single-threaded use from a test body.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "connection_link.h"
#include "data_link.h"
#include "rdma_env.h"
#include "rackhub/net/asio.h"

namespace rackhub::testing {

class DaemonProcess;

enum class Transport { kMemory, kTcp, kShm, kRdma };
std::string TransportName(Transport t);
std::vector<Transport> AllTransports();
// For INSTANTIATE_TEST_SUITE_P's name generator.
std::string TransportParamName(const ::testing::TestParamInfo<Transport>& info);

class HubUnderTest {
 public:
  // `args`: rackhubd command-line options (e.g. {"--lanes", "2"}). Null with
  // *why set when the transport cannot run here.
  static std::unique_ptr<HubUnderTest> Start(Transport transport, std::vector<std::string> args,
                                             std::string* why);
  virtual ~HubUnderTest() = default;

  virtual Transport transport() const = 0;
  virtual const std::string& admin_address() const = 0;
  // HOST:PORT of the hub's TCP data plane (it runs with every transport; the
  // in-process hub listens too). rdma_address(): its RDMA listener, "" unless
  // kRdma.
  virtual std::string data_address() const = 0;
  virtual std::string rdma_address() const { return ""; }
  // The rackhubd process (kTcp, kRdma), e.g. for its log; null for kMemory.
  virtual DaemonProcess* daemon() { return nullptr; }
  // kMemory only (else null): dials an in-memory worker link after the HELLO
  // checks, on link_io() (a thread of this object that outlives the hub's
  // ends), for client::testing::ConnectThrough. Callable from any thread;
  // the returned client end is started by a post to `io`.
  virtual ConnectionLink::Dialer memory_dialer() { return nullptr; }
  virtual boost::asio::io_context* link_io() { return nullptr; }
  // A new, unconnected worker link (HELLO connects it).
  virtual std::unique_ptr<DataLink> Connect() = 0;
  // Timing bounds of assertions (and timeouts a test gives the hub) are
  // multiplied by this (emulated RDMA is slow). TimeScale(t) is the same
  // figure before a hub exists, e.g. for the hub's own command line.
  static int TimeScale(Transport t) { return t == Transport::kRdma ? 10 : 1; }
  int time_scale() const { return TimeScale(transport()); }
  // Starts a graceful shutdown (SIGTERM for a process); FinishShutdown waits
  // for it and returns the exit code (0 in-process).
  virtual void BeginShutdown() = 0;
  virtual int FinishShutdown() = 0;
};


}  // namespace rackhub::testing
