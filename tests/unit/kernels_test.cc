// Unit tests for the conversion, reduction and optimizer kernels of
// rackhub_aggregation, against independent references written here.

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <cstdio>
#include <random>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// Reference fp16 decode, by the definition of binary16.
double RefFp16Value(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) {
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  }
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Reference fp32 -> fp16 encode in double arithmetic: scale to units of the
// target ulp and round with nearbyint (round-half-even in the default mode).
uint16_t RefFloatToFp16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return 0x7e00;  // compared as "is NaN" only
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);                // a = x * 2^e, x in [0.5, 1)
  const int exponent = std::max(e - 1, -14);  // a in [2^exponent, 2^(exponent+1))
  const double ulp = std::ldexp(1.0, exponent - 10);
  const double m = std::nearbyint(a / ulp);  // exact division by a power of 2
  if (exponent == -14 && m < 1024) return sign | static_cast<uint16_t>(m);  // subnormal
  // m in [1024, 2048]; 2048 carries into the exponent.
  return sign | static_cast<uint16_t>(((exponent + 15) << 10) + static_cast<int>(m) - 1024);
}

TEST(KernelsTest, ElementBytesAndNames) {
  EXPECT_EQ(ElementBytes(ElementType::kFp32), 4u);
  EXPECT_EQ(ElementBytes(ElementType::kFp16), 2u);
  EXPECT_EQ(ElementBytes(ElementType::kBf16), 2u);
  EXPECT_TRUE(IsValidElementType(1));
  EXPECT_TRUE(IsValidElementType(3));
  EXPECT_FALSE(IsValidElementType(0));
  EXPECT_FALSE(IsValidElementType(4));
  EXPECT_STREQ(ElementTypeName(ElementType::kBf16), "bf16");
}

TEST(KernelsTest, Fp16ExactValues) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.5f), 0xc100);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(0.0f), 0x0000);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFp16(1023 * std::ldexp(1.0f, -24)), 0x03ff);
  EXPECT_EQ(FloatToFp16(1e-7f), 0x0002);                  // 1e-7 = 1.68 * 2^-24
  EXPECT_EQ(FloatToFp16(1e-8f), 0x0000);                  // below half the smallest
  EXPECT_EQ(FloatToFp16(-1e-8f), 0x8000);
  EXPECT_EQ(Fp16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFloat(0xc100), -2.5f);
  EXPECT_EQ(Fp16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(Bits(Fp16ToFloat(0x8000)), 0x80000000u);
}

TEST(KernelsTest, Fp16RoundsTiesToEven) {
  const float ulp1 = std::ldexp(1.0f, -10);  // fp16 ulp at 1.0
  EXPECT_EQ(FloatToFp16(1.0f + ulp1 / 2), 0x3c00);        // tie, down to even
  EXPECT_EQ(FloatToFp16(1.0f + 3 * ulp1 / 2), 0x3c02);    // tie, up to even
  EXPECT_EQ(FloatToFp16(FromBits(Bits(1.0f + ulp1 / 2) + 1)), 0x3c01);  // just above
  EXPECT_EQ(FloatToFp16(FromBits(Bits(1.0f + ulp1 / 2) - 1)), 0x3c00);  // just below
  const float sub = std::ldexp(1.0f, -24);
  EXPECT_EQ(FloatToFp16(sub / 2), 0x0000);      // tie between 0 and 1 -> 0
  EXPECT_EQ(FloatToFp16(1.5f * sub), 0x0002);   // tie between 1 and 2 -> 2
  EXPECT_EQ(FloatToFp16(2.5f * sub), 0x0002);   // tie between 2 and 3 -> 2
  EXPECT_EQ(FloatToFp16(1023.5f * sub), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToFp16(2047.5f), 0x6800);  // 2047.5 -> 2048 (ulp 1 at [1024, 2048))
  EXPECT_EQ(FloatToFp16(2046.5f), 0x67fe);  // 2046.5 -> 2046
}

