// Outgoing data-plane connections (hub to hub links), transport-neutral.
//
// A Connector opens a connection to another hub's inter-hub endpoint and
// returns it as a net::Connection: the caller (a lane) never learns which
// transport carries it. Implementations: MakeTcpConnector (net/tcp),
// MakeTlsConnector (net/tls) and MakeRdmaConnector (net/rdma). The returned
// connection is not started; the caller sends its HUB_HELLO and calls Start().
//
// Ownership: the caller owns the Connector and must keep it alive while
// connects are in flight. `handler` must outlive the connection.
// Threading: Connect is called on the thread running `io`; `done` runs later
// on that same thread (never inside Connect), exactly once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/endpoint.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

namespace tls {
class TlsContext;
}

class Connector {
 public:
  // The connection, or UNAVAILABLE saying why there is none.
  using Done = std::function<void(Result<std::shared_ptr<Connection>> conn)>;

  virtual ~Connector() = default;
  // "tcp", "tcp+tls" or "rdma", for logs.
  virtual const char* name() const = 0;
  virtual void Connect(boost::asio::io_context& io, const Endpoint& to, FrameHandler* handler,
                       ConnectionIdentity id, Done done) = 0;
};

// TCP over Boost.Asio (TCP_NODELAY).
std::unique_ptr<Connector> MakeTcpConnector();

// TCP with mutual TLS (net/tls/context.h): connects, then the TLS handshake
// verifying the peer's certificate against `ctx`'s CA, within
// `handshake_timeout`; the connection is a tls::TlsConnection.
std::unique_ptr<Connector> MakeTlsConnector(std::shared_ptr<const tls::TlsContext> ctx,
                                            std::chrono::milliseconds handshake_timeout);

}  // namespace rackhub::net
