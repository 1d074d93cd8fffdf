// net::Connection over a frame channel (docs/architecture.md, Transports):
// the one implementation shared by the transports that move whole frames
// through a ring: rdma::Channel (RDMA WRITE WITH IMMEDIATE into the peer's
// registered ring) and shm::Channel (a ring in memory shared with a process
// on the same host). The lane sees exactly what it sees over TCP:
// AcceptHeader before the payload is touched, HandleFrame with the payload in
// place (in the receive ring, no copy), OnConnectionClosed once.
//
// Replies: SendShared/SendOwned hand the frame to the channel, which copies
// the payload once into its ring; a shared payload's owner is held until then.
//
// Bounded (SendLimits): the backlog is the bytes of frames handed to the
// channel and not yet reported sent; above pause_bytes the channel holds
// arriving frames in its ring without consuming them (the peer stops once the
// ring is full); past max_bytes the frames not posted yet are dropped and a
// fatal QUOTA_EXCEEDED ERROR is sent (closed once out, or after the channel's
// grace period).
//
// What a Channel must offer (both do): Callbacks {on_frame, on_violation,
// on_closed, on_sent}, Attach(io, callbacks), Detach(), Send(OutgoingFrame),
// DropQueued(), PauseDelivery(bool), Close(why), open().
//
// Turns (SetDeliveryScheduler): a channel that can deliver in turns
// (Callbacks::request_turn and Grant(): shm::Channel) asks the lane's
// scheduler before each frame, like a TCP connection, so shared-memory
// tenants get the lane in proportion to their weights too. The RDMA channel
// delivers as frames arrive (its peer is bounded by the credits of its ring).
//
// Thread safety: every member runs on the owning lane's thread only (the
// channel's fds are watched by that lane's io_context).
#pragma once

#include <memory>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/outgoing_frame.h"
#include "rackhub/net/send_budget.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

template <typename Channel>
class ChannelConnection final : public Connection {
 public:
  // `channel` is connected and detached; `io` is the lane's io_context (the
  // caller runs on its thread). `handler` must outlive the connection.
  ChannelConnection(FrameHandler* handler, std::shared_ptr<Channel> channel, ConnectionIdentity id,
                    boost::asio::io_context* io)
      : handler_(handler), channel_(std::move(channel)), id_(std::move(id)), io_(io) {}
  ~ChannelConnection() override {
    // Closed while still attached (the channel's grace timers run on the
    // lane), then detached: it calls nothing of ours after this (its
    // callbacks hold only a weak reference, expired here).
    channel_->Close("connection destroyed");
    channel_->Detach();
  }

