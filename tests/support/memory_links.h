// Test support: the pieces every maker of in-memory links (net/testing) into
// a hub needs: an io_context run by a thread of its own (the client side of
// in-memory and RDMA links, the hub's side of refusals), and the hub's end of
// a refused link, which only sends its ERROR.
//
// Threading: IoThread may be used from any thread; its io_context runs until
// the IoThread is destroyed. Refuser's callbacks run on its link's io thread.
#pragma once

#include <span>
#include <string>
#include <thread>

#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"

namespace rackhub::testing {

class IoThread {
 public:
  IoThread() : guard_(boost::asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~IoThread() {
    guard_.reset();
    io_.stop();
    thread_.join();
  }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;
  boost::asio::io_context& io() { return io_; }

 private:
  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

// The hub's end of a refused in-memory connection: it only sends the ERROR.
class Refuser final : public net::FrameHandler {
 public:
  Verdict AcceptHeader(net::Connection&, const net::FrameHeader&) override {
    return Verdict::kDiscard;
  }
  void HandleFrame(net::Connection&, const net::FrameHeader&, std::span<const std::byte>) override {}
  void OnConnectionClosed(net::Connection&, const std::string&) override {}
  void OnBytesSent(net::Connection&, size_t) override {}
};

}  // namespace rackhub::testing
