#include "rackhub/net/tcp/connection.h"

#include <algorithm>
#include <cstring>

namespace rackhub::net::tcp {

namespace asio = boost::asio;

TcpConnection::TcpConnection(FrameHandler* handler, asio::ip::tcp::socket socket,
                             ConnectionIdentity id)
    : handler_(handler),
      socket_(std::move(socket)),
      id_(std::move(id)),
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
  if (!open_ || !started_ || closing_ || reader_.stopped() || reader_.paused() ||
      reader_.awaiting_turn() || read_pending_) {
    return;
  }
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
    // In its turn, like a frame (the scheduler's order), else now.
    if (reader_.RequestTurnToClose(*this)) {
      close_in_turn_ = std::move(why);
    } else {
      Close(why);
    }
    return;
  }
  reader_.Commit(bytes);
  Pump();
}

void TcpConnection::Pump() {
  if (reader_.DeliverOrRequestTurn(*this, *handler_)) ReadMore();
}

void TcpConnection::DeliverTurn() {
  reader_.TurnGranted();
  if (!close_in_turn_.empty()) return Close(close_in_turn_);
  if (!open_ || closing_) return;
  reader_.Parse(*this, *handler_);
  ReadMore();
}

void TcpConnection::SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                               std::shared_ptr<const void> owner) {
  Enqueue(QueuedFrame::Shared(header, payload, std::move(owner)));
}

void TcpConnection::SendOwned(const FrameHeader& header, std::string payload) {
  Enqueue(QueuedFrame::Owned(header, std::move(payload)));
}

void TcpConnection::SendError(WireError code, const std::string& text, uint64_t request_id,
                               bool fatal) {
  if (!open_ || closing_) return;
  QueuedFrame f = QueuedFrame::Error(code, text, id_.tenant_handle, request_id, fatal);
  if (fatal) {
    QueueFatal(std::move(f), std::string(WireErrorName(code)) + ": " + text);
    return;
  }
  Enqueue(std::move(f));
}

void TcpConnection::QueueFatal(QueuedFrame frame, const std::string& reason) {
  closing_ = true;
  fatal_ = reason;
  reader_.Stop();
  const size_t n = frame.size();
  out_.push_back(std::move(frame));
  budget_.Add(n);  // the last frame: never fails the connection again
  WriteNext();
}

void TcpConnection::Enqueue(QueuedFrame frame) {
  // Nothing goes out after a fatal ERROR: do not hold it either.
  if (!open_ || closing_) return;
  const size_t n = frame.size();
  out_.push_back(std::move(frame));
  Counted(budget_.Add(n));
  WriteNext();
}

bool TcpConnection::Reserve(size_t bytes) {
  if (!open_ || closing_) return false;
  if (budget_.WouldExceed(bytes)) {
    budget_.Add(bytes);  // for the error text
    FailOverLimit();
    return false;
  }
  Counted(budget_.Add(bytes));
  return true;
}

void TcpConnection::Unreserve(size_t bytes) { Uncounted(bytes); }

void TcpConnection::Counted(bool over) {
  if (over && !closing_) {
    FailOverLimit();
    return;
  }
  if (budget_.paused()) reader_.Pause(true);
}

void TcpConnection::Uncounted(size_t bytes) {
  if (!budget_.Remove(bytes) || !open_) return;
  // Resume on a fresh stack: this may run inside the lane's handling of
  // another connection's frame, which must not see this one's frames now.
  reader_.Pause(false);
  if (resume_posted_) return;
  resume_posted_ = true;
  asio::post(socket_.get_executor(), [self = self()] {
    self->resume_posted_ = false;
    if (!self->open_ || self->closing_ || self->reader_.paused()) return;
    self->Pump();  // frames already buffered
  });
}

// Past the limit: what is not being written yet goes now (with its memory),
// a fatal QUOTA_EXCEEDED follows the frames in flight, and the connection
// closes once that is out, or after kFatalCloseGrace for a peer that does
// not read at all.
void TcpConnection::FailOverLimit() {
  const std::string text = budget_.OverLimitText();
  while (out_.size() > in_flight_) out_.pop_back();
  size_t in_flight_bytes = 0;
  for (const QueuedFrame& f : out_) in_flight_bytes += f.size();
  budget_.Remove(budget_.bytes() - in_flight_bytes);  // reservations are void too
  QueueFatal(QueuedFrame::Error(WireError::kQuotaExceeded, text, id_.tenant_handle, 0, true),
             std::string(WireErrorName(WireError::kQuotaExceeded)) + ": " + text);
  fatal_timer_.expires_after(kFatalCloseGrace);
  fatal_timer_.async_wait([self = self()](const boost::system::error_code& ec) {
    if (!ec) self->Close("closed: the peer did not take the fatal error within 2 s (" +
                         self->fatal_ + ")");
  });
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
                        self->Close("closed after a fatal error (" + self->fatal_ + ")");
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
