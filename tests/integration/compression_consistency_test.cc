// Issue 17 end to end against a real rackhubd (TCP and shared memory):
// top-k compressed keys (docs/compression.md) and bounded / async tenants
// (docs/consistency.md).
//  - Top-k at ratio 1.0 equals a dense key bit for bit; at ratio 0.05 every
//    reply equals a reference fed the same top-k selections with the same
//    residuals (aggregation::CompressTopK), summed in rank order.
//  - Malformed sparse PUSH frames (index out of range, unsorted, count and
//    size mismatch, more entries than the ratio allows, a sparse push to a
//    dense key) are refused with a clear error and change nothing.
//  - bounded:2: a worker runs 2 iterations ahead of an idle one without
//    waiting, its third reply is held until the slow one pushes; with one
//    worker slowed, every reply's reported versions keep the bound and the
//    parameters hold every update they report; a worker that leaves stops
//    holding the others; a held reply fails after the straggler timeout
//    naming the slow rank; async never holds.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data_link.h"  // SameBits
#include "hub_under_test.h"
#include "process.h"
#include "rackhub/aggregation/topk.h"
#include "rackhub/client/client.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"
#include "wait.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::ErrorCode;
using testing::BinPath;
using testing::SameBits;
using testing::HubUnderTest;
using testing::RunCommand;
using testing::Transport;

// 1 KiB chunks: 256 elements; 600-element keys have 3 chunks (the last short).
constexpr uint32_t kChunkElements = 256;
constexpr uint64_t kElements = 600;

class CompressionConsistencyTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    std::string why;
    hub_ = HubUnderTest::Start(GetParam(), {"--lanes", "2", "--straggler-timeout-ms", "1500"},
                               &why);
    ASSERT_TRUE(hub_) << why;
  }

  testing::CommandResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {BinPath("rackhubctl"), "--admin", hub_->admin_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  std::string CreateTenant(const std::string& name, uint32_t workers,
                           std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"tenant", "create", name, "--workers",
                                     std::to_string(workers), "--chunk-bytes", "1024"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string token = testing::OutputField(r.out, "data-plane token");
    EXPECT_FALSE(token.empty()) << "no token line in:\n" << r.out;
    return token;
  }

  std::unique_ptr<Client> Connect(const std::string& tenant, const std::string& token,
                                  uint32_t rank) {
    client::Options o;
    o.hub = hub_->data_address();
    o.tenant = tenant;
    o.token = token;
    o.rank = rank;
    o.connect_timeout = 5s;
    o.op_timeout = 30s;
    o.shm = GetParam() == Transport::kShm ? client::Shm::kOn : client::Shm::kOff;
    client::Error e;
    auto c = Client::Connect(o, &e);
    EXPECT_NE(c, nullptr) << e.message;
    return c;
  }

  client::KeyId Declare(Client& c, const std::string& name, float topk, double lr = 1.0,
                        bool sum = true, std::string type = "sgd") {
    client::KeyDecl d;
    d.name = name;
    d.elements = kElements;
    d.topk_ratio = topk;
    client::OptimizerSpec o;
    o.type = type;
    o.learning_rate = lr;
    o.reduction = sum ? "sum" : "mean";
    if (type == "sgd" && !sum) {
      o.type = "momentum";
      o.momentum = 0.9;
    }
    d.optimizer = o;
    client::KeyId id = 0;
    const client::Error e = c.DeclareKey(d, &id);
    EXPECT_TRUE(e.ok()) << e.message;
    return id;
  }

  std::unique_ptr<HubUnderTest> hub_;
};

std::vector<float> RandomGrad(std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(kElements);
  for (float& x : g) x = d(rng);
  return g;
}

// Both ranks push in parallel; returns each rank's reply.
std::vector<std::vector<float>> Step(std::vector<std::unique_ptr<Client>>& ranks,
                                     client::KeyId key,
                                     const std::vector<std::vector<float>>& grads) {
  std::vector<std::vector<float>> out(ranks.size(), std::vector<float>(kElements));
  std::vector<client::Ticket> t;
  for (size_t r = 0; r < ranks.size(); ++r) t.push_back(ranks[r]->PushPull(key, grads[r], out[r]));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const client::Error e = ranks[r]->Wait(t[r]);
    EXPECT_TRUE(e.ok()) << "rank " << r << ": " << e.message;
  }
  return out;
}

