// Unit tests for the chunk layout and optimizer validation of
// rackhub_aggregation.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "rackhub/aggregation/chunk_layout.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {
namespace {

// 1 KiB chunks hold 256 fp32 elements.
constexpr uint32_t kSmallChunk = 1024;
constexpr uint64_t kPer = kSmallChunk / kMasterElementBytes;

TEST(ChunkLayoutTest, AccessorsReflectConstruction) {
  ChunkLayout layout(kDefaultChunkBytes, 3);
  EXPECT_EQ(layout.chunk_bytes(), kDefaultChunkBytes);
  EXPECT_EQ(layout.chunk_elements(), kDefaultChunkBytes / 4);
  EXPECT_EQ(layout.lanes(), 3u);
  EXPECT_EQ(layout.next_chunk(), 0u);
}

TEST(ChunkLayoutTest, ChunksForExactMultiple) {
  ChunkLayout layout(kSmallChunk, 2);
  EXPECT_EQ(layout.ChunksFor(kPer), 1u);
  EXPECT_EQ(layout.ChunksFor(2 * kPer), 2u);
  EXPECT_EQ(layout.ChunksFor(100 * kPer), 100u);
}

TEST(ChunkLayoutTest, ChunksForRemainderRoundsUp) {
  ChunkLayout layout(kSmallChunk, 2);
  EXPECT_EQ(layout.ChunksFor(kPer + 1), 2u);
  EXPECT_EQ(layout.ChunksFor(2 * kPer - 1), 2u);
  EXPECT_EQ(layout.ChunksFor(2 * kPer + 1), 3u);
}

TEST(ChunkLayoutTest, ChunksForOneElementAndZero) {
  ChunkLayout layout(kSmallChunk, 2);
  EXPECT_EQ(layout.ChunksFor(1), 1u);
  EXPECT_EQ(layout.ChunksFor(0), 0u);
}

TEST(ChunkLayoutTest, ChunksForHugeCountsDoesNotOverflow) {
  ChunkLayout layout(kSmallChunk, 2);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  // ceil(max / 256) == max / 256 + 1 since max is not a multiple of 256.
  EXPECT_EQ(layout.ChunksFor(max), max / kPer + 1);
  EXPECT_EQ(layout.ChunksFor(max - kPer + 2), max / kPer + 1);
}

TEST(ChunkLayoutTest, AllocateGivesConsecutiveRanges) {
  ChunkLayout layout(kSmallChunk, 4);
  const KeyPlacement a = layout.Allocate(3 * kPer);   // 3 chunks
  const KeyPlacement b = layout.Allocate(1);          // 1 chunk
  const KeyPlacement c = layout.Allocate(kPer + 10);  // 2 chunks
  EXPECT_EQ(a.first_chunk, 0u);
  EXPECT_EQ(a.chunk_count, 3u);
  EXPECT_EQ(b.first_chunk, 3u);
  EXPECT_EQ(b.chunk_count, 1u);
  EXPECT_EQ(c.first_chunk, 4u);
  EXPECT_EQ(c.chunk_count, 2u);
  EXPECT_EQ(layout.next_chunk(), 6u);
}

TEST(ChunkLayoutTest, LaneOfIsIndexModuloLanes) {
  ChunkLayout one(kSmallChunk, 1);
  ChunkLayout three(kSmallChunk, 3);
  for (uint64_t g = 0; g < 20; ++g) {
    EXPECT_EQ(one.LaneOf(g), 0u) << g;
    EXPECT_EQ(three.LaneOf(g), g % 3) << g;
  }
  EXPECT_EQ(three.LaneOf((1ull << 40) + 1), ((1ull << 40) + 1) % 3);
}

TEST(ChunkLayoutTest, ChunksCoverKeyWithShortLastChunk) {
  ChunkLayout layout(kSmallChunk, 3);
  layout.Allocate(kPer);  // occupies chunk 0, so the next key starts at 1
  const uint64_t elements = 2 * kPer + 7;
  const KeyPlacement p = layout.Allocate(elements);
  ASSERT_EQ(p.first_chunk, 1u);
  ASSERT_EQ(p.chunk_count, 3u);

  const auto spans = layout.Chunks(p, elements);
  ASSERT_EQ(spans.size(), 3u);
  uint64_t covered = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].index, 1 + i);
    EXPECT_EQ(spans[i].lane, (1 + i) % 3);
    EXPECT_EQ(spans[i].first_element, i * kPer);
    covered += spans[i].elements;
  }
  EXPECT_EQ(spans[0].elements, kPer);
  EXPECT_EQ(spans[1].elements, kPer);
  EXPECT_EQ(spans[2].elements, 7u);
  EXPECT_EQ(covered, elements);
}

TEST(ChunkLayoutTest, ChunksOfExactMultipleAreAllFull) {
  ChunkLayout layout(kSmallChunk, 2);
  const KeyPlacement p = layout.Allocate(4 * kPer);
  const auto spans = layout.Chunks(p, 4 * kPer);
  ASSERT_EQ(spans.size(), 4u);
  for (const auto& s : spans) EXPECT_EQ(s.elements, kPer);
  EXPECT_EQ(spans.back().first_element, 3 * kPer);
}

