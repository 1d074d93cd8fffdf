#include "connection_lane.h"

#include <cstring>
#include <future>
#include <mutex>
#include <utility>

#include "convert.h"
#include "wire.h"

namespace rackhub::client::internal {

using Clock = std::chrono::steady_clock;

// The connection's FrameHandler, on conn_io's thread: hands everything to the
// lane on the client's I/O thread, and closes the connection once a BYE
// queued with close_after is out.
class ConnectionLane::Bridge final : public net::FrameHandler,
                                     public std::enable_shared_from_this<Bridge> {
 public:
  Bridge(ConnectionLane* lane, asio::io_context* client_io) : lane_(lane), client_io_(client_io) {}

  // Any thread: nothing reaches the lane any more.
  void Detach() {
    std::lock_guard lock(mu_);
    lane_ = nullptr;
    client_io_ = nullptr;
  }
  // Client I/O thread: the lane, or null once detached.
  ConnectionLane* lane() {
    std::lock_guard lock(mu_);
    return lane_;
  }

  // conn_io's thread.
  void Queue(net::Connection& conn, const net::FrameHeader& h, std::string payload,
             bool close_after) {
    if (!conn.open()) return;
    queued_ += net::kHeaderBytes + payload.size();
    conn.SendOwned(h, std::move(payload));
    if (close_after) {
      close_when_flushed_ = true;
      MaybeClose(conn);
    }
  }

  Verdict AcceptHeader(net::Connection&, const net::FrameHeader&) override {
    return Verdict::kAccept;
  }
  void HandleFrame(net::Connection&, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override {
    ToLane([h, body = std::string(reinterpret_cast<const char*>(payload.data()), payload.size())](
               ConnectionLane& lane) { lane.OnFrame(h, body); });
  }
  void OnConnectionClosed(net::Connection&, const std::string& why) override {
    ToLane([why](ConnectionLane& lane) { lane.OnClosed(why); });
  }
  void OnBytesSent(net::Connection& conn, size_t bytes) override {
    // Bytes reported before the lane's first frame are the dialer's HELLO
    // (if it sent one on the connection): the hub answered it before the
    // lane could send anything.
    if (queued_ == 0) return;
    sent_ += bytes;
    MaybeClose(conn);
  }

 private:
  void MaybeClose(net::Connection& conn) {
    if (close_when_flushed_ && sent_ >= queued_ && conn.open()) {
      conn.Close("the client closed the lane after BYE");
    }
  }
  template <typename Fn>
  void ToLane(Fn fn) {
    std::lock_guard lock(mu_);
    if (client_io_ == nullptr) return;
    asio::post(*client_io_, [self = shared_from_this(), fn = std::move(fn)]() mutable {
      if (ConnectionLane* lane = self->lane()) fn(*lane);
    });
  }

  std::mutex mu_;
  ConnectionLane* lane_;         // GUARDED_BY(mu_)
  asio::io_context* client_io_;  // GUARDED_BY(mu_)
  // conn_io's thread.
  uint64_t queued_ = 0;  // bytes handed to the connection
  uint64_t sent_ = 0;    // bytes it reported sent
  bool close_when_flushed_ = false;
};

ConnectionLane::ConnectionLane(Client::Impl* owner, uint32_t index, asio::io_context& conn_io)
    : owner_(owner),
      index_(index),
      conn_io_(conn_io),
      bridge_(std::make_shared<Bridge>(this, &owner->io())) {}

ConnectionLane::~ConnectionLane() {
  bridge_->Detach();
  if (!conn_) return;
  if (conn_io_.get_executor().running_in_this_thread()) {
    conn_->Close("client lane destroyed");
    return;
  }
  // The connection calls the Bridge (kept alive here) until it is closed.
  auto closed = std::make_shared<std::promise<void>>();
  std::future<void> done = closed->get_future();
  asio::post(conn_io_, [conn = conn_, bridge = bridge_, closed] {
    conn->Close("client lane destroyed");
    closed->set_value();
  });
  done.wait_for(std::chrono::seconds(10));
}

Result<ConnectionLane::HandshakeReply> ConnectionLane::Handshake(const testing::LaneDialer& dial,
                                                                 const std::string& hello,
                                                                 Clock::time_point deadline) {
  net::FrameHeader h;
  h.opcode = net::Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(hello.size());
  conn_ = dial(h, hello, conn_io_, bridge_.get());
  if (!conn_) {
    open_ = false;
    return Unavailable("the dialer made no connection");
  }
  asio::io_context& io = owner_->io();
  io.restart();
  // Keeps run_one_until waiting for the Bridge's posts instead of returning
  // at once for lack of work.
  auto work = asio::make_work_guard(io);
  while (!have_reply_ && open_ && Clock::now() < deadline) io.run_one_until(deadline);
  if (have_reply_) return HandshakeReply{handshake_header_, std::move(handshake_body_)};
  return Unavailable(open_ ? std::string("timed out waiting for WELCOME")
                           : "connection closed: " + closed_why_);
}

void ConnectionLane::Expect(uint64_t request_id, PendingRequest request) {
  pending_.emplace(request_id, std::move(request));
}

void ConnectionLane::Release(OutFrame& frame) {
  if (frame.borrows_user && frame.op) owner_->ReleaseIo(frame.op);
  frame.borrows_user = false;
  frame.op.reset();
}

void ConnectionLane::Post(const net::FrameHeader& h, std::string payload, bool close_after) {
  if (!conn_) return;
  asio::post(conn_io_,
             [bridge = bridge_, conn = conn_, h, payload = std::move(payload),
              close_after]() mutable { bridge->Queue(*conn, h, std::move(payload), close_after); });
}

void ConnectionLane::Send(OutFrame frame) {
  // Frames of operations that already failed are not sent (as lane.cc).
  if (!open_ || closing_ || (frame.op && frame.op->failed)) {
    Release(frame);
    return;
  }
  const net::FrameHeader h = net::DecodeHeader(frame.header);
  std::string payload;
  if (frame.bytes > 0) payload.assign(static_cast<const char*>(frame.payload), frame.bytes);
  Release(frame);  // copied: the caller's buffer is free again
  Post(h, std::move(payload), false);
}

void ConnectionLane::SendByeAndClose() {
  if (!open_ || closing_) return;
  net::FrameHeader h;
  h.opcode = net::Opcode::kBye;
  h.tenant = owner_->tenant_handle();
  closing_ = true;
  Post(h, "", /*close_after=*/true);
}

void ConnectionLane::Abort() {
  if (!open_) return;
  open_ = false;
  if (conn_) {
    asio::post(conn_io_, [conn = conn_] { conn->Close("the client aborted the lane"); });
  }
  pending_.clear();  // their operations are failed by the owner
  owner_->LaneClosed();
}

void ConnectionLane::OnClosed(const std::string& why) {
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

void ConnectionLane::Broken(const std::string& reason) {
  owner_->ConnectionLost("lane " + std::to_string(index_) + ": " + reason);
}

void ConnectionLane::OnFrame(const net::FrameHeader& h, const std::string& body) {
  if (!open_) return;
  const auto payload = std::as_bytes(std::span(body.data(), body.size()));
  if (const Status bad = net::CheckHeader(h); !bad.ok()) {
    if (handshake_) return OnClosed("invalid reply to HELLO: " + bad.message());
    return Broken("invalid frame header from the hub: " + bad.message());
  }
  if (handshake_) {
    if (have_reply_) return;
    handshake_header_ = h;
    handshake_body_ = body;
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
