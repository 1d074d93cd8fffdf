// Test support: a hub running in this process (server::Hub, hub.h) whose
// workers reach it over in-memory links (net/testing), and which can crash,
// stop gracefully and start again on the same state directory while the
// clients connected to it live on: the in-process counterpart of
// DaemonProcess's Kill / Stop / Restart (process.h).
//
// The in-memory acceptor, dialer(): the worker's HELLO gets the same checks
// as over TCP and RDMA (hello_check.h); a refused HELLO is answered with its
// ERROR on a link of its own; an accepted one becomes a connection pair
// whose hub end goes to the lane the HELLO names (AdoptWorker) and whose
// client end, built on the caller's io_context with the caller's handler, is
// returned with its Start posted to that io_context. The dialer stays valid
// across restarts and always reaches the hub that runs now. While no hub
// runs (after Kill or Stop, before Restart) a dial returns null at once and
// delivers nothing, as a TCP connect to a closed port is refused: a client's
// connect fails with kConnectFailed, its reconnect tries again until its
// timeout.
//
// Kill: a crash (Hub::Crash): every link is dropped at once, nothing is sent
// (no SHUTTING_DOWN), drained or checkpointed. Stop: the graceful path
// (Hub::Stop): SHUTTING_DOWN, the checkpoint of checkpoint.on_shutdown.
// Restart: a new Hub with the same command line, on the same state
// directory (the listen ports are ephemeral: the admin, data and metrics
// addresses change; read them again).
//
// Command line: "--admin-listen 127.0.0.1:0 --data-listen 127.0.0.1:0
// --metrics-listen 127.0.0.1:0 --no-pin-lanes" followed by `args`; unless
// `args` has --state-dir or --in-memory, "--state-dir <fresh temp dir>/state"
// (durable state, as DaemonProcess does; the temp dir is removed with this
// object).
//
// Ownership: the hubs' ends of in-memory links post to link_io() (and the
// clients' ends to the lanes' io_contexts), so every Client dialed through
// dialer() must be destroyed before this object, and a stopped Hub is kept
// (its lanes' io_contexts alive, not running) until then.
// Threading: Start, Kill, Restart and the address accessors from one thread
// (the test's); Stop from one thread at a time (HubUnderTest runs it on a
// thread of its own), not concurrently with Kill or Restart; dialer() is
// callable from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config.h"
#include "connection_link.h"
#include "memory_links.h"
#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"

namespace rackhub::server {
class Hub;
}

namespace rackhub::testing {

class InProcessHub {
 public:
  // Null with *why set when the command line does not parse or the hub does
  // not start.
  static std::unique_ptr<InProcessHub> Start(const std::vector<std::string>& args,
                                             std::string* why);
  ~InProcessHub();
  InProcessHub(const InProcessHub&) = delete;
  InProcessHub& operator=(const InProcessHub&) = delete;

  // Of the hub that runs now (or ran last): "127.0.0.1:PORT"; metrics ""
  // with --no-metrics.
  const std::string& admin_address() const { return admin_address_; }
  const std::string& data_address() const { return data_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  // The --state-dir ("" with --in-memory).
  const std::string& state_dir() const { return state_dir_; }
  bool running() const;

  ConnectionLink::Dialer dialer();
  // The io_context of the clients' ends (a thread of this object).
  boost::asio::io_context& link_io() { return client_io_.io(); }

  // A crash (see above). Nothing when no hub runs.
  void Kill();
  // The graceful stop (see above), waiting up to `grace` for the workers'
  // last frames. Nothing when no hub runs.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  // Starts the hub again after Kill or Stop. FAILED_PRECONDITION while one
  // runs; the Hub's own error if it does not start.
  Status Restart();

 private:
  InProcessHub(server::Config config, std::string state_dir, std::string temp_dir);
  Status StartHub();
  // Takes the running hub out of reach of the dialer (null if none).
  std::unique_ptr<server::Hub> TakeHub();
  std::shared_ptr<net::Connection> Dial(const net::FrameHeader& h, const std::string& payload,
                                        boost::asio::io_context& io, net::FrameHandler* handler);

  const server::Config config_;
  const std::string state_dir_;
  const std::string temp_dir_;  // made by Start ("" if none): removed last
  std::string admin_address_, data_address_, metrics_address_;
  // Declared first: the clients' io thread and the refusals' outlive every
  // hub (destroyed last).
  IoThread client_io_;
  IoThread refuser_io_;
  Refuser refuser_;
  mutable std::mutex mu_;
  std::unique_ptr<server::Hub> hub_;                        // GUARDED_BY(mu_): the running one
  std::vector<std::unique_ptr<server::Hub>> stopped_;       // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<net::Connection>> refused_;  // GUARDED_BY(mu_)
};

}  // namespace rackhub::testing
