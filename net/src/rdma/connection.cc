#include "rackhub/net/rdma/connection.h"

namespace rackhub::net::rdma {

RdmaConnection::RdmaConnection(FrameHandler* handler, std::shared_ptr<Channel> channel,
                               ConnectionIdentity id, boost::asio::io_context* io)
    : handler_(handler), channel_(std::move(channel)), id_(std::move(id)), io_(io) {}

RdmaConnection::~RdmaConnection() {
  // The channel may outlive us briefly (its pending handlers hold it); make
  // sure it calls nothing of ours.
  channel_->Detach();
  channel_->Close("connection destroyed");
}

void RdmaConnection::Start() {
  if (started_) return;
  started_ = true;
  std::weak_ptr<Connection> weak = weak_from_this();
  Channel::Callbacks cb;
  cb.on_frame = [weak](const FrameHeader& h, std::span<const std::byte> payload) {
    if (auto self = weak.lock()) static_cast<RdmaConnection*>(self.get())->OnFrame(h, payload);
  };
  cb.on_violation = [weak](const std::string& text) {
    if (auto self = weak.lock()) {
      self->SendError(WireError::kMalformed, text, 0, true);
    }
  };
  cb.on_closed = [weak](const std::string& why) {
    if (auto self = weak.lock()) static_cast<RdmaConnection*>(self.get())->OnChannelClosed(why);
  };
  cb.on_sent = [weak](size_t bytes) {
    if (auto self = weak.lock()) {
      auto* c = static_cast<RdmaConnection*>(self.get());
      c->handler_->OnBytesSent(*c, bytes);
    }
  };
  if (!channel_->open()) {  // closed before the lane adopted it
    channel_->Attach(*io_, std::move(cb));
    OnChannelClosed("the connection closed before the lane took it over");
    return;
  }
  channel_->Attach(*io_, std::move(cb));
}

void RdmaConnection::OnFrame(const FrameHeader& h, std::span<const std::byte> payload) {
  if (!open_ || closing_) return;
  if (Status valid = CheckHeader(h); !valid.ok()) {
    SendError(WireError::kMalformed, valid.message(), h.request_id, true);
    return;
  }
  // The lane checks every field before the payload is looked at.
  if (handler_->AcceptHeader(*this, h) != FrameHandler::Verdict::kAccept) return;
  handler_->HandleFrame(*this, h, payload);
}

void RdmaConnection::SendBorrowed(const FrameHeader& header, std::span<const std::byte> payload) {
  if (!open_) return;
  OutgoingFrame f;
  EncodeHeader(header, f.header);
  f.borrowed = payload;  // valid until written (ChunkState double buffering)
  channel_->Send(std::move(f));
}

void RdmaConnection::SendOwned(const FrameHeader& header, std::string payload) {
  if (!open_) return;
  OutgoingFrame f;
  FrameHeader h = header;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  EncodeHeader(h, f.header);
  f.owned = std::move(payload);
  channel_->Send(std::move(f));
}

void RdmaConnection::SendError(WireError code, const std::string& text, uint64_t request_id,
                               bool fatal) {
  if (!open_ || closing_) return;
  ErrorFrame e = MakeErrorFrame(code, text, id_.tenant_handle, request_id, fatal);
  OutgoingFrame f;
  f.owned = std::move(e.body);
  EncodeHeader(e.header, f.header);
  f.close_after = fatal;
  if (fatal) {
    closing_ = true;
    fatal_ = std::string(WireErrorName(code)) + ": " + text;
  }
  channel_->Send(std::move(f));
}

void RdmaConnection::Close(const std::string& why) {
  if (!open_) return;
  channel_->Close(why);  // calls OnChannelClosed while attached
  OnChannelClosed(why);
}

void RdmaConnection::OnChannelClosed(const std::string& why) {
  if (!open_) return;
  open_ = false;
  auto keep = shared_from_this();
  if (started_) handler_->OnConnectionClosed(*this, fatal_.empty() ? why : why + " (" + fatal_ + ")");
}

}  // namespace rackhub::net::rdma
