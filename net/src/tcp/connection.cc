#include "rackhub/net/tcp/connection.h"

#include <algorithm>
#include <cstring>

namespace rackhub::net::tcp {

namespace asio = boost::asio;

TcpConnection::TcpConnection(FrameHandler* handler, asio::ip::tcp::socket socket,
                             ConnectionIdentity id)
    : handler_(handler), socket_(std::move(socket)), id_(std::move(id)) {}

namespace {

// Frames written with one gather write (two buffers each; IOV_MAX is 1024).
constexpr size_t kMaxFramesPerWrite = 64;

}  // namespace

void TcpConnection::Start() { ReadMore(); }

void TcpConnection::ReadMore() {
  if (!open_ || closing_ || reader_.stopped()) return;
  // The reader makes room for the frame being received (compacts, grows only
  // for a frame larger than its buffer); one recv takes all the room it has.
  const std::span<std::byte> room = reader_.WritableSpan();
  socket_.async_read_some(asio::buffer(room.data(), room.size()),
                          [self = self()](const boost::system::error_code& ec, size_t n) {
                            self->OnRead(ec, n);
                          });
}

void TcpConnection::OnRead(const boost::system::error_code& ec, size_t bytes) {
  if (!open_) return;
  if (ec) {
    const bool clean = ec == asio::error::eof && !reader_.inside_frame();
    Close(clean ? "peer closed the connection"
                : (ec == asio::error::eof ? "peer closed the connection inside a frame"
                                          : ec.message()));
    return;
  }
  reader_.Commit(bytes);
  reader_.Parse(*this, *handler_);
  ReadMore();
}

void TcpConnection::SendBorrowed(const FrameHeader& header,
                                 std::span<const std::byte> payload) {
  Enqueue(QueuedFrame::Borrowed(header, payload));
}

void TcpConnection::SendOwned(const FrameHeader& header, std::string payload) {
  Enqueue(QueuedFrame::Owned(header, std::move(payload)));
}

void TcpConnection::SendError(WireError code, const std::string& text, uint64_t request_id,
                               bool fatal) {
  if (!open_ || closing_) return;
  if (fatal) {
    closing_ = true;
    reader_.Stop();
  }
  Enqueue(QueuedFrame::Error(code, text, id_.tenant_handle, request_id, fatal));
}

void TcpConnection::Enqueue(QueuedFrame frame) {
  if (!open_) return;
  out_.push_back(std::move(frame));
  WriteNext();
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
                      if (!self->open_) return;
                      if (ec) {
                        self->Close("write failed: " + ec.message());
                        return;
                      }
                      self->handler_->OnBytesSent(*self, n);
                      bool close_after = false;
                      for (size_t i = 0; i < self->in_flight_; ++i) {
                        close_after = close_after || self->out_.front().close_after;
                        self->out_.pop_front();
                      }
                      self->in_flight_ = 0;
                      if (close_after) {
                        self->Close("closed after a fatal error");
                        return;
                      }
                      self->WriteNext();
                    });
}

void TcpConnection::Close(const std::string& why) {
  if (!open_) return;
  open_ = false;
  reader_.Stop();
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // out_ is kept: a cancelled write may still reference it until its handler runs.
  handler_->OnConnectionClosed(*this, why);
}

}  // namespace rackhub::net::tcp
