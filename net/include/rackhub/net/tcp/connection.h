// TCP implementation of net::Connection (Boost.Asio): one data-plane
// connection of one (worker, lane), owned by that lane's thread after the
// acceptor handed it over (docs/threading.md).
//
// Reads frames in order, many per system call into the receive buffer of a
// FrameReader (net/frame_reader.h); each header goes to the handler before its
// payload is looked at, and accepted frames are handed over in place (no copy
// besides the kernel's). Replies are queued and written as gathers of header + payload
// without staging copies; a payload that is not owned by the frame (the
// lane's parameter buffers) is held through its owner reference until written.
//
// Bounded (SendLimits): while the backlog is above pause_bytes no more frames
// are parsed and the socket is not read (the peer's sends back up in TCP);
// past max_bytes the frames not being written are dropped and a fatal
// QUOTA_EXCEEDED ERROR is queued, closing the connection once written or
// after kFatalCloseGrace.
//
// Thread safety: every member runs on the owning lane's thread only.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/frame_reader.h"
#include "rackhub/net/send_budget.h"
#include "rackhub/net/transport.h"

namespace rackhub::net::tcp {

class TcpConnection final : public Connection {
 public:
  // `handler` must outlive the connection's handlers (the lane that owns it).
  TcpConnection(FrameHandler* handler, boost::asio::ip::tcp::socket socket,
                ConnectionIdentity id);

  const ConnectionIdentity& id() const override { return id_; }
  bool open() const override { return open_; }
  void Start() override;
  void SendShared(const FrameHeader& header, std::span<const std::byte> payload,
                  std::shared_ptr<const void> owner) override;
  void SendOwned(const FrameHeader& header, std::string payload) override;
  void SendError(WireError code, const std::string& text, uint64_t request_id,
                 bool fatal) override;
  void Close(const std::string& why) override;
  void SetSendLimits(const SendLimits& limits) override { budget_.set_limits(limits); }
  size_t backlog_bytes() const override { return budget_.bytes(); }
  bool Reserve(size_t bytes) override;
  void Unreserve(size_t bytes) override;
  void SetDeliveryScheduler(DeliveryScheduler* scheduler) override {
    reader_.set_scheduler(scheduler);
  }
  void DeliverTurn() override;

  // A fatal ERROR that is not written within this long closes anyway.
  static constexpr auto kFatalCloseGrace = std::chrono::seconds(2);

 private:
  void ReadMore();
  // Delivers buffered frames (or asks the scheduler for a turn), reads on.
  void Pump();
  void OnRead(const boost::system::error_code& ec, size_t bytes);
  void Enqueue(QueuedFrame frame);
  void WriteNext();
  // Backlog changes: pause reading, resume (posted), or fail past the limit.
  void Counted(bool over);
  void Uncounted(size_t bytes);
  void FailOverLimit();
  void QueueFatal(QueuedFrame frame, const std::string& reason);

  std::shared_ptr<TcpConnection> self() {
    return std::static_pointer_cast<TcpConnection>(shared_from_this());
  }

  FrameHandler* handler_;
  boost::asio::ip::tcp::socket socket_;
  ConnectionIdentity id_;
  bool open_ = true;
  bool started_ = false;
  bool closing_ = false;  // a fatal error is queued: read nothing more
  bool read_pending_ = false;
  bool resume_posted_ = false;
  std::string fatal_;     // the fatal error queued, for the close reason
  std::string close_in_turn_;  // the stream ended: close when the turn comes
  SendBudget budget_;
  boost::asio::steady_timer fatal_timer_;

  // Receive side: one recv fills as much of the reader's buffer as the socket
  // has (many frames per system call); frames are handled in place.
  FrameReader reader_;

  // Send side: queued frames go out in batches, one gather write each.
  std::deque<QueuedFrame> out_;
  size_t in_flight_ = 0;  // frames at the front of out_ being written
};

}  // namespace rackhub::net::tcp
