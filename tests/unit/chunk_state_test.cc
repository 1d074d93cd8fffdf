// Unit tests for ChunkState: rank-ordered (reproducible) accumulation,
// contribution checks, double-buffered parameters, wire types, optimizer
// changes, discarding and initial values, and the memory bound hub quotas
// count (MemoryBytes against what the allocator really hands out).

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {
namespace {

using AddResult = ChunkState::AddResult;

OptimizerConfig Config(OptimizerType type, double lr, double momentum = 0,
                       Reduction reduction = Reduction::kMean) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  c.momentum = momentum;
  c.reduction = reduction;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  return c;
}

std::vector<std::byte> Wire(const std::vector<float>& v, ElementType type) {
  std::vector<std::byte> out(v.size() * ElementBytes(type));
  CopyOut(out.data(), v.data(), v.size(), type);
  return out;
}

// Gradients whose fp32 sum depends on the order of addition (mixed
// magnitudes), so an order-dependent implementation would be caught.
std::vector<std::vector<float>> Gradients(uint32_t workers, uint32_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> g(workers, std::vector<float>(n));
  for (uint32_t r = 0; r < workers; ++r) {
    const float scale = r % 2 ? 1e4f : 1e-3f;
    for (auto& x : g[r]) x = dist(rng) * scale;
  }
  return g;
}

// The expected result, computed with the kernels directly: rank-ordered sum
// then one optimizer step.
std::vector<float> Expected(const std::vector<std::vector<float>>& g, const OptimizerConfig& c,
                            const std::vector<float>& p_old, std::vector<float>* s0,
                            std::vector<float>* s1, uint64_t t) {
  const size_t n = p_old.size();
  std::vector<float> acc(g[0]);
  for (size_t r = 1; r < g.size(); ++r) AddIn(acc.data(), g[r].data(), n, ElementType::kFp32);
  std::vector<float> out(n);
  const float scale =
      c.reduction == Reduction::kMean ? static_cast<float>(1.0 / g.size()) : 1.0f;
  ApplyOptimizer(c, OptimizerStep{scale, t}, acc.data(), p_old.data(), out.data(), s0->data(),
                 s1->data(), n);
  return out;
}

std::vector<float> Copy(std::span<const float> s) { return {s.begin(), s.end()}; }

TEST(ChunkStateTest, ConstructionDefaults) {
  ChunkState cs(100, 3, Config(OptimizerType::kSgd, 0.1), ElementType::kFp16);
  EXPECT_EQ(cs.elements(), 100u);
  EXPECT_EQ(cs.workers(), 3u);
  EXPECT_EQ(cs.wire_type(), ElementType::kFp16);
  EXPECT_EQ(cs.wire_bytes(), 200u);
  EXPECT_EQ(cs.version(), 0u);
  EXPECT_FALSE(cs.initialized());
  EXPECT_EQ(cs.contributions(), 0u);
  ASSERT_EQ(cs.params(0).size(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cs.params(0).data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cs.wire_params(0).data()) % 64, 0u);
  for (float x : cs.params(0)) EXPECT_EQ(x, 0.0f);
  for (std::byte b : cs.wire_params(0)) EXPECT_EQ(b, std::byte{0});
  EXPECT_TRUE(cs.params(1).empty());
  cs.MarkInitialized();
  EXPECT_TRUE(cs.initialized());
}

TEST(ChunkStateTest, AllArrivalOrdersGiveBitwiseIdenticalResults) {
  constexpr uint32_t kWorkers = 4, kN = 1000;
  const OptimizerConfig cfg = Config(OptimizerType::kMomentum, 0.05, 0.9);
  // Two updates so the optimizer state takes part too.
  const auto g1 = Gradients(kWorkers, kN, 1), g2 = Gradients(kWorkers, kN, 2);
  std::vector<float> p0(kN), s0(kN), s1(kN);
  for (uint32_t i = 0; i < kN; ++i) p0[i] = static_cast<float>(i) * 1e-3f;
  const auto e1 = Expected(g1, cfg, p0, &s0, &s1, 1);
  const auto e2 = Expected(g2, cfg, e1, &s0, &s1, 2);

  // Sanity: the data is order-sensitive (reverse order sums differently).
  std::vector<float> fwd(g1[0]), rev(g1[3]);
  for (int r = 1; r < 4; ++r) AddIn(fwd.data(), g1[r].data(), kN, ElementType::kFp32);
  for (int r = 2; r >= 0; --r) AddIn(rev.data(), g1[r].data(), kN, ElementType::kFp32);
  ASSERT_NE(std::memcmp(fwd.data(), rev.data(), kN * 4), 0);

  std::array<uint32_t, kWorkers> order = {0, 1, 2, 3};
  int permutations = 0;
  do {
    ChunkState cs(kN, kWorkers, cfg, ElementType::kFp32);
    ASSERT_TRUE(cs.SetInitial(std::span<const float>(p0)));
    for (const auto* g : {&g1, &g2}) {
      for (uint32_t k = 0; k < kWorkers; ++k) {
        const auto bytes = Wire((*g)[order[k]], ElementType::kFp32);
        const AddResult want = k + 1 == kWorkers ? AddResult::kComplete : AddResult::kAccepted;
        ASSERT_EQ(cs.Contribute(order[k], bytes), want);
        EXPECT_EQ(cs.contributions(), k + 1);
        EXPECT_TRUE(cs.has_contributed(order[k]));
      }
      cs.Update();
    }
    ASSERT_EQ(cs.version(), 2u);
    ASSERT_EQ(std::memcmp(cs.params(1).data(), e1.data(), kN * 4), 0) << permutations;
    ASSERT_EQ(std::memcmp(cs.params(2).data(), e2.data(), kN * 4), 0) << permutations;
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(permutations, 24);
}

TEST(ChunkStateTest, RejectsDuplicateBadRankBadSizeWithoutChanges) {
  constexpr uint32_t kN = 16;
  const OptimizerConfig cfg = Config(OptimizerType::kSgd, 0.5, 0, Reduction::kSum);
  const auto g = Gradients(3, kN, 7);
  ChunkState cs(kN, 3, cfg, ElementType::kFp32);
  cs.MarkInitialized();
  const auto other = Wire(std::vector<float>(kN, 123.0f), ElementType::kFp32);

  EXPECT_EQ(cs.Contribute(2, Wire(g[2], ElementType::kFp32)), AddResult::kAccepted);  // parked
  EXPECT_EQ(cs.Contribute(2, other), AddResult::kDuplicate);
  EXPECT_EQ(cs.Contribute(0, Wire(g[0], ElementType::kFp32)), AddResult::kAccepted);
  EXPECT_EQ(cs.Contribute(0, other), AddResult::kDuplicate);
  EXPECT_EQ(cs.Contribute(3, other), AddResult::kBadRank);
  EXPECT_EQ(cs.Contribute(UINT32_MAX, other), AddResult::kBadRank);
  const auto good = Wire(g[1], ElementType::kFp32);
  EXPECT_EQ(cs.Contribute(1, std::span(good).first(good.size() - 1)), AddResult::kBadSize);
  std::vector<std::byte> longer(good);
  longer.resize(good.size() + 4);
  EXPECT_EQ(cs.Contribute(1, longer), AddResult::kBadSize);
  EXPECT_EQ(cs.Contribute(1, std::span<const std::byte>()), AddResult::kBadSize);
  EXPECT_EQ(cs.contributions(), 2u);
  EXPECT_FALSE(cs.has_contributed(1));
  EXPECT_FALSE(cs.has_contributed(3));
  EXPECT_EQ(cs.Contribute(1, good), AddResult::kComplete);
  EXPECT_EQ(cs.Contribute(1, good), AddResult::kDuplicate);
  cs.Update();

  std::vector<float> p0(kN), s0(kN), s1(kN);
  const auto want = Expected(g, cfg, p0, &s0, &s1, 1);
  EXPECT_EQ(std::memcmp(cs.params(1).data(), want.data(), kN * 4), 0);
}

TEST(ChunkStateTest, VersionsAdvanceAndDoubleBufferingKeepsPreviousVersion) {
  constexpr uint32_t kN = 64;
  ChunkState cs(kN, 2, Config(OptimizerType::kSgd, 0.1), ElementType::kFp32);
  cs.MarkInitialized();
  std::vector<std::span<const float>> held;
  std::vector<std::vector<float>> copies;
  for (uint64_t v = 0; v < 5; ++v) {
    ASSERT_EQ(cs.version(), v);
    held.push_back(cs.params(v));
    copies.push_back(Copy(cs.params(v)));
    for (uint32_t r : {1u, 0u}) {
      const auto g = Wire(std::vector<float>(kN, static_cast<float>(v + r + 1)), ElementType::kFp32);
      cs.Contribute(r, g);
    }
    cs.Update();
    // The reply of version v, taken before the update, is still intact and
    // still served for v (now version() - 1).
    ASSERT_EQ(cs.version(), v + 1);
    EXPECT_EQ(cs.params(v).data(), held[v].data());
    EXPECT_EQ(std::memcmp(held[v].data(), copies[v].data(), kN * 4), 0) << v;
    EXPECT_NE(std::memcmp(cs.params(v + 1).data(), copies[v].data(), kN * 4), 0) << v;
    if (v >= 1) {
      // Version v - 1 is too old now; its buffer holds version v + 1.
      EXPECT_TRUE(cs.params(v - 1).empty());
      EXPECT_TRUE(cs.wire_params(v - 1).empty());
      EXPECT_EQ(cs.params(v + 1).data(), held[v - 1].data());
    }
    EXPECT_TRUE(cs.params(v + 2).empty());
    EXPECT_EQ(cs.contributions(), 0u);
    EXPECT_FALSE(cs.has_contributed(0));
  }
  // SGD with lr 0.1, mean of (v+1, v+2) = v + 1.5 each step: p_5 = -0.1 * sum.
  EXPECT_NEAR(cs.params(5)[0], -0.1 * (1.5 + 2.5 + 3.5 + 4.5 + 5.5), 1e-5);
}

// A reply queued on a connection holds wire_params_ref(v): its bytes stay
// what they were whatever the chunk does next (later updates, a skipped
// step, a restore, INIT) and after the chunk is gone; the chunk moves to
// fresh memory only while such a reference is held.
TEST(ChunkStateTest, HeldParameterReferencesNeverChange) {
  constexpr uint32_t kN = 48;
  for (ElementType type : {ElementType::kFp32, ElementType::kBf16}) {
    SCOPED_TRACE(static_cast<int>(type));
    auto cs = std::make_unique<ChunkState>(kN, 1, Config(OptimizerType::kSgd, 0.5), type);
    std::vector<float> init(kN);
    for (uint32_t i = 0; i < kN; ++i) init[i] = static_cast<float>(i) - 7.0f;
    ASSERT_TRUE(cs->SetInitial(Wire(init, type)));
    struct Held {
      std::shared_ptr<const void> ref;
      std::span<const std::byte> bytes;
      std::vector<std::byte> copy;
    };
    std::vector<Held> held;
    auto hold = [&](uint64_t v) {
      Held h{cs->wire_params_ref(v), cs->wire_params(v), {}};
      ASSERT_TRUE(h.ref);
      h.copy.assign(h.bytes.begin(), h.bytes.end());
      held.push_back(std::move(h));
    };
    auto step = [&](float g) {
      ASSERT_EQ(cs->Contribute(0, Wire(std::vector<float>(kN, g), type)), AddResult::kComplete);
      cs->Update();
    };
    hold(0);
    const auto* v0 = cs->wire_params(0).data();
    step(1.0f);  // version 1 in the other buffer
    hold(1);
    step(2.0f);  // version 2 would overwrite version 0's buffer: held, so fresh memory
    EXPECT_NE(cs->wire_params(2).data(), v0);
    hold(2);
    ASSERT_TRUE(cs->SkipTo(5));  // rewrites the other buffer (version 1's, held)
    hold(5);
    const std::vector<float> restored(kN, 3.25f);
    ASSERT_TRUE(cs->Restore(9, restored, {}));  // rewrites both (held)
    EXPECT_EQ(cs->params(9)[0], 3.25f);
    for (const Held& h : held) {
      EXPECT_EQ(std::memcmp(h.bytes.data(), h.copy.data(), h.copy.size()), 0);
    }
    cs.reset();  // the chunk is deleted: the held bytes stay
    for (const Held& h : held) {
      EXPECT_EQ(std::memcmp(h.bytes.data(), h.copy.data(), h.copy.size()), 0);
    }
  }
  // Without a reference held the buffers are reused in place (no allocation
  // on the data path).
  ChunkState cs(kN, 1, Config(OptimizerType::kSgd, 0.5), ElementType::kFp32);
  cs.MarkInitialized();
  const auto* b0 = cs.params(0).data();
  for (int i = 0; i < 4; ++i) {
    { auto ref = cs.wire_params_ref(cs.version()); }  // taken and dropped (a reply written)
    ASSERT_EQ(cs.Contribute(0, Wire(std::vector<float>(kN, 1.0f), ElementType::kFp32)),
              AddResult::kComplete);
    cs.Update();
  }
  EXPECT_EQ(cs.params(4).data(), b0);
  EXPECT_EQ(cs.wire_params_ref(6), nullptr);  // not a version it has
}

class WireTypeTest : public ::testing::TestWithParam<ElementType> {};

TEST_P(WireTypeTest, EndToEndInWireType) {
  const ElementType type = GetParam();
  constexpr uint32_t kN = 33, kWorkers = 3;
  const OptimizerConfig cfg = Config(OptimizerType::kSgd, 0.25, 0, Reduction::kSum);
  std::vector<float> init(kN);
  std::vector<std::vector<float>> g(kWorkers, std::vector<float>(kN));
  for (uint32_t i = 0; i < kN; ++i) {
    init[i] = 0.5f * static_cast<float>(i) - 3.0f;  // exact in fp16 and bf16
    for (uint32_t r = 0; r < kWorkers; ++r) g[r][i] = static_cast<float>(r + 1) * 0.125f * i;
  }
  ChunkState cs(kN, kWorkers, cfg, type);
  const auto init_wire = Wire(init, type);
  ASSERT_TRUE(cs.SetInitial(init_wire));
  EXPECT_TRUE(cs.initialized());
  EXPECT_EQ(std::memcmp(cs.params(0).data(), init.data(), kN * 4), 0);
  ASSERT_EQ(cs.wire_params(0).size(), init_wire.size());
  EXPECT_EQ(std::memcmp(cs.wire_params(0).data(), init_wire.data(), init_wire.size()), 0);

  for (uint32_t r : {2u, 0u, 1u}) cs.Contribute(r, Wire(g[r], type));
  cs.Update();
  std::vector<float> want(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    const float sum = g[0][i] + g[1][i] + g[2][i];
    want[i] = init[i] - 0.25f * sum;
  }
  EXPECT_EQ(std::memcmp(cs.params(1).data(), want.data(), kN * 4), 0);
  // The wire copy is the fp32 master converted (round to nearest even).
  const auto want_wire = Wire(want, type);
  ASSERT_EQ(cs.wire_params(1).size(), kN * ElementBytes(type));
  EXPECT_EQ(std::memcmp(cs.wire_params(1).data(), want_wire.data(), want_wire.size()), 0);
  // The previous version's wire copy is untouched.
  EXPECT_EQ(std::memcmp(cs.wire_params(0).data(), init_wire.data(), init_wire.size()), 0);
  if (type == ElementType::kFp32) {
    EXPECT_EQ(static_cast<const void*>(cs.wire_params(1).data()),
              static_cast<const void*>(cs.params(1).data()));
  }
  // A payload sized for fp32 is rejected for the 2-byte types (and vice versa).
  const auto wrong = Wire(g[0], type == ElementType::kFp32 ? ElementType::kFp16 : ElementType::kFp32);
  EXPECT_EQ(cs.Contribute(0, wrong), AddResult::kBadSize);
}

TEST_P(WireTypeTest, NonRepresentableMasterIsRoundedOnlyInWireCopy) {
  const ElementType type = GetParam();
  ChunkState cs(4, 1, Config(OptimizerType::kSgd, 0.1, 0, Reduction::kSum), type);
  cs.MarkInitialized();
  const std::vector<float> g = {1.0f, 3.0f, -7.0f, 0.5f};
  ASSERT_EQ(cs.Contribute(0, Wire(g, type)), AddResult::kComplete);
  cs.Update();
  std::vector<float> want(4);
  for (int i = 0; i < 4; ++i) want[i] = 0.0f - 0.1f * g[i];
  EXPECT_EQ(std::memcmp(cs.params(1).data(), want.data(), 16), 0);  // fp32 master kept exact
  const auto want_wire = Wire(want, type);
  EXPECT_EQ(std::memcmp(cs.wire_params(1).data(), want_wire.data(), want_wire.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, WireTypeTest,
                         ::testing::Values(ElementType::kFp32, ElementType::kFp16,
                                           ElementType::kBf16),
                         [](const auto& info) { return std::string(ElementTypeName(info.param)); });

TEST(ChunkStateTest, SetOptimizerAppliesFromTheGivenUpdate) {
  ChunkState cs(1, 1, Config(OptimizerType::kSgd, 0.1, 0, Reduction::kSum), ElementType::kFp32);
  cs.MarkInitialized();
  const auto one = Wire({1.0f}, ElementType::kFp32);
  cs.SetOptimizer(Config(OptimizerType::kSgd, 0.5, 0, Reduction::kSum), 3);
  cs.SetOptimizer(Config(OptimizerType::kSgd, 0.25, 0, Reduction::kSum), 3);  // replaces
  EXPECT_TRUE(cs.has_pending_optimizer());
  float p = 0.0f;
  const float lrs[] = {0.1f, 0.1f, 0.25f, 0.25f};
  for (int t = 1; t <= 4; ++t) {
    ASSERT_EQ(cs.Contribute(0, one), AddResult::kComplete);
    cs.Update();
    p = p - lrs[t - 1] * 1.0f;
    EXPECT_EQ(cs.params(t)[0], p) << "t=" << t;
    EXPECT_EQ(cs.optimizer().learning_rate, t < 3 ? 0.1 : 0.25) << "t=" << t;
  }
  EXPECT_FALSE(cs.has_pending_optimizer());
  // A from_update already passed applies to the next update.
  cs.SetOptimizer(Config(OptimizerType::kSgd, 2.0, 0, Reduction::kSum), 1);
  cs.Contribute(0, one);
  cs.Update();
  EXPECT_EQ(cs.params(5)[0], p - 2.0f);
}

TEST(ChunkStateTest, MeanReductionScalesByWorkers) {
  ChunkState cs(2, 4, Config(OptimizerType::kSumOnly, 0), ElementType::kFp32);
  cs.MarkInitialized();
  for (uint32_t r = 0; r < 4; ++r) cs.Contribute(r, Wire({1.0f, static_cast<float>(r)}, ElementType::kFp32));
  cs.Update();
  EXPECT_EQ(cs.params(1)[0], 1.0f);
  EXPECT_EQ(cs.params(1)[1], 1.5f);
}

// Elastic tenants (SetMembers): an update sums its members only, in rank
// order whatever the arrival order (every permutation),
// bit for bit the kernels' sum of the members' gradients; the mean divides
// by the member count; a non-member is refused; the membership cannot
// change while an update is being formed.
TEST(ChunkStateTest, MembersSumInRankOrderAndMeanDividesByTheirCount) {
  constexpr uint32_t kN = 67, kW = 6;
  const std::vector<uint8_t> member = {0, 1, 0, 1, 1, 0};  // ranks 1, 3, 4
  const std::vector<uint32_t> ranks = {1, 3, 4};
  const auto g = Gradients(kW, kN, 7);
  for (const Reduction reduction : {Reduction::kSum, Reduction::kMean}) {
    const OptimizerConfig cfg = Config(OptimizerType::kSumOnly, 0, 0, reduction);
    std::vector<std::vector<float>> members;
    for (uint32_t r : ranks) members.push_back(g[r]);
    std::vector<float> s0(kN), s1(kN), zero(kN, 0.0f);
    const std::vector<float> want = Expected(members, cfg, zero, &s0, &s1, 1);
    std::vector<uint32_t> order = ranks;
    do {
      ChunkState cs(kN, kW, cfg, ElementType::kFp32);
      cs.MarkInitialized();
      ASSERT_TRUE(cs.SetMembers(member));
      EXPECT_EQ(cs.expected(), 3u);
      EXPECT_FALSE(cs.is_member(0));
      EXPECT_EQ(cs.Contribute(0, Wire(g[0], ElementType::kFp32)), AddResult::kNotMember);
      for (size_t k = 0; k < order.size(); ++k) {
        const AddResult res = cs.Contribute(order[k], Wire(g[order[k]], ElementType::kFp32));
        EXPECT_EQ(res, k + 1 == order.size() ? AddResult::kComplete : AddResult::kAccepted);
        if (k == 0) {
          EXPECT_FALSE(cs.SetMembers(member)) << "changed while pending";
        }
      }
      cs.Update();
      const std::vector<float> got = Copy(cs.params(1));
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kN * sizeof(float)), 0);
      // Back to every rank: the next update waits for all six.
      ASSERT_TRUE(cs.SetMembers(std::vector<uint8_t>(kW, 1)));
      EXPECT_EQ(cs.expected(), kW);
    } while (std::next_permutation(order.begin(), order.end()));
  }
  ChunkState cs(kN, kW, Config(OptimizerType::kSumOnly, 0), ElementType::kFp32);
  EXPECT_FALSE(cs.SetMembers(std::vector<uint8_t>(kW, 0))) << "no member";
  EXPECT_FALSE(cs.SetMembers(std::vector<uint8_t>(kW + 1, 1))) << "more ranks than slots";
}

TEST(ChunkStateTest, DiscardPendingLetsSameRanksContributeAgain) {
  constexpr uint32_t kN = 8;
  const OptimizerConfig cfg = Config(OptimizerType::kSgd, 0.5);
  ChunkState cs(kN, 3, cfg, ElementType::kBf16);
  cs.MarkInitialized();
  const auto junk = Wire(std::vector<float>(kN, 1000.0f), ElementType::kBf16);
  EXPECT_EQ(cs.Contribute(2, junk), AddResult::kAccepted);  // parked out of order
  EXPECT_EQ(cs.Contribute(0, junk), AddResult::kAccepted);
  cs.DiscardPending();
  EXPECT_EQ(cs.contributions(), 0u);
  EXPECT_FALSE(cs.has_contributed(0));
  EXPECT_FALSE(cs.has_contributed(2));
  EXPECT_EQ(cs.version(), 0u);
  for (uint32_t r : {2u, 1u, 0u}) {
    const auto g = Wire(std::vector<float>(kN, static_cast<float>(r + 1)), ElementType::kBf16);
    EXPECT_EQ(cs.Contribute(r, g), r == 0 ? AddResult::kComplete : AddResult::kAccepted);
  }
  cs.Update();
  // mean(1, 2, 3) = 2; p = 0 - 0.5 * 2.
  for (float x : cs.params(1)) EXPECT_EQ(x, -1.0f);
}

TEST(ChunkStateTest, SpareBuffersAreReusedAcrossUpdates) {
  // Reverse arrival every time parks all but rank 0; results stay exact.
  constexpr uint32_t kW = 5, kN = 9;
  ChunkState cs(kN, kW, Config(OptimizerType::kSumOnly, 0, 0, Reduction::kSum), ElementType::kFp16);
  cs.MarkInitialized();
  for (uint64_t it = 1; it <= 3; ++it) {
    for (uint32_t k = kW; k-- > 0;) {
      const auto g = Wire(std::vector<float>(kN, static_cast<float>(k * it)), ElementType::kFp16);
      cs.Contribute(k, g);
    }
    cs.Update();
    for (float x : cs.params(it)) EXPECT_EQ(x, static_cast<float>(10 * it));
  }
}

TEST(ChunkStateTest, SetInitialRules) {
  constexpr uint32_t kN = 4;
  ChunkState cs(kN, 2, Config(OptimizerType::kSgd, 0.1), ElementType::kFp32);
  const std::vector<float> init = {1, 2, 3, 4};
  EXPECT_FALSE(cs.SetInitial(std::span<const float>(init).first(3)));  // wrong size
  EXPECT_FALSE(cs.SetInitial(std::span<const std::byte>(Wire({1, 2, 3}, ElementType::kFp32))));
  EXPECT_FALSE(cs.initialized());
  EXPECT_TRUE(cs.SetInitial(std::span<const float>(init)));
  EXPECT_TRUE(cs.initialized());
  EXPECT_EQ(Copy(cs.params(0)), init);
  const auto g = Wire(std::vector<float>(kN, 0.0f), ElementType::kFp32);
  cs.Contribute(1, g);
  EXPECT_FALSE(cs.SetInitial(std::span<const float>(init)));  // contribution pending
  cs.Contribute(0, g);
  cs.Update();
  EXPECT_FALSE(cs.SetInitial(std::span<const float>(init)));  // version 1
  EXPECT_EQ(Copy(cs.params(1)), init);  // zero gradient, no weight decay

  // The fp32 overload of a bf16 chunk fills the wire copy too.
  ChunkState bf(2, 1, Config(OptimizerType::kSgd, 0.1), ElementType::kBf16);
  const std::vector<float> vals = {1.0f, -2.5f};
  ASSERT_TRUE(bf.SetInitial(std::span<const float>(vals)));
  const auto want = Wire(vals, ElementType::kBf16);
  EXPECT_EQ(std::memcmp(bf.wire_params(0).data(), want.data(), want.size()), 0);
}

TEST(ChunkStateTest, AdaGradStateStartsAtInitialAccumulator) {
  OptimizerConfig c;
  c.type = OptimizerType::kAdaGrad;
  c.learning_rate = 0.5;
  c.initial_accumulator = 3.0;
  c.reduction = Reduction::kSum;
  ASSERT_TRUE(NormalizeOptimizer(&c).ok());
  ChunkState cs(1, 1, c, ElementType::kFp32);
  cs.MarkInitialized();
  cs.Contribute(0, Wire({1.0f}, ElementType::kFp32));
  cs.Update();
  // s = 3 + 1 = 4; p = 0 - 0.5 * 1 / (2 + 1e-10).
  EXPECT_NEAR(cs.params(1)[0], -0.25f, 1e-7);
}

TEST(ChunkStateTest, SingleWorkerAndAdamState) {
  const OptimizerConfig c = Config(OptimizerType::kAdam, 0.01);
  ChunkState cs(3, 1, c, ElementType::kFp32);
  cs.MarkInitialized();
  std::vector<float> p(3), m(3), v(3);
  for (uint64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = {0.5f * t, -1.0f, 2.0f};
    ASSERT_EQ(cs.Contribute(0, Wire(g, ElementType::kFp32)), AddResult::kComplete);
    cs.Update();
    const auto want = Expected({g}, c, p, &m, &v, t);
    EXPECT_EQ(Copy(cs.params(t)), want) << t;
    p = want;
  }
}

// ---- Fast paths: one-pass folding of parked ranks, ReduceAndUpdate ----

OptimizerConfig AnyConfig(OptimizerType type) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = type == OptimizerType::kSumOnly ? 0.0 : 0.01;
  if (type == OptimizerType::kMomentum || type == OptimizerType::kNesterov) c.momentum = 0.9;
  if (type != OptimizerType::kSumOnly) c.weight_decay = 0.01;
  if (type == OptimizerType::kAdaGrad) c.initial_accumulator = 0.1;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  return c;
}

// Every kernel path, every optimizer and wire type, an odd length and
// unaligned payloads: arrival in reverse (all but rank 0 parked, then folded
// in one pass), in a mixed order, and ReduceAndUpdate all give the bits of the
// step-by-step reference computed with the portable kernels.
TEST(ChunkStateTest, FastPathsMatchStepByStepOnEveryKernelPath) {
  constexpr uint32_t kW = 5, kN = 1001;
  const std::array<uint32_t, kW> mixed = {3, 0, 4, 1, 2};
  for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kMomentum,
                            OptimizerType::kNesterov, OptimizerType::kAdam, OptimizerType::kAdamW,
                            OptimizerType::kAdaGrad, OptimizerType::kSumOnly}) {
    const OptimizerConfig cfg = AnyConfig(opt);
    for (ElementType type : {ElementType::kFp32, ElementType::kFp16, ElementType::kBf16}) {
      // Gradients rounded to the wire type, so the reference sums them exactly
      // as the chunk sees them; payloads at byte offset 1 + r.
      const auto g1 = Gradients(kW, kN, 40 + static_cast<unsigned>(opt));
      const auto g2 = Gradients(kW, kN, 50 + static_cast<unsigned>(opt));
      std::vector<std::vector<std::byte>> w1, w2;
      std::vector<std::vector<float>> r1, r2;
      for (uint32_t r = 0; r < kW; ++r) {
        for (auto [g, w, rg] : {std::tuple{&g1, &w1, &r1}, std::tuple{&g2, &w2, &r2}}) {
          const auto bytes = Wire((*g)[r], type);
          w->emplace_back(1 + r, std::byte{0});
          w->back().insert(w->back().end(), bytes.begin(), bytes.end());
          rg->emplace_back(kN);
          CopyIn(rg->back().data(), bytes.data(), kN, type);
        }
      }
      auto payload = [&](const std::vector<std::vector<std::byte>>& w, uint32_t r) {
        return std::span<const std::byte>(w[r]).subspan(1 + r);
      };
      ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
      std::vector<float> p0(kN, 0.0f), s0(kN), s1(kN);
      if (opt == OptimizerType::kAdaGrad) std::fill(s0.begin(), s0.end(), 0.1f);
      const auto e1 = Expected(r1, cfg, p0, &s0, &s1, 1);
      const auto e2 = Expected(r2, cfg, e1, &s0, &s1, 2);
      for (KernelPath path : kAllKernelPaths) {
        if (!ForceKernelPath(path)) continue;
        for (int mode = 0; mode < 3; ++mode) {  // reverse, mixed, ReduceAndUpdate
          ChunkState cs(kN, kW, cfg, type);
          cs.MarkInitialized();
          for (const auto* w : {&w1, &w2}) {
            if (mode == 2) {
              std::vector<std::span<const std::byte>> all;
              for (uint32_t r = 0; r < kW; ++r) all.push_back(payload(*w, r));
              ASSERT_TRUE(cs.ReduceAndUpdate(all));
              continue;
            }
            for (uint32_t k = 0; k < kW; ++k) {
              const uint32_t r = mode == 0 ? kW - 1 - k : mixed[k];
              cs.Contribute(r, payload(*w, r));
            }
            cs.Update();
          }
          const std::string where = std::string(KernelPathName(path)) + " " +
                                    OptimizerTypeName(opt) + " " + ElementTypeName(type) +
                                    " mode " + std::to_string(mode);
          ASSERT_EQ(cs.version(), 2u);
          EXPECT_EQ(std::memcmp(cs.params(1).data(), e1.data(), kN * 4), 0) << where;
          EXPECT_EQ(std::memcmp(cs.params(2).data(), e2.data(), kN * 4), 0) << where;
          const auto want_wire = Wire(e2, type);
          EXPECT_EQ(std::memcmp(cs.wire_params(2).data(), want_wire.data(), want_wire.size()), 0)
              << where;
        }
      }
    }
  }
  ResetKernelPath();
}

