// Unit tests for the registry's keys: chunk ranges, quotas
// (max_parameter_bytes counts the hub memory a key holds, key_memory.h),
// optimizer sources and schedules, lanes, totals, concurrent creation.
// Tenants and tokens: registry_tenant_test.cc.

#include "registry_test.h"

namespace rackhub::server {
namespace {

using namespace registry_testing;

// ---------------------------------------------------------------------------
// Keys

TEST_F(RegistryTest, KeysGetConsecutiveChunkRangesInOrder) {
  MakeTenant("t");
  const KeyInfo a = MustCreateKey(Key("t", "a", 600));  // 3 chunks of 256
  const KeyInfo b = MustCreateKey(Key("t", "b", 1));    // 1 chunk
  const KeyInfo c = MustCreateKey(Key("t", "c", 512));  // 2 chunks
  EXPECT_EQ(a.placement.first_chunk, 0u);
  EXPECT_EQ(a.placement.chunk_count, 3u);
  EXPECT_EQ(b.placement.first_chunk, 3u);
  EXPECT_EQ(b.placement.chunk_count, 1u);
  EXPECT_EQ(c.placement.first_chunk, 4u);
  EXPECT_EQ(c.placement.chunk_count, 2u);
  EXPECT_EQ(a.chunk_elements, 256u);
  EXPECT_EQ(std::set<uint32_t>({a.id, b.id, c.id}).size(), 3u);
  EXPECT_NE(a.id, 0u);

  EXPECT_EQ(Usage("t"), "3/" + std::to_string((600 + 1 + 512) * 4) + "/6/a,b,c,");
  ASSERT_TRUE(r_.GetKey("t", "b", &key_).ok());
  EXPECT_EQ(key_.id, b.id);
  EXPECT_EQ(key_.placement.first_chunk, 3u);
}

// Keys declared from another hub's KEY_BIND (RackExchange::AdoptKey) take
// that hub's id and chunks, in any order: a key of a higher id first leaves
// the lower id and chunks free for the key that has them there, and a
// worker's key made afterwards comes after all of them. Only an id or chunk
// another key has here is refused, naming that key.
TEST_F(RegistryTest, AdoptedKeysTakeThePeersIdsAndChunksInAnyOrder) {
  MakeTenant("t");
  // There: "a" id 1 chunks 0..2, "b" id 2 chunk 3, "c" id 4 chunks 6..7 (id 3
  // and chunks 4..5 were a key deleted there).
  ASSERT_TRUE(r_.AdoptKey(Key("t", "b", 1), 2, 3, &key_).ok());
  EXPECT_EQ(key_.id, 2u);
  EXPECT_EQ(key_.placement.first_chunk, 3u);
  ASSERT_TRUE(r_.AdoptKey(Key("t", "c", 512), 4, 6, &key_).ok());
  ASSERT_TRUE(r_.AdoptKey(Key("t", "a", 600), 1, 0, &key_).ok());
  EXPECT_EQ(key_.id, 1u);
  EXPECT_EQ(key_.placement.first_chunk, 0u);
  EXPECT_EQ(key_.placement.chunk_count, 3u);
  const KeyInfo own = MustCreateKey(Key("t", "d", 10));  // after every adopted one
  EXPECT_EQ(own.id, 5u);
  EXPECT_EQ(own.placement.first_chunk, 8u);
  EXPECT_STATUS(r_.AdoptKey(Key("t", "e", 10), 2, 20, &key_), StatusCode::kFailedPrecondition,
                "key 'e' of tenant 't': id 2 or chunks 20..20 are key 'b''s here");
  EXPECT_STATUS(r_.AdoptKey(Key("t", "e", 600), 3, 2, &key_), StatusCode::kFailedPrecondition,
                "key 'e' of tenant 't': id 3 or chunks 2..4 are key ");
  EXPECT_STATUS(r_.AdoptKey(Key("t", "a", 600), 1, 0, &key_), StatusCode::kAlreadyExists,
                "name: key 'a' already exists");
  // Id 3 and chunks 4..5 stay free for the key that had them.
  ASSERT_TRUE(r_.AdoptKey(Key("t", "x", 300), 3, 4, &key_).ok());
  EXPECT_EQ(Usage("t"), "5/" + std::to_string((1 + 512 + 600 + 10 + 300) * 4) + "/9/a,b,x,c,d,");  // by id
  // A key deleted here never comes back at its id or chunks (a KEY_BIND kept
  // from before its deletion).
  EXPECT_OK(r_.DeleteKey("t", "b"));
  EXPECT_STATUS(r_.AdoptKey(Key("t", "b", 1), 2, 3, &key_), StatusCode::kFailedPrecondition,
                "key 'b' of tenant 't': id 2 or chunks 3..3 are key 'b' (deleted here");
  EXPECT_STATUS(r_.AdoptKey(Key("t", "y", 1), 9, 3, &key_), StatusCode::kFailedPrecondition,
                "key 'y' of tenant 't': id 9 or chunks 3..3 are key 'b' (deleted here");
}

TEST_F(RegistryTest, InvalidKeys) {
  MakeTenant("t");
  KeyInfo& k = key_;
  EXPECT_STATUS(r_.CreateKey(Key("t", "bad name", 1), &k), StatusCode::kInvalidArgument, "name");
  EXPECT_STATUS(r_.CreateKey(Key("t", "zero", 0), &k), StatusCode::kInvalidArgument, "elements");
  EXPECT_STATUS(r_.CreateKey(Key("t", "huge", (1ull << 34) + 1), &k),
                StatusCode::kInvalidArgument, "elements");
  EXPECT_EQ(r_.CreateKey(Key("nope", "k", 1), &k).code(), StatusCode::kNotFound);

  KeySpec spec = Key("t", "opt", 10);
  spec.use_tenant_optimizer = false;
  spec.optimizer.type = OptimizerType::kNesterov;  // momentum missing
  EXPECT_STATUS(r_.CreateKey(spec, &k), StatusCode::kInvalidArgument, "optimizer.momentum");

  MustCreateKey(Key("t", "k", 10));
  EXPECT_EQ(r_.CreateKey(Key("t", "k", 10), &k).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(MustGetTenant("t").key_count, 1u);
}

TEST_F(RegistryTest, MaxKeysQuotaFailureChangesNothing) {
  MakeTenant("t", Quotas{0, /*max_keys=*/2, 0});
  MustCreateKey(Key("t", "a", 300));
  const KeyInfo b = MustCreateKey(Key("t", "b", 10));
  const std::string before = Usage("t");
  EXPECT_STATUS(r_.CreateKey(Key("t", "c", 10), &key_), StatusCode::kResourceExhausted,
                "quotas.max_keys");
  EXPECT_EQ(Usage("t"), before);
  EXPECT_EQ(before, "2/1240/3/a,b,");

  // After freeing a slot the next key continues the index space right after b.
  ASSERT_TRUE(r_.DeleteKey("t", "a").ok());
  const KeyInfo c = MustCreateKey(Key("t", "c", 10));
  EXPECT_EQ(c.placement.first_chunk, b.placement.first_chunk + b.placement.chunk_count);
}

TEST_F(RegistryTest, MaxParameterBytesQuotaFailureChangesNothing) {
  // The quota counts hub memory: room for a key of 1000 and one of 16 elements
  // (64 bytes: one line; 17 elements take two).
  const uint64_t quota = SgdMemory(1000) + SgdMemory(16);
  MakeTenant("t", Quotas{/*max_parameter_bytes=*/quota, 0, 0});
  const KeyInfo a = MustCreateKey(Key("t", "a", 1000));
  EXPECT_EQ(a.memory_bytes, SgdMemory(1000));
  const std::string before = Usage("t");
  ASSERT_GT(SgdMemory(17), SgdMemory(16));
  EXPECT_STATUS(r_.CreateKey(Key("t", "b", 17), &key_), StatusCode::kResourceExhausted,
                "quotas.max_parameter_bytes: key 'b' needs ");
  EXPECT_EQ(Usage("t"), before);
  EXPECT_EQ(before, "1/4000/4/a,");
  EXPECT_EQ(r_.GetKey("t", "b", &key_).code(), StatusCode::kNotFound);

  const KeyInfo b = MustCreateKey(Key("t", "b", 16));  // exactly fills the quota
  EXPECT_EQ(b.placement.first_chunk, a.placement.first_chunk + a.placement.chunk_count);
  EXPECT_EQ(MustGetTenant("t").parameter_bytes, 4064u);
  EXPECT_EQ(MustGetTenant("t").memory_bytes, quota);
}

// An elastic tenant's COMMIT copies (docs/elastic.md, "Hub optimizers"):
// a key with a hub optimizer reserves, per chunk, its fp32 parameters and
// its state slots once more (each a std::vector: 16-byte rounding plus a
// 16-byte header) and the copy's entry (160 bytes); a sum-only key and a
// tenant that is not elastic reserve no copy.
TEST_F(RegistryTest, ElasticQuotaCountsTheCommitCopies) {
  TenantSpec spec = Spec("el", /*workers=*/2, 1024);  // 256 elements per chunk
  spec.elastic = true;
  spec.min_workers = 1;
  spec.quotas.max_workers = 4;
  ASSERT_TRUE(r_.CreateTenant(spec, &info_, &token_).ok());
  MakeTenant("fixed");  // 4 workers: the same rank slots
  const auto memory_of = [&](const std::string& tenant, OptimizerType type, uint64_t elements) {
    KeySpec k = Key(tenant, std::to_string(static_cast<int>(type)), elements);
    k.use_tenant_optimizer = false;
    k.optimizer.type = type;
    k.optimizer.learning_rate = 0.1;
    if (type == OptimizerType::kMomentum) k.optimizer.momentum = 0.9;
    if (type == OptimizerType::kSumOnly) k.optimizer.learning_rate = 0;
    return MustCreateKey(k).memory_bytes;
  };
  // 10 full chunks + one of 100 elements; momentum: parameters + 1 slot.
  const uint64_t copies = 10 * (2 * (1024 + 16) + 160) + (2 * (400 + 16) + 160);
  EXPECT_EQ(memory_of("el", OptimizerType::kMomentum, 2660),
            memory_of("fixed", OptimizerType::kMomentum, 2660) + copies);
  EXPECT_EQ(CommitCopyBytes(2660, 256, OptimizerType::kMomentum), copies);
  EXPECT_EQ(CommitCopyBytes(2660, 256, OptimizerType::kAdam),
            copies + 10 * (1024 + 16) + (400 + 16));
  EXPECT_EQ(memory_of("el", OptimizerType::kSumOnly, 2660),
            memory_of("fixed", OptimizerType::kSumOnly, 2660));
}

// Issue 12, hole 3: Adam with a 256 MiB quota took 1.5 GiB of hub memory
// for 256 MiB of parameters. Now the key's whole footprint is checked.
TEST_F(RegistryTest, QuotaCountsOptimizerStateDoubleBufferAndParkedContributions) {
  TenantSpec spec = Spec("adam", /*workers=*/2);  // 32 KiB chunks
  spec.default_optimizer.type = OptimizerType::kAdam;
  spec.default_optimizer.learning_rate = 0.001;
  spec.quotas.max_parameter_bytes = 256ull << 20;
  ASSERT_TRUE(r_.CreateTenant(spec, &info_, &token_).ok());
  const Status s = r_.CreateKey(Key("adam", "w", 64ull << 20), &key_);  // 256 MiB of fp32
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.message();
  EXPECT_EQ(s.message(),
            "quotas.max_parameter_bytes: key 'w' needs 1.5 GiB of hub memory for 256 MiB of "
            "parameters (6.1x: fp32 parameters x2 (double buffer), 2 adam state slots, an "
            "accumulator and up to 1 parked contribution per chunk) but tenant 'adam' has 256 MiB "
            "left of its 256 MiB quota");
  EXPECT_EQ(MustGetTenant("adam").memory_bytes, 0u);
  // A seventh of it fits: what the key holds is about 6x its parameters.
  const KeyInfo k = MustCreateKey(Key("adam", "w", (64ull << 20) / 7));
  EXPECT_GT(k.memory_bytes, 6 * k.parameter_bytes());
  EXPECT_LT(k.memory_bytes, 6 * k.parameter_bytes() + k.parameter_bytes() / 10);
  EXPECT_LE(MustGetTenant("adam").memory_bytes, 256ull << 20);

  // Per optimizer: state slots (sgd 0, momentum/adagrad 1, adam 2) and a
  // bf16 key's wire copies and parked bf16 contributions.
  MakeTenant("opt");
  const auto memory_with = [&](OptimizerType type, WireDType dtype) {
    KeySpec k = Key("opt", std::to_string(static_cast<int>(type)) + WireDTypeName(dtype), 2560);
    k.dtype = dtype;
    k.use_tenant_optimizer = false;
    k.optimizer.type = type;
    k.optimizer.learning_rate = 0.1;
    if (type == OptimizerType::kMomentum) k.optimizer.momentum = 0.9;
    return MustCreateKey(k).memory_bytes;
  };
  const uint64_t sgd = memory_with(OptimizerType::kSgd, WireDType::kFp32);
  const uint64_t momentum = memory_with(OptimizerType::kMomentum, WireDType::kFp32);
  const uint64_t adagrad = memory_with(OptimizerType::kAdaGrad, WireDType::kFp32);
  const uint64_t adam = memory_with(OptimizerType::kAdam, WireDType::kFp32);
  const uint64_t slot = momentum - sgd;
  EXPECT_EQ(slot, 10u * (1024 + 80)) << "one fp32 slot per chunk, in 64-byte lines + a header";
  EXPECT_EQ(adagrad, momentum);
  EXPECT_EQ(adam - sgd, 2 * slot);
  const uint64_t bf16 = memory_with(OptimizerType::kSgd, WireDType::kBf16);
  // 2 wire copies, and the 3 parked contributions are half as big.
  EXPECT_EQ(bf16, sgd + 2 * 10u * (512 + 80) - 3 * 10u * 512);
}

TEST_F(RegistryTest, MultiRackKeysHoldTheirStagesToo) {
  TopologyConfig topo;
  topo.racks.resize(3);
  Registry hierarchical(2, TenantDefaults{}, topo);
  topo.mode = "flat";
  Registry flat(2, TenantDefaults{}, topo);
  uint64_t memory[3];
  Registry* registries[] = {&r_, &hierarchical, &flat};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(registries[i]->CreateTenant(Spec("t", 4, 1024), &info_, &token_).ok());
    ASSERT_TRUE(registries[i]->CreateKey(Key("t", "k", 2560), &key_).ok());
    memory[i] = key_.memory_bytes;
    EXPECT_EQ(registries[i]->GetTotals().memory_bytes, memory[i]);
  }
  EXPECT_GT(memory[1], memory[0]) << "a sum stage and the cross-rack state";
  EXPECT_GT(memory[2], memory[1]) << "flat: one stage per rack";
}

TEST_F(RegistryTest, DeleteKeyFreesQuotaButNeverReusesIndices) {
  MakeTenant("t", Quotas{/*max_parameter_bytes=*/SgdMemory(1024), 0, 0});
  const KeyInfo a = MustCreateKey(Key("t", "a", 1024));
  ASSERT_TRUE(r_.DeleteKey("t", "a").ok());
  EXPECT_EQ(Usage("t"), "0/0/4/");  // quota freed; the index space only grows

  const KeyInfo again = MustCreateKey(Key("t", "a", 1024));  // same name, fits again
  EXPECT_EQ(again.placement.first_chunk, a.placement.first_chunk + a.placement.chunk_count);
  EXPECT_NE(again.id, a.id);
  EXPECT_EQ(MustGetTenant("t").chunk_count, 8u);
  EXPECT_EQ(r_.DeleteKey("t", "missing").code(), StatusCode::kNotFound);
  EXPECT_EQ(r_.DeleteKey("nope", "a").code(), StatusCode::kNotFound);
}

TEST_F(RegistryTest, ReadinessFollowsInitMode) {
  MakeTenant("t");
  EXPECT_TRUE(MustCreateKey(Key("t", "z", 5, InitMode::kZeros)).ready);
  const KeyInfo c = MustCreateKey(Key("t", "c", 5, InitMode::kFromClient));
  EXPECT_FALSE(c.ready);
  EXPECT_EQ(c.init, InitMode::kFromClient);
}

TEST_F(RegistryTest, KeyOptimizerSource) {
  TenantSpec s = Spec("t", 4, 1024);
  s.default_optimizer.type = OptimizerType::kMomentum;
  s.default_optimizer.learning_rate = 0.5;
  s.default_optimizer.momentum = 0.9;
  ASSERT_TRUE(r_.CreateTenant(s, &info_, &token_).ok());

  KeySpec spec = Key("t", "inherit", 10);
  spec.optimizer.type = OptimizerType::kAdam;  // ignored: use_tenant_optimizer
  const KeyInfo inherit = MustCreateKey(spec);
  EXPECT_EQ(inherit.optimizer, info_.default_optimizer);

  spec = Key("t", "own", 10);
  spec.use_tenant_optimizer = false;
  spec.optimizer.type = OptimizerType::kAdam;
  spec.optimizer.learning_rate = 1e-3;
  const KeyInfo own = MustCreateKey(spec);
  EXPECT_EQ(own.optimizer.type, OptimizerType::kAdam);
  EXPECT_DOUBLE_EQ(own.optimizer.beta2, 0.999);  // normalized
}

TEST_F(RegistryTest, SetOptimizer) {
  MakeTenant("t");
  KeySpec spec = Key("t", "k", 10);
  spec.use_tenant_optimizer = false;
  spec.optimizer.type = OptimizerType::kAdam;
  spec.optimizer.learning_rate = 1e-3;
  MustCreateKey(spec);

  auto stored = [this] {
    KeyInfo k;
    EXPECT_TRUE(r_.GetKey("t", "k", &k).ok());
    return k.optimizer;
  };

  OptimizerConfig next;
  next.type = OptimizerType::kAdam;
  next.learning_rate = 5e-4;
  ASSERT_TRUE(r_.SetOptimizer("t", "k", next, false, &key_).ok());
  EXPECT_DOUBLE_EQ(key_.optimizer.learning_rate, 5e-4);
  EXPECT_DOUBLE_EQ(key_.optimizer.beta1, 0.9);
  EXPECT_EQ(stored(), key_.optimizer);
  const OptimizerConfig current = key_.optimizer;

  // A different type is refused and leaves the key alone.
  OptimizerConfig sgd;
  sgd.learning_rate = 0.1;
  EXPECT_STATUS(r_.SetOptimizer("t", "k", sgd, false, &key_), StatusCode::kInvalidArgument,
                "optimizer.type");
  EXPECT_EQ(stored(), current);

  // keep_type: the type in the request is ignored.
  ASSERT_TRUE(r_.SetOptimizer("t", "k", sgd, true, &key_).ok());
  EXPECT_EQ(key_.optimizer.type, OptimizerType::kAdam);
  EXPECT_DOUBLE_EQ(key_.optimizer.learning_rate, 0.1);
  const OptimizerConfig kept = key_.optimizer;

  // An invalid value is refused and leaves the key alone.
  next.learning_rate = -1;
  EXPECT_STATUS(r_.SetOptimizer("t", "k", next, false, &key_), StatusCode::kInvalidArgument,
                "optimizer.learning_rate");
  EXPECT_EQ(stored(), kept);
  EXPECT_EQ(r_.SetOptimizer("t", "missing", next, true, &key_).code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Quotas

TEST_F(RegistryTest, UpdateQuotasPartial) {
  MakeTenant("t");
  const Quotas before = MustGetTenant("t").quotas;
  ASSERT_TRUE(r_.UpdateQuotas("t", Quotas{0, /*max_keys=*/7, 0}, &info_).ok());
  EXPECT_EQ(info_.quotas.max_keys, 7u);
  EXPECT_EQ(info_.quotas.max_parameter_bytes, before.max_parameter_bytes);
  EXPECT_EQ(info_.quotas.max_workers, before.max_workers);
  EXPECT_EQ(MustGetTenant("t").quotas.max_keys, 7u);
  EXPECT_EQ(r_.UpdateQuotas("nope", Quotas{0, 7, 0}, &info_).code(), StatusCode::kNotFound);
}

TEST_F(RegistryTest, UpdateQuotasBelowUsageChangesNothing) {
  MakeTenant("t");  // 4 workers per rack
  for (const char* n : {"a", "b", "c"}) MustCreateKey(Key("t", n, 100));  // 1200 bytes
  const uint64_t used = MustGetTenant("t").memory_bytes;
  EXPECT_EQ(used, 3 * SgdMemory(100));
  const Quotas before = MustGetTenant("t").quotas;
  // max_workers = 100 alone would be fine, but must not be applied either.
  EXPECT_STATUS(r_.UpdateQuotas("t", Quotas{0, 2, 100}, &info_), StatusCode::kFailedPrecondition,
                "quotas.max_keys");
  EXPECT_STATUS(r_.UpdateQuotas("t", Quotas{used - 1, 0, 0}, &info_),
                StatusCode::kFailedPrecondition, "quotas.max_parameter_bytes");
  EXPECT_STATUS(r_.UpdateQuotas("t", Quotas{0, 0, 3}, &info_), StatusCode::kFailedPrecondition,
                "quotas.max_workers");
  const Quotas after = MustGetTenant("t").quotas;
  EXPECT_EQ(after.max_keys, before.max_keys);
  EXPECT_EQ(after.max_parameter_bytes, before.max_parameter_bytes);
  EXPECT_EQ(after.max_workers, before.max_workers);

  // Exactly the current usage is allowed, and then full.
  ASSERT_TRUE(r_.UpdateQuotas("t", Quotas{used, 3, 0}, &info_).ok());
  EXPECT_EQ(r_.CreateKey(Key("t", "d", 1), &key_).code(), StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------
// Layout and totals

TEST_F(RegistryTest, ChunksOfAlternatesLanes) {
  MakeTenant("t");
  const KeyInfo a = MustCreateKey(Key("t", "a", 5 * 256));
  const auto spans = r_.ChunksOf(a);
  ASSERT_EQ(spans.size(), 5u);
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].index, i);
    EXPECT_EQ(spans[i].lane, i % 2);
    EXPECT_EQ(spans[i].first_element, i * 256);
    EXPECT_EQ(spans[i].elements, 256u);
  }
  // The next key starts at chunk 5, i.e. on lane 1.
  const KeyInfo b = MustCreateKey(Key("t", "b", 300));
  const auto bs = r_.ChunksOf(b);
  ASSERT_EQ(bs.size(), 2u);
  EXPECT_EQ(bs[0].index, 5u);
  EXPECT_EQ(bs[0].lane, 1u);
  EXPECT_EQ(bs[1].lane, 0u);
  EXPECT_EQ(bs[1].elements, 300u - 256u);
}

TEST_F(RegistryTest, GetTotalsSums) {
  MakeTenant("x");
  MakeTenant("y");
  MustCreateKey(Key("x", "a", 10));
  MustCreateKey(Key("x", "b", 20));
  MustCreateKey(Key("y", "a", 30));
  Registry::Totals t = r_.GetTotals();
  EXPECT_EQ(t.tenants, 2u);
  EXPECT_EQ(t.keys, 3u);
  EXPECT_EQ(t.parameter_bytes, 60u * 4u);
  EXPECT_EQ(t.memory_bytes, SgdMemory(10) + SgdMemory(20) + SgdMemory(30));
  ASSERT_TRUE(r_.DeleteKey("x", "b").ok());
  t = r_.GetTotals();
  EXPECT_EQ(t.keys, 2u);
  EXPECT_EQ(t.parameter_bytes, 40u * 4u);
  EXPECT_EQ(t.memory_bytes, SgdMemory(10) + SgdMemory(30));
}

TEST_F(RegistryTest, ConcurrentKeyCreation) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  const std::string token = MakeTenant("busy");
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &token] {
      for (int i = 0; i < kPerThread; ++i) {
        KeyInfo k;
        const std::string name = std::to_string(t * 1000 + i);
        EXPECT_OK(r_.CreateKey(Key("busy", name, 1 + (i * 37 + t) % 700), &k));
        TenantInfo info;  // readers interleaved with writers
        EXPECT_TRUE(r_.Authenticate("busy", token, &info).ok());
      }
    });
  }
  for (auto& th : threads) th.join();

  std::vector<KeyInfo> keys;
  ASSERT_TRUE(r_.ListKeys("busy", &keys).ok());
  ASSERT_EQ(keys.size(), static_cast<size_t>(kThreads * kPerThread));
  std::set<uint32_t> ids;
  uint64_t bytes = 0;
  for (const auto& k : keys) {
    ids.insert(k.id);
    bytes += k.parameter_bytes();
    EXPECT_EQ(k.placement.chunk_count, (k.elements + 255) / 256) << k.name;
  }
  EXPECT_EQ(ids.size(), keys.size());

  std::sort(keys.begin(), keys.end(), [](const KeyInfo& a, const KeyInfo& b) {
    return a.placement.first_chunk < b.placement.first_chunk;
  });
  uint64_t next = 0;
  for (const auto& k : keys) {
    EXPECT_EQ(k.placement.first_chunk, next) << k.name;  // disjoint and gap-free
    next = k.placement.first_chunk + k.placement.chunk_count;
  }
  const TenantInfo info = MustGetTenant("busy");
  EXPECT_EQ(info.chunk_count, next);
  EXPECT_EQ(info.key_count, keys.size());
  EXPECT_EQ(info.parameter_bytes, bytes);
  const Registry::Totals totals = r_.GetTotals();
  EXPECT_EQ(totals.keys, keys.size());
  EXPECT_EQ(totals.parameter_bytes, bytes);
}

}  // namespace
}  // namespace rackhub::server
