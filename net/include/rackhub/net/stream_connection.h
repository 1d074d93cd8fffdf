// StreamConnection: the receive side the byte-stream transports share
// (tcp::TcpConnection, testing::MemoryConnection), on top of their shared send
// side (BoundedConnection): a FrameReader fed by the transport's reads,
// delivery in the turns of the lane's DeliveryScheduler, backpressure from
// the send backlog (the reader pauses; it resumes through a closure posted to
// the connection's executor, never inside the call that drained the
// backlog), and the end of the stream closing the connection in its turn.
//
// The transport implements ReadMore() (start the next read if CanRead() and
// none is pending) and calls Received(n) once n bytes landed in
// reader_.WritableSpan(), EndOfStream(why) when the stream ended or failed.
// Its Close sets open_ = false and stops reader_.
//
// Ownership: owns the receive buffer (reader_); `handler` must outlive the
// connection's handlers (the lane that owns it).
// Threading: every member runs on the owning thread only, the one running
// `executor` (docs/threading.md).
#pragma once

#include <cstddef>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/bounded_connection.h"
#include "rackhub/net/frame_reader.h"
#include "rackhub/net/transport.h"

namespace rackhub::net {

class StreamConnection : public BoundedConnection {
 public:
  bool open() const final { return open_; }
  void SetDeliveryScheduler(DeliveryScheduler* scheduler) final {
    reader_.set_scheduler(scheduler);
  }
  void DeliverTurn() final;
  void HoldIntake(bool hold) final;
  bool can_hold_intake() const final { return true; }

 protected:
  StreamConnection(FrameHandler* handler, ConnectionIdentity id,
                   boost::asio::any_io_executor executor)
      : BoundedConnection(std::move(id)), handler_(handler), executor_(std::move(executor)) {}

  // Starts the next read if CanRead() and no read is pending.
  virtual void ReadMore() = 0;
  // Whether the connection takes bytes from the peer now (a read pending or
  // not): open, started, no fatal error queued, the reader neither stopped,
  // paused nor waiting for a turn.
  bool CanRead() const;
  // `n` bytes were written at the start of reader_.WritableSpan().
  void Received(size_t n) {
    reader_.Commit(n);
    Pump();
  }
  // Delivers the frames buffered (or asks the scheduler for a turn); reads on.
  void Pump();
  // The stream ended (or failed) with `why`: closes in its turn, like a frame
  // (the scheduler's order), else now.
  void EndOfStream(std::string why);

  FrameHandler* const handler_;
  FrameReader reader_;    // owning thread
  bool open_ = true;      // owning thread
  bool started_ = false;  // owning thread

 private:
  void StopIntake() final { reader_.Stop(); }
  void PauseIntake() final { reader_.Pause(true); }
  void ResumeIntake() final;
  // Delivers what was buffered while paused or held, on a fresh stack, once
  // neither is on.
  void PostResume();

  const boost::asio::any_io_executor executor_;
  bool resume_posted_ = false;  // owning thread
  std::string close_in_turn_;   // the stream ended: close when the turn comes
};

}  // namespace rackhub::net
