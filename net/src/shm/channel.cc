// The data path of a shared-memory Channel: the ring protocol, doorbells and
// the watch on the peer's socket (see shm/channel.h); set-up and teardown
// are in setup.cc, lent regions (LEND / UNLEND, LREF records) in
// channel_lend.cc.
#include "rackhub/net/shm/channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "shm_internal.h"

namespace rackhub::net::shm {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using internal::Prefix;

namespace {

// Busy polling keeps looking this long after the last frame before sleeping.
constexpr auto kBusyPollWindow = std::chrono::microseconds(50);
// One turn delivers at most this many frames, then yields the thread to the
// other connections of the lane (a producer that keeps its ring full must not
// hold the lane).
constexpr size_t kFramesPerTurn = 128;
// Client spin on the receive ring before sleeping (SpinForFrames): bounds
// of the adaptive budget.
constexpr std::chrono::nanoseconds kMaxSpin = std::chrono::microseconds(64);
constexpr std::chrono::nanoseconds kMinSpin = std::chrono::microseconds(2);
// After a close, arena space the peer was referred to is reused this much later.
constexpr auto kRefsGrace = std::chrono::milliseconds(1000);

}  // namespace

Channel::RingControl* Channel::rx_control() const {
  return internal::Control(base_, side_ == Side::kHub ? 0 : 1);
}
Channel::RingControl* Channel::tx_control() const {
  return internal::Control(base_, side_ == Side::kHub ? 1 : 0);
}
std::byte* Channel::rx_ring() const {
  return base_ + kControlBytes + (side_ == Side::kHub ? 0 : size_t{ring_bytes_});
}
std::byte* Channel::tx_ring() const {
  return base_ + kControlBytes + (side_ == Side::kHub ? size_t{ring_bytes_} : 0);
}

void Channel::Attach(asio::io_context& io, Callbacks callbacks) {
  request_turn_ = std::move(callbacks.request_turn);
  SetAttached(io, std::move(callbacks));
  turn_asked_ = turn_granted_ = false;
  if (closed_) return;
  bell_fd_ = std::make_unique<asio::posix::stream_descriptor>(io, my_bell_);
  socket_desc_ = std::make_unique<asio::posix::stream_descriptor>(io, socket_fd_);
  WatchBell();
  WatchSocket();
  SchedulePoll();  // frames may have arrived before we watched
}

void Channel::SchedulePoll() {
  if (!io_ || poll_posted_ || closed_) return;
  poll_posted_ = true;
  asio::post(*io_, [self = self(), gen = attach_gen_] {
    if (gen == self->attach_gen_) self->Poll();
  });
}

void Channel::OnDetach() {
  if (bell_fd_) bell_fd_->release();  // cancels the pending wait; the fd stays open
  if (socket_desc_) socket_desc_->release();
  bell_fd_.reset();
  socket_desc_.reset();
  request_turn_ = nullptr;
  poll_posted_ = false;
}

void Channel::WatchBell() {
  if (!bell_fd_ || closed_) return;
  WatchReadable(*bell_fd_, &Channel::OnBell);
}

void Channel::WatchSocket() {
  if (!socket_desc_ || closed_ || peer_gone_) return;
  WatchReadable(*socket_desc_, &Channel::OnSocketReadable);
}

void Channel::OnBell() {
  uint64_t count = 0;
  while (::read(my_bell_, &count, sizeof count) < 0 && errno == EINTR) {
  }
  const uint64_t gen = attach_gen_;
  if (!poll_posted_) Poll();
  if (gen == attach_gen_) WatchBell();
}

void Channel::OnSocketReadable() {
  if (peer_gone_ || closed_) return;
  if (ReadSocket()) return WatchSocket();
  if (violated_ || closed_) return;
  if (!poll_posted_) Poll();  // at EOF: deliver what is left, then close
}

bool Channel::ReadSocket() {
  for (;;) {
    std::array<char, 16 * sizeof(internal::LendMessage)> buf;
    iovec iov{buf.data(), side_ == Side::kHub ? buf.size() : 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 16)> control{};
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(socket_fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          socket_fds_.push_back(fd);
        }
      }
    }
    if (n <= 0) {
      // EOF or reset: the peer closed or died. What it wrote before is still
      // in the ring (the mapping outlives it): deliver that first, then
      // close; only what was written before the EOF (a peer that lives on
      // without its socket must not keep the lane busy).
      peer_gone_ = true;
      gone_head_ = internal::Head(rx_control()).load(std::memory_order_acquire);
      return false;
    }
    if (side_ != Side::kHub) {
      Violation("the peer sent data on the set-up socket after the set-up");
      return false;
    }
    socket_buf_.append(buf.data(), static_cast<size_t>(n));
    while (socket_buf_.size() >= sizeof(internal::LendMessage)) {
      internal::LendMessage m;
      std::memcpy(&m, socket_buf_.data(), sizeof m);
      socket_buf_.erase(0, sizeof m);
      int fd = -1;
      if (m.op == internal::kLendOp && !socket_fds_.empty()) {
        fd = socket_fds_.front();
        socket_fds_.pop_front();
      }
      OnLendMessage(m, fd);
      if (fd >= 0) ::close(fd);
      if (violated_ || closed_) return false;
    }
    // Descriptors beyond the LEND messages that came with them: not ours.
    if (socket_buf_.empty()) {
      for (int fd : socket_fds_) ::close(fd);
      socket_fds_.clear();
    }
  }
}

