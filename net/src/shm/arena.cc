#include "rackhub/net/shm/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace rackhub::net::shm {

namespace {

constexpr uint64_t kAlign = 64;
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1
#endif

}  // namespace

Result<std::shared_ptr<PublishArena>> PublishArena::Create(size_t bytes) {
  if (bytes == 0 || bytes % 4096 != 0) {
    return InvalidArgument("publish arena of " + std::to_string(bytes) + " bytes");
  }
  const int fd = ::memfd_create("rackhub-publish", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Internal(std::string("memfd_create: ") + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Internal("sizing the publish arena: " + why);
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Internal("mmap of the publish arena: " + why);
  }
  // Only the mapping made above may write: a worker that reopens its
  // read-only descriptor read-write (/proc/self/fd) still cannot write.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    const std::string why = std::strerror(errno);
    ::munmap(map, bytes);
    ::close(fd);
    return Internal("sealing the publish arena against writes: " + why);
  }
  return std::shared_ptr<PublishArena>(new PublishArena(fd, static_cast<std::byte*>(map), bytes));
}

PublishArena::~PublishArena() {
  ::munmap(base_, bytes_);
  ::close(fd_);
}

int PublishArena::ReadOnlyDescriptor() const {
  // A new open file description, read-only: a worker cannot map it writable.
  return ::open(("/proc/self/fd/" + std::to_string(fd_)).c_str(), O_RDONLY | O_CLOEXEC);
}

int64_t PublishArena::Publish(std::span<const std::byte> payload,
                              const std::shared_ptr<const void>& owner) {
  if (const auto it = by_data_.find(payload.data()); it != by_data_.end()) {
    Slot& s = slots_[it->second - first_id_];
    if (s.size == payload.size() && s.owner == owner) {
      ++s.refs;
      return static_cast<int64_t>(s.start % bytes_);
    }
  }
  const uint64_t need = (payload.size() + kAlign - 1) / kAlign * kAlign;
  if (slots_.empty()) head_ = (head_ + bytes_ - 1) / bytes_ * bytes_;  // empty: start over at 0
  const uint64_t tail = slots_.empty() ? head_ : slots_.front().start;
  uint64_t start = head_;
  if (start % bytes_ + need > bytes_) start += bytes_ - start % bytes_;  // no wrap inside
  if (need > bytes_ || start + need - tail > bytes_) return -1;
  std::memcpy(base_ + start % bytes_, payload.data(), payload.size());
  const uint64_t id = first_id_ + slots_.size();
  slots_.push_back({start, start + need, payload.size(), payload.data(), owner, 1});
  head_ = start + need;
  by_data_[payload.data()] = id;  // the newest publication of these bytes
  by_offset_[start % bytes_] = id;
  return static_cast<int64_t>(start % bytes_);
}

void PublishArena::Release(uint64_t offset) {
  const auto it = by_offset_.find(offset);
  if (it == by_offset_.end()) return;
  Slot& s = slots_[it->second - first_id_];
  if (s.refs == 0 || --s.refs > 0) return;
  if (const auto d = by_data_.find(s.data); d != by_data_.end() && d->second == it->second) {
    by_data_.erase(d);
  }
  by_offset_.erase(it);
  s.owner.reset();
  // Free the space of the oldest slots nobody references any more.
  while (!slots_.empty() && slots_.front().refs == 0) {
    slots_.pop_front();
    ++first_id_;
  }
}

}  // namespace rackhub::net::shm
