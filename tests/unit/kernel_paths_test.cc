// Kernel paths (AVX-512 / AVX2 / portable): every path available on this
// machine gives the portable path's bits, for every kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "kernel_test_util.h"

namespace rackhub::aggregation {
namespace {

using testing::Encode;
using testing::Make;

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

// The vector paths (AVX2, AVX-512) this host can run: what ForEachPath
// compares with the portable path. None on a host without AVX2.
int VectorPathsHere() {
  int n = 0;
  for (KernelPath p : kAllKernelPaths) n += p != KernelPath::kPortable && KernelPathAvailable(p);
  return n;
}
constexpr const char* kNoVectorPath =
    "only the portable kernel path runs on this host (no AVX2 / AVX-512): no other path to "
    "compare with it";

// Runs fn() on the portable path, then on every vector path available here,
// and checks each vector path's result against the portable one (the portable
// path is not compared with itself). Tests that check nothing else skip first
// when VectorPathsHere() is 0.
template <typename Fn>
void ForEachPath(Fn fn) {
  ASSERT_TRUE(ForceKernelPath(KernelPath::kPortable));
  const auto want = fn();
  for (KernelPath p : kAllKernelPaths) {
    if (p == KernelPath::kPortable || !ForceKernelPath(p)) continue;
    EXPECT_TRUE(SameBits(fn(), want)) << KernelPathName(p);
  }
  ResetKernelPath();
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

// Vector paths against the portable one (none on a host without AVX2: then
// only the bulk conversions against the scalar inline ones are checked).
TEST(KernelPathTest, ConversionsOfAll16BitPatternsAndManyFloats) {
  if (VectorPathsHere() == 0) std::printf("%s; checking against the scalar conversions only\n", kNoVectorPath);
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
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(s)) << std::hex << i;
    }
  }
  // Every 1021st fp32 pattern (NaNs, subnormals, ties included), the widened
  // fp16 values and their neighbours.
  std::vector<float> floats;
  for (uint64_t b = 0; b <= 0xffffffffu; b += 1021) floats.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t b = std::bit_cast<uint32_t>(Fp16ToFloat(static_cast<uint16_t>(h)));
    for (uint32_t d : {0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) floats.push_back(std::bit_cast<float>(b + d));
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
  if (VectorPathsHere() == 0) GTEST_SKIP() << kNoVectorPath;
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
