// net::Connector over TCP: resolve, connect, TCP_NODELAY, then a
// TcpConnection on the caller's io_context.
#include <memory>

#include "rackhub/net/connector.h"
#include "rackhub/net/tcp/connection.h"
#include "rackhub/net/tcp/keepalive.h"

namespace rackhub::net {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class TcpConnector final : public Connector {
 public:
  const char* name() const override { return "tcp"; }

  void Connect(asio::io_context& io, const Endpoint& to, FrameHandler* handler,
               ConnectionIdentity id, Done done) override {
    auto socket = std::make_shared<tcp::socket>(io);
    auto resolver = std::make_shared<tcp::resolver>(io);
    resolver->async_resolve(
        to.host, std::to_string(to.port),
        [socket, resolver, handler, id = std::move(id), done = std::move(done)](
            const boost::system::error_code& ec, tcp::resolver::results_type results) mutable {
          if (ec) return done(Unavailable("resolve: " + ec.message()));
          asio::async_connect(
              *socket, results,
              [socket, handler, id = std::move(id), done = std::move(done)](
                  const boost::system::error_code& cec, const tcp::endpoint&) mutable {
                if (cec) return done(Unavailable("connect: " + cec.message()));
                boost::system::error_code ignored;
                socket->set_option(tcp::no_delay(true), ignored);
                net::tcp::EnableHubKeepAlive(*socket);  // (connectors dial hub links only)
                done(std::shared_ptr<Connection>(std::make_shared<net::tcp::TcpConnection>(
                    handler, std::move(*socket), std::move(id))));
              });
        });
  }
};

}  // namespace

std::unique_ptr<Connector> MakeTcpConnector() { return std::make_unique<TcpConnector>(); }

}  // namespace rackhub::net