TEST_P(CompressionConsistencyTest, TopKRatioOneEqualsDenseBitForBit) {
  const std::string token = CreateTenant("exact", 2);
  std::vector<std::unique_ptr<Client>> ranks;
  client::KeyId dense = 0, topk = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(Connect("exact", token, r));
    ASSERT_TRUE(ranks.back());
    // Momentum SGD with mean reduction: every element's state matters.
    dense = Declare(*ranks.back(), "dense", 0.0f, 0.1, false);
    topk = Declare(*ranks.back(), "topk", 1.0f, 0.1, false);
  }
  EXPECT_FLOAT_EQ(ranks[0]->GetKeyInfo(topk)->topk_ratio, 1.0f);
  std::mt19937 rng(7);
  for (int it = 0; it < 6; ++it) {
    const std::vector<std::vector<float>> grads = {RandomGrad(rng), RandomGrad(rng)};
    const auto a = Step(ranks, dense, grads);
    const auto b = Step(ranks, topk, grads);
    for (size_t r = 0; r < 2; ++r) EXPECT_TRUE(SameBits(a[r], b[r])) << "iteration " << it;
  }
}

// Ratio 0.05: 13 of 256 entries per chunk (and 5 of the 88 of the last)
// travel sparse; the test keeps its own residuals and selections. With SGD
// the replies are the dense parameters; sum-only, the replies (the sums)
// travel sparse too.
TEST_P(CompressionConsistencyTest, TopKRepliesEqualTheRankOrderReference) {
  for (const int variant : {0, 1, 2}) {
    const bool ef = variant != 1;
    const bool sum_only = variant == 2;
    const std::string tenant = std::string("sparse-") + (ef ? "ef" : "noef") + (sum_only ? "-sum" : "");
    const std::string token = CreateTenant(tenant, 2);
    std::vector<std::unique_ptr<Client>> ranks;
    client::KeyId key = 0;
    for (uint32_t r = 0; r < 2; ++r) {
      ranks.push_back(Connect(tenant, token, r));
      ASSERT_TRUE(ranks.back());
      client::KeyDecl d;
      d.name = "w";
      d.elements = kElements;
      d.topk_ratio = 0.05;
      d.error_feedback = ef;
      client::OptimizerSpec o;
      o.type = sum_only ? "sum-only" : "sgd";
      o.learning_rate = sum_only ? 0.0 : 1.0;
      o.reduction = "sum";
      d.optimizer = o;
      const client::Error e = ranks.back()->DeclareKey(d, &key);
      ASSERT_TRUE(e.ok()) << e.message;
    }
    std::vector<std::vector<float>> residual(2, std::vector<float>(kElements, 0.0f));
    std::vector<float> params(kElements, 0.0f);
    aggregation::TopKScratch scratch;
    std::mt19937 rng(11);
    for (int it = 0; it < 8; ++it) {
      const std::vector<std::vector<float>> grads = {RandomGrad(rng), RandomGrad(rng)};
      // Reference: per chunk, rank 0's selection assigned into zeros, rank
      // 1's added, then p - 1 * sum.
      for (uint64_t first = 0; first < kElements; first += kChunkElements) {
        const auto n = static_cast<uint32_t>(std::min<uint64_t>(kChunkElements, kElements - first));
        const uint32_t k = aggregation::TopKCount(0.05, n);
        EXPECT_EQ(k, n == kChunkElements ? 13u : 5u);
        std::vector<float> sum(n, 0.0f);
        for (int r = 0; r < 2; ++r) {
          std::vector<uint32_t> idx(k);
          std::vector<float> val(k);
          aggregation::CompressTopK({grads[r].data() + first, n},
                                    ef ? std::span<float>(residual[r].data() + first, n)
                                       : std::span<float>(),
                                    k, ef, idx.data(), val.data(), scratch);
          for (uint32_t j = 0; j < k; ++j) {
            if (r == 0) {
              sum[idx[j]] = val[j];
            } else {
              sum[idx[j]] += val[j];
            }
          }
        }
        for (uint32_t i = 0; i < n; ++i) {
          params[first + i] = sum_only ? sum[i] : params[first + i] - 1.0f * sum[i];
        }
      }
      const auto got = Step(ranks, key, grads);
      for (size_t r = 0; r < 2; ++r) {
        EXPECT_TRUE(SameBits(got[r], params))
            << "iteration " << it << " rank " << r << " variant " << variant;
      }
    }
  }
}