TEST(ChunkStateTest, ReduceAndUpdateRules) {
  constexpr uint32_t kN = 6;
  ChunkState cs(kN, 2, Config(OptimizerType::kSgd, 0.5, 0, Reduction::kSum), ElementType::kFp16);
  cs.MarkInitialized();
  const auto a = Wire(std::vector<float>(kN, 1.0f), ElementType::kFp16);
  const auto b = Wire(std::vector<float>(kN, 2.0f), ElementType::kFp16);
  const auto bad = Wire(std::vector<float>(kN - 1, 2.0f), ElementType::kFp16);
  using Payloads = std::vector<std::span<const std::byte>>;
  EXPECT_FALSE(cs.ReduceAndUpdate(Payloads{a}));          // one missing
  EXPECT_FALSE(cs.ReduceAndUpdate(Payloads{a, b, b}));    // one too many
  EXPECT_FALSE(cs.ReduceAndUpdate(Payloads{a, bad}));     // wrong size
  ASSERT_EQ(cs.Contribute(1, b), AddResult::kAccepted);
  EXPECT_FALSE(cs.ReduceAndUpdate(Payloads{a, b}));       // a contribution is pending
  EXPECT_EQ(cs.version(), 0u);
  cs.DiscardPending();
  ASSERT_TRUE(cs.ReduceAndUpdate(Payloads{a, b}));
  EXPECT_EQ(cs.version(), 1u);
  EXPECT_EQ(cs.contributions(), 0u);
  for (float x : cs.params(1)) EXPECT_EQ(x, -1.5f);  // 0 - 0.5 * (1 + 2)
  EXPECT_TRUE(cs.params(0).size() == kN);             // previous version still served
}

