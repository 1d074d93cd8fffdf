// Lent regions on a shared-memory Channel (docs/wire-protocol.md section 10):
// the LEND / UNLEND messages on the set-up socket (SCM_RIGHTS), the hub's
// checks and read-only mappings of the regions a client lends, and the
// client's LREF records for payloads that lie in a lent region, whose
// buffers are released once the hub's tail passes them. The ring protocol
// itself is in channel.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "rackhub/net/shm/channel.h"
#include "rackhub/net/shm/lend.h"
#include "shm_internal.h"

namespace rackhub::net::shm {

void Channel::OnLendMessage(const internal::LendMessage& m, int fd) {
  const std::string what = "lent region " + std::to_string(m.id);
  if (m.magic != internal::kLendMagic ||
      (m.op != internal::kLendOp && m.op != internal::kUnlendOp)) {
    return Violation("a message on the set-up socket that is not LEND or UNLEND");
  }
  if (m.op == internal::kUnlendOp) {
    const auto it = mapped_.find(m.id);
    if (it == mapped_.end()) return Violation("UNLEND of " + what + ", which was never lent");
    ::munmap(const_cast<std::byte*>(it->second.base), it->second.bytes);
    mapped_.erase(it);
    return;
  }
  if (fd < 0) return Violation("LEND of " + what + " without its descriptor");
  if (m.id == 0 || mapped_.count(m.id) != 0) {
    return Violation("LEND of " + what + ": the id is 0 or already lent");
  }
  if (mapped_.size() >= kMaxLentRegionsPerConnection) {
    return Violation("LEND of " + what + ": more than " +
                     std::to_string(kMaxLentRegionsPerConnection) + " regions lent at once");
  }
  struct stat st{};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (m.bytes == 0 || m.bytes > kMaxLendBytes || m.bytes % 4096 != 0 || ::fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != m.bytes || seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Violation("LEND of " + what + ": not a memfd of " + std::to_string(m.bytes) +
                     " bytes (a multiple of 4 KiB up to " + std::to_string(kMaxLendBytes) +
                     ") sealed against shrinking");
  }
  void* map = ::mmap(nullptr, m.bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return Violation("LEND of " + what + ": mmap: " + std::strerror(errno));
  }
  mapped_[m.id] = Mapped{static_cast<const std::byte*>(map), static_cast<size_t>(m.bytes)};
}

bool Channel::SendLendMessage(uint32_t op, uint32_t id, uint64_t bytes, int fd) {
  internal::LendMessage m;
  m.op = op;
  m.id = id;
  m.bytes = bytes;
  iovec iov{&m, sizeof m};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  if (fd >= 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  // A 24-byte message goes into the socket's buffer whole or not at all
  // while it has room (the socket carries nothing else); EAGAIN: later, or
  // the frame is copied instead.
  for (;;) {
    const ssize_t n = ::sendmsg(socket_fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof m)) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n >= 0) Close("a lend message was cut short on the set-up socket");
    return false;
  }
}

bool Channel::SendLendMessageForTesting(uint32_t op, uint32_t id, uint64_t bytes, int fd) {
  return SendLendMessage(op, id, bytes, fd);
}

Channel::LentWrite Channel::TryWriteLent(OutgoingFrame& f, uint64_t tail) {
  const std::span<const std::byte> payload = f.payload();
  if (side_ != Side::kClient || !lend_ok_ || payload.size() < kLendMinBytes) {
    return LentWrite::kNotLent;
  }
  std::shared_ptr<LendRegion> region = LendRegion::Find(payload.data(), payload.size());
  if (!region) return LentWrite::kNotLent;
  const auto known = announced_.find(region->id());
  if (known == announced_.end() || known->second.expired()) {
    if (!SendLendMessage(internal::kLendOp, region->id(), region->bytes().size(), region->fd())) {
      return LentWrite::kNotLent;  // the socket is full: copy this one
    }
    announced_[region->id()] = region;
  }
  if (!HasRoom(internal::kRefRecordBytes, tail)) return LentWrite::kFull;
  Append(internal::kLentKind, internal::kRefRecordBytes, f, {},
         static_cast<uint64_t>(payload.data() - region->bytes().data()), region->id());
  pending_lent_.push_back({tx_head_, std::move(region), std::move(f.release)});
  f.release = nullptr;
  f.owner.reset();
  ++lent_sent_;
  return LentWrite::kWritten;
}

void Channel::ReleaseLent(uint64_t tail) {
  while (!pending_lent_.empty() && pending_lent_.front().end <= tail) {
    std::function<void()> release = std::move(pending_lent_.front().release);
    pending_lent_.pop_front();  // lets the region go first
    if (release) release();     // the caller's buffer is free again
  }
}

void Channel::UnlendGone() {
  for (auto it = announced_.begin(); it != announced_.end();) {
    if (!it->second.expired()) {
      ++it;
    } else if (SendLendMessage(internal::kUnlendOp, it->first, 0, -1)) {
      it = announced_.erase(it);
    } else {
      return;  // the socket is full: next turn
    }
  }
}

}  // namespace rackhub::net::shm
