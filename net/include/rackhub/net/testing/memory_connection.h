// An in-memory net::Connection pair with fault injection, for tests of
// everything above the transport (lanes, hub links, clients) without sockets.
// Library: rackhub_net_testing, linked by tests and test hooks; no production
// connection uses it.
//
// MakeMemoryPair connects two ends, a and b. Each direction (a->b, b->a) is a
// byte stream carrying the encoded wire frames (40-byte header + payload)
// exactly as TCP would, parsed on the receiving end by a FrameReader, so
// partial frames, short reads and short writes are real. Semantics follow
// tcp::TcpConnection:
//   - Send* only queue. The writer drains the queue later, on its own thread
//     (never inside the Send call): a write step copies at most
//     max_write_bytes (and at most 64 frames) of queued frames into the
//     stream. A shared payload is held (its owner) until that copy, as on
//     TCP.
//   - A write step completes once the peer has taken all of its bytes; then
//     OnBytesSent(step bytes) runs and the next step starts. A peer that
//     does not read (stop_reading, stall, not started) back-pressures: the
//     queue grows (queued_bytes()) and OnBytesSent stops.
//   - SendLimits as on TCP: above pause_bytes of backlog (bytes the peer has
//     not taken, plus reservations) no more frames are delivered to the
//     handler until it is down to half; past max_bytes the frames not yet
//     written are dropped, a fatal QUOTA_EXCEEDED ERROR is queued and the
//     end closes once the peer took it (or 2 s later).
//   - SendError(fatal) stops delivery at once and closes the end with
//     "closed after a fatal error" once the peer has taken the ERROR frame;
//     frames queued after it are never sent.
//   - Close(why) is idempotent, drops what is still queued (bytes already in
//     the stream still reach the peer) and calls OnConnectionClosed(why).
//     The peer then sees "peer closed the connection", or "peer closed the
//     connection inside a frame" if the stream ends mid-frame, once it has
//     read what came before (a stall or stop_reading holds the end of the
//     stream back too). An end that no longer reads (fatal error pending)
//     and finds its peer gone closes with "write failed: broken pipe". An
//     abortive close (reset) gives both ends "connection reset by peer", at
//     once, even when a direction is stalled. OnConnectionClosed runs exactly
//     once per end. Destroying an open end closes its streams without
//     calling its handler (like a socket's destructor).
//
// Faults (FaultPlan) act on one direction; MakeMemoryPair takes the initial
// plan of each, and FaultInjector changes it at run time.
//
// Threading: the two ends may run on different io_contexts and threads (a hub
// lane thread and a test thread). Each direction's stream and fault plan sit
// behind a mutex; everything else of an end (its Connection members, its
// handler's callbacks, its timer) runs on its own io_context's thread, as
// with TcpConnection. An end tells the other about progress by posting to the
// other's io_context, so both io_contexts must outlive both ends. When no
// bytes are moving and no delay timer is armed, neither end has work pending
// on its io_context: io_context::run() returns (tests use this to wait for
// quiescence).
// FaultInjector and queued_bytes() may be used from any thread, and an end
// may be released on any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/queued_frame.h"
#include "rackhub/net/stream_connection.h"
#include "rackhub/net/transport.h"

namespace rackhub::net::testing {

// Faults of one direction (sender -> receiver). Byte counts are of that
// direction's stream, counted from its start.
struct FaultPlan {
  // The stream ends cleanly (as if the sender closed) once this many bytes
  // were delivered, possibly mid-frame: the receiver closes with "peer closed
  // the connection[ inside a frame]" and the sender then sees its close.
  std::optional<uint64_t> eof_after_bytes;
  // Abortive close once this many bytes were delivered: both ends close with
  // "connection reset by peer".
  std::optional<uint64_t> reset_after_bytes;
  size_t max_read_bytes = 0;   // >0: the receiver takes at most this per step
  size_t max_write_bytes = 0;  // >0: the sender writes at most this per step
  // Each delivery step waits this long on a steady_timer first.
  std::chrono::steady_clock::duration delay{};
  bool stall = false;         // the network holds the stream: nothing delivered
  bool stop_reading = false;  // the receiving end takes nothing
};

namespace detail {
struct Pipe;
}

// A thread-safe handle on one direction's FaultPlan (cheap to copy; keeps the
// direction's state alive). Changes apply to the next step of either end;
// lifting a stall or stop_reading resumes delivery.
class FaultInjector {
 public:
  FaultPlan plan() const;
  void Set(const FaultPlan& plan);
  void Update(const std::function<void(FaultPlan&)>& edit);
  void Stall(bool on) { Update([on](FaultPlan& p) { p.stall = on; }); }
  void StopReading(bool on) { Update([on](FaultPlan& p) { p.stop_reading = on; }); }
  // Bytes of this direction the receiver has taken so far.
  uint64_t delivered_bytes() const;