void Channel::Poll() {
  poll_posted_ = false;
  if (!io_ || closed_) return;
  auto keep = shared_from_this();  // callbacks may drop the owner's reference
  polling_ = true;
  struct PollingDone {
    bool& flag;
    ~PollingDone() { flag = false; }
  } polling_done{polling_};
  const uint64_t gen = attach_gen_;
  if (!pending_refs_.empty() || !pending_lent_.empty()) {
    const uint64_t tail = internal::Tail(tx_control()).load(std::memory_order_acquire);
    if (tail <= tx_head_) {  // a bogus tail is caught by TryWrite
      ReleaseConsumed(tail);
      ReleaseLent(tail);
    }
  }
  if (!announced_.empty()) UnlendGone();
  // One turn: at most kFramesPerTurn records, then the lane's other
  // connections run before this one looks again (a peer that keeps its
  // ring full, or rewrites head, cannot hold the thread).
  const size_t records = DeliverReady();
  if (closed_ || gen != attach_gen_) return;
  PumpSends();
  // After a violation nothing more is read or written: the owner's fatal
  // ERROR (if it got into the ring) or the grace timer closes us.
  if (closed_ || gen != attach_gen_ || violated_) return;
  const auto now = Clock::now();
  if (records > 0) last_activity_ = now;
  if (peer_gone_) {
    if (turn_asked_) return;  // the grant polls again
    if (records == 0 || delivery_paused_) {
      Close("the peer closed the connection");
    } else {
      SchedulePoll();
    }
    return;
  }
  if (records >= kFramesPerTurn ||
      (poll_ == PollMode::kBusy && now - last_activity_ < kBusyPollWindow)) {
    SchedulePoll();
    return;
  }
  if (records > 0) reply_due_ = false;
  if (reply_due_ && SpinForFrames()) {
    SchedulePoll();
    return;
  }
  if (ArmSleep()) SchedulePoll();  // work arrived meanwhile; otherwise the doorbell wakes us
}

