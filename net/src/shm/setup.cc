// Set-up and teardown of a shared-memory Channel (shm/channel.h): the sealed
// memfd region, the doorbells, and the HELLO / set-up exchange over the Unix
// socket that passes their descriptors (SCM_RIGHTS, unix(7)).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "rackhub/net/shm/channel.h"
#include "shm_internal.h"

namespace rackhub::net::shm {

using Clock = std::chrono::steady_clock;

namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

size_t RegionBytes(uint32_t ring_bytes) { return kControlBytes + 2 * size_t{ring_bytes}; }

bool ValidRingBytes(uint32_t ring_bytes) {
  return ring_bytes >= kMinRingBytes && ring_bytes <= kMaxRingBytes && ring_bytes % 4096 == 0;
}

// Closes a descriptor unless released.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Waits until `fd` is readable (or writable) or `deadline`; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Reads exactly `bytes` into `dest` by `deadline`; the first read also takes
// up to `fds.size()` descriptors (the rest of `fds` stays -1).
Status ReadAll(int fd, void* dest, size_t bytes, std::span<int> fds,
               Clock::time_point deadline) {
  size_t got = 0;
  bool first = true;
  while (got < bytes) {
    if (!WaitFor(fd, POLLIN, deadline)) return Unavailable("timed out waiting for the hub");
    iovec iov{static_cast<char*>(dest) + got, bytes - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 4)> control{};
    if (first && !fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
    }
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return Unavailable(Errno("reading from the hub's shared-memory socket"));
    }
    if (n == 0) return Unavailable("the hub closed the shared-memory socket");
    if (msg.msg_controllen > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) {
          if (i < fds.size() && fds[i] < 0) {
            fds[i] = in[i];
          } else {
            ::close(in[i]);  // more than expected: not ours to keep
          }
        }
      }
    }
    first = false;
    got += static_cast<size_t>(n);
  }
  return {};
}

