#include "rackhub/net/tcp/connection.h"

namespace rackhub::net::tcp {

namespace asio = boost::asio;

TcpConnection::TcpConnection(FrameHandler* handler, asio::ip::tcp::socket socket,
                             ConnectionIdentity id)
    : handler_(handler), socket_(std::move(socket)), id_(std::move(id)) {}

void TcpConnection::Start() { ReadHeader(); }

void TcpConnection::ReadHeader() {
  if (!open_ || closing_) return;
  asio::async_read(socket_, asio::buffer(header_buf_),
                   [self = self()](const boost::system::error_code& ec, size_t) {
                     self->OnHeader(ec);
                   });
}

void TcpConnection::OnHeader(const boost::system::error_code& ec) {
  if (!open_) return;
  if (ec) {
    Close(ec == asio::error::eof ? "peer closed the connection" : ec.message());
    return;
  }
  header_ = DecodeHeader(header_buf_);
  if (auto error = ValidateHeader(header_); !error.empty()) {
    SendError(WireError::kMalformed, error, header_.request_id, true);
    return;
  }
  // The lane checks every field against its state before we read (and size)
  // the payload.
  const auto verdict = handler_->AcceptHeader(*this, header_);
  if (verdict == FrameHandler::Verdict::kReject) return;
  discard_ = verdict == FrameHandler::Verdict::kDiscard;
  if (header_.payload_bytes == 0) {
    OnPayload({});
    return;
  }
  payload_buf_.resize(header_.payload_bytes);
  asio::async_read(socket_, asio::buffer(payload_buf_),
                   [self = self()](const boost::system::error_code& ec, size_t) {
                     self->OnPayload(ec);
                   });
}

void TcpConnection::OnPayload(const boost::system::error_code& ec) {
  if (!open_) return;
  if (ec) {
    Close("connection lost in a payload: " + ec.message());
    return;
  }
  if (!discard_) {
    handler_->HandleFrame(*this, header_,
                       std::span<const std::byte>(payload_buf_.data(), header_.payload_bytes));
  }
  ReadHeader();
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
  FrameHeader h;
  h.opcode = Opcode::kError;
  h.flags = fatal ? kFlagFatal : 0;
  h.tenant = id_.tenant_handle;
  h.request_id = request_id;
  OutFrame f;
  f.owned = EncodeErrorBody(code, text);
  h.payload_bytes = static_cast<uint32_t>(f.owned.size());
  EncodeHeader(h, f.header);
  f.close_after = fatal;
  if (fatal) closing_ = true;
  Enqueue(std::move(f));
}

void TcpConnection::Enqueue(OutFrame frame) {
  if (!open_) return;
  out_.push_back(std::move(frame));
  if (!writing_) WriteNext();
}

void TcpConnection::WriteNext() {
  if (out_.empty() || !open_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  OutFrame& f = out_.front();
  const asio::const_buffer payload = f.owned.empty()
                                         ? asio::const_buffer(f.payload.data(), f.payload.size())
                                         : asio::const_buffer(f.owned.data(), f.owned.size());
  std::array<asio::const_buffer, 2> buffers = {asio::const_buffer(f.header.data(), f.header.size()),
                                               payload};
  asio::async_write(socket_, buffers,
                    [self = self()](const boost::system::error_code& ec, size_t n) {
                      if (!self->open_) return;
                      if (ec) {
                        self->Close("write failed: " + ec.message());
                        return;
                      }
                      self->handler_->OnBytesSent(*self, n);
                      const bool close_after = self->out_.front().close_after;
                      self->out_.pop_front();
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
