// Test support: a DataLink over any client-side net::Connection (the
// in-memory transport's client end, or an RDMA connection). The connection
// is made when the first frame, HELLO, is sent: a Dialer receives that HELLO
// and returns the client end (having delivered the HELLO to the hub its own
// way). Frames from the hub are queued for Receive().
//
// Ownership: the link owns its client end; `io` (run by a thread the caller
// owns, see hub_under_test.h) must outlive the link and the hub's end.
// Threading: the link's methods from the test thread; the FrameHandler
// callbacks on `io`'s thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "data_link.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/transport.h"

namespace rackhub::testing {

class ConnectionLink final : public DataLink, private net::FrameHandler {
 public:
  // Runs on the test thread; returns the client end (built with `handler`
  // on `io`), or null after failing the test.
  using Dialer = std::function<std::shared_ptr<net::Connection>(
      const FrameHeader& hello, const std::string& payload, boost::asio::io_context& io,
      net::FrameHandler* handler)>;

  ConnectionLink(boost::asio::io_context& io, Dialer dial, int time_scale = 1);
  ~ConnectionLink() override;

  void Send(FrameHeader h, const std::string& payload = "") override;
  std::optional<Frame> Receive(std::chrono::milliseconds timeout = kReceiveTimeout) override;
  bool ClosedByPeer(std::chrono::milliseconds timeout = kReceiveTimeout) override;
  // The client end (null before HELLO), e.g. for fault injection, which
  // runs on io's thread through RunOnIo.
  std::shared_ptr<net::Connection> connection() const { return conn_; }
  // Runs fn on io's thread and waits for it.
  void RunOnIo(std::function<void()> fn);

 private:
  // net::FrameHandler, on io's thread.
  Verdict AcceptHeader(net::Connection&, const FrameHeader&) override { return Verdict::kAccept; }
  void HandleFrame(net::Connection& conn, const FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection&, size_t) override {}

  boost::asio::io_context& io_;
  Dialer dial_;
  const int time_scale_;
  std::shared_ptr<net::Connection> conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Frame> frames_;  // GUARDED_BY(mu_)
  bool closed_ = false;       // GUARDED_BY(mu_)
  std::string close_reason_;  // GUARDED_BY(mu_)
};

}  // namespace rackhub::testing