// ---- Durable state: SkipTo and Restore ----

// A chunk restored from another's version, parameters and optimizer state
// continues bit for bit like the original (every optimizer, wire types).
TEST(ChunkStateTest, RestoreContinuesBitIdentically) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdaGrad}) {
    for (ElementType wire : {ElementType::kFp32, ElementType::kBf16}) {
      const OptimizerConfig c = AnyConfig(type);
      const uint32_t n = 37;
      ChunkState a(n, 2, c, wire);
      a.MarkInitialized();
      auto step = [&](ChunkState& cs, unsigned seed) {
        const auto g = Gradients(2, n, seed);
        ASSERT_EQ(cs.Contribute(1, Wire(g[1], wire)), AddResult::kAccepted);
        ASSERT_EQ(cs.Contribute(0, Wire(g[0], wire)), AddResult::kComplete);
        cs.Update();
      };
      for (unsigned i = 0; i < 3; ++i) step(a, i);
      std::vector<std::vector<float>> state;
      std::vector<std::span<const float>> views;
      for (int s = 0; s < a.state_slots(); ++s) state.push_back(Copy(a.optimizer_state(s)));
      for (const auto& s : state) views.push_back(s);
      ChunkState b(n, 2, c, wire);
      ASSERT_TRUE(b.Restore(a.version(), a.params(a.version()), views));
      EXPECT_TRUE(b.initialized());
      EXPECT_EQ(b.version(), 3u);
      EXPECT_EQ(b.updated_version(), 0u);  // restored, not updated here
      ASSERT_TRUE(std::ranges::equal(b.wire_params(3), a.wire_params(3)));
      for (unsigned i = 3; i < 6; ++i) {
        step(a, i);
        step(b, i);
      }
      const auto pa = a.params(6), pb = b.params(6);
      EXPECT_EQ(std::memcmp(pa.data(), pb.data(), n * sizeof(float)), 0)
          << OptimizerTypeName(type);
      // A wrong slot count or size changes nothing.
      std::vector<std::span<const float>> none;
      if (a.state_slots() > 0) {
        EXPECT_FALSE(b.Restore(1, a.params(6), none));
      }
      EXPECT_FALSE(b.Restore(1, std::span<const float>(state.empty() ? nullptr : state[0].data(), 0),
                             views));
      EXPECT_EQ(b.version(), 6u);
    }
  }
}

