#include "rackhub/net/tls/connection.h"

#include <algorithm>

namespace rackhub::net::tls {

namespace asio = boost::asio;

namespace {

// A batch stops growing past this many bytes (a single larger frame goes alone).
constexpr size_t kMaxBatchBytes = 256u << 10;
constexpr size_t kMaxFramesPerWrite = 64;

}  // namespace

TlsConnection::TlsConnection(FrameHandler* handler, TlsStream stream, ConnectionIdentity id)
    : StreamConnection(handler, std::move(id), stream.socket().get_executor()),
      stream_(std::move(stream)),
      fatal_timer_(stream_.socket().get_executor()) {}

void TlsConnection::Start() {
  started_ = true;
  ReadMore();
}

void TlsConnection::ReadMore() {
  if (!CanRead() || read_pending_) return;
  const std::span<std::byte> room = reader_.WritableSpan();
  read_pending_ = true;
  stream_.AsyncReadSome(room, [self = self()](const boost::system::error_code& ec, size_t n) {
    self->OnRead(ec, n);
  });
}

void TlsConnection::OnRead(const boost::system::error_code& ec, size_t bytes) {
  read_pending_ = false;
  if (!open_) return;
  if (ec) {
    const bool clean = ec == asio::error::eof && !reader_.inside_frame();
    std::string why = clean ? "peer closed the connection"
                            : (ec == asio::error::eof ? "peer closed the connection inside a frame"
                                                      : "TLS: " + ec.message());
    EndOfStream(std::move(why));
    return;
  }
  Received(bytes);
}

size_t TlsConnection::DropUnsent() {
  while (out_.size() > in_flight_) out_.pop_back();
  size_t in_flight_bytes = 0;
  for (const QueuedFrame& f : out_) in_flight_bytes += f.size();
  fatal_timer_.expires_after(kFatalCloseGrace);
  fatal_timer_.async_wait([self = self()](const boost::system::error_code& ec) {
    if (!ec) self->Close("closed: the peer did not take the fatal error within 2 s (" +
                         self->fatal_error() + ")");
  });
  return backlog_bytes() - in_flight_bytes;
}

void TlsConnection::WriteNext() {
  if (in_flight_ > 0 || out_.empty() || !open_) return;
  staging_.clear();
  while (in_flight_ < out_.size() && in_flight_ < kMaxFramesPerWrite &&
         (in_flight_ == 0 || staging_.size() + out_[in_flight_].size() <= kMaxBatchBytes)) {
    const QueuedFrame& f = out_[in_flight_++];
    staging_.append(reinterpret_cast<const char*>(f.header.data()), f.header.size());
    if (!f.owned.empty()) {
      staging_.append(f.owned);
    } else if (!f.payload.empty()) {
      staging_.append(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
    }
  }
  stream_.AsyncWrite(std::as_bytes(std::span<const char>(staging_)),
                     [self = self()](const boost::system::error_code& ec, size_t) {
                       self->OnWritten(ec);
                     });
}

void TlsConnection::OnWritten(const boost::system::error_code& ec) {
  if (!open_ || ec) {
    for (; in_flight_ > 0; --in_flight_) out_.pop_front();
    if (open_) Close("write failed: TLS: " + ec.message());
    return;
  }
  handler_->OnBytesSent(*this, staging_.size());
  bool close_after = false;
  size_t written = 0;
  for (size_t i = 0; i < in_flight_; ++i) {
    close_after = close_after || out_.front().close_after;
    written += out_.front().size();
    out_.pop_front();
  }
  in_flight_ = 0;
  if (close_after) {
    Close("closed after a fatal error (" + fatal_error() + ")");
    return;
  }
  Uncounted(written);
  WriteNext();
}

void TlsConnection::Close(const std::string& why) {
  if (!open_) return;
  open_ = false;
  reader_.Stop();
  fatal_timer_.cancel();
  stream_.Close();
  while (out_.size() > in_flight_) out_.pop_back();
  handler_->OnConnectionClosed(*this, why);
}

}  // namespace rackhub::net::tls