TEST(ChunkLayoutTest, ChunksOfSingleElementKey) {
  ChunkLayout layout(kSmallChunk, 2);
  const KeyPlacement p = layout.Allocate(1);
  const auto spans = layout.Chunks(p, 1);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].index, 0u);
  EXPECT_EQ(spans[0].lane, 0u);
  EXPECT_EQ(spans[0].first_element, 0u);
  EXPECT_EQ(spans[0].elements, 1u);
}

TEST(ChunkLayoutTest, IsValidChunkBytesBoundsAndAlignment) {
  EXPECT_TRUE(ChunkLayout::IsValidChunkBytes(kMinChunkBytes));
  EXPECT_TRUE(ChunkLayout::IsValidChunkBytes(kMaxChunkBytes));
  EXPECT_TRUE(ChunkLayout::IsValidChunkBytes(kDefaultChunkBytes));
  EXPECT_TRUE(ChunkLayout::IsValidChunkBytes(kMinChunkBytes + kChunkAlignment));

  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(0));
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(kMinChunkBytes - kChunkAlignment));  // aligned, small
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(kMinChunkBytes - 1));
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(kMinChunkBytes + 32));  // misaligned
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(kDefaultChunkBytes + 1));
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(uint64_t{kMaxChunkBytes} + kChunkAlignment));
  EXPECT_FALSE(ChunkLayout::IsValidChunkBytes(1ull << 40));
}

TEST(ChunkLayoutDeathTest, InvalidConstructionAborts) {
  EXPECT_DEATH(ChunkLayout(1000, 2), "invalid chunk_bytes");
  EXPECT_DEATH(ChunkLayout(kSmallChunk, 0), "lanes=0");
}

// ---------------------------------------------------------------------------
// NormalizeOptimizer

OptimizerConfig Make(OptimizerType type, double lr = 0.01) {
  OptimizerConfig c;
  c.type = type;
  c.learning_rate = lr;
  return c;
}

// The error is INVALID_ARGUMENT and names the field first: "<field>: <reason>".
void ExpectField(OptimizerConfig c, const std::string& field) {
  const Status s = NormalizeOptimizer(&c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message().rfind(field + ": ", 0), 0u)
      << "expected error for " << field << ", got '" << s.ToString() << "'";
}

TEST(NormalizeOptimizerTest, PlainSgdIsValidAndUnchanged) {
  OptimizerConfig c = Make(OptimizerType::kSgd, 0.1);
  const OptimizerConfig before = c;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  EXPECT_EQ(c, before);
}

TEST(NormalizeOptimizerTest, AdamDefaultsAreFilled) {
  for (OptimizerType t : {OptimizerType::kAdam, OptimizerType::kAdamW}) {
    OptimizerConfig c = Make(t, 1e-3);
    EXPECT_TRUE(NormalizeOptimizer(&c).ok());
    EXPECT_DOUBLE_EQ(c.beta1, 0.9);
    EXPECT_DOUBLE_EQ(c.beta2, 0.999);
    EXPECT_DOUBLE_EQ(c.epsilon, 1e-8);
    EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  }
}

TEST(NormalizeOptimizerTest, AdamExplicitValuesAreKept) {
  OptimizerConfig c = Make(OptimizerType::kAdam);
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.epsilon = 1e-6;
  c.weight_decay = 0.01;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  EXPECT_DOUBLE_EQ(c.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(c.weight_decay, 0.01);
}

TEST(NormalizeOptimizerTest, AdaGradEpsilonDefault) {
  OptimizerConfig c = Make(OptimizerType::kAdaGrad);
  c.initial_accumulator = 0.1;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
  EXPECT_DOUBLE_EQ(c.epsilon, 1e-10);
  EXPECT_DOUBLE_EQ(c.initial_accumulator, 0.1);
  EXPECT_DOUBLE_EQ(c.beta1, 0);
}

TEST(NormalizeOptimizerTest, MomentumAndNesterovAcceptValidMomentum) {
  for (OptimizerType t : {OptimizerType::kMomentum, OptimizerType::kNesterov}) {
    OptimizerConfig c = Make(t);
    c.momentum = 0.9;
    EXPECT_TRUE(NormalizeOptimizer(&c).ok()) << OptimizerTypeName(t);
  }
}

TEST(NormalizeOptimizerTest, SumOnlyWithAllZeroIsValid) {
  OptimizerConfig c = Make(OptimizerType::kSumOnly, 0);
  c.reduction = Reduction::kSum;
  EXPECT_TRUE(NormalizeOptimizer(&c).ok());
}

TEST(NormalizeOptimizerTest, LearningRateMustBePositive) {
  ExpectField(Make(OptimizerType::kSgd, 0), "learning_rate");
  ExpectField(Make(OptimizerType::kSgd, -0.1), "learning_rate");
  ExpectField(Make(OptimizerType::kAdam, 0), "learning_rate");
}

TEST(NormalizeOptimizerTest, NonFiniteValuesAreRejectedByName) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  ExpectField(Make(OptimizerType::kSgd, nan), "learning_rate");
  ExpectField(Make(OptimizerType::kSgd, inf), "learning_rate");
  OptimizerConfig c = Make(OptimizerType::kMomentum);
  c.momentum = nan;
  ExpectField(c, "momentum");
  c = Make(OptimizerType::kAdam);
  c.beta2 = nan;
  ExpectField(c, "beta2");
  c = Make(OptimizerType::kSgd);
  c.weight_decay = -inf;
  ExpectField(c, "weight_decay");
}