TEST(ChunkStateTest, SkipToKeepsParametersAndRefusesWhilePending) {
  const OptimizerConfig c = Config(OptimizerType::kSgd, 0.5);
  ChunkState cs(4, 2, c, ElementType::kFp16);
  cs.MarkInitialized();
  const std::vector<float> g = {1, 2, 3, 4};
  cs.Contribute(0, Wire(g, ElementType::kFp16));
  cs.Contribute(1, Wire(g, ElementType::kFp16));
  EXPECT_EQ(cs.updated_version(), 0u);  // no update yet
  cs.Update();
  EXPECT_EQ(cs.updated_version(), 1u);  // version 1 came from an update
  const auto p1 = Copy(cs.params(1));
  const std::vector<std::byte> w1(cs.wire_params(1).begin(), cs.wire_params(1).end());
  ASSERT_EQ(cs.Contribute(0, Wire(g, ElementType::kFp16)), AddResult::kAccepted);
  EXPECT_FALSE(cs.SkipTo(2));  // a contribution is pending
  cs.DiscardPending();
  EXPECT_FALSE(cs.SkipTo(0));  // never backwards
  ASSERT_TRUE(cs.SkipTo(1));   // already there: nothing moves
  EXPECT_EQ(cs.updated_version(), 1u);
  ASSERT_TRUE(cs.SkipTo(2));
  EXPECT_EQ(cs.version(), 2u);
  EXPECT_EQ(cs.updated_version(), 0u);  // version 2 is a skipped step
  EXPECT_EQ(Copy(cs.params(2)), p1);
  EXPECT_EQ(Copy(cs.params(1)), p1);
  EXPECT_TRUE(std::ranges::equal(cs.wire_params(2), w1));
  // The next update starts from the skipped-to parameters (t = 3).
  cs.Contribute(0, Wire(g, ElementType::kFp16));
  cs.Contribute(1, Wire(g, ElementType::kFp16));
  cs.Update();
  EXPECT_EQ(cs.version(), 3u);
  EXPECT_FLOAT_EQ(cs.params(3)[0], p1[0] - 0.5f * 1.0f);
  EXPECT_EQ(cs.updated_version(), 3u);
}

