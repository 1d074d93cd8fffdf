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
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "kernel_test_util.h"

namespace rackhub::aggregation {
namespace {

using testing::Encode;
using testing::Make;

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

// Zero elements with null arrays (an empty std::vector's data()), as an
// empty payload reaches them: no memcpy/memset of null (UBSan in the
// sanitizer build; found by fuzz/frame/frame_fuzz).
// n = 0 on every kernel path: null pointers are accepted (never dereferenced;
// in build-asan UBSan's null checks would also fire), and with real buffers
// nothing is read into or written out of them (sentinels unchanged).
TEST(KernelsTest, ZeroElementsMayBeNull) {
  int paths = 0;
  for (KernelPath p : kAllKernelPaths) {
    if (!ForceKernelPath(p)) continue;
    ++paths;
    ConvertFp16ToFp32(nullptr, nullptr, 0);
    ConvertFp32ToFp16(nullptr, nullptr, 0);
    ConvertBf16ToFp32(nullptr, nullptr, 0);
    ConvertFp32ToBf16(nullptr, nullptr, 0);
    for (ElementType t : {ElementType::kFp32, ElementType::kFp16, ElementType::kBf16}) {
      CopyIn(nullptr, nullptr, 0, t);
      AddIn(nullptr, nullptr, 0, t);
      CopyOut(nullptr, nullptr, 0, t);
      SumInto(nullptr, {}, 0, t);
      AccumulateInto(nullptr, {}, 0, t);
      const void* const null_in[1] = {nullptr};
      SumInto(nullptr, null_in, 0, t);
      AccumulateInto(nullptr, null_in, 0, t);

      float acc[2] = {7.0f, -3.0f};
      unsigned char wire[8];
      std::memset(wire, 0x5a, sizeof wire);
      const void* const in[2] = {wire, wire};
      CopyIn(acc, wire, 0, t);
      AddIn(acc, wire, 0, t);
      SumInto(acc, in, 0, t);
      AccumulateInto(acc, in, 0, t);
      EXPECT_EQ(std::bit_cast<uint32_t>(acc[0]), std::bit_cast<uint32_t>(7.0f))
          << KernelPathName(p) << " " << ElementTypeName(t);
      EXPECT_EQ(std::bit_cast<uint32_t>(acc[1]), std::bit_cast<uint32_t>(-3.0f))
          << KernelPathName(p) << " " << ElementTypeName(t);
      CopyOut(wire, acc, 0, t);
      for (unsigned char b : wire) EXPECT_EQ(b, 0x5a) << KernelPathName(p) << " " << ElementTypeName(t);
    }
  }
  ResetKernelPath();
  EXPECT_GE(paths, 1) << "not even the portable kernel path could be forced";
}

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

// ---- Element-wise min / max / product (ReduceInto, ReduceAccumulateInto) ----

// The reference, written from the definition in kernels.h: the first NaN in
// rank order wins (bits kept); otherwise the smaller (larger) value, -0
// below +0; product is the fp32 product in rank order.
float RefMin(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? a : b;  // equal values, or the two zeros
  return a < b ? a : b;
}
float RefMax(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
float RefCombine(Reduction r, float a, float b) {
  switch (r) {
    case Reduction::kMin: return RefMin(a, b);
    case Reduction::kMax: return RefMax(a, b);
    default: return a * b;
  }
}

// A value of `type` as fp32, widened independently of the kernels: fp32
// bits as they are, bf16 into the upper half, fp16 by the binary16
// definition (RefFp16Value; a NaN keeps sign and payload and is made quiet,
// as kernels.h specifies).
float RefWiden(const std::byte* p, ElementType type) {
  if (type == ElementType::kFp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (type == ElementType::kBf16) return FromBits(static_cast<uint32_t>(h) << 16);
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0) {  // NaN
    return FromBits((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u |
                    (static_cast<uint32_t>(h & 0x03ffu) << 13));
  }
  return static_cast<float>(RefFp16Value(h));
}

// Values meant to hit every rule: NaNs of several payloads and both signs,
// both zeros, both infinities, subnormals, ties (equal values from several
// ranks), ordinary numbers exact in every type. All are exact in fp16 and
// bf16 except the NaN payloads and the fp32 subnormal, which the fp16/bf16
// encodings round (the reference reads back the encoded bits, whatever they are).
std::vector<float> SpecialValues(size_t n, unsigned seed) {
  const float kPick[] = {FromBits(0x7fc00001u), FromBits(0xffc12345u), FromBits(0x7f800001u),
                         0.0f,  -0.0f, std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(), 0x1p-130f, -0x1p-20f,
                         1.5f, -1.5f, 2.0f, -0.5f, 3.0f, 0.25f, -7.0f, 1.0f};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 99), which(0, sizeof kPick / sizeof kPick[0] - 1);
  std::uniform_int_distribution<int> small(-16, 16);
  std::vector<float> v(n);
  for (auto& x : v) {
    // Mostly small integers and halves (products stay exact for a while),
    // one in four a special value.
    x = pick(rng) < 25 ? kPick[which(rng)] : static_cast<float>(small(rng)) * 0.5f;
  }
  return v;
}

struct ReduceCase {
  Reduction reduction;
  ElementType type;
};

class ElementwiseReductionTest : public ::testing::TestWithParam<ReduceCase> {};

// Every kernel path this CPU has, every length (vector bodies, tails),
// every byte offset of the inputs, 1 to 9 inputs (the fixed-count loops and
// the runtime-count one): bitwise equal to the scalar reference, for
// ReduceInto and for ReduceAccumulateInto onto an accumulator of special
// values too. For the product a result the reference finds NaN only needs to
// be a NaN (two NaNs meeting in a multiplication, kernels.h); min and max
// are compared bit for bit, NaN payloads included.
TEST_P(ElementwiseReductionTest, MatchesScalarReferenceOnEveryPath) {
  const auto [reduction, type] = GetParam();
  const size_t bytes = ElementBytes(type);
  int paths = 0;
  for (KernelPath path : kAllKernelPaths) {
    if (!ForceKernelPath(path)) continue;
    ++paths;
    for (size_t k : {1u, 2u, 3u, 4u, 5u, 9u}) {
      for (size_t n : {0u, 1u, 3u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 100u,
                       1023u, 1024u, 1025u, 4099u}) {
        const size_t offset = (k + n) % 4;
        std::vector<std::vector<std::byte>> wire;
        std::vector<const void*> inputs;
        for (size_t r = 0; r < k; ++r) {
          wire.push_back(Encode(SpecialValues(n, static_cast<unsigned>(1000 * k + 10 * r + n)),
                                type, offset));
        }
        for (size_t r = 0; r < k; ++r) inputs.push_back(wire[r].data() + offset);
        const std::vector<float> acc0 = SpecialValues(n, static_cast<unsigned>(7 + n));

        std::vector<float> got(n + 1, 42.0f), acc(acc0);
        acc.push_back(42.0f);  // guards: must stay
        ReduceInto(got.data(), inputs, n, type, reduction);
        ReduceAccumulateInto(acc.data(), inputs, n, type, reduction);
        for (size_t i = 0; i < n; ++i) {
          float want = RefWiden(wire[0].data() + offset + i * bytes, type);
          float want_acc = RefCombine(reduction, acc0[i], want);
          for (size_t r = 1; r < k; ++r) {
            const float x = RefWiden(wire[r].data() + offset + i * bytes, type);
            want = RefCombine(reduction, want, x);
            want_acc = RefCombine(reduction, want_acc, x);
          }
          for (const auto& [g, w, what] : {std::tuple{got[i], want, "ReduceInto"},
                                          std::tuple{acc[i], want_acc, "ReduceAccumulateInto"}}) {
            if (reduction == Reduction::kProduct && std::isnan(w)) {
              ASSERT_TRUE(std::isnan(g)) << what << " " << KernelPathName(path) << " k=" << k
                                         << " n=" << n << " i=" << i;
            } else {
              ASSERT_EQ(Bits(g), Bits(w))
                  << what << " " << KernelPathName(path) << " " << ReductionName(reduction)
                  << " " << ElementTypeName(type) << " k=" << k << " n=" << n << " i=" << i
                  << std::hexfloat << " got " << g << " want " << w;
            }
          }
        }
        ASSERT_EQ(got[n], 42.0f) << "wrote past the end";
        ASSERT_EQ(acc[n], 42.0f) << "wrote past the end";
      }
    }
  }
  ResetKernelPath();
  EXPECT_GE(paths, 1);
}

INSTANTIATE_TEST_SUITE_P(
    AllReductionsAndTypes, ElementwiseReductionTest,
    ::testing::Values(ReduceCase{Reduction::kMin, ElementType::kFp32},
                      ReduceCase{Reduction::kMin, ElementType::kFp16},
                      ReduceCase{Reduction::kMin, ElementType::kBf16},
                      ReduceCase{Reduction::kMax, ElementType::kFp32},
                      ReduceCase{Reduction::kMax, ElementType::kFp16},
                      ReduceCase{Reduction::kMax, ElementType::kBf16},
                      ReduceCase{Reduction::kProduct, ElementType::kFp32},
                      ReduceCase{Reduction::kProduct, ElementType::kFp16},
                      ReduceCase{Reduction::kProduct, ElementType::kBf16}),
    [](const auto& info) {
      return std::string(ReductionName(info.param.reduction)) + "_" +
             ElementTypeName(info.param.type);
    });

// The rules, spelled out on single elements (first operand = lower rank).
TEST(KernelsTest, MinMaxNaNAndSignedZeroRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan1 = FromBits(0x7fc00001u), nan2 = FromBits(0xffc00002u);
  const float snan = FromBits(0x7f800001u);  // signaling: kept as it is, not quieted
  struct Row {
    float a, b;
    uint32_t min, max;
  } rows[] = {
      {0.0f, -0.0f, Bits(-0.0f), Bits(0.0f)},   {-0.0f, 0.0f, Bits(-0.0f), Bits(0.0f)},
      {1.0f, nan1, Bits(nan1), Bits(nan1)},     {nan1, 1.0f, Bits(nan1), Bits(nan1)},
      {nan2, nan1, Bits(nan2), Bits(nan2)},     {nan1, nan2, Bits(nan1), Bits(nan1)},
      {snan, 2.0f, Bits(snan), Bits(snan)},     {-inf, inf, Bits(-inf), Bits(inf)},
      {3.0f, -2.0f, Bits(-2.0f), Bits(3.0f)},   {0x1p-140f, 0.0f, Bits(0.0f), Bits(0x1p-140f)},
  };
  for (KernelPath path : kAllKernelPaths) {
    if (!ForceKernelPath(path)) continue;
    for (const Row& r : rows) {
      // 40 copies: the vector body and the scalar tail both see the pair.
      std::vector<float> a(40, r.a), b(40, r.b), out(40);
      const void* const in[2] = {a.data(), b.data()};
      for (auto [red, want] : {std::pair{Reduction::kMin, r.min}, std::pair{Reduction::kMax, r.max}}) {
        ReduceInto(out.data(), in, out.size(), ElementType::kFp32, red);
        for (float o : out) {
          ASSERT_EQ(Bits(o), want) << KernelPathName(path) << " " << ReductionName(red) << " of "
                                   << std::hexfloat << r.a << ", " << r.b;
        }
      }
    }
    // Product: IEEE, -0 * 5 = -0, inf * 0 = NaN.
    std::vector<float> a = {-0.0f, inf, 3.0f, -2.0f}, b = {5.0f, 0.0f, 0.5f, -inf}, out(4);
    const void* const in[2] = {a.data(), b.data()};
    ReduceInto(out.data(), in, 4, ElementType::kFp32, Reduction::kProduct);
    EXPECT_EQ(Bits(out[0]), Bits(-0.0f));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(out[2], 1.5f);
    EXPECT_EQ(out[3], inf);
  }
  ResetKernelPath();
}

// An empty input list gives the reduction's identity; kSum/kMean are the sum.
TEST(KernelsTest, ReduceIntoIdentitiesAndSumDelegation) {
  float out[3] = {5, 5, 5};
  ReduceInto(out, {}, 3, ElementType::kFp32, Reduction::kMin);
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());
  ReduceInto(out, {}, 3, ElementType::kFp32, Reduction::kMax);
  EXPECT_EQ(out[0], -std::numeric_limits<float>::infinity());
  ReduceInto(out, {}, 3, ElementType::kFp32, Reduction::kProduct);
  EXPECT_EQ(out[1], 1.0f);
  const float a[3] = {1, 2, 3}, b[3] = {0.5f, -4, 8};
  const void* const in[2] = {a, b};
  ReduceInto(out, in, 3, ElementType::kFp32, Reduction::kSum);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  ReduceAccumulateInto(out, in, 3, ElementType::kFp32, Reduction::kMean);
  EXPECT_EQ(out[2], 11.0f + 11.0f);
}

TEST(KernelsTest, ElementwiseReductionsNeedSumOnly) {
  for (Reduction r : {Reduction::kMin, Reduction::kMax, Reduction::kProduct}) {
    OptimizerConfig c;
    c.type = OptimizerType::kSgd;
    c.learning_rate = 0.1;
    c.reduction = r;
    const Status s = NormalizeOptimizer(&c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("reduction: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("sum-only"), std::string::npos) << s.message();
    OptimizerConfig ok{OptimizerType::kSumOnly, 0};
    ok.reduction = r;
    EXPECT_TRUE(NormalizeOptimizer(&ok).ok()) << ReductionName(r);
  }
  OptimizerConfig bad{OptimizerType::kSumOnly, 0};
  bad.reduction = static_cast<Reduction>(6);
  const Status s = NormalizeOptimizer(&bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("reduction: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace rackhub::aggregation