TEST(NormalizeOptimizerTest, MomentumOutOfRange) {
  for (OptimizerType t : {OptimizerType::kMomentum, OptimizerType::kNesterov}) {
    for (double m : {0.0, 1.0, 1.5, -0.1}) {
      OptimizerConfig c = Make(t);
      c.momentum = m;
      SCOPED_TRACE(std::string(OptimizerTypeName(t)) + " momentum=" + std::to_string(m));
      ExpectField(c, "momentum");
    }
  }
}

TEST(NormalizeOptimizerTest, MomentumOnSgdOrAdamIsRejected) {
  OptimizerConfig c = Make(OptimizerType::kSgd);
  c.momentum = 0.9;
  ExpectField(c, "momentum");
  c = Make(OptimizerType::kAdam);
  c.momentum = 0.5;
  ExpectField(c, "momentum");
}

TEST(NormalizeOptimizerTest, BetaOutOfRange) {
  OptimizerConfig c = Make(OptimizerType::kAdam);
  c.beta1 = 1.0;
  ExpectField(c, "beta1");
  c = Make(OptimizerType::kAdam);
  c.beta1 = -0.5;
  ExpectField(c, "beta1");
  c = Make(OptimizerType::kAdamW);
  c.beta2 = 1.2;
  ExpectField(c, "beta2");
}

TEST(NormalizeOptimizerTest, BetaOnNonAdamIsRejected) {
  OptimizerConfig c = Make(OptimizerType::kSgd);
  c.beta1 = 0.9;
  ExpectField(c, "beta1");
  c = Make(OptimizerType::kAdaGrad);
  c.beta2 = 0.9;
  ExpectField(c, "beta2");
}

TEST(NormalizeOptimizerTest, NegativeWeightDecay) {
  for (OptimizerType t : {OptimizerType::kSgd, OptimizerType::kAdamW, OptimizerType::kAdaGrad}) {
    OptimizerConfig c = Make(t);
    c.weight_decay = -0.01;
    SCOPED_TRACE(OptimizerTypeName(t));
    ExpectField(c, "weight_decay");
  }
}

TEST(NormalizeOptimizerTest, EpsilonRules) {
  OptimizerConfig c = Make(OptimizerType::kAdam);
  c.epsilon = -1e-8;
  ExpectField(c, "epsilon");
  c = Make(OptimizerType::kSgd);
  c.epsilon = 1e-8;
  ExpectField(c, "epsilon");
}

TEST(NormalizeOptimizerTest, InitialAccumulatorRules) {
  OptimizerConfig c = Make(OptimizerType::kAdaGrad);
  c.initial_accumulator = -1;
  ExpectField(c, "initial_accumulator");
  c = Make(OptimizerType::kSgd);
  c.initial_accumulator = 0.1;
  ExpectField(c, "initial_accumulator");
}

TEST(NormalizeOptimizerTest, SumOnlyRejectsLearningRateAndOtherFields) {
  ExpectField(Make(OptimizerType::kSumOnly, 0.01), "learning_rate");
  OptimizerConfig c = Make(OptimizerType::kSumOnly, 0);
  c.weight_decay = 0.1;
  ExpectField(c, "weight_decay");
}

TEST(NormalizeOptimizerTest, UnknownReductionIsRejected) {
  OptimizerConfig c = Make(OptimizerType::kSgd);
  c.reduction = static_cast<Reduction>(9);
  ExpectField(c, "reduction");
}

TEST(NormalizeOptimizerTest, FailureDoesNotReportLaterFields) {
  // Only the first bad field is reported.
  OptimizerConfig c = Make(OptimizerType::kSgd, -1);
  c.weight_decay = -1;
  c.momentum = 0.5;
  OptimizerConfig copy = c;
  EXPECT_EQ(NormalizeOptimizer(&copy).message().rfind("learning_rate: ", 0), 0u);
}

TEST(OptimizerTypeTest, NamesAndStateSlots) {
  EXPECT_STREQ(OptimizerTypeName(OptimizerType::kSgd), "sgd");
  EXPECT_STREQ(OptimizerTypeName(OptimizerType::kNesterov), "nesterov");
  EXPECT_STREQ(OptimizerTypeName(OptimizerType::kAdamW), "adamw");
  EXPECT_STREQ(OptimizerTypeName(OptimizerType::kSumOnly), "sum-only");
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kSgd), 0);
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kSumOnly), 0);
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kMomentum), 1);
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kAdaGrad), 1);
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kAdam), 2);
  EXPECT_EQ(OptimizerStateSlots(OptimizerType::kAdamW), 2);
}

}  // namespace
}  // namespace rackhub::aggregation
