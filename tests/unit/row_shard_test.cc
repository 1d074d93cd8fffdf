// RowShard (row-sparse tables, issue 16): every update is compared bit for
// bit with the reference model (tests/support/table_reference.h) fed the same
// contributions. Covers every arrival order,
// empty pushes, all-rows pushes, duplicate ids, the first and last row of the
// shard, fp16/bf16 rows, and bad contributions (which change nothing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "rackhub/aggregation/row_shard.h"
#include "table_reference.h"

namespace rackhub::aggregation {
namespace {

constexpr uint64_t kFirst = 1000, kRows = 40;
constexpr uint32_t kDim = 7;

using Push = testing::TablePush;

// A push of `n` random ids of the shard (duplicates likely), always including
// the first and last row when `ends`.
Push RandomPush(std::mt19937& rng, size_t n, bool ends) {
  Push p;
  std::uniform_int_distribution<uint64_t> id(kFirst, kFirst + kRows - 1);
  std::normal_distribution<float> val(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) p.ids.push_back(id(rng));
  if (ends) {
    p.ids.push_back(kFirst);
    p.ids.push_back(kFirst + kRows - 1);
    p.ids.push_back(kFirst);  // a duplicate of an end row
  }
  for (size_t i = 0; i < p.ids.size() * kDim; ++i) p.rows.push_back(val(rng));
  return p;
}

// The reference (tests/support/table_reference.h) of this shard's rows.
struct Reference : testing::TableReference {
  Reference(const OptimizerConfig& c, uint32_t w)
      : testing::TableReference(c, w, kFirst, kRows, kDim) {}
};

std::vector<float> Values(const RowShard& s) {
  std::vector<float> out;
  for (uint64_t id = kFirst; id < kFirst + kRows; ++id) {
    const auto row = s.row(id);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void Contribute(RowShard& s, uint32_t rank, const Push& p) {
  ASSERT_TRUE(
      s.CheckContribution(rank, p.ids, p.rows.size() * sizeof(float), ElementType::kFp32).ok());
  s.Contribute(rank, p.ids, p.rows.data(), ElementType::kFp32);
}

OptimizerConfig Config(OptimizerType type, Reduction reduction = Reduction::kMean) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = 0.05;
  c.reduction = reduction;
  if (type == OptimizerType::kMomentum) c.momentum = 0.9;
  if (type == OptimizerType::kSgd || type == OptimizerType::kAdaGrad) c.weight_decay = 0.01;
  if (type == OptimizerType::kAdaGrad) c.initial_accumulator = 0.1;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  return c;
}

TEST(RowShardTest, RankOrderSumsWhateverTheArrivalOrder) {
  const OptimizerConfig cfg = Config(OptimizerType::kSgd, Reduction::kSum);
  std::mt19937 rng(7);
  std::vector<Push> pushes = {RandomPush(rng, 30, true), RandomPush(rng, 12, false),
                              RandomPush(rng, 25, true)};
  Reference ref(cfg, 3);
  ref.Update(pushes);
  std::vector<uint32_t> order = {0, 1, 2};
  do {
    RowShard s(kFirst, kRows, kDim, 3, cfg);
    for (const uint32_t r : order) Contribute(s, r, pushes[r]);
    ASSERT_TRUE(s.ready());
    const std::vector<uint64_t> touched = s.Update();
    EXPECT_TRUE(std::is_sorted(touched.begin(), touched.end()));
    EXPECT_EQ(touched.front(), kFirst);
    EXPECT_EQ(touched.back(), kFirst + kRows - 1);
    EXPECT_TRUE(SameBits(Values(s), ref.values))
        << "arrival order " << order[0] << order[1] << order[2];
    EXPECT_EQ(s.version(), 1u);
  } while (std::next_permutation(order.begin(), order.end()));
}

class RowShardOptimizerTest : public ::testing::TestWithParam<OptimizerType> {};

TEST_P(RowShardOptimizerTest, EveryIterationMatchesTheReferenceBitForBit) {
  const OptimizerConfig cfg = Config(GetParam());
  constexpr uint32_t kWorkers = 3;
  RowShard s(kFirst, kRows, kDim, kWorkers, cfg);
  Reference ref(cfg, kWorkers);
  // Start from non-zero rows (as rank 0's initial values would be).
  std::vector<uint64_t> all(kRows);
  std::iota(all.begin(), all.end(), kFirst);
  std::vector<float> init(kRows * kDim);
  for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(static_cast<float>(i)) * 0.5f;
  s.WriteRows(all, init.data(), ElementType::kFp32);
  ref.values = init;
  std::mt19937 rng(11);
  for (int it = 0; it < 6; ++it) {
    std::vector<Push> pushes;
    for (uint32_t r = 0; r < kWorkers; ++r) {
      if (it == 2 && r == 1) {
        pushes.push_back(Push{});  // an empty push
      } else if (it == 3 && r == 0) {
        Push p;  // every row, in descending order
        for (uint64_t id = kFirst + kRows; id-- > kFirst;) p.ids.push_back(id);
        std::normal_distribution<float> val;
        for (size_t i = 0; i < p.ids.size() * kDim; ++i) p.rows.push_back(val(rng));
        pushes.push_back(p);
      } else {
        pushes.push_back(RandomPush(rng, 8, it % 2 == 0));
      }
    }
    if (it == 4) pushes = {Push{}, Push{}, Push{}};  // nobody touched anything
    const std::vector<float> before_state0(s.state(0).begin(), s.state(0).end());
    for (uint32_t r = kWorkers; r-- > 0;) Contribute(s, r, pushes[r]);  // reverse arrival
    const std::vector<uint64_t> touched = s.Update();
    ref.Update(pushes);
    ASSERT_TRUE(SameBits(Values(s), ref.values)) << "iteration " << it;
    // Untouched rows keep their optimizer state (lazy).
    const auto st = s.state(0);
    const size_t per_row = cfg.type == OptimizerType::kAdaGrad ? 1 : kDim;
    for (uint64_t id = kFirst; id < kFirst + kRows && !st.empty(); ++id) {
      if (std::binary_search(touched.begin(), touched.end(), id)) continue;
      const size_t at = (id - kFirst) * per_row;
      ASSERT_EQ(std::memcmp(st.data() + at, before_state0.data() + at, per_row * sizeof(float)),
                0)
          << "the state of untouched row " << id << " changed at iteration " << it;
    }
    if (it == 4) {
      EXPECT_TRUE(touched.empty());
    }
  }
  EXPECT_EQ(s.version(), 6u);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, RowShardOptimizerTest,
                         ::testing::Values(OptimizerType::kSgd, OptimizerType::kMomentum,
                                           OptimizerType::kAdam, OptimizerType::kAdaGrad),
                         [](const auto& info) { return OptimizerTypeName(info.param); });

// A table spanning racks (server/lanes/rack_rows.cc): each rack's RowSums
// sums its ranks' rows, whatever order they arrive in; the home's shard takes
// the racks' sums as its contributors (any arrival order) with the mean over
// every rack's workers: the reference's rack-then-rack-order sums, bit for bit,
// for 2 and 3 racks of 2 workers over several iterations (Adam: its t too).
TEST(RowShardTest, RackSumsThenRackOrderMatchTheReferenceAcrossRacks) {
  for (const uint32_t racks : {2u, 3u}) {
    const uint32_t workers = 2;
    const OptimizerConfig cfg = Config(OptimizerType::kAdam);
    Reference ref(cfg, racks * workers);
    RowShard home(kFirst, kRows, kDim, racks, cfg);
    home.set_mean_divisor(racks * workers);
    std::mt19937 rng(racks);
    for (int it = 0; it < 4; ++it) {
      std::vector<std::vector<Push>> by_rack(racks);
      for (auto& ranks : by_rack) {
        for (uint32_t w = 0; w < workers; ++w) {
          ranks.push_back(it == 2 && w == 1 ? Push{} : RandomPush(rng, 6 + rng() % 10, w == 0));
        }
      }
      ref.UpdateAcrossRacks(by_rack);
      for (uint32_t r = racks; r-- > 0;) {  // the racks' sums arrive last rack first
        RowSums stage(workers, kDim);
        for (uint32_t w = workers; w-- > 0;) {  // and each rack's ranks in reverse
          stage.Contribute(w, by_rack[r][w].ids, by_rack[r][w].rows.data(), ElementType::kFp32);
        }
        ASSERT_TRUE(stage.ready());
        std::vector<float> sums;
        const std::vector<uint64_t> ids = stage.Take(&sums);
        EXPECT_FALSE(stage.pending()) << "Take clears the contributions";
        EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
        ASSERT_EQ(sums.size(), ids.size() * kDim);
        ASSERT_TRUE(home.CheckContribution(r, ids, sums.size() * sizeof(float),
                                           ElementType::kFp32).ok());
        home.Contribute(r, ids, sums.data(), ElementType::kFp32);
      }
      ASSERT_TRUE(home.ready());
      home.Update();
      EXPECT_TRUE(SameBits(Values(home), ref.values)) << racks << " racks, iteration " << it;
    }
    EXPECT_EQ(home.version(), 4u);
  }
}

TEST(RowShardTest, HalfPrecisionRowsAreWidenedBeforeTheSum) {
  const OptimizerConfig cfg = Config(OptimizerType::kSgd, Reduction::kSum);
  for (const ElementType type : {ElementType::kFp16, ElementType::kBf16}) {
    SCOPED_TRACE(ElementTypeName(type));
    RowShard s(kFirst, kRows, kDim, 2, cfg);
    Reference ref(cfg, 2);
    std::mt19937 rng(3);
    std::vector<Push> pushes = {RandomPush(rng, 10, true), RandomPush(rng, 10, false)};
    for (uint32_t r = 0; r < 2; ++r) {
      std::vector<uint16_t> wire(pushes[r].rows.size());
      for (size_t i = 0; i < wire.size(); ++i) {
        wire[i] = type == ElementType::kFp16 ? FloatToFp16(pushes[r].rows[i])
                                             : FloatToBf16(pushes[r].rows[i]);
        pushes[r].rows[i] =  // what the hub sees
            type == ElementType::kFp16 ? Fp16ToFloat(wire[i]) : Bf16ToFloat(wire[i]);
      }
      ASSERT_TRUE(s.CheckContribution(r, pushes[r].ids, wire.size() * 2, type).ok());
      s.Contribute(r, pushes[r].ids, wire.data(), type);
    }
    s.Update();
    ref.Update(pushes);
    EXPECT_TRUE(SameBits(Values(s), ref.values));
    // Rows go back in the wire type, rounded to nearest even.
    const std::vector<uint64_t> ids = {kFirst + kRows - 1, kFirst};
    std::vector<uint16_t> out(ids.size() * kDim);
    s.ReadRows(ids, out.data(), type);
    for (size_t k = 0; k < ids.size(); ++k) {
      for (uint32_t j = 0; j < kDim; ++j) {
        const float v = s.row(ids[k])[j];
        EXPECT_EQ(out[k * kDim + j], type == ElementType::kFp16 ? FloatToFp16(v) : FloatToBf16(v));
      }
    }
  }
}

TEST(RowShardTest, BadContributionsAreRefusedAndChangeNothing) {
  const OptimizerConfig cfg = Config(OptimizerType::kAdam);
  RowShard s(kFirst, kRows, kDim, 2, cfg);
  const std::vector<float> row(kDim, 1.0f);
  const std::vector<uint64_t> below = {kFirst - 1}, above = {kFirst + kRows}, ok = {kFirst};
  EXPECT_EQ(s.CheckContribution(0, below, kDim * 4, ElementType::kFp32).ToString(),
            "INVALID_ARGUMENT: row id 999 is not in [1000, 1040)");
  EXPECT_EQ(s.CheckContribution(0, above, kDim * 4, ElementType::kFp32).ToString(),
            "INVALID_ARGUMENT: row id 1040 is not in [1000, 1040)");
  EXPECT_EQ(s.CheckContribution(0, ok, kDim * 4 - 4, ElementType::kFp32).ToString(),
            "INVALID_ARGUMENT: 1 row ids need 28 bytes of fp32 rows of 7, got 24");
  EXPECT_EQ(s.CheckContribution(2, ok, kDim * 4, ElementType::kFp32).ToString(),
            "INVALID_ARGUMENT: rank 2 is not in [0, 2)");
  EXPECT_FALSE(s.contributed(0));
  Contribute(s, 0, Push{ok, row});
  EXPECT_EQ(s.CheckContribution(0, ok, kDim * 4, ElementType::kFp32).ToString(),
            "INVALID_ARGUMENT: rank 0 already contributed to update 1");
  EXPECT_FALSE(s.ready());
  Contribute(s, 1, Push{});
  ASSERT_TRUE(s.ready());
  EXPECT_EQ(s.Update(), ok);
  EXPECT_NE(s.row(kFirst)[0], 0.0f);
  EXPECT_EQ(s.row(kFirst + 1)[0], 0.0f) << "untouched";
  EXPECT_EQ(s.CheckRows(above).ToString(), "INVALID_ARGUMENT: row id 1040 is not in [1000, 1040)");
  EXPECT_GT(s.memory_bytes(), 3 * kRows * kDim * sizeof(float) - 1);
}

}  // namespace
}  // namespace rackhub::aggregation
