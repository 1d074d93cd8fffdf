#include "rackhub/net/tcp/connection.h"

#include <algorithm>
#include <cstring>

namespace rackhub::net::tcp {

namespace asio = boost::asio;

TcpConnection::TcpConnection(FrameHandler* handler, asio::ip::tcp::socket socket,
                             ConnectionIdentity id)
    : handler_(handler), socket_(std::move(socket)), id_(std::move(id)) {}

namespace {

// Initial receive buffer: room for several 32 KiB chunk frames per recv.
constexpr size_t kInitialReceiveBytes = 256 * 1024;
// Frames written with one gather write (two buffers each; IOV_MAX is 1024).
constexpr size_t kMaxFramesPerWrite = 64;

}  // namespace

void TcpConnection::Start() {
  rbuf_.resize(kInitialReceiveBytes);
  ReadMore();
}

void TcpConnection::ReadMore() {
  if (!open_ || closing_) return;
  if (rstart_ == rend_) rstart_ = rend_ = 0;
  // Room for the frame being received: compact, and grow only when one frame
  // is larger than the buffer.
  const size_t need = have_header_ ? header_.payload_bytes : kHeaderBytes;
  if (rbuf_.size() - rstart_ < need || rend_ == rbuf_.size()) {
    std::memmove(rbuf_.data(), rbuf_.data() + rstart_, rend_ - rstart_);
    rend_ -= rstart_;
    rstart_ = 0;
    if (rbuf_.size() < need) rbuf_.resize(std::max(need, 2 * rbuf_.size()));
  }
  socket_.async_read_some(asio::buffer(rbuf_.data() + rend_, rbuf_.size() - rend_),
                          [self = self()](const boost::system::error_code& ec, size_t n) {
                            self->OnRead(ec, n);
                          });
}

void TcpConnection::OnRead(const boost::system::error_code& ec, size_t bytes) {
  if (!open_) return;
  if (ec) {
    const bool clean = ec == asio::error::eof && !have_header_ && skip_ == 0 && rstart_ == rend_;
    Close(clean ? "peer closed the connection"
                : (ec == asio::error::eof ? "peer closed the connection inside a frame"
                                          : ec.message()));
    return;
  }
  rend_ += bytes;
  ParseFrames();
  ReadMore();
}

void TcpConnection::ParseFrames() {
  while (open_ && !closing_) {
    const size_t avail = rend_ - rstart_;
    if (skip_ > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(skip_, avail));
      rstart_ += n;
      skip_ -= n;
      if (skip_ > 0) return;
      continue;
    }
    if (!have_header_) {
      if (avail < kHeaderBytes) return;
      header_ = DecodeHeader(std::span<const std::byte, kHeaderBytes>(rbuf_.data() + rstart_,
                                                                        kHeaderBytes));
      rstart_ += kHeaderBytes;
      if (auto error = ValidateHeader(header_); !error.empty()) {
        SendError(WireError::kMalformed, error, header_.request_id, true);
        return;
      }
      // The lane checks every field against its state before the payload
      // is looked at (or room is made for it).
      const auto verdict = handler_->AcceptHeader(*this, header_);
      if (verdict == FrameHandler::Verdict::kReject) return;
      if (verdict == FrameHandler::Verdict::kDiscard) {
        skip_ = header_.payload_bytes;
        continue;
      }
      have_header_ = true;
      continue;
    }
    if (avail < header_.payload_bytes) return;
    const std::span<const std::byte> payload(rbuf_.data() + rstart_, header_.payload_bytes);
    rstart_ += header_.payload_bytes;
    have_header_ = false;
    handler_->HandleFrame(*this, header_, payload);
  }
}

void TcpConnection::SendBorrowed(const FrameHeader& header,
                                  std::span<const std::byte> payload) {
  OutFrame f;
  EncodeHeader(header, f.header);
  f.payload = payload;
  Enqueue(std::move(f));
}

void TcpConnection::SendOwned(const FrameHeader& header, std::string payload) {
  OutFrame f;
  FrameHeader h = header;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  EncodeHeader(h, f.header);
  f.owned = std::move(payload);
  Enqueue(std::move(f));
}

void TcpConnection::SendError(WireError code, const std::string& text, uint64_t request_id,
                               bool fatal) {
  if (!open_ || closing_) return;
  ErrorFrame e = MakeErrorFrame(code, text, id_.tenant_handle, request_id, fatal);
  OutFrame f;
  f.owned = std::move(e.body);
  EncodeHeader(e.header, f.header);
  f.close_after = fatal;
  if (fatal) closing_ = true;
  Enqueue(std::move(f));
}

void TcpConnection::Enqueue(OutFrame frame) {
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
    const OutFrame& f = out_[i];
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
  boost::system::error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  // out_ is kept: a cancelled write may still reference it until its handler runs.
  handler_->OnConnectionClosed(*this, why);
}

}  // namespace rackhub::net::tcp
