// Private to librackhub: one lane connection over RDMA (net/rdma/channel.h):
// an RC queue pair to the hub's lane, frames written with RDMA WRITE WITH
// IMMEDIATE into the hub's registered ring, replies written by the hub into
// this lane's registered ring.
//
// Replies are copied once from the ring into the caller's `out` (fp32) or
// widened from it (fp16/bf16); gradients are copied once into the registered
// staging ring (then the caller's buffer is released). Zero-copy placement of
// PARAMS into a registered `out` is not done yet.
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
#include "rackhub/net/rdma/channel.h"

namespace rackhub::client::internal {

class RdmaLane final : public LaneLink {
 public:
  RdmaLane(Client::Impl* owner, uint32_t index, std::shared_ptr<net::rdma::Channel> channel);
  ~RdmaLane() override;
  RdmaLane(const RdmaLane&) = delete;
  RdmaLane& operator=(const RdmaLane&) = delete;

  // The hub's first frame on the lane (WELCOME or ERROR) and its payload.
  struct HandshakeReply {
    net::FrameHeader header;
    std::string body;
  };
  // Sends HELLO and runs `io` until the hub's first reply or `deadline`;
  // UNAVAILABLE (timed out, connection closed) otherwise.
  Result<HandshakeReply> Handshake(asio::io_context& io, const std::string& hello,
                                   std::chrono::steady_clock::time_point deadline);

  uint32_t index() const override { return index_; }
  bool open() const override { return open_; }
  void StartReading() override { handshake_ = false; }
  void Expect(uint64_t request_id, PendingRequest request) override;
  void Send(OutFrame frame) override;
  void SendByeAndClose() override;
  void Abort() override;

  net::rdma::Channel& channel() { return *channel_; }

 private:
  void OnFrame(const net::FrameHeader& h, std::span<const std::byte> payload);
  void OnClosed(const std::string& why);
  void Broken(const std::string& reason);

  Client::Impl* const owner_;
  const uint32_t index_;
  std::shared_ptr<net::rdma::Channel> channel_;
  bool open_ = true;
  bool closing_ = false;
  bool handshake_ = true;  // frames go to handshake_reply_ until StartReading
  bool have_reply_ = false;
  net::FrameHeader handshake_header_{};
  std::string handshake_body_;
  std::string closed_why_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
};

}  // namespace rackhub::client::internal
