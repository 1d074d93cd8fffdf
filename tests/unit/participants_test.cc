// Participant sets (a key whose updates sum a subset of the workers: the
// keys of a Horovod process set, docs/pytorch.md): the registry's checks of
// the set (range, order, tenants that cannot keep one), a declaration of an
// existing key with another set refused, and the chunk part: a ChunkState
// given the set's members sums them in rank order, divides a mean by their
// count and refuses the others' contributions.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "rackhub/aggregation/chunk_state.h"
#include "registry.h"

namespace rackhub::server {
namespace {

using aggregation::ChunkState;
using aggregation::ElementType;
using aggregation::OptimizerConfig;
using aggregation::OptimizerType;
using aggregation::Reduction;

class ParticipantsRegistryTest : public ::testing::Test {
 protected:
  void MakeTenant(const std::string& name, bool elastic = false,
                  Consistency consistency = Consistency::kSync) {
    TenantSpec s;
    s.name = name;
    s.workers_per_rack = 4;
    s.chunk_bytes = 1024;
    s.elastic = elastic;
    if (elastic) {
      s.min_workers = 2;
      s.quotas.max_workers = 8;
    }
    s.consistency = consistency;
    if (consistency == Consistency::kBounded) s.staleness = 2;
    TenantInfo info;
    std::string token;
    const Status st = r_.CreateTenant(s, &info, &token);
    ASSERT_TRUE(st.ok()) << st.message();
  }

  static KeySpec Key(const std::string& tenant, const std::string& name,
                     std::vector<uint32_t> participants) {
    KeySpec k;
    k.tenant = tenant;
    k.name = name;
    k.elements = 300;
    k.participants = std::move(participants);
    return k;
  }

  // The message of a refused declaration ("" if it was accepted).
  std::string Refusal(const KeySpec& spec) {
    KeyInfo info;
    bool created = false;
    const Status s = r_.DeclareKey(spec, &info, &created);
    if (s.ok()) return "";
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    return s.message();
  }

  Registry r_{/*lanes=*/2, TenantDefaults{}};
};

TEST_F(ParticipantsRegistryTest, ASetIsPartOfTheKey) {
  MakeTenant("t");
  KeyInfo info;
  bool created = false;
  ASSERT_TRUE(r_.DeclareKey(Key("t", "a", {0, 2}), &info, &created).ok());
  EXPECT_TRUE(created);
  EXPECT_EQ(info.participants, (std::vector<uint32_t>{0, 2}));
  // The same set finds it; another set, or none, is refused naming both.
  ASSERT_TRUE(r_.DeclareKey(Key("t", "a", {0, 2}), &info, &created).ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(Refusal(Key("t", "a", {0, 3})),
            "participants: key 'a' already exists with participants [0,2], not with "
            "participants [0,3]");
  EXPECT_EQ(Refusal(Key("t", "a", {})),
            "participants: key 'a' already exists with participants [0,2], not summing every "
            "worker");
  // A key of every worker is not one of a set.
  ASSERT_TRUE(r_.DeclareKey(Key("t", "all", {}), &info, &created).ok());
  EXPECT_TRUE(info.participants.empty());
  EXPECT_NE(Refusal(Key("t", "all", {1})).find("summing every worker, not with participants [1]"),
            std::string::npos);
}

TEST_F(ParticipantsRegistryTest, BadSetsAreRefusedByName) {
  MakeTenant("t");
  EXPECT_EQ(Refusal(Key("t", "k", {1, 4})),
            "participants: rank 4 of key 'k' is out of range: tenant 't' has 4 workers");
  EXPECT_EQ(Refusal(Key("t", "k", {1, 1})),
            "participants: the ranks of key 'k' must be strictly ascending (no duplicates), "
            "got 1 then 1");
  EXPECT_EQ(Refusal(Key("t", "k", {2, 0})),
            "participants: the ranks of key 'k' must be strictly ascending (no duplicates), "
            "got 2 then 0");
  KeySpec table = Key("t", "table", {0, 1});
  table.elements = 0;
  table.rows = 10;
  table.dim = 4;
  EXPECT_NE(Refusal(table).find("participants: row-sparse tables sum every worker's rows"),
            std::string::npos);
  MakeTenant("e", /*elastic=*/true);
  EXPECT_NE(Refusal(Key("e", "k", {0, 1})).find("participants: tenant 'e' is elastic"),
            std::string::npos);
  MakeTenant("b", false, Consistency::kBounded);
  EXPECT_NE(Refusal(Key("b", "k", {0, 1})).find("participants: a participant set needs a sync "
                                                "tenant; tenant 'b' is"),
            std::string::npos);
  // Nothing was created by the refusals.
  std::vector<KeyInfo> keys;
  ASSERT_TRUE(r_.ListKeys("t", &keys).ok());
  EXPECT_TRUE(keys.empty());
}

// The chunk part: what the lanes do with a participant key's chunk
// (ChunkTable::GetChunk gives it the set as its members).
std::span<const std::byte> Bytes(const std::vector<float>& v) {
  return std::as_bytes(std::span<const float>(v));
}

TEST(ParticipantsChunkTest, ASetSumsItsMembersInRankOrderAndRefusesTheOthers) {
  OptimizerConfig sum_only;
  sum_only.type = OptimizerType::kSumOnly;
  sum_only.learning_rate = 0;
  sum_only.reduction = Reduction::kMean;
  ASSERT_TRUE(aggregation::NormalizeOptimizer(&sum_only).ok());
  constexpr uint32_t kN = 64;
  // Two disjoint sets of a 4-worker tenant, as two keys' chunks.
  ChunkState a(kN, 4, sum_only, ElementType::kFp32), b(kN, 4, sum_only, ElementType::kFp32);
  const std::vector<uint8_t> set_a = {1, 0, 1, 1}, set_b = {0, 1, 0, 0};
  ASSERT_TRUE(a.SetMembers(set_a));
  ASSERT_TRUE(b.SetMembers(set_b));
  EXPECT_EQ(a.expected(), 3u);
  EXPECT_EQ(b.expected(), 1u);
  std::vector<std::vector<float>> in(4, std::vector<float>(kN));
  for (uint32_t r = 0; r < 4; ++r) {
    for (uint32_t i = 0; i < kN; ++i) in[r][i] = 1.0f / static_cast<float>(3 + r + i) * (r + 1);
  }
  EXPECT_EQ(a.Contribute(1, Bytes(in[1])), ChunkState::AddResult::kNotMember);
  EXPECT_EQ(b.Contribute(0, Bytes(in[0])), ChunkState::AddResult::kNotMember);
  // Arrival order 3, 0, 2: the sum is still ((in0 + in2) + in3).
  EXPECT_EQ(a.Contribute(3, Bytes(in[3])), ChunkState::AddResult::kAccepted);
  EXPECT_EQ(b.Contribute(1, Bytes(in[1])), ChunkState::AddResult::kComplete);
  EXPECT_EQ(a.Contribute(0, Bytes(in[0])), ChunkState::AddResult::kAccepted);
  EXPECT_EQ(a.Contribute(2, Bytes(in[2])), ChunkState::AddResult::kComplete);
  a.Update();
  b.Update();
  const float third = static_cast<float>(1.0 / 3);
  for (uint32_t i = 0; i < kN; ++i) {
    const float want_a = ((in[0][i] + in[2][i]) + in[3][i]) * third;
    EXPECT_EQ(a.params(1)[i], want_a) << i;
    EXPECT_EQ(b.params(1)[i], in[1][i]) << i;
  }
}

}  // namespace
}  // namespace rackhub::server
