// Private to librackhub: one lane connection over a frame channel: an RDMA
// queue pair to the hub's lane (net/rdma/channel.h: frames written with RDMA
// WRITE WITH IMMEDIATE into the hub's registered ring, replies into this
// lane's) or a shared-memory ring pair with a hub on this host
// (net/shm/channel.h).
//
// Replies are copied once from the ring into the caller's `out` (fp32) or
// widened from it (fp16/bf16); gradients are copied once into the ring (then
// the caller's buffer is released).
//
// Thread: every member runs on the client's I/O thread (the channel's fds are
// watched by the client's io_context), except Handshake, which runs that
// io_context on the connecting thread before the I/O thread starts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "client_impl.h"
#include "lane_link.h"
#include "rackhub/net/outgoing_frame.h"

namespace rackhub::client::internal {

template <typename Channel>
class ChannelLane final : public LaneLink {
 public:
  // `transport` names it in errors ("rdma", "shm").
  ChannelLane(Client::Impl* owner, uint32_t index, std::shared_ptr<Channel> channel,
              const char* transport)
      : owner_(owner), index_(index), channel_(std::move(channel)), transport_(transport) {}
  ~ChannelLane() override;
  ChannelLane(const ChannelLane&) = delete;
  ChannelLane& operator=(const ChannelLane&) = delete;

  // The hub's first frame on the lane (WELCOME or ERROR) and its payload.
  struct HandshakeReply {
    net::FrameHeader header;
    std::string body;
  };
  // Sends HELLO (unless empty: shared memory sent it at set-up) and runs `io`
  // until the hub's first reply or `deadline`; UNAVAILABLE (timed out,
  // connection closed) otherwise.
  Result<HandshakeReply> Handshake(asio::io_context& io, const std::string& hello,
                                   std::chrono::steady_clock::time_point deadline);

  uint32_t index() const override { return index_; }
  bool open() const override { return open_; }
  void StartReading() override { handshake_ = false; }
  void Expect(uint64_t request_id, PendingRequest request) override;
  void Send(OutFrame frame) override;
  void SendByeAndClose() override;
  void Abort() override;

  Channel& channel() { return *channel_; }

 private:
  void OnFrame(const net::FrameHeader& h, std::span<const std::byte> payload);
  void OnClosed(const std::string& why);
  void Broken(const std::string& reason);

  Client::Impl* const owner_;
  const uint32_t index_;
  std::shared_ptr<Channel> channel_;
  const char* const transport_;
  bool open_ = true;
  bool closing_ = false;
  bool handshake_ = true;  // frames go to handshake_reply_ until StartReading
  bool have_reply_ = false;
  net::FrameHeader handshake_header_{};
  std::string handshake_body_;
  std::string closed_why_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
};

template <typename Channel>
ChannelLane<Channel>::~ChannelLane() {
  channel_->Detach();  // nothing may call back into this object any more
  channel_->Close("client lane destroyed");
}

template <typename Channel>
Result<typename ChannelLane<Channel>::HandshakeReply> ChannelLane<Channel>::Handshake(
    asio::io_context& io, const std::string& hello, std::chrono::steady_clock::time_point deadline) {
  typename Channel::Callbacks cb;
  cb.on_frame = [this](const net::FrameHeader& h, std::span<const std::byte> payload) {
    OnFrame(h, payload);
  };
  cb.on_violation = [this](const std::string& text) { OnClosed(text); };
  cb.on_closed = [this](const std::string& why) { OnClosed(why); };
  channel_->Attach(io, std::move(cb));
  if (!hello.empty()) {  // RDMA: HELLO goes through the channel
    net::FrameHeader h;
    h.opcode = net::Opcode::kHello;
    h.payload_bytes = static_cast<uint32_t>(hello.size());
    net::OutgoingFrame f;
    net::EncodeHeader(h, f.header);
    f.owned = hello;
    channel_->Send(std::move(f));
  }
  io.restart();
  while (!have_reply_ && open_ && std::chrono::steady_clock::now() < deadline) io.run_one_until(deadline);
  if (have_reply_) return HandshakeReply{handshake_header_, std::move(handshake_body_)};
  return Unavailable(open_ ? std::string("timed out waiting for WELCOME")
                           : "connection closed: " + closed_why_);
}

template <typename Channel>
void ChannelLane<Channel>::Expect(uint64_t request_id, PendingRequest request) {
  pending_.emplace(request_id, std::move(request));
}

template <typename Channel>
void ChannelLane<Channel>::Send(OutFrame frame) {
  const bool borrows = frame.borrows_user && frame.op;
  auto release = [owner = owner_, op = frame.op, borrows] {
    if (borrows) owner->ReleaseIo(op);
  };
  if (!open_ || closing_) {
    release();
    return;
  }
  net::OutgoingFrame f;
  f.header = frame.header;
  f.borrowed = std::span<const std::byte>(static_cast<const std::byte*>(frame.payload), frame.bytes);
  if (frame.op) {
    // Frames of operations that already failed are not sent.
    f.still_wanted = [op = frame.op] { return !op->failed; };
  }
  f.release = std::move(release);
  channel_->Send(std::move(f));
}

template <typename Channel>
void ChannelLane<Channel>::SendByeAndClose() {
  if (!open_ || closing_) return;
  net::FrameHeader h;
  h.opcode = net::Opcode::kBye;
  h.tenant = owner_->tenant_handle();
  net::OutgoingFrame f;
  net::EncodeHeader(h, f.header);
  f.close_after = true;  // the channel disconnects once BYE was delivered
  closing_ = true;
  channel_->Send(std::move(f));
}

template <typename Channel>
void ChannelLane<Channel>::Abort() {
  if (!open_) return;
  open_ = false;
  channel_->Close("aborted");  // drops queued frames, releasing their io_refs
  pending_.clear();            // their operations are failed by the owner
  owner_->LaneClosed();
}

template <typename Channel>
void ChannelLane<Channel>::OnClosed(const std::string& why) {
  if (!open_) return;
  closed_why_ = why;
  if (handshake_) {
    open_ = false;
    return;
  }
  if (closing_ || owner_->closing()) {
    open_ = false;
    pending_.clear();
    owner_->LaneClosed();
    return;
  }
  Broken(why);
}

template <typename Channel>
void ChannelLane<Channel>::Broken(const std::string& reason) {
  owner_->ConnectionLost("lane " + std::to_string(index_) + " (" + transport_ + "): " + reason);
}

template <typename Channel>
void ChannelLane<Channel>::OnFrame(const net::FrameHeader& h, std::span<const std::byte> payload) {
  if (!open_) return;
  if (const Status bad = net::CheckHeader(h); !bad.ok()) {
    if (handshake_) return OnClosed("invalid reply to HELLO: " + bad.message());
    return Broken("invalid frame header from the hub: " + bad.message());
  }
  if (handshake_) {
    if (have_reply_) return;
    handshake_header_ = h;
    handshake_body_.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    have_reply_ = true;
    return;
  }
  if (const Status s = RouteFrame(owner_, index_, h, payload, &pending_); !s.ok()) {
    owner_->ConnectionLost("lane " + std::to_string(index_) + ": " + s.message(),
                           s.code() != StatusCode::kFailedPrecondition);
    return;
  }
}

}  // namespace rackhub::client::internal