TEST(KernelsTest, Fp16OverflowInfNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);  // tie to even rounds to 2^16: overflow
  EXPECT_EQ(FloatToFp16(1e6f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-1e30f), 0xfc00);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToFp16(inf), 0x7c00);
  EXPECT_EQ(FloatToFp16(-inf), 0xfc00);
  EXPECT_EQ(Fp16ToFloat(0x7c00), inf);
  EXPECT_EQ(Fp16ToFloat(0xfc00), -inf);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t h = FloatToFp16(nan);
  EXPECT_EQ(h & 0x7c00, 0x7c00);
  EXPECT_NE(h & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(h)));
  // A NaN whose payload sits only in the dropped low bits stays a NaN.
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(FromBits(0x7f800001u)))));
  EXPECT_EQ(FloatToFp16(FromBits(0xff800001u)) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0x7c01)));
  EXPECT_TRUE(std::isnan(Fp16ToFloat(0xfe00)));
}

TEST(KernelsTest, Bf16ExactValuesTiesInfNan) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.5f), 0xc020);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc020), -2.5f);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);  // tie, down to even
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);  // tie, up to even
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // subnormal tie, up to even
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // subnormal tie, down to 0
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past max
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fffu)), 0x7f7f);              // largest that stays
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0xffffffffu)))));
  EXPECT_EQ(FloatToBf16(FromBits(0xff800001u)) & 0x8000, 0x8000);
}

TEST(KernelsTest, AllFp16PatternsRoundTrip) {
  std::vector<uint16_t> in(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  ConvertFp16ToFp32(wide.data(), in.data(), in.size());
  ConvertFp32ToFp16(back.data(), wide.data(), wide.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const double ref = RefFp16Value(in[i]);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(wide[i])) << std::hex << i;
      ASSERT_TRUE(std::isnan(Fp16ToFloat(back[i]))) << std::hex << i;
      ASSERT_EQ(back[i] & 0x8000, in[i] & 0x8000) << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(wide[i]), ref) << std::hex << i;
      ASSERT_EQ(std::signbit(wide[i]), (in[i] & 0x8000) != 0) << std::hex << i;
      ASSERT_EQ(back[i], in[i]) << std::hex << i;
    }
  }
}

TEST(KernelsTest, AllBf16PatternsRoundTrip) {
  std::vector<uint16_t> in(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  ConvertBf16ToFp32(wide.data(), in.data(), in.size());
  ConvertFp32ToBf16(back.data(), wide.data(), wide.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(Bits(wide[i]), i << 16);
    if (std::isnan(wide[i])) {
      ASSERT_TRUE(std::isnan(Bf16ToFloat(back[i]))) << std::hex << i;
    } else {
      ASSERT_EQ(back[i], in[i]) << std::hex << i;
    }
  }
}

// Narrowing against the double reference over a sweep of fp32 bit patterns
// (every 4099th pattern, plus the neighbourhood of every fp16 boundary).
TEST(KernelsTest, Fp32ToFp16MatchesReferenceOnSweep) {
  std::vector<float> values;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 4099) values.push_back(FromBits(static_cast<uint32_t>(b)));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // midpoints between neighbouring fp16 values
    const double mid = (RefFp16Value(static_cast<uint16_t>(h)) + RefFp16Value(h + 1)) / 2;
    const float f = static_cast<float>(mid);  // exact: a midpoint needs 12 bits
    for (int d = -1; d <= 1; ++d) {
      values.push_back(FromBits(Bits(f) + d));
      values.push_back(-FromBits(Bits(f) + d));
    }
  }
  std::vector<uint16_t> out(values.size());
  ConvertFp32ToFp16(out.data(), values.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      ASSERT_TRUE(std::isnan(Fp16ToFloat(out[i])));
    } else {
      ASSERT_EQ(out[i], RefFloatToFp16(values[i])) << std::hexfloat << values[i];
    }
  }
}

// Wire buffer helpers for the reduction tests: values exactly representable
// in every type, stored at an odd byte offset to exercise unaligned access.
std::vector<std::byte> Encode(const std::vector<float>& v, ElementType type, size_t offset) {
  std::vector<std::byte> out(offset + v.size() * ElementBytes(type));
  for (size_t i = 0; i < v.size(); ++i) {
    std::byte* at = out.data() + offset + i * ElementBytes(type);
    if (type == ElementType::kFp32) {
      std::memcpy(at, &v[i], 4);
    } else {
      const uint16_t h = type == ElementType::kFp16 ? FloatToFp16(v[i]) : FloatToBf16(v[i]);
      std::memcpy(at, &h, 2);
    }
  }
  return out;
}

