// LendRegion: memory a worker lends to the hubs on its host, so they read
// its pushes in place (zero copy; docs/wire-protocol.md, section 10).
//
// A region is a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW: nobody can
// truncate it under a reader) mapped read-write here. While it lives it is
// in a process-wide registry; a client-side shm::Channel that is asked to
// send a frame whose payload lies inside a registered region passes the
// region's descriptor to its hub once (a LEND message on the set-up socket)
// and then writes a 128-byte reference record into the ring instead of the
// payload; the hub maps the region read-only and hands the frame's payload
// over in place. Other transports send from the region's memory as from any
// other memory.
//
// Ownership: the creator owns the region (a shared_ptr); a channel that
// referenced it keeps it alive until the hub consumed the reference. When
// the last owner lets go, the region leaves the registry and is unmapped
// here; channels that lent it tell their hub (UNLEND) on their next turn.
// Threading: Create, the destructor and Find from any thread (the registry
// has a mutex); bytes() is plain memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "rackhub/common/status.h"

namespace rackhub::net::shm {

class LendRegion {
 public:
  // A region of at least `bytes` bytes (rounded up to 4 KiB), zero-filled.
  // INVALID_ARGUMENT for 0 or more than kMaxLendBytes, INTERNAL when the
  // memfd or mapping cannot be made.
  static Result<std::shared_ptr<LendRegion>> Create(size_t bytes);
  ~LendRegion();
  LendRegion(const LendRegion&) = delete;
  LendRegion& operator=(const LendRegion&) = delete;

  std::span<std::byte> bytes() const { return {base_, bytes_}; }
  // Unique in this process for its lifetime (never reused).
  uint32_t id() const { return id_; }
  int fd() const { return fd_; }

  // The live region holding [data, data + size), or null.
  static std::shared_ptr<LendRegion> Find(const void* data, size_t size);

 private:
  LendRegion(int fd, std::byte* base, size_t bytes, uint32_t id)
      : fd_(fd), base_(base), bytes_(bytes), id_(id) {}
  int fd_;
  std::byte* base_;
  size_t bytes_;
  uint32_t id_;
};

// Largest region, and the most regions a hub maps for one connection.
inline constexpr size_t kMaxLendBytes = size_t{64} << 30;
inline constexpr size_t kMaxLentRegionsPerConnection = 1024;
// Payloads smaller than this are copied into the ring even from a region.
inline constexpr size_t kLendMinBytes = 4096;

}  // namespace rackhub::net::shm
