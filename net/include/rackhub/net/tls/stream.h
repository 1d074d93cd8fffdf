// TlsStream: one TLS session (OpenSSL) over a connected, non-blocking TCP
// socket of Boost.Asio: handshake, reads and writes completing through the
// socket's io_context (the socket waits for readiness, OpenSSL reads and
// writes the descriptor itself).
//
// Why not boost::asio::ssl::stream: a hub link's handshake runs on the
// acceptor's thread and the link then moves to a lane's io_context
// (server/transports/tcp_acceptor.h). Boost 1.74's ssl::stream cannot change
// io_contexts; here the session is the SSL object bound to the descriptor,
// so Detach()/Attach() move both to another io_context unchanged.
//
// Ownership: owns the socket and the SSL session. The owner keeps the stream
// alive (and unmoved) while an operation is pending: handlers capture `this`.
// Threading: every member runs on the thread of the socket's io_context.
// At most one read and one write (or one handshake) pending at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <openssl/ssl.h>

#include "rackhub/common/status.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/tls/context.h"

namespace rackhub::net::tls {

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

enum class Role { kClient, kServer };

class TlsStream {
 public:
  using IoHandler = std::function<void(const boost::system::error_code& ec, size_t bytes)>;

  // A session of `role` on `socket` (connected; made non-blocking here), not
  // yet shaken hands. INTERNAL if OpenSSL cannot make one.
  static Result<TlsStream> Make(boost::asio::ip::tcp::socket socket, const TlsContext& ctx,
                                Role role);
  TlsStream(TlsStream&&) noexcept = default;
  TlsStream& operator=(TlsStream&&) noexcept = default;
  ~TlsStream();

  // The TLS handshake, including the verification of the peer's
  // certificate. `done`: OK, or UNAVAILABLE saying what failed ("certificate
  // verify failed: unable to get local issuer certificate", "the peer does
  // not speak TLS", ...).
  void AsyncHandshake(std::function<void(Status)> done);
  // Reads what is there (at least one byte) into `into`. Errors: eof when
  // the peer closed, else an OpenSSL error (boost::asio::error::get_ssl_category()).
  void AsyncReadSome(std::span<std::byte> into, IoHandler done);
  // Writes all of `bytes` (which must stay valid and unchanged until done).
  void AsyncWrite(std::span<const std::byte> bytes, IoHandler done);
  // Sends close_notify if it can at once, then closes the socket (pending
  // operations end with operation_aborted). Idempotent.
  void Close();
  bool is_open() const { return socket_.is_open(); }
  boost::asio::ip::tcp::socket& socket() { return socket_; }
  // "TLSv1.3 TLS_AES_256_GCM_SHA384", for logs (after the handshake).
  std::string Describe() const;

  // Moving a session to another io_context (another thread): Detach on the
  // stream's thread (no operation may be pending), Attach on the new one.
  // The descriptor and the session state travel unchanged.
  struct Detached {
    Detached() = default;
    Detached(Detached&& other) noexcept
        : protocol(other.protocol), fd(std::exchange(other.fd, -1)), ssl(std::move(other.ssl)) {}
    Detached& operator=(Detached&&) = delete;
    ~Detached();  // closes the descriptor unless it was attached
    boost::asio::ip::tcp protocol = boost::asio::ip::tcp::v4();
    int fd = -1;
    SslPtr ssl;
  };
  Result<Detached> Detach() &&;
  static Result<TlsStream> Attach(boost::asio::io_context& io, Detached session);

 private:
  TlsStream(boost::asio::ip::tcp::socket socket, SslPtr ssl)
      : socket_(std::move(socket)), ssl_(std::move(ssl)) {}
  // Runs `attempt` (an SSL call's result: > 0 done) until it stops wanting
  // to read or write, waiting for the socket in between; then `finish(ret, error)`.
  using Finish = std::function<void(int ret, const boost::system::error_code& ec)>;
  void Drive(std::function<int()> attempt, Finish finish);
  // The error of an SSL call that returned `ret` (<= 0), read at once
  // (OpenSSL's error queue is per thread and per call).
  boost::system::error_code ErrorOf(int ret) const;

  boost::asio::ip::tcp::socket socket_;
  SslPtr ssl_;
};

}  // namespace rackhub::net::tls
