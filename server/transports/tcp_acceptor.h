// TcpAcceptor: the TCP side of rackhubd's data plane. On its own thread it
// accepts worker connections (data.listen) and, in a hierarchical topology,
// other racks' hub links (this rack's inter-hub address); reads and checks
// the first frame (HELLO through hello_check.h, HUB_HELLO with the hub
// secret), then moves the socket to the lane it names, builds the
// TcpConnection there and hands it over (Lane::AdoptWorker / AdoptHubLink).
// The only server file that knows TCP sockets.
//
// Ownership: owned by the daemon; borrows the DataPlane (which outlives it).
// Threading: Listen/Start/Stop from the main thread; sessions run on the
// acceptor thread; hand-overs on the lanes' threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "data_plane.h"
#include "hello_session.h"
#include "log_limiter.h"
#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"

namespace rackhub::server {

class TcpAcceptor {
 public:
  explicit TcpAcceptor(DataPlane* plane);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  // Binds data.listen (and the inter-hub address when this hub exchanges
  // with other racks). The error names the config field.
  Status Listen();
  // "host:port" actually bound for workers (after Listen).
  const std::string& address() const { return address_; }
  // The shared-memory offer answering HELLOs with shm_probe: the abstract
  // socket of the ShmAcceptor ("" = none). Before Start.
  void OfferShm(const std::string& socket_name);
  // Starts accepting on the acceptor thread.
  void Start();
  // Stops accepting and joins the thread. Idempotent.
  void Stop();

 private:
  class HubHelloSession;
  void AcceptWorkers();
  void AcceptHubs();
  // After a failed accept: go on at once, or after kAcceptRetryDelay when the
  // process is out of descriptors or memory (the listener stays readable:
  // retrying at once would spin).
  void AfterAcceptError(const boost::system::error_code& ec, const char* what,
                        boost::asio::steady_timer& retry, void (TcpAcceptor::*again)());
  // True (and the session is counted in `waiting` until it ends) if another
  // connection may wait for its first frame; otherwise the socket is closed
  // here. Workers and hub links count separately: a flood of the data port
  // does not shut other racks' hubs out.
  bool AdmitUnauthenticated(boost::asio::ip::tcp::socket& socket, const char* what,
                            size_t waiting);
  // A warning a remote peer can cause, through the acceptor's LogLimiter.
  void WarnLimited(const std::string& line);
  // Moves an accepted socket to lane `lane` and runs `adopt` there.
  void MoveToLane(boost::asio::ip::tcp::socket socket, uint32_t lane,
                  std::function<void(Lane&, boost::asio::ip::tcp::socket)> adopt);

  DataPlane* plane_;
  // Live HelloSessions and HubHelloSessions (acceptor thread; declared before
  // io_ because sessions still pending when io_ goes count themselves out).
  size_t unauthenticated_workers_ = 0;
  size_t unauthenticated_hubs_ = 0;
  HelloSession<boost::asio::ip::tcp::socket>::Hooks hello_hooks_;
  boost::asio::io_context io_{1};
  boost::asio::ip::tcp::acceptor workers_{io_};
  std::unique_ptr<boost::asio::ip::tcp::acceptor> hubs_;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  // Acceptor thread only:
  boost::asio::steady_timer retry_workers_{io_};  // one per listener
  boost::asio::steady_timer retry_hubs_{io_};
  LogLimiter warnings_{20, std::chrono::seconds(10)};
};

// Outgoing hub links over TCP (net::MakeTcpConnector), for DataPlane.
std::unique_ptr<net::Connector> MakeTcpHubConnector();

}  // namespace rackhub::server