class ReductionTest : public ::testing::TestWithParam<ElementType> {};

TEST_P(ReductionTest, CopyInAddInCopyOut) {
  const ElementType type = GetParam();
  constexpr size_t kN = 37;  // not a multiple of any vector width
  std::vector<float> a(kN), b(kN);
  for (size_t i = 0; i < kN; ++i) {
    a[i] = static_cast<float>(i) * 0.5f - 4.0f;   // representable in fp16 and bf16
    b[i] = 1.0f / static_cast<float>(1 << (i % 8)) - 2.0f;
  }
  for (size_t offset : {0u, 1u, 3u}) {
    const auto wa = Encode(a, type, offset);
    const auto wb = Encode(b, type, offset);
    std::vector<float> acc(kN, 99.0f);
    CopyIn(acc.data(), wa.data() + offset, kN, type);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(acc[i], a[i]) << i;
    AddIn(acc.data(), wb.data() + offset, kN, type);
    AddIn(acc.data(), wb.data() + offset, kN, type);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(acc[i], a[i] + b[i] + b[i]) << i;
    std::vector<std::byte> out(offset + kN * ElementBytes(type), std::byte{0x5a});
    CopyOut(out.data() + offset, acc.data(), kN, type);
    std::vector<float> expect(kN);
    for (size_t i = 0; i < kN; ++i) expect[i] = a[i] + b[i] + b[i];
    const auto want = Encode(expect, type, offset);
    EXPECT_EQ(std::memcmp(out.data() + offset, want.data() + offset, kN * ElementBytes(type)), 0);
    for (size_t i = 0; i < offset; ++i) EXPECT_EQ(out[i], std::byte{0x5a});  // no stray writes
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReductionTest,
                         ::testing::Values(ElementType::kFp32, ElementType::kFp16,
                                           ElementType::kBf16),
                         [](const auto& info) { return std::string(ElementTypeName(info.param)); });

TEST(KernelsTest, CopyOutRoundsFp16AndBf16) {
  const float in[3] = {1.0f + std::ldexp(1.0f, -11), 70000.0f, FromBits(0x3f818000u)};
  uint16_t h[3], b[3];
  CopyOut(h, in, 3, ElementType::kFp16);
  CopyOut(b, in, 3, ElementType::kBf16);
  EXPECT_EQ(h[0], 0x3c00);
  EXPECT_EQ(h[1], 0x7c00);
  EXPECT_EQ(b[2], 0x3f82);
}

// ---- Optimizers against a double-precision reference ----

struct RefState {
  std::vector<double> p, s0, s1;
};

// One step of the textbook (torch.optim) formulas, all in double.
void RefStep(const OptimizerConfig& c, double gs, uint64_t t, const std::vector<float>& sum,
             RefState* st) {
  const double lr = c.learning_rate, wd = c.weight_decay, mu = c.momentum;
  for (size_t i = 0; i < sum.size(); ++i) {
    const double g = sum[i] * gs;
    double& p = st->p[i];
    double& s0 = st->s0[i];
    double& s1 = st->s1[i];
    switch (c.type) {
      case OptimizerType::kSgd: p -= lr * (g + wd * p); break;
      case OptimizerType::kMomentum: {
        const double d = g + wd * p;
        s0 = mu * s0 + d;
        p -= lr * s0;
        break;
      }
      case OptimizerType::kNesterov: {
        const double d = g + wd * p;
        s0 = mu * s0 + d;
        p -= lr * (d + mu * s0);
        break;
      }
      case OptimizerType::kAdam:
      case OptimizerType::kAdamW: {
        const bool w = c.type == OptimizerType::kAdamW;
        const double d = w ? g : g + wd * p;
        s0 = c.beta1 * s0 + (1 - c.beta1) * d;
        s1 = c.beta2 * s1 + (1 - c.beta2) * d * d;
        const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(t));
        const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(t));
        const double upd = lr * (s0 / bc1) / (std::sqrt(s1 / bc2) + c.epsilon);
        p = (w ? p * (1 - lr * wd) : p) - upd;
        break;
      }
      case OptimizerType::kAdaGrad: {
        const double d = g + wd * p;
        s0 += d * d;
        p -= lr * d / (std::sqrt(s0) + c.epsilon);
        break;
      }
      case OptimizerType::kSumOnly: p = g; break;
    }
  }
}

