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
      c->Uncounted(bytes);
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

void RdmaConnection::SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                                std::shared_ptr<const void> owner) {
  if (!open_) return;
  OutgoingFrame f;
  EncodeHeader(header, f.header);
  f.borrowed = payload;
  f.owner = std::move(owner);  // held until staged
  Queue(std::move(f), kHeaderBytes + payload.size());
}

void RdmaConnection::SendOwned(const FrameHeader& header, std::string payload) {
  if (!open_) return;
  OutgoingFrame f;
  FrameHeader h = header;
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  EncodeHeader(h, f.header);
  const size_t bytes = kHeaderBytes + payload.size();
  f.owned = std::move(payload);
  Queue(std::move(f), bytes);
}

void RdmaConnection::Queue(OutgoingFrame f, size_t bytes) {
  if (closing_) return;  // nothing goes out after a fatal ERROR
  const bool over = budget_.Add(bytes);
  channel_->Send(std::move(f));
  Counted(over);
}

bool RdmaConnection::Reserve(size_t bytes) {
  if (!open_ || closing_) return false;
  if (budget_.WouldExceed(bytes)) {
    budget_.Add(bytes);  // for the error text
    FailOverLimit();
    return false;
  }
  Counted(budget_.Add(bytes));
  return true;
}

void RdmaConnection::Unreserve(size_t bytes) { Uncounted(bytes); }

void RdmaConnection::Counted(bool over) {
  if (!open_) return;
  if (over && !closing_) {
    FailOverLimit();
    return;
  }
  if (budget_.paused()) channel_->PauseDelivery(true);
}

void RdmaConnection::Uncounted(size_t bytes) {
  if (budget_.Remove(bytes) && open_) channel_->PauseDelivery(false);  // delivers on a fresh stack
}

void RdmaConnection::FailOverLimit() {
  const std::string text = budget_.OverLimitText();
  budget_.Remove(channel_->DropQueued());
  SendError(WireError::kQuotaExceeded, text, 0, true);
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
  const bool over = budget_.Add(kHeaderBytes + f.owned.size());
  channel_->Send(std::move(f));
  if (!fatal) Counted(over);
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