// ASan and TSan replace malloc: mallinfo2 does not see their heap.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizedAllocator = true;
#elif defined(__has_feature)
constexpr bool kSanitizedAllocator =
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer);
#else
constexpr bool kSanitizedAllocator = false;
#endif

// Heap bytes in use (single-threaded test: the main arena and mmapped blocks).
uint64_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// What quotas count must bound what a chunk really allocates at its largest
// (every rank but one parked, an update done), and not by much more.
TEST(ChunkStateTest, MemoryBytesBoundsWhatAChunkAllocates) {
  if (kSanitizedAllocator) {
    GTEST_SKIP() << "the sanitizers' allocator is invisible to mallinfo2 (build-asan, build-tsan)";
  }
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdaGrad, OptimizerType::kSumOnly}) {
    for (ElementType wire : {ElementType::kFp32, ElementType::kBf16}) {
      for (uint32_t workers : {1u, 2u, 5u}) {
        for (uint32_t elements : {1000u, 8192u}) {
          SCOPED_TRACE(std::string(OptimizerTypeName(type)) + " wire " +
                       std::to_string(ElementBytes(wire)) + " workers " +
                       std::to_string(workers) + " elements " + std::to_string(elements));
          OptimizerConfig opt;
          opt.type = type;
          opt.learning_rate = type == OptimizerType::kSumOnly ? 0 : 0.1;
          if (type == OptimizerType::kMomentum) opt.momentum = 0.9;
          if (type == OptimizerType::kSumOnly) opt.reduction = Reduction::kSum;
          ASSERT_TRUE(NormalizeOptimizer(&opt).ok());
          const std::vector<std::byte> grad(size_t{elements} * ElementBytes(wire), std::byte{0});
          const uint64_t before = HeapInUse();
          auto state = std::make_unique<ChunkState>(elements, workers, opt, wire);
          for (uint32_t r = workers; r-- > 1;) {
            ASSERT_EQ(state->Contribute(r, grad), AddResult::kAccepted);
          }
          ASSERT_EQ(state->Contribute(0, grad), AddResult::kComplete);
          state->Update();
          const uint64_t used = HeapInUse() - before - sizeof(ChunkState);
          const uint64_t bound = ChunkState::MemoryBytes(elements, workers, type, wire);
          EXPECT_LE(used, bound);
          EXPECT_LE(bound, used + used / 20 + 2048) << "the bound should stay close";
        }
      }
    }
  }
  // The case: Adam, fp32, 2 workers holds 6x the fp32 parameters.
  const double ratio =
      static_cast<double>(ChunkState::MemoryBytes(8192, 2, OptimizerType::kAdam,
                                                  ElementType::kFp32)) /
      (8192.0 * 4);
  EXPECT_GT(ratio, 6.0);
  EXPECT_LT(ratio, 6.05);
}

