// Unit tests for top-k sparsification with error feedback (topk.h), against a
// brute-force reference written here: sort all entries by (magnitude bits
// descending, index ascending), take k, sort the indices. Every check runs on
// every kernel path this CPU has (portable, AVX2, AVX-512).

#include "rackhub/aggregation/topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "rackhub/aggregation/kernels.h"

namespace rackhub::aggregation {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t Key(float f) { return Bits(f) & 0x7fffffffu; }

// The selection rank of every entry of x: its position when all entries are
// sorted by magnitude bits descending, then index ascending.
std::vector<uint32_t> Ranks(const std::vector<float>& x) {
  std::vector<uint64_t> order(x.size());  // (0x7fffffff - key) << 32 | index, ascending
  for (size_t i = 0; i < x.size(); ++i) {
    order[i] = (uint64_t{0x7fffffffu - Key(x[i])} << 32) | i;
  }
  std::sort(order.begin(), order.end());
  std::vector<uint32_t> rank(x.size());
  for (size_t r = 0; r < order.size(); ++r)
    rank[static_cast<uint32_t>(order[r])] = static_cast<uint32_t>(r);
  return rank;
}

// The reference top k: the indices of rank < k, ascending.
std::vector<uint32_t> TopOfRanks(const std::vector<uint32_t>& rank, uint32_t k) {
  std::vector<uint32_t> top;
  top.reserve(k);
  for (uint32_t i = 0; i < rank.size(); ++i) {
    if (rank[i] < k) top.push_back(i);
  }
  return top;
}

std::vector<uint32_t> Reference(const std::vector<float>& x, uint32_t k) {
  return TopOfRanks(Ranks(x), k);
}

std::vector<KernelPath> Paths() {
  std::vector<KernelPath> paths;
  for (KernelPath p : kAllKernelPaths) {
    if (KernelPathAvailable(p)) paths.push_back(p);
  }
  return paths;
}

// Runs `fn` once per available kernel path (forced), then restores the
// automatic choice.
template <class Fn>
void ForEachPath(Fn fn) {
  for (KernelPath p : Paths()) {
    ASSERT_TRUE(ForceKernelPath(p));
    SCOPED_TRACE(std::string("kernel path ") + KernelPathName(p));
    fn();
  }
  ResetKernelPath();
}

// SelectTopK and CompressTopK without error feedback on x, both against the
// expected indices (and values = x[idx], bit for bit).
void ExpectSelects(const std::vector<float>& x, uint32_t k, const std::vector<uint32_t>& expected,
                   TopKScratch& scratch) {
  SCOPED_TRACE("n=" + std::to_string(x.size()) + " k=" + std::to_string(k));
  std::vector<uint32_t> idx(k + 1, 0xdeadbeefu);  // the extra entry must stay untouched
  SelectTopK(x, k, idx.data(), scratch);
  ASSERT_EQ(idx.back(), 0xdeadbeefu);
  idx.pop_back();
  ASSERT_EQ(idx, expected);

  std::vector<uint32_t> idx2(k + 1, 0xdeadbeefu);
  std::vector<float> values(k + 1, FromBits(0x7fc0dead));
  CompressTopK(x, {}, k, /*error_feedback=*/false, idx2.data(), values.data(), scratch);
  ASSERT_EQ(idx2.back(), 0xdeadbeefu);
  ASSERT_EQ(Bits(values.back()), 0x7fc0deadu);
  idx2.pop_back();
  ASSERT_EQ(idx2, expected);
  for (uint32_t j = 0; j < k; ++j) ASSERT_EQ(Bits(values[j]), Bits(x[idx2[j]])) << j;
}

// Every k in `ks` on every path, against the reference.
void CheckAll(const std::vector<float>& x, const std::vector<uint32_t>& ks, TopKScratch& scratch) {
  const std::vector<uint32_t> rank = Ranks(x);
  ForEachPath([&] {
    for (uint32_t k : ks) {
      if (k > x.size()) continue;
      ExpectSelects(x, k, TopOfRanks(rank, k), scratch);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

std::vector<uint32_t> KsFor(uint32_t n) {
  std::vector<uint32_t> ks = {0, 1, 2, n / 2, n > 0 ? n - 1 : 0, n};
  for (double r : {0.0001, 0.001, 0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.9}) {
    ks.push_back(TopKCount(r, n));
  }
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// Fewer k for the largest inputs: the ratios that matter, and two large k.
std::vector<uint32_t> FewKsFor(uint32_t n) {
  std::vector<uint32_t> ks = {1, n / 2, n};
  for (double r : {0.001, 0.01, 0.1}) ks.push_back(TopKCount(r, n));
  return ks;
}

// ---- TopKCount ----

TEST(TopKCountTest, CeilAtLeastOneAtMostN) {
  EXPECT_EQ(TopKCount(0.01, 0), 0u);
  EXPECT_EQ(TopKCount(1.0, 0), 0u);
  EXPECT_EQ(TopKCount(0.01, 1), 1u);
  EXPECT_EQ(TopKCount(0.01, 100), 1u);
  EXPECT_EQ(TopKCount(0.01, 101), 2u);
  EXPECT_EQ(TopKCount(0.001, 32768), 33u);
  EXPECT_EQ(TopKCount(0.01, 32768), 328u);
  EXPECT_EQ(TopKCount(0.1, 1u << 24), 1677722u);
  EXPECT_EQ(TopKCount(1e-9, 10), 1u);
  EXPECT_EQ(TopKCount(0.5, 3), 2u);
  EXPECT_EQ(TopKCount(1.0, 12345), 12345u);
  EXPECT_EQ(TopKCount(0.999999, 10), 10u);
  EXPECT_EQ(TopKCount(1.0, UINT32_MAX), UINT32_MAX);
  // Products a rounding error above an integer (0.1 * 30 and 0.07 * 100 are
  // 3.0000000000000004 and 7.000000000000001 in double).
  EXPECT_EQ(TopKCount(0.1, 30), 3u);
  EXPECT_EQ(TopKCount(0.07, 100), 7u);
  EXPECT_EQ(TopKCount(0.3, 10), 3u);
  // Out of range: clamped.
  EXPECT_EQ(TopKCount(0.0, 10), 1u);
  EXPECT_EQ(TopKCount(-1.0, 10), 1u);
  EXPECT_EQ(TopKCount(std::nan(""), 10), 1u);
  EXPECT_EQ(TopKCount(2.0, 10), 10u);
}

// k of the ratio as given: against an independent reference in integer
// arithmetic, ceil(p * n / 1000) for every ratio p / 1000 written with three
// decimals and every chunk of up to 3000 elements. The ratio must reach
// TopKCount as the double it was given as: rounded to a float, 0.05 is
// 0.0500000007..., and 0.05f * 2560 keeps 129 entries, not 128.
TEST(TopKCountTest, ExactForEveryThreeDecimalRatio) {
  uint64_t wrong = 0;
  for (uint32_t p = 1; p <= 1000; ++p) {
    const double ratio = std::stod("0." + std::to_string(1000 + p).substr(1));
    for (uint32_t n = 1; n <= 3000; ++n) {
      const uint64_t want = std::max<uint64_t>(1, (uint64_t{p} * n + 999) / 1000);
      if (TopKCount(p == 1000 ? 1.0 : ratio, n) != want && wrong++ < 5) {
        ADD_FAILURE() << "ratio " << p << "/1000, n " << n << ": " << TopKCount(ratio, n)
                      << ", want " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(TopKCount(0.05, 2560), 128u);
  EXPECT_EQ(TopKCount(0.05f, 2560), 129u);  // why the wire carries the double
}

// ---- SelectTopK against the reference ----

enum class Dist { kNormal, kUniform, kFewValues, kMostlyZero, kQuantized, kHeavyTail, kPeriodic };

std::vector<float> MakeInput(Dist dist, size_t n, std::mt19937_64& rng) {
  std::vector<float> x(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_int_distribution<int> period_pick(0, 5);
  const size_t period = size_t{4} << (2 * period_pick(rng));  // 4 .. 4096
  for (size_t i = 0; i < n; ++i) {
    switch (dist) {
      case Dist::kNormal:
        x[i] = normal(rng);
        break;
      case Dist::kUniform:
        x[i] = uniform(rng);
        break;
      case Dist::kFewValues:
        x[i] = static_cast<float>(small(rng)) * 0.5f;
        break;
      case Dist::kMostlyZero:
        x[i] = (rng() % 50 == 0) ? normal(rng) : ((rng() & 1) ? 0.0f : -0.0f);
        break;
      case Dist::kQuantized:
        x[i] = std::round(normal(rng) * 4.0f) / 4.0f;
        break;
      case Dist::kHeavyTail:
        x[i] = normal(rng) / (std::abs(normal(rng)) + 1e-3f);
        break;
      case Dist::kPeriodic:
        // Large values on a lattice (which a strided sample may hit or miss
        // entirely), small noise elsewhere.
        x[i] = (i % period == period / 2) ? 100.0f + normal(rng) : 1e-3f * normal(rng);
        break;
    }
  }
  return x;
}

TEST(SelectTopKTest, RandomInputsAllSizesAndRatios) {
  std::mt19937_64 rng(20261125);
  TopKScratch scratch;
  const size_t sizes[] = {1,    2,    3,     5,     15,    16,    17,     31,
                          33,   100,  255,   1000,  4095,  4096,  4097,   5000,
                          8191, 8192, 10007, 32768, 32771, 65536, 100003, (size_t{1} << 20) + 5};
  for (Dist dist : {Dist::kNormal, Dist::kUniform, Dist::kFewValues, Dist::kMostlyZero,
                    Dist::kQuantized, Dist::kHeavyTail, Dist::kPeriodic}) {
    for (size_t n : sizes) {
      // The largest size with the distributions that stress the estimate.
      if (n > 200000 && dist != Dist::kNormal && dist != Dist::kMostlyZero &&
          dist != Dist::kPeriodic) {
        continue;
      }
      SCOPED_TRACE("dist " + std::to_string(static_cast<int>(dist)));
      const std::vector<float> x = MakeInput(dist, n, rng);
      CheckAll(x, KsFor(static_cast<uint32_t>(n)), scratch);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(SelectTopKTest, ManyRandomSmallCases) {
  std::mt19937_64 rng(7);
  TopKScratch scratch;
  for (int iter = 0; iter < 600; ++iter) {
    const size_t n = 1 + rng() % 20000;
    const Dist dist = static_cast<Dist>(rng() % 7);
    const std::vector<float> x = MakeInput(dist, n, rng);
    const uint32_t k = static_cast<uint32_t>(rng() % (n + 1));
    CheckAll(x, {k, static_cast<uint32_t>(1 + rng() % n)}, scratch);
    if (HasFatalFailure()) return;
  }
}

TEST(SelectTopKTest, NEqualsOne) {
  TopKScratch scratch;
  for (float v : {0.0f, -0.0f, 1.0f, -5.0f, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::infinity()}) {
    CheckAll({v}, {0, 1}, scratch);
  }
}

TEST(SelectTopKTest, AllEqualValues) {
  TopKScratch scratch;
  for (size_t n : {size_t{7}, size_t{4096}, size_t{50000}, size_t{1} << 20}) {
    const auto ks =
        n > 100000 ? FewKsFor(static_cast<uint32_t>(n)) : KsFor(static_cast<uint32_t>(n));
    for (float v : {0.0f, 1.5f, -1.5f}) {
      std::vector<float> x(n, v);
      CheckAll(x, ks, scratch);
      if (HasFatalFailure()) return;
    }
    // Equal magnitudes, mixed signs (and +0 / -0): ties by index.
    std::vector<float> x(n), z(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = (i * 2654435761u) % 3 == 0 ? -2.0f : 2.0f;
      z[i] = (i * 2654435761u) % 3 == 0 ? -0.0f : 0.0f;
    }
    CheckAll(x, ks, scratch);
    CheckAll(z, ks, scratch);
    if (HasFatalFailure()) return;
  }
}

TEST(SelectTopKTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            FromBits(0x7f800001),  // signaling NaN, smallest payload
                            FromBits(0xffffffff),  // negative NaN, largest payload
                            FromBits(0x7fbfffff),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            1.0f,
                            -1.0f};
  std::mt19937_64 rng(99);
  TopKScratch scratch;
  for (size_t n : {size_t{16}, size_t{100}, size_t{5000}, size_t{70000}}) {
    for (int density : {2, 10, 1000}) {  // 1 in `density` entries is special
      std::vector<float> x = MakeInput(Dist::kNormal, n, rng);
      for (size_t i = 0; i < n; ++i) {
        if (rng() % density == 0) x[i] = specials[rng() % std::size(specials)];
      }
      CheckAll(x, KsFor(static_cast<uint32_t>(n)), scratch);
      if (HasFatalFailure()) return;
    }
  }
  // Magnitude order: NaN (by payload) > inf > finite; -0 ties with +0.
  std::vector<float> x = {1.0f, -inf, FromBits(0xffc00001), 0.0f, inf, -0.0f, FromBits(0x7fc00000)};
  std::vector<uint32_t> idx(3);
  SelectTopK(x, 2, idx.data(), scratch);
  EXPECT_EQ(idx[0], 2u);  // payload 0x400001 > 0x400000
  EXPECT_EQ(idx[1], 6u);
  SelectTopK(x, 3, idx.data(), scratch);
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 2, 6}));  // -inf before +inf by index
  std::vector<float> zeros = {-0.0f, 0.0f, -0.0f};
  SelectTopK(zeros, 2, idx.data(), scratch);
  EXPECT_EQ(idx[0], 0u);
  EXPECT_EQ(idx[1], 1u);
}

TEST(SelectTopKTest, ManyTiesAtTheThreshold) {
  // Large inputs whose k-th largest magnitude is shared by many entries, so
  // the ties (lowest indices first) decide; thresholds inside the sampled
  // candidates and over all entries.
  std::mt19937_64 rng(5);
  TopKScratch scratch;
  for (size_t n : {size_t{40000}, size_t{1} << 20}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = rng() % 1000;
      x[i] = r < 5 ? 8.0f : (r < 50 ? ((rng() & 1) ? 4.0f : -4.0f) : 1e-3f * static_cast<float>(r));
    }
    CheckAll(x, KsFor(static_cast<uint32_t>(n)), scratch);
    // A k exactly at the boundary between the 8s and the 4s, and just past it.
    const auto eights = static_cast<uint32_t>(std::count(x.begin(), x.end(), 8.0f));
    CheckAll(x, {eights - 1, eights, eights + 1}, scratch);
    if (HasFatalFailure()) return;
  }
}

TEST(SelectTopKTest, SampleLatticeAdversaries) {
  // Large values exactly on (or off) a strided lattice with many periods: the
  // threshold estimate is far too high (fewer than k candidates) or far too
  // low (candidate overflow); the exact fallback must give the same answer.
  std::mt19937_64 rng(11);
  TopKScratch scratch;
  const size_t n = size_t{1} << 20;
  for (size_t period : {size_t{64}, size_t{256}}) {
    for (size_t phase : {size_t{0}, period / 2}) {
      std::vector<float> on(n), off(n);
      for (size_t i = 0; i < n; ++i) {
        const float noise = 1e-3f * static_cast<float>(rng() % 1000);
        on[i] = i % period == phase ? 10.0f + noise : noise;
        off[i] = i % period == phase ? noise : 10.0f;
      }
      CheckAll(on, FewKsFor(static_cast<uint32_t>(n)), scratch);
      CheckAll(off, FewKsFor(static_cast<uint32_t>(n)), scratch);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(SelectTopKTest, FreshScratchEachCall) {
  std::mt19937_64 rng(3);
  const std::vector<float> x = MakeInput(Dist::kNormal, 100000, rng);
  const uint32_t k = TopKCount(0.01, 100000);
  const std::vector<uint32_t> expected = Reference(x, k);
  ForEachPath([&] {
    TopKScratch scratch;
    EXPECT_EQ(scratch.bytes(), 0u);
    ExpectSelects(x, k, expected, scratch);
    EXPECT_GT(scratch.bytes(), 0u);
  });
}

// ---- Error feedback ----

// The reference of one CompressTopK step with error feedback.
struct RefStep {
  std::vector<uint32_t> idx;
  std::vector<float> values;
};
RefStep ReferenceStep(const std::vector<float>& grad, std::vector<float>& residual, uint32_t k) {
  for (size_t i = 0; i < grad.size(); ++i) residual[i] = residual[i] + grad[i];
  RefStep s;
  s.idx = Reference(residual, k);
  for (uint32_t i : s.idx) {
    s.values.push_back(residual[i]);
    residual[i] = 0.0f;
  }
  return s;
}

void ExpectBitsEqual(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(a[i]), Bits(b[i])) << "at " << i;
}

TEST(CompressTopKTest, KEqualsNSendsTheCorrectedGradient) {
  std::mt19937_64 rng(17);
  TopKScratch scratch;
  ForEachPath([&] {
    for (size_t n : {size_t{1}, size_t{17}, size_t{4096}, size_t{100000}}) {
      const std::vector<float> grad = MakeInput(Dist::kNormal, n, rng);
      std::vector<float> residual = MakeInput(Dist::kHeavyTail, n, rng);
      std::vector<float> corrected(n);
      for (size_t i = 0; i < n; ++i) corrected[i] = residual[i] + grad[i];
      std::vector<uint32_t> idx(n);
      std::vector<float> values(n);
      const auto k = static_cast<uint32_t>(n);
      CompressTopK(grad, residual, k, true, idx.data(), values.data(), scratch);
      for (uint32_t j = 0; j < k; ++j) ASSERT_EQ(idx[j], j);
      ExpectBitsEqual(values, corrected);
      ExpectBitsEqual(residual, std::vector<float>(n, 0.0f));  // +0.0, all of it
    }
  });
}

TEST(CompressTopKTest, SentPlusResidualReconstructsTheCorrectedGradient) {
  std::mt19937_64 rng(23);
  TopKScratch scratch;
  ForEachPath([&] {
    for (size_t n : {size_t{10}, size_t{5000}, size_t{32768}, size_t{300001}}) {
      for (double ratio : {0.001, 0.01, 0.1, 0.5}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " ratio=" + std::to_string(ratio));
        const std::vector<float> grad = MakeInput(Dist::kNormal, n, rng);
        std::vector<float> residual = MakeInput(Dist::kNormal, n, rng);
        for (float& r : residual) r *= 0.5f;
        std::vector<float> corrected(n);
        for (size_t i = 0; i < n; ++i) corrected[i] = residual[i] + grad[i];
        const uint32_t k = TopKCount(ratio, static_cast<uint32_t>(n));
        std::vector<uint32_t> idx(k);
        std::vector<float> values(k);
        CompressTopK(grad, residual, k, true, idx.data(), values.data(), scratch);
        ASSERT_EQ(idx, Reference(corrected, k));
        std::vector<float> rebuilt = residual;
        for (uint32_t j = 0; j < k; ++j) {
          ASSERT_EQ(Bits(values[j]), Bits(corrected[idx[j]]));
          ASSERT_EQ(Bits(residual[idx[j]]), 0u);  // sent: exactly +0.0
          rebuilt[idx[j]] = values[j];
        }
        // Unsent entries keep the corrected value; with the sent ones put
        // back, the corrected gradient is rebuilt bit for bit.
        ExpectBitsEqual(rebuilt, corrected);
      }
    }
  });
}

TEST(CompressTopKTest, ManyStepsMatchTheReferenceAndConserveTheGradient) {
  // (1) Bit for bit against a reference simulation of the same steps (same
  //     additions in the same order). (2) Per index, the float sum of all sent
  //     values (in step order) plus the final residual equals the float sum of
  //     all gradients computed in the same order as the residual chain: the
  //     reference replays each index's additions (acc = acc + g, and a send
  //     moves acc into the sent sum) so the comparison is exact.
  // (3) With dyadic gradients (every sum exact in fp32) the sent values plus
  //     the final residual equal the plain sum of the gradients exactly.
  for (bool dyadic : {false, true}) {
    ForEachPath([&] {
      std::mt19937_64 rng(dyadic ? 31 : 29);
      const size_t n = 50000;
      const int steps = 40;
      TopKScratch scratch;
      std::vector<float> residual(n, 0.0f), ref_residual(n, 0.0f);
      std::vector<float> sent_sum(n, 0.0f), grad_sum(n, 0.0f);
      std::vector<double> exact_grad_sum(n, 0.0), exact_sent_sum(n, 0.0);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int step = 0; step < steps; ++step) {
        std::vector<float> grad(n);
        for (size_t i = 0; i < n; ++i) {
          // Dyadic: multiples of 2^-10 in [-1, 1]; 40 steps stay below 2^6,
          // 16 significant bits: every fp32 sum here is exact.
          grad[i] = dyadic ? static_cast<float>(static_cast<int>(rng() % 2049) - 1024) / 1024.0f
                           : normal(rng) * (1.0f + static_cast<float>(i % 7));
          grad_sum[i] += grad[i];
          exact_grad_sum[i] += grad[i];
        }
        const uint32_t k = TopKCount(step % 2 ? 0.01 : 0.001, static_cast<uint32_t>(n));
        std::vector<uint32_t> idx(k);
        std::vector<float> values(k);
        CompressTopK(grad, residual, k, true, idx.data(), values.data(), scratch);
        const RefStep ref = ReferenceStep(grad, ref_residual, k);
        ASSERT_EQ(idx, ref.idx) << "step " << step;
        ExpectBitsEqual(values, ref.values);
        ExpectBitsEqual(residual, ref_residual);
        for (uint32_t j = 0; j < k; ++j) {
          sent_sum[idx[j]] += values[j];
          exact_sent_sum[idx[j]] += values[j];
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (dyadic) {
          ASSERT_EQ(Bits(sent_sum[i] + residual[i]), Bits(grad_sum[i])) << i;
          ASSERT_EQ(exact_sent_sum[i] + residual[i], exact_grad_sum[i]) << i;
        } else {
          // Within the rounding of the fp32 additions: each of the `steps`
          // residual additions rounds by at most half an ulp of its result.
          const double err = std::abs(exact_sent_sum[i] + residual[i] - exact_grad_sum[i]);
          ASSERT_LE(err, steps * 1e-6 * 64.0) << i;
        }
      }
    });
  }
}

TEST(CompressTopKTest, ManyStepsConservationInReplayOrder) {
  // Exact conservation for arbitrary floats: replay each index's residual
  // chain (acc = acc + g; on a send, sent += acc and acc = 0) from the sent
  // values alone and check it reproduces the residual and the sent values.
  std::mt19937_64 rng(41);
  const size_t n = 20000;
  TopKScratch scratch;
  std::vector<float> residual(n, 0.0f);
  std::vector<float> acc(n, 0.0f);  // replayed residual
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < 60; ++step) {
    std::vector<float> grad(n);
    for (float& g : grad) g = normal(rng);
    for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + grad[i];
    const uint32_t k = TopKCount(0.01, static_cast<uint32_t>(n));
    std::vector<uint32_t> idx(k);
    std::vector<float> values(k);
    CompressTopK(grad, residual, k, true, idx.data(), values.data(), scratch);
    for (uint32_t j = 0; j < k; ++j) {
      ASSERT_EQ(Bits(values[j]), Bits(acc[idx[j]]));  // what was sent is what had accumulated
      acc[idx[j]] = 0.0f;
    }
    ExpectBitsEqual(residual, acc);
  }
}

TEST(CompressTopKTest, WithoutErrorFeedback) {
  std::mt19937_64 rng(47);
  TopKScratch scratch;
  ForEachPath([&] {
    for (size_t n : {size_t{100}, size_t{65536}}) {
      const std::vector<float> grad = MakeInput(Dist::kNormal, n, rng);
      const uint32_t k = TopKCount(0.01, static_cast<uint32_t>(n));
      const std::vector<uint32_t> expected = Reference(grad, k);
      for (int step = 0; step < 3; ++step) {
        // A zero residual stays zero; a stale one is cleared; grad alone
        // decides, every step the same.
        std::vector<float> residual(n, step == 1 ? 3.0f : 0.0f);
        std::vector<uint32_t> idx(k);
        std::vector<float> values(k);
        CompressTopK(grad, residual, k, false, idx.data(), values.data(), scratch);
        ASSERT_EQ(idx, expected);
        for (uint32_t j = 0; j < k; ++j) ASSERT_EQ(Bits(values[j]), Bits(grad[idx[j]]));
        ExpectBitsEqual(residual, std::vector<float>(n, 0.0f));
      }
      // An empty residual span.
      std::vector<uint32_t> idx(k);
      std::vector<float> values(k);
      CompressTopK(grad, {}, k, false, idx.data(), values.data(), scratch);
      ASSERT_EQ(idx, expected);
    }
  });
}

TEST(CompressTopKTest, AdversarialInputsWithErrorFeedback) {
  // The estimate's failure modes with error feedback (fewer than k
  // candidates, candidate overflow, mostly zeros, all equal), a few steps
  // each, bit for bit against the reference steps.
  std::mt19937_64 rng(59);
  TopKScratch scratch;
  const size_t n = size_t{1} << 18;
  std::vector<std::vector<float>> inputs;
  inputs.push_back(std::vector<float>(n, 0.0f));   // all zero
  inputs.push_back(std::vector<float>(n, 0.25f));  // all equal
  inputs.push_back(MakeInput(Dist::kMostlyZero, n, rng));
  std::vector<float> sparse(n, 0.0f);  // fewer nonzeros than k
  for (size_t i = 0; i < n; i += 997) sparse[i] = static_cast<float>(i % 7) - 3.0f;
  inputs.push_back(sparse);
  for (size_t period : {size_t{64}, size_t{256}}) {
    std::vector<float> on(n), off(n);
    for (size_t i = 0; i < n; ++i) {
      const float noise = 1e-3f * static_cast<float>(rng() % 1000);
      on[i] = i % period == 0 ? 10.0f + noise : noise;
      off[i] = i % period == 0 ? noise : 10.0f;
    }
    inputs.push_back(on);
    inputs.push_back(off);
  }
  ForEachPath([&] {
    for (size_t in = 0; in < inputs.size(); ++in) {
      for (double ratio : {0.001, 0.01, 0.1}) {
        SCOPED_TRACE("input " + std::to_string(in) + " ratio " + std::to_string(ratio));
        std::vector<float> residual(n, 0.0f), ref_residual(n, 0.0f);
        const uint32_t k = TopKCount(ratio, static_cast<uint32_t>(n));
        for (int step = 0; step < 3; ++step) {
          std::vector<uint32_t> idx(k);
          std::vector<float> values(k);
          CompressTopK(inputs[in], residual, k, true, idx.data(), values.data(), scratch);
          const RefStep ref = ReferenceStep(inputs[in], ref_residual, k);
          ASSERT_EQ(idx, ref.idx) << "step " << step;
          ExpectBitsEqual(values, ref.values);
          ExpectBitsEqual(residual, ref_residual);
        }
      }
    }
  });
}

TEST(CompressTopKTest, KZeroOnlyAccumulates) {
  TopKScratch scratch;
  std::vector<float> grad = {1.0f, -2.0f, 3.0f};
  std::vector<float> residual = {0.5f, 0.5f, 0.5f};
  CompressTopK(grad, residual, 0, true, nullptr, nullptr, scratch);
  ExpectBitsEqual(residual, {1.5f, -1.5f, 3.5f});
}

TEST(CompressTopKTest, SpecialValuesWithErrorFeedback) {
  // inf, NaN and signed zeros in the gradient (residual finite, so no two
  // NaNs meet in one addition).
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937_64 rng(53);
  TopKScratch scratch;
  ForEachPath([&] {
    for (size_t n : {size_t{50}, size_t{20000}}) {
      std::vector<float> grad = MakeInput(Dist::kNormal, n, rng);
      std::vector<float> residual = MakeInput(Dist::kNormal, n, rng);
      for (size_t i = 0; i < n; i += 97) grad[i] = (i / 97) % 3 == 0 ? inf : -inf;
      for (size_t i = 13; i < n; i += 89) grad[i] = std::numeric_limits<float>::quiet_NaN();
      for (size_t i = 7; i < n; i += 31) {
        grad[i] = -0.0f;
        residual[i] = -0.0f;
      }
      std::vector<float> ref_residual = residual;
      const uint32_t k = TopKCount(0.05, static_cast<uint32_t>(n));
      std::vector<uint32_t> idx(k);
      std::vector<float> values(k);
      CompressTopK(grad, residual, k, true, idx.data(), values.data(), scratch);
      const RefStep ref = ReferenceStep(grad, ref_residual, k);
      ASSERT_EQ(idx, ref.idx);
      ExpectBitsEqual(values, ref.values);
      ExpectBitsEqual(residual, ref_residual);
    }
  });
}

}  // namespace
}  // namespace rackhub::aggregation