TEST_P(CompressionConsistencyTest, MalformedSparsePushesAreRefusedAndChangeNothing) {
  if (GetParam() == Transport::kShm) GTEST_SKIP() << "raw frames travel over TCP";
  const std::string token = CreateTenant("raw", 1);
  std::unique_ptr<testing::DataLink> link = hub_->Connect();
  const auto w = link->Hello("raw", token, 0, 0);
  ASSERT_NE(w.tenant_handle(), 0u);
  const auto declare = [&](const std::string& name, float topk) {
    data::v1::KeyDeclaration d;
    d.set_name(name);
    d.set_elements(kElements);
    d.set_topk_ratio(topk);
    net::FrameHeader h;
    h.opcode = net::Opcode::kDeclare;
    h.tenant = w.tenant_handle();
    link->Send(h, d.SerializeAsString());
    auto info = link->Receive();
    EXPECT_TRUE(info && info->h.opcode == net::Opcode::kKeyInfo) << testing::Describe(info);
    return info ? info->h.key : 0u;
  };
  const uint32_t key = declare("t", 0.05f);  // 13 entries per 256-element chunk
  const uint32_t dense = declare("d", 0.0f);
  const auto sparse = [](std::vector<uint32_t> idx, std::vector<float> val, int count_delta = 0) {
    const uint32_t count = static_cast<uint32_t>(idx.size()) + count_delta;
    std::string p(4, '\0');
    std::memcpy(p.data(), &count, 4);
    p.append(reinterpret_cast<const char*>(idx.data()), idx.size() * 4);
    p.append(reinterpret_cast<const char*>(val.data()), val.size() * 4);
    return p;
  };
  uint64_t request = 0;
  const auto push = [&](uint32_t k, const std::string& payload, bool is_sparse,
                        uint32_t chunk = 0) {
    net::FrameHeader p;
    p.opcode = net::Opcode::kPush;
    p.flags = is_sparse ? net::kFlagSparse : 0;
    p.dtype = net::DType::kFp32;
    p.tenant = w.tenant_handle();
    p.key = k;
    p.chunk = chunk;  // on lane 0
    p.iteration = 0;
    p.request_id = ++request;
    link->Send(p, payload);
    return link->Receive();
  };
  const auto expect_error = [&](const std::optional<testing::Frame>& f, const std::string& words) {
    ASSERT_TRUE(f.has_value());
    ASSERT_EQ(f->h.opcode, net::Opcode::kError) << testing::Describe(f);
    EXPECT_EQ(f->h.flags & net::kFlagFatal, 0) << testing::Describe(f);
    EXPECT_NE(testing::Describe(f).find(words), std::string::npos) << testing::Describe(f);
  };
  expect_error(push(key, sparse({3, 256}, {1, 1}), true),
               "entry 1 is index 256, out of range for a chunk of 256 elements");
  expect_error(push(key, sparse({5, 3}, {1, 1}), true),
               "entry 1 is index 3 after 5; indices must be strictly ascending");
  expect_error(push(key, sparse({5, 3}, {1, 1}, 1), true),
               "payload_bytes: 3 sparse entries of fp32 need 28 bytes, got 20");
  std::vector<uint32_t> many(14);
  for (uint32_t i = 0; i < 14; ++i) many[i] = i;
  expect_error(push(key, sparse(many, std::vector<float>(14, 1.0f)), true),
               "count: 14 entries, the chunk's top-k allows at most 13");
  // (Key d's chunks start at tenant-wide index 3: its chunk 1 is on lane 0.)
  expect_error(push(dense, sparse({1}, {1}), true, 1), "was not declared with top-k compression");
  expect_error(push(key, std::string(256 * 4 + 4, '\0'), true),
               "is larger than the chunk dense");
  // The refusals changed nothing: a good sparse push is the rank's first
  // contribution (iteration 0 -> 1), and only its entries moved.
  auto ok = push(key, sparse({2, 7}, {0.5f, -2.0f}), true);
  ASSERT_TRUE(ok && ok->h.opcode == net::Opcode::kParams) << testing::Describe(ok);
  EXPECT_EQ(ok->h.iteration, 1u);
  ASSERT_EQ(ok->payload.size(), 256u * 4);
  std::vector<float> p(256);
  std::memcpy(p.data(), ok->payload.data(), p.size() * 4);
  for (uint32_t i = 0; i < 256; ++i) {
    // Tenant default optimizer: SGD lr 0.01, mean over 1 worker.
    const float want = i == 2 ? -0.01f * 0.5f : i == 7 ? -0.01f * -2.0f : 0.0f;
    EXPECT_EQ(p[i], want) << i;
  }
  // A sum-only top-k key: the reply (the sum) travels sparse when smaller.
  {
    data::v1::KeyDeclaration d;
    d.set_name("s");
    d.set_elements(kElements);
    d.set_topk_ratio(0.05f);
    d.mutable_optimizer()->set_type(admin::v1::SUM_ONLY);
    d.mutable_optimizer()->set_reduction(admin::v1::SUM);
    net::FrameHeader h;
    h.opcode = net::Opcode::kDeclare;
    h.tenant = w.tenant_handle();
    link->Send(h, d.SerializeAsString());
    auto info = link->Receive();
    ASSERT_TRUE(info && info->h.opcode == net::Opcode::kKeyInfo) << testing::Describe(info);
    // (Its chunks start at tenant-wide index 6: chunk 0 is on lane 0.)
    auto r = push(info->h.key, sparse({2, 7, 9}, {0.5f, -0.0f, 3.0f}), true);
    ASSERT_TRUE(r && r->h.opcode == net::Opcode::kParams) << testing::Describe(r);
    EXPECT_EQ(r->h.flags, net::kFlagSparse);
    // Every entry whose bits are not +0.0: -0.0 is kept.
    EXPECT_EQ(r->payload, sparse({2, 7, 9}, {0.5f, -0.0f, 3.0f}));
  }
  // A payload that is not whole elements is a broken frame: fatal.
  auto broken = push(key, std::string(2, '\0'), true);
  ASSERT_TRUE(broken && broken->h.opcode == net::Opcode::kError) << testing::Describe(broken);
  EXPECT_NE(broken->h.flags & net::kFlagFatal, 0);
}

