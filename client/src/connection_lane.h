// Private to rackhub_client_testing (rackhub/client/testing.h): one lane of a
// client over any net::Connection, e.g. the client end of an in-memory
// connection pair whose hub end sits in a hub running in the same process.
//
// The connection lives on a caller-owned io_context (`conn_io`, its own
// thread), because the in-memory transport needs both io_contexts to outlive
// both ends, and a client's io_context dies with the client. A Bridge, the
// connection's FrameHandler, copies each frame and posts it to the client's
// I/O thread; the lane posts its sends to `conn_io`. Replies are checked and
// routed exactly as by the TCP lane (lane.cc) and the RDMA lane: same checks,
// same order, same errors. Outgoing payloads are copied when Send is called
// (the caller's buffer is released at once); BYE is followed by a close once
// the connection reported every queued byte sent.
//
// Ownership: the client owns the lane; the lane and the connection share the
// Bridge, which the lane detaches on destruction so that nothing is posted to
// the client afterwards. The destructor closes the connection on `conn_io`'s
// thread and waits (up to 10 s) for that.
// Threads: every LaneLink member runs on the client's I/O thread, except
// Handshake (on the connecting thread, running the client's io_context
// there before the I/O thread starts) and the destructor (the thread that
// destroys the client, after its I/O thread stopped).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "client_impl.h"
#include "lane_link.h"
#include "rackhub/client/testing.h"
#include "rackhub/common/status.h"
#include "rackhub/net/transport.h"

namespace rackhub::client::internal {

class ConnectionLane final : public LaneLink {
 public:
  ConnectionLane(Client::Impl* owner, uint32_t index, asio::io_context& conn_io);
  ~ConnectionLane() override;
  ConnectionLane(const ConnectionLane&) = delete;
  ConnectionLane& operator=(const ConnectionLane&) = delete;

  // The hub's first frame on the lane (WELCOME or ERROR) and its payload.
  struct HandshakeReply {
    net::FrameHeader header;
    std::string body;
  };
  // Dials the lane with HELLO(`hello`) through `dial` and runs the client's
  // io_context on this thread until the hub's first reply or `deadline`;
  // UNAVAILABLE (dial refused, timed out, connection closed) otherwise.
  Result<HandshakeReply> Handshake(const testing::LaneDialer& dial, const std::string& hello,
                                   std::chrono::steady_clock::time_point deadline);

  uint32_t index() const override { return index_; }
  bool open() const override { return open_; }
  void StartReading() override { handshake_ = false; }
  void Expect(uint64_t request_id, PendingRequest request) override;
  void Send(OutFrame frame) override;
  void SendByeAndClose() override;
  void Abort() override;

 private:
  class Bridge;

  // Client I/O thread (posted by the Bridge).
  void OnFrame(const net::FrameHeader& h, const std::string& payload);
  void OnClosed(const std::string& why);
  void Broken(const std::string& reason);
  void Release(OutFrame& frame);
  // Queues a frame (owned payload) on the connection, on conn_io's thread.
  void Post(const net::FrameHeader& h, std::string payload, bool close_after);

  Client::Impl* const owner_;
  const uint32_t index_;
  asio::io_context& conn_io_;
  std::shared_ptr<Bridge> bridge_;
  std::shared_ptr<net::Connection> conn_;  // set by Handshake
  bool open_ = true;
  bool closing_ = false;
  bool handshake_ = true;  // frames go to the handshake reply until StartReading
  bool have_reply_ = false;
  net::FrameHeader handshake_header_{};
  std::string handshake_body_;
  std::string closed_why_;
  std::unordered_map<uint64_t, PendingRequest> pending_;
};

}  // namespace rackhub::client::internal