OptimizerConfig Make(OptimizerType type, double lr, double mu, double wd) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  c.momentum = mu;
  c.weight_decay = wd;
  if (type == OptimizerType::kAdaGrad) c.initial_accumulator = 0.1;
  if (type == OptimizerType::kSumOnly) c = OptimizerConfig{OptimizerType::kSumOnly, 0};
  EXPECT_EQ(NormalizeOptimizer(&c), "");
  return c;
}

class OptimizerTest : public ::testing::TestWithParam<OptimizerType> {};

TEST_P(OptimizerTest, MatchesDoubleReferenceOverSteps) {
  const OptimizerType type = GetParam();
  for (double wd : {0.0, 0.05}) {
    if (type == OptimizerType::kSumOnly && wd != 0) continue;
    const OptimizerConfig cfg = Make(type, 0.01, type == OptimizerType::kMomentum ||
                                                     type == OptimizerType::kNesterov
                                                 ? 0.9
                                                 : 0.0,
                                     wd);
    constexpr size_t kN = 1027;
    constexpr float kScale = 0.25f;  // a mean over 4 workers
    std::mt19937 rng(static_cast<unsigned>(type) * 7 + (wd > 0));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> p(kN), p_new(kN), s0(kN), s1(kN), sum(kN);
    for (auto& x : p) x = dist(rng);
    const float init_acc = static_cast<float>(cfg.initial_accumulator);
    std::fill(s0.begin(), s0.end(), type == OptimizerType::kAdaGrad ? init_acc : 0.0f);
    RefState ref{std::vector<double>(p.begin(), p.end()),
                 std::vector<double>(kN, type == OptimizerType::kAdaGrad ? init_acc : 0.0),
                 std::vector<double>(kN, 0.0)};
    for (uint64_t t = 1; t <= 6; ++t) {
      for (auto& x : sum) x = 4.0f * dist(rng);
      ApplyOptimizer(cfg, OptimizerStep{kScale, t}, sum.data(), p.data(), p_new.data(),
                     s0.data(), s1.data(), kN);
      RefStep(cfg, kScale, t, sum, &ref);
      // Relative tolerance 1e-5, with an absolute floor at the scale of the
      // inputs (~1) where fp32 cancellation (p - lr*d, mu*v + d) loses digits.
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_NEAR(p_new[i], ref.p[i], 1e-5 * (std::fabs(ref.p[i]) + 0.1))
            << OptimizerTypeName(type) << " wd=" << wd << " t=" << t << " i=" << i;
        ASSERT_NEAR(s0[i], ref.s0[i], 1e-5 * (std::fabs(ref.s0[i]) + 0.1)) << i;
        ASSERT_NEAR(s1[i], ref.s1[i], 1e-5 * (std::fabs(ref.s1[i]) + 1e-6)) << i;
      }
      std::swap(p, p_new);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, OptimizerTest,
    ::testing::Values(OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kNesterov,
                      OptimizerType::kAdam, OptimizerType::kAdamW, OptimizerType::kAdaGrad,
                      OptimizerType::kSumOnly),
    [](const auto& info) {
      std::string n = OptimizerTypeName(info.param);
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

TEST(KernelsTest, SgdExactSmallCase) {
  // p' = p - lr*(g*scale + wd*p) with values exact in binary.
  OptimizerConfig c = Make(OptimizerType::kSgd, 0.5, 0, 0.25);
  const float sum[2] = {4.0f, -8.0f}, p[2] = {1.0f, 2.0f};
  float out[2];
  ApplyOptimizer(c, OptimizerStep{0.5f, 1}, sum, p, out, nullptr, nullptr, 2);
  EXPECT_EQ(out[0], 1.0f - 0.5f * (2.0f + 0.25f));
  EXPECT_EQ(out[1], 2.0f - 0.5f * (-4.0f + 0.5f));
}

TEST(KernelsTest, AdamBiasCorrectionFirstStepIsSignedLr) {
  // At t = 1 the bias-corrected Adam step is lr * g / (|g| + eps) ~= lr * sign(g).
  OptimizerConfig c = Make(OptimizerType::kAdam, 0.1, 0, 0);
  const float sum[3] = {3.0f, -0.02f, 500.0f}, p[3] = {0, 0, 0};
  float out[3], m[3] = {}, v[3] = {};
  ApplyOptimizer(c, OptimizerStep{1.0f, 1}, sum, p, out, m, v, 3);
  EXPECT_NEAR(out[0], -0.1f, 1e-6);
  EXPECT_NEAR(out[1], 0.1f, 1e-5);
  EXPECT_NEAR(out[2], -0.1f, 1e-6);
}

TEST(KernelsTest, SumOnlyAppliesGradScale) {
  OptimizerConfig c = Make(OptimizerType::kSumOnly, 0, 0, 0);
  const float sum[4] = {4.0f, -2.0f, 0.0f, 1.0f}, p[4] = {9, 9, 9, 9};
  float out[4];
  ApplyOptimizer(c, OptimizerStep{0.25f, 3}, sum, p, out, nullptr, nullptr, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.25f);
  ApplyOptimizer(c, OptimizerStep{1.0f, 3}, sum, p, out, nullptr, nullptr, 4);
  EXPECT_EQ(out[0], 4.0f);
}


// ---- Kernel paths: every path available here gives the portable bits ----
namespace paths {

// Bitwise equality.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
    return ::testing::AssertionFailure() << "element " << i << " of " << a.size() << ": "
                                         << std::hexfloat << +a[i] << " vs " << +b[i];
  }
  return ::testing::AssertionSuccess();
}

// Runs fn() once per available path (portable first) and checks each result
// against the portable one.
template <typename Fn>
void ForEachPath(Fn fn) {
  ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
  const auto want = fn();
  int checked = 0;
  for (KernelPath p : kAllKernelPaths) {
    if (!ForceKernelPath(p)) continue;
    EXPECT_TRUE(SameBits(fn(), want)) << KernelPathName(p);
    ++checked;
  }
  ResetKernelPath();
  EXPECT_GE(checked, 1);
}

// Random fp32 data: mixed magnitudes (order-sensitive sums), subnormals,
// signed zeros, infinities when `specials`.
std::vector<float> RandomFloats(size_t n, unsigned seed, bool specials = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-30, 30), pick(0, 99);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = std::ldexp(unit(rng), exp(rng));
    const int k = pick(rng);
    if (specials && k == 0) x = std::numeric_limits<float>::infinity();
    if (specials && k == 1) x = -0.0f;
    if (specials && k == 2) x = std::ldexp(unit(rng), -135);  // subnormal
  }
  return v;
}

