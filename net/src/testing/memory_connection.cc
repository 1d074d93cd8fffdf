#include "rackhub/net/testing/memory_connection.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

namespace rackhub::net::testing {

namespace asio = boost::asio;

namespace {

// Frames copied by one write step at most (as TcpConnection's gather write).
constexpr size_t kMaxFramesPerWrite = 64;
constexpr char kResetReason[] = "connection reset by peer";

}  // namespace

namespace detail {

// One direction's byte stream and fault plan, shared by its two ends.
struct Pipe {
  mutable std::mutex mu;
  FaultPlan plan;
  std::vector<std::byte> bytes;  // written, not taken yet: [head, size())
  size_t head = 0;
  uint64_t written = 0;      // stream bytes the sender has written
  uint64_t taken = 0;        // stream bytes the receiver has taken
  bool eof = false;          // the sender closed: the stream ends after `bytes`
  bool reader_gone = false;  // the receiver closed: writes go nowhere
  bool reset = false;        // abortive close of the whole connection

  // Set once by MakeMemoryPair, before either end is used.
  std::weak_ptr<MemoryConnection> sender, receiver;
  asio::io_context* sender_io = nullptr;
  asio::io_context* receiver_io = nullptr;

  // Posts Wake() to an end on its own thread (nothing if it is gone).
  static void Wake(const std::weak_ptr<MemoryConnection>& end, asio::io_context* io) {
    if (io == nullptr) return;
    asio::post(*io, [end] {
      if (auto c = end.lock()) c->Wake();
    });
  }
  void WakeSender() { Wake(sender, sender_io); }
  void WakeReceiver() { Wake(receiver, receiver_io); }
};

}  // namespace detail

// --- FaultInjector --------------------------------------------------------

FaultPlan FaultInjector::plan() const {
  std::lock_guard lock(pipe_->mu);
  return pipe_->plan;
}

void FaultInjector::Set(const FaultPlan& plan) {
  Update([&plan](FaultPlan& p) { p = plan; });
}

void FaultInjector::Update(const std::function<void(FaultPlan&)>& edit) {
  {
    std::lock_guard lock(pipe_->mu);
    edit(pipe_->plan);
  }
  // Either end may have waited on the old plan (a stall, a short write).
  pipe_->WakeSender();
  pipe_->WakeReceiver();
}

uint64_t FaultInjector::delivered_bytes() const {
  std::lock_guard lock(pipe_->mu);
  return pipe_->taken;
}

// --- MemoryPair -----------------------------------------------------------

MemoryPair MakeMemoryPair(asio::io_context& io_a, FrameHandler* handler_a, ConnectionIdentity id_a,
                          asio::io_context& io_b, FrameHandler* handler_b, ConnectionIdentity id_b,
                          FaultPlan faults_a_to_b, FaultPlan faults_b_to_a) {
  auto ab = std::make_shared<detail::Pipe>();
  auto ba = std::make_shared<detail::Pipe>();
  ab->plan = std::move(faults_a_to_b);
  ba->plan = std::move(faults_b_to_a);
  MemoryPair pair;
  pair.a.reset(new MemoryConnection(io_a, handler_a, std::move(id_a), ba, ab));
  pair.b.reset(new MemoryConnection(io_b, handler_b, std::move(id_b), ab, ba));
  ab->sender = pair.a;
  ab->sender_io = &io_a;
  ab->receiver = pair.b;
  ab->receiver_io = &io_b;
  ba->sender = pair.b;
  ba->sender_io = &io_b;
  ba->receiver = pair.a;
  ba->receiver_io = &io_a;
  return pair;
}

// --- MemoryConnection -----------------------------------------------------

MemoryConnection::MemoryConnection(asio::io_context& io, FrameHandler* handler,
                                   ConnectionIdentity id, std::shared_ptr<detail::Pipe> in,
                                   std::shared_ptr<detail::Pipe> out)
    : StreamConnection(handler, std::move(id), io.get_executor()),
      io_(io),
      in_(std::move(in)),
      out_(std::move(out)),
      timer_(io),
      fatal_timer_(io) {}

MemoryConnection::~MemoryConnection() {
  if (open_) Shutdown();
}

void MemoryConnection::Start() {
  if (started_) return;
  started_ = true;
  ReadMore();
}

// Past the limit: frames not started yet go; a partly written front frame is
// finished; the whole backlog is void (reservations too). The end closes once
// the fatal ERROR that follows was taken, or 2 s later.
size_t MemoryConnection::DropUnsent() {
  size_t dropped = 0;
  while (queue_.size() > (front_offset_ > 0 ? 1u : 0u)) {
    dropped += queue_.back().size();
    queue_.pop_back();
  }
  queued_bytes_.fetch_sub(dropped, std::memory_order_acq_rel);
  fatal_timer_.expires_after(std::chrono::seconds(2));
  fatal_timer_.async_wait([self = self()](const boost::system::error_code& ec) {
    if (!ec) self->Close("closed: the peer did not take the fatal error within 2 s");
  });
  return backlog_bytes();
}

void MemoryConnection::Close(const std::string& why) {
  if (!open_) return;
  open_ = false;
  reader_.Stop();
  timer_.cancel();
  fatal_timer_.cancel();
  queue_.clear();
  front_offset_ = 0;
  Shutdown();
  handler_->OnConnectionClosed(*this, why);
}

void MemoryConnection::Shutdown() {
  {
    std::lock_guard lock(out_->mu);
    out_->eof = true;
  }
  {
    std::lock_guard lock(in_->mu);
    in_->reader_gone = true;
    in_->bytes.clear();
    in_->head = 0;
  }
  out_->WakeReceiver();  // the peer reads the end of the stream
}

void MemoryConnection::Push(QueuedFrame frame) {
  queued_bytes_.fetch_add(frame.size(), std::memory_order_acq_rel);
  queue_.push_back(std::move(frame));
}

void MemoryConnection::Flush() {
  // The writer drains later on this thread, never inside the Send call.
  if (write_posted_ || step_bytes_ > 0) return;
  write_posted_ = true;
  asio::post(io_, [self = self()] {
    self->write_posted_ = false;
    self->WriteNext();
  });
}

void MemoryConnection::Wake() {
  if (!open_) return;
  bool reset;
  {
    std::lock_guard lock(in_->mu);
    reset = in_->reset;
  }
  if (reset) {  // abortive: noticed at once, whatever this end was doing
    Close(kResetReason);
    return;
  }
  FinishWrite();
  WriteNext();
  ReadMore();
}

void MemoryConnection::WriteNext() {
  if (!open_ || step_bytes_ > 0 || queue_.empty()) return;
  std::unique_lock lock(out_->mu);
  if (out_->reader_gone || out_->reset) {
    lock.unlock();
    // The peer is gone. This end's read side reports how, unless it no longer
    // reads (a fatal error is pending, delivery was refused, or paused).
    if (closing() || reader_.stopped() || reader_.paused()) Close("write failed: broken pipe");
    return;
  }
  size_t budget = out_->plan.max_write_bytes > 0 ? out_->plan.max_write_bytes
                                                 : std::numeric_limits<size_t>::max();
  size_t n = 0;
  size_t frames = 0;
  bool close_after = false;
  auto append = [this](const std::byte* p, size_t len) {
    out_->bytes.insert(out_->bytes.end(), p, p + len);
  };
  while (budget > 0 && !queue_.empty() && frames < kMaxFramesPerWrite) {
    const QueuedFrame& f = queue_.front();
    const size_t total = f.size();
    const size_t take = std::min(total - front_offset_, budget);
    size_t at = front_offset_;
    const size_t stop = front_offset_ + take;
    if (at < kHeaderBytes) {
      const size_t h = std::min(stop, kHeaderBytes) - at;
      append(f.header.data() + at, h);
      at += h;
    }
    if (at < stop) {
      // The borrowed payload is read here, when the writer drains.
      append(f.body().data() + (at - kHeaderBytes), stop - at);
    }
    front_offset_ = stop;
    budget -= take;
    n += take;
    if (front_offset_ < total) break;  // a short write
    front_offset_ = 0;
    ++frames;
    close_after = f.close_after;
    queue_.pop_front();
    if (close_after) break;  // nothing after a fatal ERROR goes out
  }
  out_->written += n;
  step_end_ = out_->written;
  step_bytes_ = n;
  step_close_after_ = close_after;
  lock.unlock();
  out_->WakeReceiver();
}

void MemoryConnection::FinishWrite() {
  if (step_bytes_ == 0) return;
  bool done;
  bool gone;
  {
    std::lock_guard lock(out_->mu);
    done = out_->taken >= step_end_;
    gone = out_->reader_gone || out_->reset;
  }
  if (!done) {
    if (gone && (closing() || reader_.stopped() || reader_.paused())) {
      Close("write failed: broken pipe");
    }
    return;
  }
  const size_t n = step_bytes_;
  const bool close_after = step_close_after_;
  queued_bytes_.fetch_sub(n, std::memory_order_acq_rel);
  handler_->OnBytesSent(*this, n);
  step_bytes_ = 0;
  step_close_after_ = false;
  if (close_after) {
    Close("closed after a fatal error");
    return;
  }
  Uncounted(n);
}

void MemoryConnection::ReadMore() {
  if (!CanRead() || read_scheduled_) return;
  std::chrono::steady_clock::duration delay;
  {
    std::lock_guard lock(in_->mu);
    delay = in_->plan.delay;
  }
  read_scheduled_ = true;
  if (delay > std::chrono::steady_clock::duration::zero()) {
    timer_.expires_after(delay);
    timer_.async_wait([self = self()](const boost::system::error_code&) {
      self->read_scheduled_ = false;
      self->ReadStep();
    });
  } else {
    asio::post(io_, [self = self()] {
      self->read_scheduled_ = false;
      self->ReadStep();
    });
  }
}

void MemoryConnection::ReadStep() {
  if (!open_ || !started_ || closing() || reader_.stopped()) return;
  // Bytes of ours the peer took before it sent (or closed) what is read now
  // are reported first, as a TCP write completes before the peer answers.
  FinishWrite();
  if (!open_ || reader_.paused()) return;
  enum class Event { kNone, kEof, kReset } event = Event::kNone;
  bool resetting = false;  // this end injects the reset
  size_t n = 0;
  {
    std::lock_guard lock(in_->mu);
    const FaultPlan& p = in_->plan;
    if (in_->reset) {
      event = Event::kReset;
    } else if (p.reset_after_bytes && in_->taken >= *p.reset_after_bytes) {
      in_->reset = true;
      resetting = true;
      event = Event::kReset;
    } else if (p.stall || p.stop_reading) {
      return;  // a fault change wakes this end up
    } else if (p.eof_after_bytes && in_->taken >= *p.eof_after_bytes) {
      event = Event::kEof;
    } else if (in_->head == in_->bytes.size()) {
      if (!in_->eof) return;  // the sender wakes this end up when it writes
      event = Event::kEof;
    } else {
      uint64_t cap = in_->bytes.size() - in_->head;
      if (p.max_read_bytes > 0) cap = std::min<uint64_t>(cap, p.max_read_bytes);
      if (p.eof_after_bytes) cap = std::min(cap, *p.eof_after_bytes - in_->taken);
      if (p.reset_after_bytes) cap = std::min(cap, *p.reset_after_bytes - in_->taken);
      const std::span<std::byte> room = reader_.WritableSpan();
      n = static_cast<size_t>(std::min<uint64_t>(cap, room.size()));
      std::memcpy(room.data(), in_->bytes.data() + in_->head, n);
      in_->head += n;
      in_->taken += n;
      if (in_->head == in_->bytes.size()) {
        in_->bytes.clear();
        in_->head = 0;
      }
    }
  }
  if (event == Event::kReset) {
    if (resetting) {
      std::lock_guard lock(out_->mu);
      out_->reset = true;
    }
    out_->WakeReceiver();  // the peer notices the reset at once
    Close(kResetReason);
    return;
  }
  if (event == Event::kEof) {
    std::string why = reader_.inside_frame() ? "peer closed the connection inside a frame"
                                             : "peer closed the connection";
    EndOfStream(std::move(why));
    return;
  }
  in_->WakeSender();  // its write step may be complete
  // The next step finds out whether anything is left (or the stream ended).
  Received(n);
}

}  // namespace rackhub::net::testing
