// PublishArena: where a hub publishes a reply payload once for every local
// worker of one tenant on one lane (docs/wire-protocol.md, section 10). The
// hub's shared-memory connections of that (tenant, lane) share one arena: the
// first reply of a parameter chunk copies it here, the others (the same
// bytes, the same owner) reference the same place, and each worker's ring
// carries a 128-byte reference record instead of the payload. Workers map the
// arena read-only (a read-only descriptor of a sealed memfd): they cannot
// change what other workers read.
//
// A published payload stays (with its owner reference, which keeps the source
// bytes unchanged: ChunkState::wire_params_ref) until every reference to it
// was released, i.e. every worker's ring consumed its record. Space is
// allocated in order, like a ring; a full arena makes Publish fail and the
// caller copies into its ring instead.
//
// Threading: Create on any thread; everything else on the lane's thread (all
// connections of one (tenant, lane) live there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>

#include "rackhub/common/status.h"

namespace rackhub::net::shm {

class PublishArena {
 public:
  // A sealed memfd of `bytes` (a multiple of 4096), mapped read-write here.
  static Result<std::shared_ptr<PublishArena>> Create(size_t bytes);
  ~PublishArena();
  PublishArena(const PublishArena&) = delete;
  PublishArena& operator=(const PublishArena&) = delete;

  size_t bytes() const { return bytes_; }
  // A new read-only descriptor of the arena for a worker (the caller closes
  // it), or -1.
  int ReadOnlyDescriptor() const;

  // The arena offset holding `payload`: already there for this owner's
  // bytes, or copied now. Takes one reference (Release). -1 when the arena
  // has no room.
  int64_t Publish(std::span<const std::byte> payload, const std::shared_ptr<const void>& owner);
  // Drops one reference taken by Publish at `offset`.
  void Release(uint64_t offset);
  // Payloads published and still referenced (tests, stats).
  size_t live() const { return by_data_.size(); }

 private:
  PublishArena(int fd, std::byte* base, size_t bytes) : fd_(fd), base_(base), bytes_(bytes) {}
  struct Slot {
    uint64_t start = 0;  // monotonic byte position of the slot (wrap skips included)
    uint64_t end = 0;
    size_t size = 0;  // bytes copied
    const void* data = nullptr;
    std::shared_ptr<const void> owner;
    uint32_t refs = 0;
  };
  int fd_;
  std::byte* base_;
  size_t bytes_;
  uint64_t head_ = 0;  // monotonic: next free byte
  uint64_t first_id_ = 0;
  std::deque<Slot> slots_;  // in allocation order; slot id = first_id_ + index
  std::unordered_map<const void*, uint64_t> by_data_;    // source bytes -> slot id
  std::unordered_map<uint64_t, uint64_t> by_offset_;     // arena offset -> slot id
};

}  // namespace rackhub::net::shm