// n elements of `type` at byte offset `offset`: random fp32 values (or, for the
// 2-byte types, random bit patterns when `all_patterns`).
std::vector<std::byte> RandomWire(size_t n, ElementType type, size_t offset, unsigned seed,
                                  bool all_patterns = false) {
  std::vector<std::byte> out = Encode(RandomFloats(n, seed), type, offset);
  if (all_patterns && type != ElementType::kFp32) {
    std::mt19937 rng(seed);
    for (size_t i = offset; i < out.size(); ++i) out[i] = static_cast<std::byte>(rng());
  }
  return out;
}

constexpr ElementType kTypes[] = {ElementType::kFp32, ElementType::kFp16, ElementType::kBf16};
constexpr size_t kLengths[] = {0, 1, 7, 15, 16, 17, 33, 64, 100, 1023, 4099};
constexpr OptimizerType kOptimizers[] = {
    OptimizerType::kSgd,   OptimizerType::kMomentum, OptimizerType::kNesterov, OptimizerType::kAdam,
    OptimizerType::kAdamW, OptimizerType::kAdaGrad,  OptimizerType::kSumOnly};

TEST(KernelPathTest, NamesAndForcing) {
  EXPECT_TRUE(KernelPathAvailable(KernelPath::kPortable));
  EXPECT_STREQ(KernelPathName(KernelPath::kAvx512), "avx512");
  for (KernelPath p : kAllKernelPaths) {
    EXPECT_EQ(ForceKernelPath(p), KernelPathAvailable(p));
    if (KernelPathAvailable(p)) {
      EXPECT_STREQ(KernelPathName(), KernelPathName(p));
    }
    std::printf("kernel path %-8s %s\n", KernelPathName(p),
                KernelPathAvailable(p) ? "available" : "not available");
  }
  ResetKernelPath();
  std::printf("default kernel path: %s\n", KernelPathName());
}

