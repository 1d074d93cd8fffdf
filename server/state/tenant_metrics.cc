#include "tenant_metrics.h"

#include <bit>

namespace rackhub::server {

void LatencyHistogram::Observe(std::chrono::nanoseconds d) {
  const uint64_t ns = d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0;
  // Bucket i holds (16 << (i-1), 16 << i] us: the first i with
  // ceil(us / 16) <= 2^i.
  const uint64_t sixteenths = (ns + 15999) / 16000;  // ceil(ns / 16 us)
  const int i = sixteenths <= 1 ? 0 : std::bit_width(sixteenths - 1);
  counts_[i < kBounds ? i : kBounds].Add(1);
  sum_ns_.Add(ns);
}

void LatencyHistogram::AddTo(Snapshot* s) const {
  for (int i = 0; i <= kBounds; ++i) {
    const uint64_t n = counts_[i].Read();
    s->counts[i] += n;
    s->count += n;
  }
  s->sum_seconds += static_cast<double>(sum_ns_.Read()) * 1e-9;
}

TenantLaneMetrics::TenantLaneMetrics(uint32_t members)
    : members_(members), lateness_(new std::atomic<LatencyHistogram*>[members]) {
  for (uint32_t m = 0; m < members; ++m) lateness_[m].store(nullptr, std::memory_order_relaxed);
}

TenantLaneMetrics::~TenantLaneMetrics() {
  for (uint32_t m = 0; m < members_; ++m) delete lateness_[m].load(std::memory_order_relaxed);
}

void TenantLaneMetrics::EnsureRank(uint32_t member) {
  if (member >= members_ || lateness_[member].load(std::memory_order_relaxed)) return;
  lateness_[member].store(new LatencyHistogram, std::memory_order_release);
}

TenantLaneSlots::TenantLaneSlots(uint32_t lanes, uint32_t members)
    : lanes_(lanes), members_(members), slots_(new std::atomic<TenantLaneMetrics*>[lanes]) {
  for (uint32_t l = 0; l < lanes; ++l) slots_[l].store(nullptr, std::memory_order_relaxed);
}

TenantLaneSlots::~TenantLaneSlots() {
  for (uint32_t l = 0; l < lanes_; ++l) delete slots_[l].load(std::memory_order_relaxed);
}

TenantLaneMetrics& TenantLaneSlots::ForLane(uint32_t lane) {
  TenantLaneMetrics* m = slots_[lane].load(std::memory_order_relaxed);
  if (!m) {
    m = new TenantLaneMetrics(members_);
    slots_[lane].store(m, std::memory_order_release);
  }
  return *m;
}

TenantLaneSlots::Totals TenantLaneSlots::Sum() const {
  Totals t;
  t.rank_lateness.resize(members_);
  for (uint32_t l = 0; l < lanes_; ++l) {
    const TenantLaneMetrics* m = Read(l);
    if (!m) continue;
    t.pushes += m->pushes.Read();
    t.bytes_in += m->bytes_in.Read();
    t.bytes_out += m->bytes_out.Read();
    for (uint32_t c = 0; c < kErrorCodeSlots; ++c) {
      const uint64_t n = m->errors[c].Read();
      t.errors_by_code[c] += n;
      t.errors += n;
    }
    m->update_latency.AddTo(&t.update_latency);
    for (uint32_t r = 0; r < members_; ++r) {
      if (const LatencyHistogram* h = m->rank_for_reading(r)) h->AddTo(&t.rank_lateness[r]);
    }
  }
  return t;
}

}  // namespace rackhub::server