Status WriteAll(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::send(fd, static_cast<const char*>(data) + done, bytes - done,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if ((errno == EAGAIN || errno == EINTR) && WaitFor(fd, POLLOUT, deadline)) continue;
      return Unavailable(Errno("writing HELLO to the hub's shared-memory socket"));
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

uint32_t RingBytesFor(uint32_t configured, size_t max_frame_payload) {
  const uint64_t want = std::max<uint64_t>(configured, 4 * RecordBytes(max_frame_payload));
  const uint64_t rounded = (want + 4095) / 4096 * 4096;
  return static_cast<uint32_t>(std::clamp<uint64_t>(rounded, kMinRingBytes, kMaxRingBytes));
}

std::string NewSocketName() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) | rd();
  char buf[64];
  std::snprintf(buf, sizeof buf, "rackhub-shm-%d-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r));
  return buf;
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

Channel::Channel(Side side, int socket_fd, std::byte* base, size_t map_bytes,
                 uint32_t ring_bytes, int my_bell, int peer_bell, std::string peer, PollMode poll)
    : FrameChannel("shared-memory ring"),
      side_(side),
      socket_fd_(socket_fd),
      base_(base),
      map_bytes_(map_bytes),
      ring_bytes_(ring_bytes),
      my_bell_(my_bell),
      peer_bell_(peer_bell),
      peer_(std::move(peer)),
      poll_(poll) {}

Channel::~Channel() {
  if (arena_) ReleaseConsumed(0, true);
  if (arena_map_) ::munmap(const_cast<std::byte*>(arena_map_), arena_bytes_);
  for (const auto& [id, m] : mapped_) ::munmap(const_cast<std::byte*>(m.base), m.bytes);
  for (int fd : socket_fds_) ::close(fd);
  // Frames lent from regions: the hub is gone or done with them.
  for (auto& f : pending_lent_) {
    if (f.release) f.release();
  }
  // The descriptors are ours, not the stream_descriptors'.
  if (bell_fd_) bell_fd_->release();
  if (socket_desc_) socket_desc_->release();
  while (!queue_.empty()) {
    if (queue_.front().release) queue_.front().release();
    queue_.pop_front();
  }
  ::munmap(base_, map_bytes_);
  ::close(socket_fd_);
  ::close(my_bell_);
  ::close(peer_bell_);
}

Result<std::shared_ptr<Channel>> Channel::Accept(int socket_fd, uint32_t ring_bytes,
                                                 std::shared_ptr<PublishArena> arena,
                                                 std::string peer, PollMode poll) {
  Fd socket(socket_fd);
  if (!ValidRingBytes(ring_bytes)) {
    return InvalidArgument("shared-memory ring of " + std::to_string(ring_bytes) +
                           " bytes (a multiple of 4096 from " + std::to_string(kMinRingBytes) +
                           " to " + std::to_string(kMaxRingBytes) + ")");
  }
  const size_t bytes = RegionBytes(ring_bytes);
  Fd memfd(::memfd_create("rackhub-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (memfd.get() < 0) return Internal(Errno("memfd_create"));
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
    return Internal(Errno("ftruncate of the shared-memory region"));
  }
  // The worker gets this descriptor: it must not be able to shrink the region
  // under the hub (a SIGBUS here) nor grow it.
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Internal(Errno("sealing the shared-memory region"));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (map == MAP_FAILED) return Internal(Errno("mmap of the shared-memory region"));
  auto* base = static_cast<std::byte*>(map);
  const internal::ControlHeader header{kSetupMagic, kSetupVersion, ring_bytes, 0};
  std::memcpy(base, &header, sizeof header);
  Fd hub_bell(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  Fd worker_bell(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (hub_bell.get() < 0 || worker_bell.get() < 0) {
    ::munmap(map, bytes);
    return Internal(Errno("eventfd"));
  }

  Fd arena_fd(arena ? arena->ReadOnlyDescriptor() : -1);
  if (arena && arena_fd.get() < 0) {
    ::munmap(map, bytes);
    return Internal(Errno("a read-only descriptor of the publish arena"));
  }
  // The set-up message: a WELCOME frame whose payload is a SetupMessage, with
  // the memfd, both doorbells (hub's, worker's) and the arena attached.
  FrameHeader h;
  h.opcode = Opcode::kWelcome;
  h.payload_bytes = sizeof(SetupMessage);
  std::array<std::byte, kHeaderBytes + sizeof(SetupMessage)> out{};
  EncodeHeader(h, std::span<std::byte, kHeaderBytes>(out.data(), kHeaderBytes));
  const SetupMessage setup{kSetupMagic, kSetupVersion, ring_bytes,
                           arena ? static_cast<uint32_t>(arena->bytes()) : 0};
  std::memcpy(out.data() + kHeaderBytes, &setup, sizeof setup);
  iovec iov{out.data(), out.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  const int fds[4] = {memfd.get(), hub_bell.get(), worker_bell.get(), arena_fd.get()};
  const size_t nfds = arena ? 4 : 3;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * 4)> control{};
  msg.msg_control = control.data();
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  // A fresh socket's buffer takes this small message at once.
  if (::sendmsg(socket.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL) !=
      static_cast<ssize_t>(out.size())) {
    ::munmap(map, bytes);
    return Unavailable(Errno("sending the shared-memory set-up to the worker"));
  }
  auto channel = std::shared_ptr<Channel>(new Channel(Side::kHub, socket.release(), base, bytes,
                                                      ring_bytes, hub_bell.release(),
                                                      worker_bell.release(), std::move(peer), poll));
  channel->arena_ = std::move(arena);
  return channel;
}

Result<ConnectReply> Channel::Connect(const std::string& socket_name, const std::string& hello,
                                      PollMode poll, Clock::time_point deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_name.empty() || socket_name.size() + 1 > sizeof addr.sun_path) {
    return InvalidArgument("shared-memory socket name '" + socket_name + "'");
  }
  std::memcpy(addr.sun_path + 1, socket_name.data(), socket_name.size());  // abstract
  Fd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socket.get() < 0) return Unavailable(Errno("socket(AF_UNIX)"));
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + socket_name.size());
  if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    return Unavailable(Errno("connecting to the hub's shared-memory socket @" + socket_name));
  }
  FrameHeader h;
  h.opcode = Opcode::kHello;
  h.payload_bytes = static_cast<uint32_t>(hello.size());
  std::array<std::byte, kHeaderBytes> header{};
  EncodeHeader(h, header);
  if (Status s = WriteAll(socket.get(), header.data(), header.size(), deadline); !s.ok()) return s;
  if (Status s = WriteAll(socket.get(), hello.data(), hello.size(), deadline); !s.ok()) return s;

  std::array<int, 4> fds = {-1, -1, -1, -1};
  const auto close_fds = [&] {
    for (int& fd : fds) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  };
  Status read = ReadAll(socket.get(), header.data(), header.size(), fds, deadline);
  if (!read.ok()) {
    close_fds();
    return read;
  }
  const FrameHeader reply = DecodeHeader(header);
  if (Status bad = CheckHeader(reply); !bad.ok()) {
    close_fds();
    return InvalidArgument("invalid reply to HELLO: " + bad.message());
  }
  if (reply.opcode == Opcode::kError) {
    close_fds();
    ConnectReply refused;
    refused.refusal = reply;
    refused.refusal_body.resize(reply.payload_bytes);
    if (Status s = ReadAll(socket.get(), refused.refusal_body.data(), reply.payload_bytes, {},
                           deadline);
        !s.ok()) {
      return s;
    }
    return refused;
  }
  SetupMessage setup;
  if (reply.opcode != Opcode::kWelcome || reply.payload_bytes != sizeof setup) {
    close_fds();
    return InvalidArgument(std::string("expected the shared-memory set-up, got ") +
                           OpcodeName(reply.opcode) + " of " +
                           std::to_string(reply.payload_bytes) + " bytes");
  }
  read = ReadAll(socket.get(), &setup, sizeof setup, {}, deadline);
  if (!read.ok()) {
    close_fds();
    return read;
  }
  Fd memfd(fds[0]), hub_bell(fds[1]), worker_bell(fds[2]), arena_fd(fds[3]);
  if (setup.magic != kSetupMagic || setup.version < 1 || setup.version > kSetupVersion ||
      !ValidRingBytes(setup.ring_bytes) || worker_bell.get() < 0) {
    return InvalidArgument("malformed shared-memory set-up (magic, version " +
                           std::to_string(setup.version) + ", ring of " +
                           std::to_string(setup.ring_bytes) + " bytes, or descriptors missing)");
  }
  const size_t bytes = RegionBytes(setup.ring_bytes);
  struct stat st{};
  if (::fstat(memfd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes ||
      (::fcntl(memfd.get(), F_GET_SEALS) & F_SEAL_SHRINK) == 0) {
    return InvalidArgument("the shared-memory region is not a sealed region of " +
                           std::to_string(bytes) + " bytes");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (map == MAP_FAILED) return Unavailable(Errno("mmap of the shared-memory region"));
  internal::ControlHeader control;
  std::memcpy(&control, map, sizeof control);
  if (control.magic != kSetupMagic || control.ring_bytes != setup.ring_bytes) {
    ::munmap(map, bytes);
    return InvalidArgument("the shared-memory region's control page does not match the set-up");
  }
  void* arena_map = nullptr;
  if (setup.arena_bytes > 0) {
    struct stat ast{};
    if (arena_fd.get() < 0 || ::fstat(arena_fd.get(), &ast) != 0 ||
        static_cast<size_t>(ast.st_size) != setup.arena_bytes ||
        (::fcntl(arena_fd.get(), F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE)) !=
            (F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE)) {
      ::munmap(map, bytes);
      return InvalidArgument("the publish arena is missing or not a sealed region of " +
                             std::to_string(setup.arena_bytes) + " bytes");
    }
    arena_map = ::mmap(nullptr, setup.arena_bytes, PROT_READ, MAP_SHARED, arena_fd.get(), 0);
    if (arena_map == MAP_FAILED) {
      ::munmap(map, bytes);
      return Unavailable(Errno("mmap of the publish arena"));
    }
  }
  const int flags = ::fcntl(socket.get(), F_GETFL);
  ::fcntl(socket.get(), F_SETFL, flags | O_NONBLOCK);
  ConnectReply accepted;
  accepted.channel = std::shared_ptr<Channel>(
      new Channel(Side::kClient, socket.release(), static_cast<std::byte*>(map), bytes,
                  setup.ring_bytes, worker_bell.release(), hub_bell.release(),
                  "shm:@" + socket_name, poll));
  accepted.channel->arena_map_ = static_cast<const std::byte*>(arena_map);
  accepted.channel->arena_bytes_ = setup.arena_bytes;
  accepted.channel->lend_ok_ = setup.version >= 2;
  return accepted;
}

}  // namespace rackhub::net::shm
