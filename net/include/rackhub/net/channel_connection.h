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
// Bounded (SendLimits, BoundedConnection): the backlog is the bytes of frames
// handed to the channel and not yet reported sent; above pause_bytes the channel holds
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
#include "rackhub/net/bounded_connection.h"
#include "rackhub/net/outgoing_frame.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

template <typename Channel>
class ChannelConnection final : public BoundedConnection {
 public:
  // `channel` is connected and detached; `io` is the lane's io_context (the
  // caller runs on its thread). `handler` must outlive the connection.
  ChannelConnection(FrameHandler* handler, std::shared_ptr<Channel> channel, ConnectionIdentity id,
                    boost::asio::io_context* io)
      : BoundedConnection(std::move(id)), handler_(handler), channel_(std::move(channel)), io_(io) {}
  ~ChannelConnection() override {
    // Closed while still attached (the channel's grace timers run on the
    // lane), then detached: it calls nothing of ours after this (its
    // callbacks hold only a weak reference, expired here).
    channel_->Close("connection destroyed");
    channel_->Detach();
  }

  bool open() const override { return open_; }
  void Start() override;
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

  Channel& channel() { return *channel_; }

 private:
  static constexpr bool kTakesTurns = requires(Channel& c) { c.Grant(); };

  // The channel copies the payload into its ring when it posts the frame; a
  // shared payload's owner is held until then.
  void Push(QueuedFrame q) override {
    OutgoingFrame f;
    f.header = q.header;
    f.owned = std::move(q.owned);
    f.borrowed = q.payload;
    f.owner = std::move(q.owner);
    f.close_after = q.close_after;
    channel_->Send(std::move(f));
  }
  void PauseIntake() override { channel_->PauseDelivery(true); }
  void ResumeIntake() override { channel_->PauseDelivery(false); }  // delivers on a fresh stack
  // The channel's own grace timer closes after a fatal ERROR it cannot send.
  size_t DropUnsent() override { return channel_->DropQueued(); }
  void OnFrame(const FrameHeader& h, std::span<const std::byte> payload) {
    if (!open_ || closing()) return;
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
      const std::string& fatal = fatal_error();
      handler_->OnConnectionClosed(*this, fatal.empty() ? why : why + " (" + fatal + ")");
    }
  }

  FrameHandler* handler_;
  std::shared_ptr<Channel> channel_;
  boost::asio::io_context* io_;
  bool open_ = true;
  bool started_ = false;
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

}  // namespace rackhub::net