TEST(KernelPathTest, ConversionsOfAll16BitPatternsAndManyFloats) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (auto convert : {ConvertFp16ToFp32, ConvertBf16ToFp32}) {
    ForEachPath([&] {
      std::vector<float> out(all.size());
      convert(out.data(), all.data(), all.size());
      return out;
    });
    // The scalar inline conversion agrees too.
    std::vector<float> out(all.size());
    convert(out.data(), all.data(), all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      const float s = convert == ConvertFp16ToFp32 ? Fp16ToFloat(all[i]) : Bf16ToFloat(all[i]);
      ASSERT_EQ(Bits(out[i]), Bits(s)) << std::hex << i;
    }
  }
  // Every 1021st fp32 pattern (NaNs, subnormals, ties included), the widened
  // fp16 values and their neighbours.
  std::vector<float> floats;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 1021) floats.push_back(FromBits(static_cast<uint32_t>(b)));
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t b = Bits(Fp16ToFloat(static_cast<uint16_t>(h)));
    for (uint32_t d : {0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) floats.push_back(FromBits(b + d));
  }
  for (auto convert : {ConvertFp32ToFp16, ConvertFp32ToBf16}) {
    ForEachPath([&] {
      std::vector<uint16_t> out(floats.size());
      convert(out.data(), floats.data(), floats.size());
      return out;
    });
    std::vector<uint16_t> out(floats.size());
    convert(out.data(), floats.data(), floats.size());
    for (size_t i = 0; i < floats.size(); ++i) {
      const uint16_t s = convert == ConvertFp32ToFp16 ? FloatToFp16(floats[i]) : FloatToBf16(floats[i]);
      ASSERT_EQ(out[i], s) << std::hexfloat << floats[i];
    }
  }
}

TEST(KernelPathTest, CopyInAddInCopyOutAllLengthsAndOffsets) {
  for (ElementType type : kTypes) {
    for (size_t n : kLengths) {
      for (size_t off : {0u, 1u, 2u, 3u}) {
        // Any bit pattern in a (NaNs of every payload), finite values in b:
        // one NaN per element, so even NaN results are bitwise identical.
        const auto a = RandomWire(n, type, off, 11 + n, true);
        const auto b = RandomWire(n, type, off, 12 + n);
        ForEachPath([&] {
          std::vector<float> acc(n + 1, 7.0f);  // the guard element must stay
          CopyIn(acc.data(), a.data() + off, n, type);
          AddIn(acc.data(), b.data() + off, n, type);
          std::vector<std::byte> out(off + n * ElementBytes(type) + 2, std::byte{0x5a});
          CopyOut(out.data() + off, acc.data(), n, type);
          std::vector<float> result = acc;
          for (std::byte x : out) result.push_back(static_cast<float>(x));
          return result;
        });
      }
    }
  }
}

// SumInto / AccumulateInto on every path equal CopyIn + AddIn... (portable).
TEST(KernelPathTest, SumIntoEqualsStepByStep) {
  for (ElementType type : kTypes) {
    for (size_t k : {1u, 2u, 3u, 5u, 8u}) {
      for (size_t n : kLengths) {
        std::vector<std::vector<std::byte>> wire;
        std::vector<const void*> inputs;
        for (size_t r = 0; r < k; ++r) wire.push_back(RandomWire(n, type, r % 4, 100 * k + r + n));
        for (size_t r = 0; r < k; ++r) inputs.push_back(wire[r].data() + r % 4);
        ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
        std::vector<float> want(n + 1, 3.0f), acc_want(n + 1, 0.5f);
        CopyIn(want.data(), inputs[0], n, type);
        for (size_t r = 1; r < k; ++r) AddIn(want.data(), inputs[r], n, type);
        for (size_t r = 0; r < k; ++r) AddIn(acc_want.data(), inputs[r], n, type);
        for (KernelPath p : kAllKernelPaths) {
          if (!ForceKernelPath(p)) continue;
          std::vector<float> got(n + 1, 3.0f), acc(n + 1, 0.5f);
          SumInto(got.data(), inputs, n, type);
          AccumulateInto(acc.data(), inputs, n, type);
          ASSERT_TRUE(SameBits(got, want)) << KernelPathName(p) << " k=" << k << " n=" << n;
          ASSERT_TRUE(SameBits(acc, acc_want)) << KernelPathName(p) << " k=" << k << " n=" << n;
        }
      }
    }
  }
  ResetKernelPath();
}