// bounded:2 with W = 2: rank 0 runs two iterations ahead of an idle rank 1;
// its third reply waits for rank 1's first push.
TEST_P(CompressionConsistencyTest, BoundedHoldsOnlyBeyondTheBound) {
  const std::string token = CreateTenant("bounded", 2, {"--consistency", "bounded:2"});
  const auto shown = Ctl({"tenant", "get", "bounded"});
  EXPECT_NE(shown.out.find("bounded:2"), std::string::npos) << shown.out;
  std::vector<std::unique_ptr<Client>> ranks;
  client::KeyId key = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(Connect("bounded", token, r));
    ASSERT_TRUE(ranks.back());
    key = Declare(*ranks.back(), "w", 0.0f);  // SGD lr 1, sum: params = -(updates)
  }
  const std::vector<float> ones(kElements, 1.0f);
  std::vector<float> out(kElements);
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(ranks[0]->Wait(ranks[0]->PushPull(key, ones, out)).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "within the bound: no wait";
    const auto info = *ranks[0]->GetKeyInfo(key);
    EXPECT_EQ(info.updates, uint64_t(i + 1));
    EXPECT_EQ(info.slowest_iteration, 0u);
    EXPECT_EQ(out[0], -float(i + 1));
  }
  std::vector<float> held(kElements);
  const client::Ticket third = ranks[0]->PushPull(key, ones, held);
  EXPECT_EQ(ranks[0]->WaitFor(third, 400ms).code, ErrorCode::kTimeout)
      << "3 ahead of rank 1 at 0: held";
  std::vector<float> slow(kElements);
  ASSERT_TRUE(ranks[1]->Wait(ranks[1]->PushPull(key, ones, slow)).ok());
  EXPECT_EQ(slow[0], -4.0f) << "the slow worker sees every update";
  ASSERT_TRUE(ranks[0]->Wait(third).ok());
  EXPECT_EQ(held[0], -4.0f);
  EXPECT_EQ(ranks[0]->GetKeyInfo(key)->slowest_iteration, 1u);

  // Rank 1 slowed: every reply keeps the bound and holds what it reports.
  std::atomic<bool> bad{false};
  auto run = [&](uint32_t r, std::chrono::milliseconds pause, int iterations) {
    std::vector<float> o(kElements);
    for (int i = 0; i < iterations; ++i) {
      std::this_thread::sleep_for(pause);
      const client::Error e = ranks[r]->Wait(ranks[r]->PushPull(key, ones, o));
      const auto k = *ranks[r]->GetKeyInfo(key);
      const uint64_t clock = k.next_iteration;
      // Missing at most s = 2 of the other worker's iterations, never more.
      if (!e.ok() || clock > k.slowest_iteration + 2 || k.updates + 2 < 2 * clock ||
          o[0] != -float(k.updates) || o[kElements - 1] != -float(k.updates)) {
        ADD_FAILURE() << "rank " << r << " iteration " << clock << ": " << e.message
                      << " updates " << k.updates << " slowest " << k.slowest_iteration
                      << " param " << o[0];
        bad = true;
        return;
      }
    }
  };
  std::thread fast(run, 0, 2ms, 40);
  std::thread lagging(run, 1, 20ms, 40);
  fast.join();
  lagging.join();
  EXPECT_FALSE(bad);

  // Rank 1 leaves: rank 0 is held by nobody. Its five PushPulls run past
  // the bound of rank 1's last count: were rank 1 still counted, a reply
  // would be held until the straggler timeout and fail.
  ranks[1].reset();
  ASSERT_TRUE(testing::WaitUntil("the hub to see rank 1 leave", [&] {
    return testing::TenantStatsOf(hub_->admin_address(), "bounded").workers_connected() == 1;
  }));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(ranks[0]->Wait(ranks[0]->PushPull(key, ones, out)).ok()) << "PushPull " << i;
    const auto k = *ranks[0]->GetKeyInfo(key);
    EXPECT_EQ(k.slowest_iteration, k.next_iteration)
        << "PushPull " << i << ": rank 0 is the slowest (the only) member left";
  }
  // It comes back: brought forward to rank 0's count, and bounds it again.
  ranks[1] = Connect("bounded", token, 1);
  ASSERT_TRUE(ranks[1]);
  key = Declare(*ranks[1], "w", 0.0f);
  ASSERT_TRUE(ranks[1]->Wait(ranks[1]->Pull(key, slow)).ok());
  EXPECT_EQ(ranks[1]->GetKeyInfo(key)->next_iteration, ranks[0]->GetKeyInfo(key)->next_iteration);
  ASSERT_TRUE(ranks[1]->Wait(ranks[1]->PushPull(key, ones, slow)).ok());
}

