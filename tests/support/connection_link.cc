#include "connection_link.h"

#include <future>

namespace rackhub::testing {

ConnectionLink::ConnectionLink(boost::asio::io_context& io, Dialer dial, int time_scale)
    : io_(io), dial_(std::move(dial)), time_scale_(time_scale) {}

ConnectionLink::~ConnectionLink() {
  if (!conn_) return;
  // Closed and let go on io's thread: the connection's destructor detaches
  // its channel, whose handlers io's thread may be running (destroyed here,
  // on the test thread, it raced them: a segfault in an RDMA test in CI).
  RunOnIo([conn = std::move(conn_)]() mutable {
    conn->Close("test link closed");
    conn.reset();
  });
}

void ConnectionLink::RunOnIo(std::function<void()> fn) {
  std::promise<void> done;
  boost::asio::post(io_, [&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

void ConnectionLink::Send(FrameHeader h, const std::string& payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  if (!conn_) {
    if (h.opcode != Opcode::kHello) {
      ADD_FAILURE() << "the first frame on a link must be HELLO";
      return;
    }
    conn_ = dial_(h, payload, io_, this);
    return;
  }
  auto conn = conn_;
  RunOnIo([conn, h, payload] {
    if (conn->open()) conn->SendOwned(h, payload);
  });
}

std::optional<Frame> ConnectionLink::Receive(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout * time_scale_, [this] { return !frames_.empty() || closed_; });
  if (frames_.empty()) return std::nullopt;
  Frame f = std::move(frames_.front());
  frames_.pop_front();
  return f;
}

bool ConnectionLink::ClosedByPeer(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout * time_scale_, [this] { return closed_; });
  frames_.clear();
  return closed_;
}

void ConnectionLink::HandleFrame(net::Connection&, const FrameHeader& h,
                                 std::span<const std::byte> payload) {
  std::lock_guard lock(mu_);
  frames_.push_back({h, std::string(reinterpret_cast<const char*>(payload.data()), payload.size())});
  cv_.notify_all();
}

void ConnectionLink::OnConnectionClosed(net::Connection&, const std::string& why) {
  std::lock_guard lock(mu_);
  closed_ = true;
  close_reason_ = why;
  cv_.notify_all();
}

}  // namespace rackhub::testing