// Min, max and product keys: every arrival order (parked early ranks folded
// in later) and the one-pass ReduceAndUpdate give the rank-order fold of a
// reference written here (the first NaN in rank order wins; -0 below +0;
// the fp32 product); sparse contributions are refused.
TEST(ChunkStateTest, ElementwiseReductionsInEveryArrivalOrder) {
  constexpr uint32_t kWorkers = 4, kN = 300;
  const float kNaN1 = std::bit_cast<float>(0x7fc00011u), kNaN2 = std::bit_cast<float>(0xffc00022u);
  std::vector<std::vector<float>> g(kWorkers, std::vector<float>(kN));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> k(-40, 40);
  for (uint32_t r = 0; r < kWorkers; ++r) {
    for (uint32_t i = 0; i < kN; ++i) g[r][i] = static_cast<float>(k(rng)) * 0.375f;
    g[r][(r * 7) % 50] = r % 2 ? kNaN1 : kNaN2;  // NaNs of two payloads meet
    g[r][60 + r] = r % 2 ? 0.0f : -0.0f;
    g[r][61 + r] = r % 2 ? -0.0f : 0.0f;
  }
  for (Reduction red : {Reduction::kMin, Reduction::kMax, Reduction::kProduct}) {
    const OptimizerConfig cfg = Config(OptimizerType::kSumOnly, 0, 0, red);
    std::vector<float> want(g[0]);
    for (uint32_t r = 1; r < kWorkers; ++r) {
      for (uint32_t i = 0; i < kN; ++i) {
        const float a = want[i], b = g[r][i];
        if (red == Reduction::kProduct) {
          want[i] = a * b;
        } else if (std::isnan(a) || std::isnan(b)) {
          want[i] = std::isnan(a) ? a : b;
        } else if (a == b) {
          want[i] = std::signbit(a) == (red == Reduction::kMin) ? a : b;
        } else {
          want[i] = (a < b) == (red == Reduction::kMin) ? a : b;
        }
      }
    }
    auto same = [&](std::span<const float> got) {
      for (uint32_t i = 0; i < kN; ++i) {
        const bool ok = red == Reduction::kProduct && std::isnan(want[i])
                            ? std::isnan(got[i])
                            : std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]);
        if (!ok) return ::testing::AssertionFailure() << "element " << i << ": " << got[i];
      }
      return ::testing::AssertionSuccess();
    };
    std::array<uint32_t, kWorkers> order = {0, 1, 2, 3};
    do {
      ChunkState cs(kN, kWorkers, cfg, ElementType::kFp32);
      cs.MarkInitialized();
      for (uint32_t j = 0; j < kWorkers; ++j) {
        ASSERT_NE(cs.Contribute(order[j], Wire(g[order[j]], ElementType::kFp32)),
                  AddResult::kBadSize);
      }
      cs.Update();
      ASSERT_TRUE(same(cs.params(1))) << ReductionName(red);
    } while (std::next_permutation(order.begin(), order.end()));
    ChunkState fast(kN, kWorkers, cfg, ElementType::kFp32);
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> payloads;
    for (uint32_t r = 0; r < kWorkers; ++r) bytes.push_back(Wire(g[r], ElementType::kFp32));
    for (const auto& b : bytes) payloads.emplace_back(b);
    ASSERT_TRUE(fast.ReduceAndUpdate(payloads));
    EXPECT_TRUE(same(fast.params(1))) << "ReduceAndUpdate " << ReductionName(red);
    // Sparse pushes leave out zeros of a sum: refused here.
    const uint32_t index = 3;
    const float value = 1.0f;
    ChunkState::SparseView sparse{1, reinterpret_cast<const std::byte*>(&index),
                                  reinterpret_cast<const std::byte*>(&value)};
    EXPECT_EQ(fast.ContributeSparse(0, sparse), AddResult::kBadSparse);
    EXPECT_FALSE(fast.ApplyAloneSparse(sparse));
  }
}

}  // namespace
}  // namespace rackhub::aggregation