TEST_P(CompressionConsistencyTest, HeldReplyFailsAfterTheStragglerTimeoutNamingTheSlowRank) {
  const std::string token = CreateTenant("stuck", 2, {"--consistency", "bounded:0"});
  std::vector<std::unique_ptr<Client>> ranks;
  client::KeyId key = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(Connect("stuck", token, r));
    ASSERT_TRUE(ranks.back());
    key = Declare(*ranks.back(), "w", 0.0f);
  }
  const std::vector<float> ones(kElements, 1.0f);
  std::vector<float> out(kElements);
  const auto t0 = std::chrono::steady_clock::now();
  const client::Error e = ranks[0]->Wait(ranks[0]->PushPull(key, ones, out));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);
  EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
  EXPECT_NE(e.message.find("waiting for rank 1 at 0"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("bounded:0"), std::string::npos) << e.message;
  // Its contribution was applied: after a Pull it continues at iteration 1.
  ASSERT_TRUE(ranks[0]->Wait(ranks[0]->Pull(key, out)).ok());
  EXPECT_EQ(ranks[0]->GetKeyInfo(key)->next_iteration, 1u);
  EXPECT_EQ(out[0], -1.0f);
  ASSERT_TRUE(ranks[1]->Wait(ranks[1]->PushPull(key, ones, out)).ok());
  EXPECT_EQ(out[0], -2.0f);
}

