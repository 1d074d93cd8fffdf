// TcpAcceptor: the TCP side of rackhubd's data plane. On its own thread it
// accepts worker connections (data.listen) and, in a hierarchical topology,
// other racks' hub links (this rack's inter-hub address); reads and checks
// the first frame (HELLO through hello_check.h; a hub link's TLS and
// handshake through hub_link_session.h), then moves the socket to the lane it
// names, builds the connection there and hands it over (Lane::AdoptWorker /
// AdoptHubLink). With hub_link_session.cc, the only server files that know
// TCP sockets.
//
// Ownership: owned by the daemon; borrows the DataPlane (which outlives it).
// Threading: Listen/Start/Stop from the main thread; sessions run on the
// acceptor thread; hand-overs on the lanes' threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "acceptor_thread.h"
#include "data_plane.h"
#include "hello_session.h"
#include "hub_link_session.h"
#include "log_limiter.h"
#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"

namespace rackhub::server {

class TcpAcceptor {
 public:
  // `hub_tls`: hub links are TLS with this context (topology.tls_*); null:
  // plaintext.
  TcpAcceptor(DataPlane* plane, std::shared_ptr<const net::tls::TlsContext> hub_tls);
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
  // One listening socket and what its accepted connections go through:
  // workers (data.listen) or other racks' hub links (the interhub address).
  struct Listener {
    Listener(boost::asio::io_context& io, const char* what, const size_t* waiting)
        : acceptor(io), retry(io), what(what), waiting(waiting) {}
    boost::asio::ip::tcp::acceptor acceptor;
    boost::asio::steady_timer retry;  // a failed accept's retry
    const char* what;                 // "data", "rack link": names it in warnings
    // Its sessions waiting for their first frame. Workers and hub links
    // count separately: a flood of the data port does not shut other
    // racks' hubs out.
    const size_t* waiting;
    // Starts the first-frame session of an admitted socket (TCP_NODELAY set).
    std::function<void(boost::asio::ip::tcp::socket)> start;
  };
  // Accepts on `l` until Stop (acceptor thread).
  void Accept(Listener& l);
  // After a failed accept: go on at once, or after kAcceptRetryDelay when the
  // process is out of descriptors or memory (the listener stays readable:
  // retrying at once would spin).
  void AfterAcceptError(const boost::system::error_code& ec, Listener& l);
  // True (and the session is counted in *l.waiting until it ends) if another
  // connection may wait for its first frame; otherwise the socket is closed
  // here.
  bool AdmitUnauthenticated(boost::asio::ip::tcp::socket& socket, const Listener& l);
  // Moves an accepted socket to lane `lane` and runs `adopt` there.
  void MoveToLane(boost::asio::ip::tcp::socket socket, uint32_t lane,
                  std::function<void(Lane&, boost::asio::ip::tcp::socket)> adopt);

  DataPlane* plane_;
  // Live HelloSessions and HubHelloSessions (acceptor thread; declared before
  // thread_ because sessions still pending when its io_context goes count
  // themselves out).
  size_t unauthenticated_workers_ = 0;
  size_t unauthenticated_hubs_ = 0;
  HelloSession<boost::asio::ip::tcp::socket>::Hooks hello_hooks_;
  HubLinkHooks hub_hooks_;
  AcceptorThread thread_;  // "rackhub-accept"
  Listener workers_{thread_.io(), "data", &unauthenticated_workers_};
  std::unique_ptr<Listener> hubs_;  // hierarchical topology only
  std::string address_;
  // A warning a remote peer can cause goes through it (acceptor thread).
  LogLimiter warnings_{20, std::chrono::seconds(10)};
};

// Moves an accepted socket to lane `lane` of `plane` and runs `adopt` there
// (acceptor thread; `adopt` on the lane's).
void MoveSocketToLane(DataPlane* plane, boost::asio::ip::tcp::socket socket, uint32_t lane,
                      std::function<void(Lane&, boost::asio::ip::tcp::socket)> adopt);

// Outgoing hub links over TCP, for DataPlane: net::MakeTcpConnector, or with
// `tls` (topology.tls_*) net::MakeTlsConnector whose handshake must finish
// within data.hello_timeout_ms.
std::unique_ptr<net::Connector> MakeTcpHubConnector(
    const Config& config, std::shared_ptr<const net::tls::TlsContext> tls);

}  // namespace rackhub::server
