// Per-lane figures of one tenant, recorded on the data path without locks,
// read-modify-write instructions or allocations, and merged over the lanes
// when someone reads them (a Prometheus scrape, GetStats, rackhubctl top).
//
// Each TenantLaneMetrics block is written by exactly one lane thread, so a
// counter is a relaxed load and store of its own cache-resident word
// (LaneCounter), never a contended atomic add. Readers on other threads load
// the words (relaxed) and sum them: a read may miss the increments of the
// last instant but never sees a torn or decreasing value.
//
// Ownership: TenantCounters (registry.h) owns one block per lane, created by
// that lane the first time it serves the tenant (TenantLaneSlots::ForLane),
// and freed with the TenantCounters. Rank histograms inside a block are
// created by the lane when a rank's connection is adopted, never per chunk.
// Threading: writers: the owning lane thread only; readers: any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace rackhub::server {

// A counter with a single writer.
class LaneCounter {
 public:
  void Add(uint64_t n) { v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t Read() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// A latency histogram with a single writer: bucket i counts observations of
// at most kBoundsMicros[i] (powers of two from 16 us to 2^25 us = 33.5 s),
// the last bucket the rest (+Inf); sum in nanoseconds.
class LatencyHistogram {
 public:
  static constexpr int kBounds = 22;
  static constexpr double BoundSeconds(int i) { return static_cast<double>(uint64_t{16} << i) * 1e-6; }

  void Observe(std::chrono::nanoseconds d);

  struct Snapshot {
    std::array<uint64_t, kBounds + 1> counts{};  // per bucket (not cumulative); last = +Inf
    uint64_t count = 0;
    double sum_seconds = 0;
  };
  void AddTo(Snapshot* s) const;

 private:
  std::array<LaneCounter, kBounds + 1> counts_;
  LaneCounter sum_ns_;
};

// Error codes counted per tenant (net::WireError values 1..14, 0 unused).
inline constexpr uint32_t kErrorCodeSlots = 16;

// What one lane recorded for one tenant.
struct TenantLaneMetrics {
  explicit TenantLaneMetrics(uint32_t members);
  ~TenantLaneMetrics();

  LaneCounter pushes;     // PUSH frames counted into a sum
  LaneCounter bytes_in;   // PUSH and INIT frames, headers included
  LaneCounter bytes_out;  // bytes the transports wrote to the tenant's workers
  std::array<LaneCounter, kErrorCodeSlots> errors;  // ERROR frames sent, by code
  void CountError(uint32_t code) { errors[code < kErrorCodeSlots ? code : 0].Add(1); }
  // First contribution of an update to its replies being queued.
  LatencyHistogram update_latency;

  // How long after an update's first contribution member m's own arrived
  // (what the others waited for m): created by EnsureRank when m connects.
  void EnsureRank(uint32_t member);
  LatencyHistogram* rank(uint32_t member) {
    return member < members_ ? lateness_[member].load(std::memory_order_relaxed) : nullptr;
  }
  const LatencyHistogram* rank_for_reading(uint32_t member) const {
    return lateness_[member].load(std::memory_order_acquire);
  }

 private:
  const uint32_t members_;
  std::unique_ptr<std::atomic<LatencyHistogram*>[]> lateness_;
};

// One TenantLaneMetrics per lane of the hub, created on demand.
class TenantLaneSlots {
 public:
  TenantLaneSlots(uint32_t lanes, uint32_t members);
  ~TenantLaneSlots();
  TenantLaneSlots(const TenantLaneSlots&) = delete;
  TenantLaneSlots& operator=(const TenantLaneSlots&) = delete;

  // Lane `lane`'s block (created by that lane's first call). Lane thread only.
  TenantLaneMetrics& ForLane(uint32_t lane);
  uint32_t lanes() const { return lanes_; }
  // The block of `lane`, null until that lane served the tenant. Any thread.
  const TenantLaneMetrics* Read(uint32_t lane) const {
    return lane < lanes_ ? slots_[lane].load(std::memory_order_acquire) : nullptr;
  }

  // Sums over the lanes (any thread).
  struct Totals {
    uint64_t pushes = 0, bytes_in = 0, bytes_out = 0, errors = 0;
    std::array<uint64_t, kErrorCodeSlots> errors_by_code{};
    LatencyHistogram::Snapshot update_latency;
    std::vector<LatencyHistogram::Snapshot> rank_lateness;  // by member; count 0: never seen
  };
  Totals Sum() const;

 private:
  const uint32_t lanes_;
  const uint32_t members_;
  std::unique_ptr<std::atomic<TenantLaneMetrics*>[]> slots_;
};

}  // namespace rackhub::server