// Large enough for streaming stores (64-byte aligned output > 1 MiB).
TEST(KernelPathTest, SumIntoStreamingLargeOutput) {
  constexpr size_t kN = (1u << 18) + 37;
  std::vector<std::vector<std::byte>> wire;
  std::vector<const void*> inputs;
  for (size_t r = 0; r < 3; ++r) wire.push_back(RandomWire(kN, ElementType::kFp32, r, 900 + r));
  for (size_t r = 0; r < 3; ++r) inputs.push_back(wire[r].data() + r);
  std::vector<float> want(kN);
  ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
  CopyIn(want.data(), inputs[0], kN, ElementType::kFp32);
  for (size_t r = 1; r < 3; ++r) AddIn(want.data(), inputs[r], kN, ElementType::kFp32);
  float* out = static_cast<float*>(::operator new(kN * 4, std::align_val_t{64}));
  for (KernelPath p : kAllKernelPaths) {
    if (!ForceKernelPath(p)) continue;
    SumInto(out, inputs, kN, ElementType::kFp32);
    EXPECT_EQ(std::memcmp(out, want.data(), kN * 4), 0) << KernelPathName(p);
  }
  ::operator delete(out, std::align_val_t{64});
  ResetKernelPath();
}

OptimizerConfig PathConfig(OptimizerType type) {
  const bool momentum = type == OptimizerType::kMomentum || type == OptimizerType::kNesterov;
  return Make(type, 0.01, momentum ? 0.9 : 0.0, 0.01);
}

// ApplyOptimizer on every path, and SumAndApplyOptimizer (every path) equal to
// CopyIn + AddIn... + ApplyOptimizer on the portable path, state included.
TEST(KernelPathTest, FusedOptimizerEqualsStepByStep) {
  for (OptimizerType opt : kOptimizers) {
    const OptimizerConfig cfg = PathConfig(opt);
    for (ElementType type : kTypes) {
      for (size_t k : {1u, 3u, 4u}) {
        for (size_t n : {0u, 1u, 15u, 17u, 63u, 1027u, 5000u}) {
          std::vector<std::vector<std::byte>> wire;
          std::vector<const void*> inputs;
          for (size_t r = 0; r < k; ++r) wire.push_back(RandomWire(n, type, (r + 1) % 4, 7 * r + n));
          for (size_t r = 0; r < k; ++r) inputs.push_back(wire[r].data() + (r + 1) % 4);
          const std::vector<float> p_old = RandomFloats(n, 31 + n, true);
          std::vector<float> s0_init = RandomFloats(n, 32 + n), s1_init = RandomFloats(n, 33 + n);
          for (auto& x : s1_init) x = std::fabs(x);  // Adam's v >= 0
          if (opt == OptimizerType::kAdaGrad) s0_init = s1_init;
          const OptimizerStep step{0.25f, 3};
          auto run = [&](bool fused) {
            std::vector<float> s0 = s0_init, s1 = s1_init, out(n + 1, 9.0f);
            if (fused) {
              SumAndApplyOptimizer(cfg, step, inputs, p_old.data(), out.data(), s0.data(),
                                   s1.data(), n, type);
            } else {
              std::vector<float> sum(n);
              CopyIn(sum.data(), inputs[0], n, type);
              for (size_t r = 1; r < k; ++r) AddIn(sum.data(), inputs[r], n, type);
              ApplyOptimizer(cfg, step, sum.data(), p_old.data(), out.data(), s0.data(),
                             s1.data(), n);
            }
            out.insert(out.end(), s0.begin(), s0.end());
            out.insert(out.end(), s1.begin(), s1.end());
            return out;
          };
          ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
          const auto want = run(false);
          for (KernelPath p : kAllKernelPaths) {
            if (!ForceKernelPath(p)) continue;
            for (bool fused : {false, true}) {
              ASSERT_TRUE(SameBits(run(fused), want))
                  << KernelPathName(p) << " " << OptimizerTypeName(opt) << " "
                  << ElementTypeName(type) << " k=" << k << " n=" << n << " fused=" << fused;
            }
          }
        }
      }
    }
  }
  ResetKernelPath();
}

}  // namespace paths

}  // namespace
}  // namespace rackhub::aggregation
