// Private to net/src/shm: the layout of the shared region (shm/channel.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "rackhub/net/shm/channel.h"

namespace rackhub::net::shm::internal {

// One direction's shared counters, each on its own cache line (the producer
// writes head and waiting, the consumer tail and sleeping).
struct RingControl {
  alignas(64) std::atomic<uint64_t> head;      // bytes written (producer)
  alignas(64) std::atomic<uint64_t> tail;      // bytes consumed (consumer)
  alignas(64) std::atomic<uint32_t> sleeping;  // consumer sleeps on its doorbell
  alignas(64) std::atomic<uint32_t> waiting;   // producer sleeps for room
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(RingControl) == 256);

// The control page: identification, then ring 0 (worker to hub) and ring 1
// (hub to worker) at 256 and 512.
struct ControlHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t ring_bytes;
  uint32_t reserved;
};
inline constexpr size_t kRingControlOffset = 256;

inline RingControl* Control(std::byte* base, int ring) {
  return reinterpret_cast<RingControl*>(base + kRingControlOffset + 256 * size_t(ring));
}
inline std::atomic<uint64_t>& Head(RingControl* c) { return c->head; }
inline std::atomic<uint64_t>& Tail(RingControl* c) { return c->tail; }
inline std::atomic<uint32_t>& Sleeping(RingControl* c) { return c->sleeping; }
inline std::atomic<uint32_t>& Waiting(RingControl* c) { return c->waiting; }

// A record's prefix (24 bytes, so the frame header ends 64-byte aligned).
inline constexpr uint32_t kFrameKind = 0x46524543;  // "CERF"
inline constexpr uint32_t kPadKind = 0x44444150;    // "PADD"
// A reply whose payload is in the publish arena: prefix, header, then the
// u64 arena offset; 128 bytes in all.
inline constexpr uint32_t kRefKind = 0x46455241;     // "AREF"
inline constexpr uint32_t kRefRecordBytes = 128;
// A worker's frame whose payload is in a region it lent (shm/lend.h):
// prefix, header, the u64 offset in the region and the u32 region id; 128
// bytes in all, like kRefKind.
inline constexpr uint32_t kLentKind = 0x4645524c;  // "LREF"

// Messages on the set-up socket after the set-up (worker to hub only, set-up
// version 2): LEND passes a region's descriptor (SCM_RIGHTS, with the
// message's first byte), UNLEND drops it.
inline constexpr uint32_t kLendMagic = 0x444e454c;  // "LEND"
enum LendOp : uint32_t { kLendOp = 1, kUnlendOp = 2 };
struct LendMessage {
  uint32_t magic = kLendMagic;
  uint32_t op = 0;
  uint32_t id = 0;
  uint32_t reserved = 0;
  uint64_t bytes = 0;  // LEND: the region's size
};
static_assert(sizeof(LendMessage) == 24);

struct Prefix {
  uint32_t kind = 0;
  uint32_t bytes = 0;  // the whole record, prefix included
  uint8_t reserved[16] = {};
};
static_assert(sizeof(Prefix) == kRecordPrefixBytes);

}  // namespace rackhub::net::shm::internal
