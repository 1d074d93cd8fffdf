#include "rackhub/net/tcp/connection.h"

#include <algorithm>
#include <cstring>

namespace rackhub::net::tcp {

namespace asio = boost::asio;

TcpConnection::TcpConnection(FrameHandler* handler, asio::ip::tcp::socket socket,
                             ConnectionIdentity id)
    : StreamConnection(handler, std::move(id), socket.get_executor()),
      socket_(std::move(socket)),
      fatal_timer_(socket_.get_executor()) {}

namespace {

// Frames written with one gather write (two buffers each; IOV_MAX is 1024).
constexpr size_t kMaxFramesPerWrite = 64;

}  // namespace

void TcpConnection::Start() {
  started_ = true;
  ReadMore();
}

void TcpConnection::ReadMore() {
  if (!CanRead() || read_pending_) return;
  // The reader makes room for the frame being received (compacts, grows only
  // for a frame larger than its buffer); one recv takes all the room it has.
  const std::span<std::byte> room = reader_.WritableSpan();
  read_pending_ = true;
  socket_.async_read_some(asio::buffer(room.data(), room.size()),
                          [self = self()](const boost::system::error_code& ec, size_t n) {
                            self->OnRead(ec, n);
                          });
}

void TcpConnection::OnRead(const boost::system::error_code& ec, size_t bytes) {
  read_pending_ = false;
  if (!open_) return;
  if (ec) {
    const bool clean = ec == asio::error::eof && !reader_.inside_frame();
    std::string why = clean ? "peer closed the connection"
                            : (ec == asio::error::eof ? "peer closed the connection inside a frame"
                                                      : ec.message());
    EndOfStream(std::move(why));
    return;
  }
  Received(bytes);
}

// Past the limit: the frames in flight stay (and stay counted), the rest goes
// now (with its memory, and the reservations are void too); the connection
// closes once the fatal ERROR that follows is out, or after kFatalCloseGrace
// for a peer that does not read at all.
size_t TcpConnection::DropUnsent() {
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

void TcpConnection::WriteNext() {
  if (in_flight_ > 0 || out_.empty() || !open_) return;
  // One gather write for up to kMaxFramesPerWrite queued frames: header and
  // payload of each, no staging copy.
  in_flight_ = std::min(out_.size(), kMaxFramesPerWrite);
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(2 * in_flight_);
  for (size_t i = 0; i < in_flight_; ++i) {
    const QueuedFrame& f = out_[i];
    buffers.emplace_back(f.header.data(), f.header.size());
    if (!f.owned.empty()) {
      buffers.emplace_back(f.owned.data(), f.owned.size());
    } else if (!f.payload.empty()) {
      buffers.emplace_back(f.payload.data(), f.payload.size());
    }
  }
  asio::async_write(socket_, buffers,
                    [self = self()](const boost::system::error_code& ec, size_t n) {
                      if (!self->open_ || ec) {
                        // The write is over either way: its frames (and the
                        // owners of their payloads) go now, not with the
                        // connection, whose owner may keep it long after.
                        for (; self->in_flight_ > 0; --self->in_flight_) self->out_.pop_front();
                        if (self->open_) self->Close("write failed: " + ec.message());
                        return;
                      }
                      self->handler_->OnBytesSent(*self, n);
                      bool close_after = false;
                      size_t written = 0;
                      for (size_t i = 0; i < self->in_flight_; ++i) {
                        close_after = close_after || self->out_.front().close_after;
                        written += self->out_.front().size();
                        self->out_.pop_front();  // drops its payload's owner
                      }
                      self->in_flight_ = 0;
                      if (close_after) {
                        self->Close("closed after a fatal error (" + self->fatal_error() + ")");
                        return;
                      }
                      self->Uncounted(written);
                      self->WriteNext();
                    });
}

void TcpConnection::Close(const std::string& why) {
  if (!open_) return;
  open_ = false;
  reader_.Stop();
  fatal_timer_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // Frames not being written go now (their memory with them); the ones in a
  // cancelled write stay until its handler has run.
  while (out_.size() > in_flight_) out_.pop_back();
  handler_->OnConnectionClosed(*this, why);
}

}  // namespace rackhub::net::tcp