TEST_P(CompressionConsistencyTest, AsyncNeverHolds) {
  const std::string token = CreateTenant("free", 2, {"--consistency", "async"});
  std::vector<std::unique_ptr<Client>> ranks;
  client::KeyId key = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(Connect("free", token, r));
    ASSERT_TRUE(ranks.back());
    key = Declare(*ranks.back(), "w", 0.05f);  // and top-k pushes
  }
  const std::vector<float> ones(kElements, 1.0f);
  std::vector<float> out(kElements);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(ranks[0]->Wait(ranks[0]->PushPull(key, ones, out)).ok());
  }
  const auto k = *ranks[0]->GetKeyInfo(key);
  EXPECT_EQ(k.next_iteration, 20u);
  EXPECT_EQ(k.updates, 20u);
  EXPECT_EQ(k.slowest_iteration, 0u);
}

TEST_P(CompressionConsistencyTest, RackhubctlOptionsAndRefusals) {
  if (GetParam() == Transport::kShm) GTEST_SKIP() << "admin only";
  auto bad = Ctl({"tenant", "create", "x", "--workers", "1", "--consistency", "bounded:two"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("is not sync, async or bounded:S"), std::string::npos) << bad.err;
  CreateTenant("ctl", 1);
  auto r = Ctl({"key", "create", "ctl", "k", "--elements", "1000", "--compression", "topk:0.01"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = Ctl({"key", "get", "ctl", "k"});
  EXPECT_NE(r.out.find("topk:0.01"), std::string::npos) << r.out;
  for (const char* c : {"topk:0", "topk:1.5", "topk:", "zip"}) {
    bad = Ctl({"key", "create", "ctl", "k2", "--elements", "10", "--compression", c});
    EXPECT_NE(bad.exit_code, 0) << c;
    EXPECT_NE(bad.err.find(std::string("--compression: '") + c + "'"), std::string::npos)
        << bad.err;
  }
  bad = Ctl({"key", "create", "ctl", "k3", "--elements", "10", "--compression", "fp16", "--dtype",
             "bf16"});
  EXPECT_NE(bad.err.find("contradicts --dtype"), std::string::npos) << bad.err;
  // A table in a bounded tenant, and a re-declaration with another ratio.
  CreateTenant("bt", 1, {"--consistency", "bounded:1"});
  bad = Ctl({"key", "create", "bt", "tab", "--rows", "10", "--dim", "4"});
  EXPECT_NE(bad.err.find("row-sparse tables need a sync tenant"), std::string::npos) << bad.err;
  const std::string token = CreateTenant("redecl", 1);
  auto c = Connect("redecl", token, 0);
  ASSERT_TRUE(c);
  Declare(*c, "w", 0.01f);
  client::KeyDecl d;
  d.name = "w";
  d.elements = kElements;
  client::KeyId id;
  const client::Error e = c->DeclareKey(d, &id);
  EXPECT_NE(e.message.find("already exists with top-k ratio"), std::string::npos) << e.message;
}

INSTANTIATE_TEST_SUITE_P(Transports, CompressionConsistencyTest,
                         ::testing::Values(Transport::kTcp, Transport::kShm),
                         [](const auto& info) {
                           return std::string(info.param == Transport::kTcp ? "Tcp" : "Shm");
                         });

}  // namespace
}  // namespace rackhub