  const ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return open_; }
  void Start() override;
  void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) override {
    if (!open_) return;
    OutgoingFrame f;
    EncodeHeader(header, f.header);
    f.borrowed = payload;
    f.owner = std::move(owner);  // held until copied into the ring
    Queue(std::move(f), kHeaderBytes + payload.size());
  }
  void SendOwned(const FrameHeader& header, std::string payload) override {
    if (!open_) return;
    OutgoingFrame f;
    FrameHeader h = header;
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    EncodeHeader(h, f.header);
    const size_t bytes = kHeaderBytes + payload.size();
    f.owned = std::move(payload);
    Queue(std::move(f), bytes);
  }
  void SendError(WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) override;
  void Close(const std::string& why) override {
    if (!open_) return;
    channel_->Close(why);  // calls OnChannelClosed while attached
    OnChannelClosed(why);
  }
  void SetDeliveryScheduler(DeliveryScheduler* scheduler) override {
    if constexpr (kTakesTurns) scheduler_ = scheduler;
  }
  void DeliverTurn() override {
    if constexpr (kTakesTurns) {
      if (open_) channel_->Grant();
    }
  }
  void SetSendLimits(const SendLimits& limits) override { budget_.set_limits(limits); }
  size_t backlog_bytes() const override { return budget_.bytes(); }
  bool Reserve(size_t bytes) override {
    if (!open_ || closing_) return false;
    if (budget_.WouldExceed(bytes)) {
      budget_.Add(bytes);  // for the error text
      FailOverLimit();
      return false;
    }
    Counted(budget_.Add(bytes));
    return true;
  }
  void Unreserve(size_t bytes) override { Uncounted(bytes); }

  Channel& channel() { return *channel_; }

 private:
  static constexpr bool kTakesTurns = requires(Channel& c) { c.Grant(); };

  void Queue(OutgoingFrame f, size_t bytes) {
    if (closing_) return;  // nothing goes out after a fatal ERROR
    const bool over = budget_.Add(bytes);
    channel_->Send(std::move(f));
    Counted(over);
  }
  void Counted(bool over) {
    if (!open_) return;
    if (over && !closing_) {
      FailOverLimit();
      return;
    }
    if (budget_.paused()) channel_->PauseDelivery(true);
  }
  void Uncounted(size_t bytes) {
    if (budget_.Remove(bytes) && open_) channel_->PauseDelivery(false);  // delivers on a fresh stack
  }
  void FailOverLimit() {
    const std::string text = budget_.OverLimitText();
    budget_.Remove(channel_->DropQueued());
    SendError(WireError::kQuotaExceeded, text, 0, true);
  }
  void OnFrame(const FrameHeader& h, std::span<const std::byte> payload) {
    if (!open_ || closing_) return;
    if (Status valid = CheckHeader(h); !valid.ok()) {
      SendError(WireError::kMalformed, valid.message(), h.request_id, true);
      return;
    }
    // The lane checks every field before the payload is looked at.
    if (handler_->AcceptHeader(*this, h) != FrameHandler::Verdict::kAccept) return;
    handler_->HandleFrame(*this, h, payload);
  }
  void OnChannelClosed(const std::string& why) {
    if (!open_) return;
    open_ = false;
    auto keep = shared_from_this();
    if (started_) {
      handler_->OnConnectionClosed(*this, fatal_.empty() ? why : why + " (" + fatal_ + ")");
    }
  }

  FrameHandler* handler_;
  std::shared_ptr<Channel> channel_;
  ConnectionIdentity id_;
  boost::asio::io_context* io_;
  bool open_ = true;
  bool started_ = false;
  bool closing_ = false;  // a fatal error is queued: deliver nothing more
  std::string fatal_;     // that error, for the close reason
  SendBudget budget_;
  DeliveryScheduler* scheduler_ = nullptr;  // not owned; null: deliver as frames arrive
};

template <typename Channel>
void ChannelConnection<Channel>::Start() {
  if (started_) return;
  started_ = true;
  std::weak_ptr<Connection> weak = weak_from_this();
  const auto self_of = [](const std::shared_ptr<Connection>& c) {
    return static_cast<ChannelConnection*>(c.get());
  };
  typename Channel::Callbacks cb;
  cb.on_frame = [weak, self_of](const FrameHeader& h, std::span<const std::byte> payload) {
    if (auto self = weak.lock()) self_of(self)->OnFrame(h, payload);
  };
  cb.on_violation = [weak](const std::string& text) {
    if (auto self = weak.lock()) self->SendError(WireError::kMalformed, text, 0, true);
  };
  cb.on_closed = [weak, self_of](const std::string& why) {
    if (auto self = weak.lock()) self_of(self)->OnChannelClosed(why);
  };
  if constexpr (kTakesTurns) {
    if (scheduler_ != nullptr) {
      cb.request_turn = [weak, self_of](size_t bytes) {
        if (auto self = weak.lock()) {
          ChannelConnection* c = self_of(self);
          if (c->open_) c->scheduler_->RequestTurn(std::move(self), bytes);
        }
      };
    }
  }
  cb.on_sent = [weak, self_of](size_t bytes) {
    if (auto self = weak.lock()) {
      ChannelConnection* c = self_of(self);
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

template <typename Channel>
void ChannelConnection<Channel>::SendError(WireError code, const std::string& text,
                                           uint64_t request_id, bool fatal) {
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

}  // namespace rackhub::net
