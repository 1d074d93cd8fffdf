// FrameChannel: what the two ring transports, rdma::Channel and shm::Channel,
// share (ChannelConnection<Channel> on the hub and the client's channel lanes
// drive both alike): the owner's callbacks and the io_context the channel is
// attached to (with a generation number that retires the handlers of an
// earlier attachment), the queue of frames not yet in the ring, the grace
// period of a fatal frame the ring cannot take, protocol violations, and
// closing (queued frames dropped, on_closed called once).
//
// The transport implements PumpSends (post queued frames while the ring has
// room), WaitForRoom (optional: have the peer wake us when it frees room),
// OnDetach (stop watching its fds, forget what belonged to the attachment)
// and OnClose (its own part of Close: disconnect, shut the socket down, ...;
// the queued frames are dropped after it).
//
// Ownership: always held by a shared_ptr (the transports' factories make
// one); handlers and timers keep it alive while they are pending. Frames
// belong to the channel from Send on; a borrowed payload's `owner` is held
// until the frame is posted or dropped.
// Threading: one thread at a time, the one running the io_context it is
// attached to (or the owner's, while detached).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/outgoing_frame.h"

namespace rackhub::net {

class FrameChannel : public std::enable_shared_from_this<FrameChannel> {
 public:
  struct Callbacks {
    // A complete frame in the ring, valid during the call only.
    std::function<void(const FrameHeader&, std::span<const std::byte>)> on_frame;
    // The peer broke the ring protocol; the channel stops delivering. The
    // owner normally answers with a fatal ERROR.
    std::function<void(const std::string&)> on_violation;
    // Called once, when the channel closed (locally or by the peer).
    std::function<void(const std::string&)> on_closed;
    // Bytes of frames sent (RDMA: completed; shared memory: in the ring).
    std::function<void(size_t)> on_sent;
  };

  virtual ~FrameChannel() = default;
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Stops watching; what arrives meanwhile waits for the next Attach.
  void Detach();
  // Queues `frame`; frames go into the ring in order as it has room. A
  // fatal frame (close_after) that cannot go now closes the channel after a
  // grace period anyway (at once if detached).
  void Send(OutgoingFrame frame);
  // Drops the frames queued and not in the ring yet; returns their bytes
  // (header + payload each).
  size_t DropQueued();
  // Closes; queued frames are dropped, on_closed runs. Idempotent.
  void Close(const std::string& why);
  bool open() const { return !closed_; }

 protected:
  // `ring_name` starts every violation message ("rdma ring").
  explicit FrameChannel(const char* ring_name) : ring_name_(ring_name) {}

  // Attaches to `io` with `callbacks` (a new generation).
  void SetAttached(boost::asio::io_context& io, Callbacks callbacks);
  // Runs (self->*on_ready)() once `fd` is readable, unless the channel was
  // detached or attached again meanwhile.
  template <class Self>
  void WatchReadable(boost::asio::posix::stream_descriptor& fd, void (Self::*on_ready)()) {
    fd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                  [self = shared_from_this(), gen = attach_gen_,
                   on_ready](boost::system::error_code ec) {
                    if (ec || gen != self->attach_gen_) return;
                    (static_cast<Self*>(self.get())->*on_ready)();
                  });
  }
  // The front frame still wanted (frames whose still_wanted() says no are
  // released and dropped), or null when none is queued or the channel closed.
  OutgoingFrame* NextToSend();
  // The peer broke the protocol: on_violation, or Close without an owner.
  void Violation(const std::string& text);

  virtual void PumpSends() = 0;
  virtual void WaitForRoom() {}
  virtual void OnDetach() = 0;
  virtual void OnClose() = 0;

  boost::asio::io_context* io_ = nullptr;  // attached to; null: detached
  uint64_t attach_gen_ = 0;  // handlers of an earlier Attach are ignored
  Callbacks cb_;
  bool closed_ = false;
  bool violated_ = false;
  std::deque<OutgoingFrame> queue_;  // not in the ring yet

 private:
  const char* const ring_name_;
};

}  // namespace rackhub::net
