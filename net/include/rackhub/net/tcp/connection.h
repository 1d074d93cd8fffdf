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

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>

#include "rackhub/net/asio.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/stream_connection.h"
#include "rackhub/net/transport.h"

namespace rackhub::net::tcp {

// The send-backlog bookkeeping is BoundedConnection's, the receive side
// StreamConnection's; this class reads and writes the socket.
class TcpConnection final : public StreamConnection {
 public:
  // `handler` must outlive the connection's handlers (the lane that owns it).
  TcpConnection(FrameHandler* handler, boost::asio::ip::tcp::socket socket,
                ConnectionIdentity id);

  void Start() override;
  void Close(const std::string& why) override;

  // A fatal ERROR that is not written within this long closes anyway.
  static constexpr auto kFatalCloseGrace = std::chrono::seconds(2);

 private:
  void ReadMore() override;
  void OnRead(const boost::system::error_code& ec, size_t bytes);
  void Push(QueuedFrame frame) override { out_.push_back(std::move(frame)); }
  void Flush() override { WriteNext(); }
  size_t DropUnsent() override;
  void WriteNext();

  std::shared_ptr<TcpConnection> self() {
    return std::static_pointer_cast<TcpConnection>(shared_from_this());
  }

  boost::asio::ip::tcp::socket socket_;
  bool read_pending_ = false;
  boost::asio::steady_timer fatal_timer_;

  // Send side: queued frames go out in batches, one gather write each.
  std::deque<QueuedFrame> out_;
  size_t in_flight_ = 0;  // frames at the front of out_ being written
};

}  // namespace rackhub::net::tcp
