// net::Connector over TCP with TLS: resolve, connect, TCP_NODELAY, the TLS
// handshake (bounded in time), then a TlsConnection on the caller's io_context.
#include <memory>

#include "rackhub/net/connector.h"
#include "rackhub/net/tcp/keepalive.h"
#include "rackhub/net/tls/connection.h"

namespace rackhub::net {

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class TlsConnector final : public Connector {
 public:
  TlsConnector(std::shared_ptr<const tls::TlsContext> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  const char* name() const override { return "tcp+tls"; }

  void Connect(asio::io_context& io, const Endpoint& to, FrameHandler* handler,
               ConnectionIdentity id, Done done) override {
    auto socket = std::make_shared<tcp::socket>(io);
    auto resolver = std::make_shared<tcp::resolver>(io);
    resolver->async_resolve(
        to.host, std::to_string(to.port),
        [this, &io, socket, resolver, handler, id = std::move(id), done = std::move(done)](
            const boost::system::error_code& ec, tcp::resolver::results_type results) mutable {
          if (ec) return done(Unavailable("resolve: " + ec.message()));
          asio::async_connect(
              *socket, results,
              [this, &io, socket, handler, id = std::move(id), done = std::move(done)](
                  const boost::system::error_code& cec, const tcp::endpoint&) mutable {
                if (cec) return done(Unavailable("connect: " + cec.message()));
                boost::system::error_code ignored;
                socket->set_option(tcp::no_delay(true), ignored);
                net::tcp::EnableHubKeepAlive(*socket);  // (connectors dial hub links only)
                Handshake(io, std::move(*socket), handler, std::move(id), std::move(done));
              });
        });
  }

 private:
  // The TLS handshake, cut after timeout_ (a peer that never answers).
  void Handshake(asio::io_context& io, tcp::socket socket, FrameHandler* handler,
                 ConnectionIdentity id, Done done) {
    Result<tls::TlsStream> made = tls::TlsStream::Make(std::move(socket), *ctx_, tls::Role::kClient);
    if (!made.ok()) return asio::post(io, [done, s = made.status()] { done(s); });
    struct Pending {
      explicit Pending(tls::TlsStream s) : stream(std::move(s)), timer(stream.socket().get_executor()) {}
      tls::TlsStream stream;
      asio::steady_timer timer;
      bool timed_out = false;
    };
    auto pending = std::make_shared<Pending>(*std::move(made));
    pending->timer.expires_after(timeout_);
    pending->timer.async_wait([pending](const boost::system::error_code& ec) {
      if (ec) return;
      pending->timed_out = true;
      pending->stream.Close();
    });
    const auto ms = timeout_.count();
    pending->stream.AsyncHandshake(
        [pending, handler, id = std::move(id), done = std::move(done), ms](Status s) mutable {
          pending->timer.cancel();
          if (pending->timed_out) {
            return done(Unavailable("TLS handshake did not finish within " + std::to_string(ms) +
                                    " ms"));
          }
          if (!s.ok()) return done(s);
          done(std::shared_ptr<Connection>(std::make_shared<tls::TlsConnection>(
              handler, std::move(pending->stream), std::move(id))));
        });
  }

  const std::shared_ptr<const tls::TlsContext> ctx_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<Connector> MakeTlsConnector(std::shared_ptr<const tls::TlsContext> ctx,
                                            std::chrono::milliseconds handshake_timeout) {
  return std::make_unique<TlsConnector>(std::move(ctx), handshake_timeout);
}

}  // namespace rackhub::net
