#include "rackhub/net/tls/stream.h"

#include <unistd.h>

#include <cerrno>

#include <boost/asio/ssl/error.hpp>
#include <openssl/err.h>
#include <openssl/x509.h>

namespace rackhub::net::tls {

namespace asio = boost::asio;
using asio::ip::tcp;

Result<TlsStream> TlsStream::Make(tcp::socket socket, const TlsContext& ctx, Role role) {
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  if (ec) return Unavailable("TLS: cannot make the socket non-blocking: " + ec.message());
  ERR_clear_error();
  SslPtr ssl(SSL_new(ctx.native()));
  if (!ssl || SSL_set_fd(ssl.get(), socket.native_handle()) != 1) {
    return Internal("TLS: cannot make a session: " + TakeOpenSslErrors());
  }
  if (role == Role::kClient) {
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_accept_state(ssl.get());
  }
  return TlsStream(std::move(socket), std::move(ssl));
}

TlsStream::~TlsStream() = default;

TlsStream::Detached::~Detached() {
  if (fd >= 0) ::close(fd);
}

boost::system::error_code TlsStream::ErrorOf(int ret) const {
  const int error = SSL_get_error(ssl_.get(), ret);
  if (error == SSL_ERROR_ZERO_RETURN) return asio::error::eof;
  const unsigned long e = ERR_peek_last_error();
  if (error == SSL_ERROR_SYSCALL) {
    const int err = errno;
    ERR_clear_error();
    if (e == 0 && (ret == 0 || err == 0)) return asio::error::eof;  // closed without close_notify
    if (e == 0) return boost::system::error_code(err, boost::system::system_category());
    return boost::system::error_code(static_cast<int>(e), asio::error::get_ssl_category());
  }
  ERR_clear_error();
  if (e != 0 && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) return asio::error::eof;
  if (e == 0) return asio::error::fault;
  return boost::system::error_code(static_cast<int>(e), asio::error::get_ssl_category());
}

void TlsStream::Drive(std::function<int()> attempt, Finish finish) {
  if (!socket_.is_open()) {
    return asio::post(socket_.get_executor(),
                      [finish = std::move(finish)] { finish(-1, asio::error::operation_aborted); });
  }
  ERR_clear_error();
  const int ret = attempt();
  if (ret > 0) {
    return asio::post(socket_.get_executor(),
                      [finish = std::move(finish), ret] { finish(ret, {}); });
  }
  const int error = SSL_get_error(ssl_.get(), ret);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    ERR_clear_error();
    socket_.async_wait(error == SSL_ERROR_WANT_READ ? tcp::socket::wait_read
                                                    : tcp::socket::wait_write,
                       [this, attempt = std::move(attempt), finish = std::move(finish)](
                           const boost::system::error_code& ec) mutable {
                         if (ec) return finish(-1, ec);
                         Drive(std::move(attempt), std::move(finish));
                       });
    return;
  }
  boost::system::error_code ec = ErrorOf(ret);
  asio::post(socket_.get_executor(), [finish = std::move(finish), ret, ec] { finish(ret, ec); });
}

void TlsStream::AsyncHandshake(std::function<void(Status)> done) {
  SSL* ssl = ssl_.get();
  Drive([ssl] { return SSL_do_handshake(ssl); },
        [this, done = std::move(done)](int, const boost::system::error_code& ec) {
          if (!ec) return done(Status::Ok());
          std::string why = ec == asio::error::eof ? "the peer closed the connection" : ec.message();
          if (ec.category() == asio::error::get_ssl_category()) {
            const int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
            if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
                reason == SSL_R_HTTP_REQUEST || reason == SSL_R_UNKNOWN_PROTOCOL) {
              why += " (the peer does not speak TLS)";
            }
          }
          if (ssl_) {
            const long verify = SSL_get_verify_result(ssl_.get());
            if (verify != X509_V_OK) {
              why += std::string(": ") + X509_verify_cert_error_string(verify);
            }
          }
          done(Unavailable("TLS handshake failed: " + why));
        });
}

void TlsStream::AsyncReadSome(std::span<std::byte> into, IoHandler done) {
  SSL* ssl = ssl_.get();
  const int n = static_cast<int>(std::min<size_t>(into.size(), 1u << 30));
  Drive([ssl, into, n] { return SSL_read(ssl, into.data(), n); },
        [done = std::move(done)](int ret, const boost::system::error_code& ec) {
          done(ec, ec ? 0 : static_cast<size_t>(ret));
        });
}

void TlsStream::AsyncWrite(std::span<const std::byte> bytes, IoHandler done) {
  if (bytes.empty()) {
    return asio::post(socket_.get_executor(), [done = std::move(done)] { done({}, 0); });
  }
  SSL* ssl = ssl_.get();
  // SSL_write writes all of it (no partial writes) or asks to be called
  // again with the same arguments.
  const std::span<const std::byte> part = bytes.first(std::min<size_t>(bytes.size(), 1u << 30));
  Drive([ssl, part] { return SSL_write(ssl, part.data(), static_cast<int>(part.size())); },
        [this, bytes, done = std::move(done)](int ret, const boost::system::error_code& ec) {
          if (ec) return done(ec, 0);
          const size_t n = static_cast<size_t>(ret);
          if (n == bytes.size()) return done({}, n);
          AsyncWrite(bytes.subspan(n), [n, done](const boost::system::error_code& e, size_t m) {
            done(e, e ? 0 : n + m);
          });
        });
}

void TlsStream::Close() {
  if (!socket_.is_open()) return;
  if (ssl_) {
    ERR_clear_error();
    SSL_shutdown(ssl_.get());  // close_notify, best effort (non-blocking)
    ERR_clear_error();
  }
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

std::string TlsStream::Describe() const {
  if (!ssl_) return "TLS";
  return std::string(SSL_get_version(ssl_.get())) + " " + SSL_get_cipher_name(ssl_.get());
}

Result<TlsStream::Detached> TlsStream::Detach() && {
  Detached out;
  boost::system::error_code ec;
  out.protocol = socket_.local_endpoint(ec).protocol();
  if (!ec) out.fd = socket_.release(ec);
  if (ec) {
    Close();
    return Unavailable("TLS: cannot hand the connection over: " + ec.message());
  }
  out.ssl = std::move(ssl_);
  return out;
}

Result<TlsStream> TlsStream::Attach(asio::io_context& io, Detached session) {
  tcp::socket socket(io);
  boost::system::error_code ec;
  socket.assign(session.protocol, session.fd, ec);
  if (ec) return Unavailable("TLS: cannot take the connection over: " + ec.message());
  session.fd = -1;  // the socket owns it now
  socket.non_blocking(true, ec);
  if (ec) return Unavailable("TLS: cannot make the socket non-blocking: " + ec.message());
  return TlsStream(std::move(socket), std::move(session.ssl));
}

}  // namespace rackhub::net::tls
