#include "rackhub/net/shm/lend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace rackhub::net::shm {

namespace {

struct Registry {
  std::mutex mu;
  uint32_t next_id = 1;
  // base address -> region (weak: the registry never keeps one alive)
  std::map<uintptr_t, std::weak_ptr<LendRegion>> by_base;
};

Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: regions may outlive statics
  return *r;
}

}  // namespace

Result<std::shared_ptr<LendRegion>> LendRegion::Create(size_t bytes) {
  if (bytes == 0 || bytes > kMaxLendBytes) {
    return InvalidArgument("lend region: " + std::to_string(bytes) + " bytes is not in [1, " +
                           std::to_string(kMaxLendBytes) + "]");
  }
  bytes = (bytes + 4095) / 4096 * 4096;
  const int fd = ::memfd_create("rackhub-lend", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Internal(std::string("memfd_create: ") + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Internal("lend region of " + std::to_string(bytes) + " bytes: " + why);
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Internal("mmap of a lend region: " + why);
  }
  Registry& r = TheRegistry();
  std::lock_guard lock(r.mu);
  std::shared_ptr<LendRegion> region(
      new LendRegion(fd, static_cast<std::byte*>(map), bytes, r.next_id++));
  r.by_base[reinterpret_cast<uintptr_t>(map)] = region;
  return region;
}

LendRegion::~LendRegion() {
  {
    Registry& r = TheRegistry();
    std::lock_guard lock(r.mu);
    r.by_base.erase(reinterpret_cast<uintptr_t>(base_));
  }
  ::munmap(base_, bytes_);
  ::close(fd_);
}

std::shared_ptr<LendRegion> LendRegion::Find(const void* data, size_t size) {
  const auto p = reinterpret_cast<uintptr_t>(data);
  Registry& r = TheRegistry();
  std::lock_guard lock(r.mu);
  auto it = r.by_base.upper_bound(p);
  if (it == r.by_base.begin()) return nullptr;
  --it;
  std::shared_ptr<LendRegion> region = it->second.lock();
  if (!region) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(region->base_);
  if (p < base || size > region->bytes_ || p - base > region->bytes_ - size) return nullptr;
  return region;
}

}  // namespace rackhub::net::shm
