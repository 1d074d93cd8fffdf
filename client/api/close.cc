// Client::Impl: failure propagation and Close: failing every unfinished
// ticket, a lost connection (reconnect or break), a broken client, a lane
// closing, and Close (BYE on every lane, a bounded flush, the I/O thread's
// end). Issuing: operations.cc; running operations: operation_io.cc.
#include <algorithm>
#include <utility>

#include "client_impl.h"
#include "lane.h"
#include "wire.h"

namespace rackhub::client {

namespace {

// Close(): how long BYE frames get to flush.
constexpr auto kCloseFlush = std::chrono::seconds(1);

}  // namespace

void Client::Impl::FailAll(ErrorCode code, const std::string& message) {
  for (const auto& op : UnfinishedOps()) FailOp(op, MakeError(code, message));
}

void Client::Impl::ConnectionLost(const std::string& reason, bool reconnectable) {
  if (reconnecting_) return;  // the lanes are already down; a reconnect is under way
  if (reconnectable && options_.reconnect && can_reconnect_ && !closing_io_) {
    {
      std::lock_guard lock(mu_);
      if (state_ != State::kOpen) return;
    }
    reconnecting_ = true;
    ++reconnect_generation_;
    break_reason_ = reason;
    break_time_ = std::chrono::steady_clock::now();
    for (auto& lane : lanes_) lane->Abort();
    if (options_.op_timeout.count() > 0) {
      reconnect_timer_ = std::make_unique<asio::steady_timer>(io_, options_.op_timeout);
      reconnect_timer_->async_wait([this](const boost::system::error_code& ec) {
        if (!ec) GiveUpReconnect("no reconnect within op_timeout");
      });
    }
    StopReconnectThread();  // the previous episode's thread, done already
    {
      std::lock_guard lock(reconnect_mu_);
      reconnect_cancel_ = false;
      reconnect_error_.clear();
    }
    reconnect_abort_ = false;
    const uint64_t generation = reconnect_generation_;
    reconnect_thread_ = std::thread([this, generation] { ReconnectLoop(generation); });
    return;
  }
  Broken("connection to the hub lost: " + reason);
}

void Client::Impl::Broken(const std::string& message) {
  {
    std::lock_guard lock(mu_);
    if (state_ == State::kBroken) return;
    if (state_ == State::kOpen) {
      state_ = State::kBroken;
      broken_ = MakeError(ErrorCode::kConnectionLost, message);
    }
  }
  for (auto& lane : lanes_) lane->Abort();
  if (!closing_io_) FailAll(ErrorCode::kConnectionLost, message);
}

void Client::Impl::LaneClosed() {
  if (!closing_io_) return;
  for (const auto& lane : lanes_) {
    if (lane->open()) return;
  }
  if (close_timer_) close_timer_->cancel();
  io_.stop();
}

void Client::Impl::CloseOnIo() {
  if (closing_io_) return;
  if (reconnecting_) {
    reconnecting_ = false;
    if (reconnect_timer_) reconnect_timer_->cancel();
    reconnect_abort_ = true;
    std::lock_guard lock(reconnect_mu_);
    reconnect_cancel_ = true;
    reconnect_cv_.notify_all();
  }
  FailAll(ErrorCode::kClosed, "the client was closed");
  closing_io_ = true;
  close_timer_ = std::make_unique<asio::steady_timer>(io_, kCloseFlush);
  close_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) io_.stop();
  });
  for (auto& lane : lanes_) lane->SendByeAndClose();
  LaneClosed();  // stops at once if no lane was open
}

void Client::Impl::Close() {
  std::lock_guard close_lock(close_mu_);
  {
    std::lock_guard lock(mu_);
    state_ = State::kClosed;
  }
  if (thread_.joinable()) {
    if (std::this_thread::get_id() == thread_.get_id()) {
      CloseOnIo();  // from a callback: the destructor joins
      return;
    }
    asio::post(io_, [this] { CloseOnIo(); });
    work_.reset();
    thread_.join();
  }
  StopReconnectThread();
  // The I/O thread is gone: nothing touches the callers' buffers any more,
  // and what transports still hold must not count io_refs any more.
  io_gate_->impl = nullptr;
  for (const auto& op : UnfinishedOps()) {
    if (!op->failed) {
      op->failed = true;
      op->error = MakeError(ErrorCode::kClosed, "the client was closed");
    }
    op->io_refs = 0;
    Finish(op);
  }
}

}  // namespace rackhub::client
