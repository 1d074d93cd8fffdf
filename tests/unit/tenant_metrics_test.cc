// The per-lane counters and histograms behind /metrics and GetStats:
// bucket boundaries, sums over lanes and ranks, and a reader that sums while
// lane threads write (never a lost or decreasing count once they stop).
#include "tenant_metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace rackhub::server {
namespace {

using std::chrono::nanoseconds;

LatencyHistogram::Snapshot Snap(const LatencyHistogram& h) {
  LatencyHistogram::Snapshot s;
  h.AddTo(&s);
  return s;
}

TEST(LatencyHistogramTest, BucketsArePowersOfTwoFrom16Microseconds) {
  EXPECT_DOUBLE_EQ(LatencyHistogram::BoundSeconds(0), 16e-6);
  EXPECT_DOUBLE_EQ(LatencyHistogram::BoundSeconds(LatencyHistogram::kBounds - 1), 33.554432);
  struct Case {
    int64_t ns;
    int bucket;
  } cases[] = {{0, 0},          {-5, 0},          {16000, 0},         {16001, 1},
               {32000, 1},      {32001, 2},       {1000000, 6},       {33554432000, 21},
               {33554432001, 22}, {int64_t{1} << 50, 22}};
  for (const Case& c : cases) {
    LatencyHistogram h;
    h.Observe(nanoseconds(c.ns));
    const auto s = Snap(h);
    EXPECT_EQ(s.count, 1u);
    EXPECT_EQ(s.counts[c.bucket], 1u) << c.ns << " ns";
  }
  LatencyHistogram h;
  h.Observe(nanoseconds(1500));
  h.Observe(nanoseconds(2500));
  EXPECT_DOUBLE_EQ(Snap(h).sum_seconds, 4e-6);
}

TEST(TenantLaneSlotsTest, SumsLanesRanksAndErrorCodes) {
  TenantLaneSlots slots(3, 4);
  EXPECT_EQ(slots.Read(1), nullptr) << "a lane's block exists once it served the tenant";
  TenantLaneMetrics& a = slots.ForLane(0);
  TenantLaneMetrics& b = slots.ForLane(2);
  EXPECT_EQ(&slots.ForLane(0), &a);
  a.pushes.Add(3);
  b.pushes.Add(4);
  a.bytes_in.Add(100);
  b.bytes_out.Add(7);
  a.errors[9].Add(2);
  b.errors[6].Add(1);
  a.update_latency.Observe(nanoseconds(20000));
  b.update_latency.Observe(nanoseconds(40000));
  EXPECT_EQ(a.rank(1), nullptr) << "rank histograms exist once the rank connected";
  a.EnsureRank(1);
  b.EnsureRank(1);
  b.EnsureRank(3);
  a.EnsureRank(4);  // out of range: ignored
  EXPECT_EQ(a.rank(4), nullptr);
  a.rank(1)->Observe(nanoseconds(1000));
  b.rank(1)->Observe(nanoseconds(1000));
  b.rank(3)->Observe(nanoseconds(5000000));
  const auto t = slots.Sum();
  EXPECT_EQ(t.pushes, 7u);
  EXPECT_EQ(t.bytes_in, 100u);
  EXPECT_EQ(t.bytes_out, 7u);
  EXPECT_EQ(t.errors, 3u);
  EXPECT_EQ(t.errors_by_code[9], 2u);
  EXPECT_EQ(t.errors_by_code[6], 1u);
  EXPECT_EQ(t.update_latency.count, 2u);
  EXPECT_EQ(t.update_latency.counts[1], 1u);
  EXPECT_EQ(t.update_latency.counts[2], 1u);
  ASSERT_EQ(t.rank_lateness.size(), 4u);
  EXPECT_EQ(t.rank_lateness[0].count, 0u);
  EXPECT_EQ(t.rank_lateness[1].count, 2u);
  EXPECT_EQ(t.rank_lateness[3].count, 1u);
}

TEST(TenantLaneSlotsTest, ReadersSumWhileLanesWrite) {
  constexpr uint32_t kLanes = 2;
  constexpr int kPerLane = 200000;
  TenantLaneSlots slots(kLanes, 2);
  std::vector<std::thread> lanes;
  for (uint32_t l = 0; l < kLanes; ++l) {
    lanes.emplace_back([&slots, l] {
      TenantLaneMetrics& m = slots.ForLane(l);
      m.EnsureRank(l);
      for (int i = 0; i < kPerLane; ++i) {
        m.pushes.Add(1);
        m.rank(l)->Observe(nanoseconds(i));
      }
    });
  }
  uint64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t now = slots.Sum().pushes;
    EXPECT_GE(now, last) << "a counter never goes back";
    last = now;
  }
  for (auto& t : lanes) t.join();
  const auto t = slots.Sum();
  EXPECT_EQ(t.pushes, uint64_t{kLanes} * kPerLane);
  EXPECT_EQ(t.rank_lateness[0].count + t.rank_lateness[1].count, uint64_t{kLanes} * kPerLane);
}

}  // namespace
}  // namespace rackhub::server