bool Channel::SpinForFrames() {
  if (side_ != Side::kClient || delivery_paused_ || turn_asked_) return false;
  RingControl* rc = rx_control();
  RingControl* tc = tx_control();
  const auto until = Clock::now() + spin_budget_;
  // Frames wait for room: the hub's tail moving is news too.
  const uint64_t tail = queue_.empty() ? 0 : internal::Tail(tc).load(std::memory_order_acquire);
  for (;;) {
    if (internal::Head(rc).load(std::memory_order_acquire) != rx_tail_ ||
        (!queue_.empty() && internal::Tail(tc).load(std::memory_order_acquire) != tail)) {
      spin_budget_ = std::min(kMaxSpin, spin_budget_ * 2);
      return true;
    }
    // The hub read everything we wrote and went to sleep: the reply waits
    // for something else (another worker's push), not for a running peer.
    if (internal::Sleeping(tc).load(std::memory_order_relaxed) != 0) break;
    if (Clock::now() >= until) {
      spin_budget_ = std::max(kMinSpin, spin_budget_ / 2);
      break;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  reply_due_ = false;  // spun for this one: sleep until the doorbell
  return false;
}

size_t Channel::DeliverReady() {
  size_t records = 0;
  const uint64_t gen = attach_gen_;
  RingControl* c = rx_control();
  // Read once per turn: what the peer writes meanwhile waits for the next.
  const uint64_t head =
      peer_gone_ ? gone_head_ : internal::Head(c).load(std::memory_order_acquire);
  const bool turns = static_cast<bool>(request_turn_);
  while (!delivery_paused_ && !closed_ && !violated_ && gen == attach_gen_ &&
         records < kFramesPerTurn) {
    if (head == rx_tail_) break;
    const uint64_t ready = head - rx_tail_;
    if (head < rx_tail_ || ready > ring_bytes_) {
      Violation("ring head " + std::to_string(head) + " is not within a ring of the tail " +
                std::to_string(rx_tail_));
      break;
    }
    const size_t pos = rx_tail_ % ring_bytes_;
    std::byte* at = rx_ring() + pos;
    Prefix p;
    std::memcpy(&p, at, sizeof p);
    if (turns && p.kind != internal::kPadKind) {
      // One frame per turn, in the lane's order; what the frame claims to
      // be is checked below, when it is delivered.
      if (!turn_granted_) {
        if (!turn_asked_) {
          turn_asked_ = true;
          request_turn_(std::min<uint64_t>(p.bytes, ready));
        }
        break;
      }
      turn_granted_ = false;
    }
    if (p.kind == internal::kPadKind) {
      if (p.bytes != ring_bytes_ - pos || p.bytes > ready) {
        Violation("a pad record of " + std::to_string(p.bytes) + " bytes at offset " +
                  std::to_string(pos) + " does not end the ring");
        break;
      }
    } else if (p.kind == internal::kLentKind && side_ == Side::kHub) {
      if (p.bytes != internal::kRefRecordBytes || p.bytes > ready || pos + p.bytes > ring_bytes_) {
        Violation("a lent-region record of " + std::to_string(p.bytes) + " bytes at offset " +
                  std::to_string(pos));
        break;
      }
      const FrameHeader h = DecodeHeader(
          std::span<const std::byte, kHeaderBytes>(at + kRecordPrefixBytes, kHeaderBytes));
      uint64_t offset = 0;
      uint32_t id = 0;
      std::memcpy(&offset, at + kRecordAlign, sizeof offset);
      std::memcpy(&id, at + kRecordAlign + sizeof offset, sizeof id);
      auto region = mapped_.find(id);
      if (region == mapped_.end() && !peer_gone_) {
        // The worker sends LEND before the first reference: it is in the
        // socket by now.
        ReadSocket();
        if (closed_ || violated_ || gen != attach_gen_) break;
        region = mapped_.find(id);
      }
      if (region == mapped_.end()) {
        Violation("a reference to lent region " + std::to_string(id) + ", which was not lent");
        break;
      }
      if (offset > region->second.bytes || h.payload_bytes > region->second.bytes - offset) {
        Violation("a reference to " + std::to_string(h.payload_bytes) + " bytes at offset " +
                  std::to_string(offset) + " of the " + std::to_string(region->second.bytes) +
                  "-byte lent region " + std::to_string(id));
        break;
      }
      ++lent_received_;
      if (auto on_frame = cb_.on_frame) {
        on_frame(h, std::span<const std::byte>(region->second.base + offset, h.payload_bytes));
      }
    } else if (p.kind == internal::kRefKind && side_ == Side::kClient && arena_map_ != nullptr) {
      if (p.bytes != internal::kRefRecordBytes || p.bytes > ready || pos + p.bytes > ring_bytes_) {
        Violation("a reference record of " + std::to_string(p.bytes) + " bytes at offset " +
                  std::to_string(pos));
        break;
      }
      const FrameHeader h = DecodeHeader(
          std::span<const std::byte, kHeaderBytes>(at + kRecordPrefixBytes, kHeaderBytes));
      uint64_t offset = 0;
      std::memcpy(&offset, at + kRecordAlign, sizeof offset);
      if (offset > arena_bytes_ || h.payload_bytes > arena_bytes_ - offset) {
        Violation("a reference to " + std::to_string(h.payload_bytes) + " bytes at offset " +
                  std::to_string(offset) + " of a " + std::to_string(arena_bytes_) +
                  "-byte arena");
        break;
      }
      ++references_received_;
      if (auto on_frame = cb_.on_frame) {
        on_frame(h, std::span<const std::byte>(arena_map_ + offset, h.payload_bytes));
      }
    } else {
      if (p.kind != internal::kFrameKind || p.bytes < kRecordAlign || p.bytes % kRecordAlign ||
          p.bytes > ready || pos + p.bytes > ring_bytes_) {
        Violation("a record of kind " + std::to_string(p.kind) + " and " +
                  std::to_string(p.bytes) + " bytes at offset " + std::to_string(pos) +
                  " is not a frame within the " + std::to_string(ready) + " bytes written");
        break;
      }
      const FrameHeader h = DecodeHeader(
          std::span<const std::byte, kHeaderBytes>(at + kRecordPrefixBytes, kHeaderBytes));
      if (RecordBytes(h.payload_bytes) != p.bytes) {
        Violation("a frame of " + std::to_string(h.payload_bytes) + " payload bytes in a record of " +
                  std::to_string(p.bytes) + " bytes");
        break;
      }
      // A copy: the callback may detach or close the channel, which clears cb_.
      if (auto on_frame = cb_.on_frame) {
        on_frame(h, std::span<const std::byte>(at + kRecordAlign, h.payload_bytes));
      }
    }
    // Consumed: the handler copied or used the payload during the call.
    ++records;  // pads count too
    rx_tail_ += p.bytes;
    internal::Tail(c).store(rx_tail_, std::memory_order_seq_cst);
    if (internal::Waiting(c).load(std::memory_order_seq_cst) != 0 &&
        internal::Waiting(c).exchange(0) != 0) {
      RingPeer();  // the peer waits for room
    }
  }
  return records;
}

void Channel::Grant() {
  turn_asked_ = false;
  turn_granted_ = true;
  // The scheduler grants on a fresh stack: deliver now unless a poll is due.
  if (!poll_posted_) Poll();
}

void Channel::PauseDelivery(bool on) {
  delivery_paused_ = on;
  if (!on) SchedulePoll();
}

bool Channel::ArmSleep() {
  bool work = false;
  RingControl* rc = rx_control();
  if (!delivery_paused_ && !violated_ && !turn_asked_) {
    internal::Sleeping(rc).store(1, std::memory_order_seq_cst);
    if (internal::Head(rc).load(std::memory_order_seq_cst) != rx_tail_) {
      internal::Sleeping(rc).store(0, std::memory_order_relaxed);
      work = true;
    }
  }
  if (!pending_lent_.empty() && !violated_) {
    // Frames lent from a region wait for the hub to consume them: have it
    // ring us when it does.
    RingControl* tc = tx_control();
    internal::Waiting(tc).store(1, std::memory_order_seq_cst);
    if (internal::Tail(tc).load(std::memory_order_seq_cst) >= pending_lent_.front().end) {
      internal::Waiting(tc).store(0, std::memory_order_relaxed);
      work = true;
    }
  }
  if (!queue_.empty() && !violated_) {
    RingControl* tc = tx_control();
    // The smallest record the front frame can take (a reference if it may
    // go to the arena).
    const OutgoingFrame& f = queue_.front();
    const size_t need = arena_ && f.owner && f.payload().size() >= kPublishMinBytes
                            ? internal::kRefRecordBytes
                            : RecordBytes(f.payload().size());
    internal::Waiting(tc).store(1, std::memory_order_seq_cst);
    const uint64_t tail = internal::Tail(tc).load(std::memory_order_seq_cst);
    if (tail <= tx_head_ && tx_head_ - tail <= ring_bytes_ && HasRoom(need, tail)) {
      internal::Waiting(tc).store(0, std::memory_order_relaxed);
      work = true;
    }
  }
  return work;
}

void Channel::RingPeer() {
  const uint64_t one = 1;
  // EAGAIN: the counter is saturated, the peer is woken anyway.
  while (::write(peer_bell_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Channel::WaitForRoom() {
  if (io_ && !poll_posted_ && ArmSleep()) SchedulePoll();
}

void Channel::PumpSends() {
  bool wrote = false;
  while (OutgoingFrame* next = NextToSend()) {
    OutgoingFrame& f = *next;
    const size_t bytes = kHeaderBytes + f.payload().size();
    const bool close_after = f.close_after;
    if (!TryWrite(f)) break;
    if (closed_) return;  // TryWrite closed us (and emptied the queue)
    wrote = true;
    queue_.pop_front();
    if (close_after) {
      RingPeer();
      // The peer drains its ring when it sees the socket close.
      Close("closed after its last frame");
      return;
    }
    if (auto on_sent = cb_.on_sent) on_sent(bytes);
  }
  if (wrote && side_ == Side::kClient) {
    reply_due_ = true;
    // Sent from outside Poll (the owner's Send): poll once more, so the
    // spin for the reply runs before the thread sleeps.
    if (!polling_) SchedulePoll();
  }
  if (std::exchange(pad_written_, false)) wrote = true;  // the reader must pass the pad
  // Lent frames wait for the hub's tail: have it ring us when it moves.
  if (!pending_lent_.empty() && !closed_) WaitForRoom();
  if (!wrote || closed_) return;
  RingControl* tc = tx_control();
  if (internal::Sleeping(tc).load(std::memory_order_seq_cst) != 0 &&
      internal::Sleeping(tc).exchange(0) != 0) {
    RingPeer();
  }
}

bool Channel::HasRoom(size_t rec, uint64_t tail) const {
  const size_t pos = tx_head_ % ring_bytes_;
  const size_t skip = pos + rec > ring_bytes_ ? ring_bytes_ - pos : 0;
  return tx_head_ + skip + rec - tail <= ring_bytes_;
}

void Channel::PadAhead(size_t rec, uint64_t tail) {
  const size_t pos = tx_head_ % ring_bytes_;
  if (pos == 0 || pos + rec <= ring_bytes_) return;  // no pad needed
  const size_t skip = ring_bytes_ - pos;
  if (tx_head_ + skip - tail > ring_bytes_) return;  // not even the pad fits yet
  const Prefix pad{internal::kPadKind, static_cast<uint32_t>(skip)};
  std::memcpy(tx_ring() + pos, &pad, sizeof pad);
  tx_head_ += skip;
  internal::Head(tx_control()).store(tx_head_, std::memory_order_seq_cst);
  pad_written_ = true;
}

void Channel::Append(uint32_t kind, size_t rec, const OutgoingFrame& f,
                     std::span<const std::byte> payload, uint64_t offset, uint32_t region) {
  std::byte* ring = tx_ring();
  const size_t pos = tx_head_ % ring_bytes_;
  if (pos + rec > ring_bytes_) {  // a record never wraps: pad to the end
    const Prefix pad{internal::kPadKind, static_cast<uint32_t>(ring_bytes_ - pos)};
    std::memcpy(ring + pos, &pad, sizeof pad);
    tx_head_ += ring_bytes_ - pos;
  }
  std::byte* dst = ring + tx_head_ % ring_bytes_;
  const Prefix p{kind, static_cast<uint32_t>(rec)};
  std::memcpy(dst, &p, sizeof p);
  std::memcpy(dst + kRecordPrefixBytes, f.header.data(), kHeaderBytes);
  if (kind == internal::kRefKind || kind == internal::kLentKind) {
    std::memcpy(dst + kRecordAlign, &offset, sizeof offset);
    std::memcpy(dst + kRecordAlign + sizeof offset, &region, sizeof region);
  } else if (!payload.empty()) {
    std::memcpy(dst + kRecordAlign, payload.data(), payload.size());
  }
  tx_head_ += rec;
  internal::Head(tx_control()).store(tx_head_, std::memory_order_seq_cst);
}

bool Channel::TryWrite(OutgoingFrame& f) {
  const std::span<const std::byte> payload = f.payload();
  const size_t rec = RecordBytes(payload.size());
  if (lend_ok_) {
    // A worker's payload in a region it lent its hub: a reference, no copy
    // (whatever its size: the record is 128 bytes).
    const uint64_t tail = internal::Tail(tx_control()).load(std::memory_order_seq_cst);
    if (tail <= tx_head_ && tx_head_ - tail <= ring_bytes_) {
      switch (TryWriteLent(f, tail)) {
        case LentWrite::kWritten: return true;
        case LentWrite::kFull: return false;  // a reference waits for room, never a copy
        case LentWrite::kNotLent: break;
      }
    }
  }
  if (rec > ring_bytes_) {
    if (f.release) f.release();
    f.release = nullptr;
    Close("a frame of " + std::to_string(kHeaderBytes + payload.size()) +
          " bytes does not fit the shared-memory ring (" + std::to_string(ring_bytes_) +
          " bytes); raise data.shm_ring_bytes");
    return true;
  }
  const uint64_t tail = internal::Tail(tx_control()).load(std::memory_order_seq_cst);
  if (tail > tx_head_ || tx_head_ - tail > ring_bytes_) {
    Violation("ring tail " + std::to_string(tail) + " is not within a ring of the head " +
              std::to_string(tx_head_));
    return false;
  }
  if (!pending_refs_.empty()) ReleaseConsumed(tail);
  bool written = false;
  // A shared reply payload goes to the publish arena once for every local
  // worker of the tenant; the ring carries a reference to it. A full arena
  // (a worker of the tenant reads slowly) falls back to a copy.
  if (arena_ && f.owner && payload.size() >= kPublishMinBytes) {
    if (!HasRoom(internal::kRefRecordBytes, tail)) {
      return false;
    }
    if (const int64_t offset = arena_->Publish(payload, f.owner); offset >= 0) {
      Append(internal::kRefKind, internal::kRefRecordBytes, f, {},
             static_cast<uint64_t>(offset));
      pending_refs_.emplace_back(tx_head_, static_cast<uint64_t>(offset));
      written = true;
    }
  }
  if (!written) {
    if (!HasRoom(rec, tail)) {
      PadAhead(rec, tail);
      return false;  // full
    }
    Append(internal::kFrameKind, rec, f, payload, 0);
  }
  f.owner.reset();  // copied (or held by the arena): its owner may let it go
  if (f.release) {
    f.release();  // the caller's buffer is free again
    f.release = nullptr;
  }
  return true;
}

void Channel::ReleaseConsumed(uint64_t tail, bool all) {
  while (!pending_refs_.empty() && (all || pending_refs_.front().first <= tail)) {
    arena_->Release(pending_refs_.front().second);
    pending_refs_.pop_front();
  }
}

void Channel::WriteRawForTesting(std::span<const std::byte> bytes, uint64_t head_advance) {
  const size_t pos = tx_head_ % ring_bytes_;
  if (!bytes.empty()) {
    std::memcpy(tx_ring() + pos, bytes.data(), std::min(bytes.size(), ring_bytes_ - pos));
  }
  tx_head_ += head_advance;
  internal::Head(tx_control()).store(tx_head_, std::memory_order_seq_cst);
  RingPeer();
}

void Channel::OnClose() {
  // The peer sees EOF on its socket, drains its ring and closes too.
  ::shutdown(socket_fd_, SHUT_RDWR);
  // Frames lent from regions: nothing waits for them any more (a hub that
  // drains its ring after our close reads what the region holds then, as
  // with any payload a worker rewrites while it is read).
  ReleaseLent(UINT64_MAX);
  if (bell_fd_) bell_fd_->cancel();
  if (socket_desc_) socket_desc_->cancel();
  if (!pending_refs_.empty()) {
    // The peer may still be copying replies it was sent (it drains its ring
    // on EOF): their arena space is reused only a while later.
    if (io_) {
      auto timer = std::make_shared<asio::steady_timer>(*io_, kRefsGrace);
      timer->async_wait([self = self(), timer](boost::system::error_code) {
        self->ReleaseConsumed(0, true);
      });
    } else {
      ReleaseConsumed(0, true);
    }
  }
}

}  // namespace rackhub::net::shm