 private:
  friend class MemoryConnection;
  explicit FaultInjector(std::shared_ptr<detail::Pipe> pipe) : pipe_(std::move(pipe)) {}
  std::shared_ptr<detail::Pipe> pipe_;
};

class MemoryConnection;

struct MemoryPair {
  std::shared_ptr<MemoryConnection> a, b;
};

// Two connected, not yet started ends. `handler_a` runs on io_a's thread and
// `handler_b` on io_b's (the same io_context is fine); each must outlive its
// end. Frames may be sent before Start(); an end delivers only once started.
MemoryPair MakeMemoryPair(boost::asio::io_context& io_a, FrameHandler* handler_a,
                          ConnectionIdentity id_a, boost::asio::io_context& io_b,
                          FrameHandler* handler_b, ConnectionIdentity id_b,
                          FaultPlan faults_a_to_b = {}, FaultPlan faults_b_to_a = {});

// The send-backlog bookkeeping is BoundedConnection's, the receive side
// StreamConnection's (as TcpConnection's); this class moves the bytes.
class MemoryConnection final : public StreamConnection {
 public:
  ~MemoryConnection() override;

  void Start() override;
  void Close(const std::string& why) override;

  // Faults of the direction this end sends (this end -> peer), and of the one
  // it receives (peer -> this end; the same as the peer's faults()).
  FaultInjector faults() const { return FaultInjector(out_); }
  FaultInjector incoming_faults() const { return FaultInjector(in_); }
  // Bytes handed to Send* that the peer has not taken yet (those dropped by a
  // Close stay counted). Any thread.
  size_t queued_bytes() const { return queued_bytes_.load(std::memory_order_acquire); }

 private:
  friend struct detail::Pipe;
  friend MemoryPair MakeMemoryPair(boost::asio::io_context&, FrameHandler*, ConnectionIdentity,
                                   boost::asio::io_context&, FrameHandler*, ConnectionIdentity,
                                   FaultPlan, FaultPlan);


  MemoryConnection(boost::asio::io_context& io, FrameHandler* handler, ConnectionIdentity id,
                   std::shared_ptr<detail::Pipe> in, std::shared_ptr<detail::Pipe> out);
  std::shared_ptr<MemoryConnection> self() {
    return std::static_pointer_cast<MemoryConnection>(shared_from_this());
  }

  void Push(QueuedFrame frame) override;
  void Flush() override;
  size_t DropUnsent() override;
  // Everything an end does when woken by the peer or a fault change: notice a
  // reset, finish a write step the peer has taken, write, read.
  void Wake();
  void WriteNext();
  void FinishWrite();
  void ReadMore() override;  // schedules a read step
  void ReadStep();
  // Marks both streams closed by this end and wakes the peer.
  void Shutdown();

  boost::asio::io_context& io_;
  std::shared_ptr<detail::Pipe> in_;   // peer -> this end
  std::shared_ptr<detail::Pipe> out_;  // this end -> peer

  // Receive side.
  boost::asio::steady_timer timer_;  // FaultPlan::delay
  bool read_scheduled_ = false;

  // Send side: frames not yet copied into the stream; the front one may be
  // partly copied (front_offset_ bytes).
  std::deque<QueuedFrame> queue_;
  size_t front_offset_ = 0;
  bool write_posted_ = false;
  size_t step_bytes_ = 0;     // bytes of the write step the peer has not all taken
  uint64_t step_end_ = 0;     // stream position the step ends at
  bool step_close_after_ = false;
  std::atomic<size_t> queued_bytes_{0};
  boost::asio::steady_timer fatal_timer_;
};

}  // namespace rackhub::net::testing
