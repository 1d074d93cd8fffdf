#include "rackhub/net/frame_channel.h"

#include <chrono>
#include <utility>

namespace rackhub::net {

namespace asio = boost::asio;

namespace {

// A fatal ERROR that cannot go into the ring (the peer grants no credit or
// consumes nothing) closes the connection after this long anyway.
constexpr auto kFatalCloseGrace = std::chrono::milliseconds(2000);

}  // namespace

void FrameChannel::SetAttached(asio::io_context& io, Callbacks callbacks) {
  io_ = &io;
  cb_ = std::move(callbacks);
  ++attach_gen_;
}

void FrameChannel::Detach() {
  OnDetach();
  io_ = nullptr;
  cb_ = {};
  ++attach_gen_;
}

void FrameChannel::Send(OutgoingFrame frame) {
  if (closed_) {
    if (frame.release) frame.release();
    return;
  }
  const bool fatal = frame.close_after;
  queue_.push_back(std::move(frame));
  PumpSends();
  if (closed_ || queue_.empty()) return;
  WaitForRoom();
  if (!fatal) return;
  // Do not wait forever for a peer that takes nothing.
  if (!io_) return Close("closing after a fatal error");
  auto timer = std::make_shared<asio::steady_timer>(*io_, kFatalCloseGrace);
  timer->async_wait([self = shared_from_this(), timer](boost::system::error_code ec) {
    if (!ec) self->Close("closing after a fatal error (not sent within the grace period)");
  });
}

OutgoingFrame* FrameChannel::NextToSend() {
  while (!queue_.empty() && !closed_) {
    OutgoingFrame& f = queue_.front();
    if (!f.still_wanted || f.still_wanted()) return &f;
    if (f.release) f.release();
    queue_.pop_front();
  }
  return nullptr;
}

size_t FrameChannel::DropQueued() {
  size_t bytes = 0;
  while (!queue_.empty()) {
    OutgoingFrame& f = queue_.back();
    bytes += kHeaderBytes + f.payload().size();
    if (f.release) f.release();
    queue_.pop_back();
  }
  return bytes;
}

void FrameChannel::Violation(const std::string& text) {
  if (violated_ || closed_) return;
  violated_ = true;
  const std::string message = std::string(ring_name_) + ": " + text;
  if (cb_.on_violation) {
    cb_.on_violation(message);
  } else {
    Close(message);
  }
}

void FrameChannel::Close(const std::string& why) {
  if (closed_) return;
  auto keep = shared_from_this();
  closed_ = true;
  OnClose();
  while (!queue_.empty()) {
    if (queue_.front().release) queue_.front().release();
    queue_.pop_front();
  }
  auto on_closed = std::move(cb_.on_closed);
  cb_ = {};
  if (on_closed) on_closed(why);
}

}  // namespace rackhub::net
