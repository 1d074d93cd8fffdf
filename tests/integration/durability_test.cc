// Job lifecycle and checkpoints with a real rackhubd (docs/durability.md):
// a clean close is not a loss and a late rank is fine; a rank that leaves
// cleanly mid-iteration is waited for, not failed; a tenant deleted while
// its workers train; checkpoints created and restored through the admin API
// resume training bit-exactly (dense keys and row-sparse tables, also after
// kill -9 of the hub); damaged checkpoints are skipped at start-up.
// (The kill -9 loops are tests/durability/kill_loop_test.cc.)
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <xxhash.h>

#include "checkpoint_file.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/client/client.h"
#include "training.h"
#include "wait.h"

namespace rackhub::testing {
namespace {

namespace fs = std::filesystem;
namespace pb = rackhub::admin::v1;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "durability-test-token-0123456789abcdef";
constexpr uint64_t kElements = 5000;  // 5 chunks of 1024 over 2 lanes
constexpr uint64_t kChunks = 5;       // a PushPull is kChunks pushes at the hub

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon({}); }

  void StartDaemon(const std::vector<std::string>& extra) {
    std::vector<std::string> args{"--lanes", "2", "--checkpoint-every-iterations", "0",
                                  "--checkpoint-every-seconds", "0", "--straggler-timeout-ms",
                                  "20000"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_.reset();
    daemon_ = std::make_unique<DaemonProcess>(args);
    ASSERT_TRUE(daemon_->started());
    channel_ = grpc::CreateChannel(daemon_->admin_address(), grpc::InsecureChannelCredentials());
    tenants_ = pb::TenantService::NewStub(channel_);
    checkpoints_ = pb::CheckpointService::NewStub(channel_);
    handle_ = CreateTenant("job", 2);
  }

  uint32_t CreateTenant(const std::string& name, uint32_t workers) {
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(4096);
    req.set_token(kToken);
    pb::CreateTenantResponse resp;
    const grpc::Status s = tenants_->CreateTenant(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.tenant().handle();
  }

  std::unique_ptr<client::Client> Connect(uint32_t rank, const std::string& tenant = "job") {
    client::Options o;
    o.hub = daemon_->data_address();
    o.tenant = tenant;
    o.token = kToken;
    o.rank = rank;
    o.op_timeout = std::chrono::seconds(20);
    client::Error e;
    auto c = client::Client::Connect(o, &e);
    EXPECT_TRUE(c) << e.message;
    return c;
  }

  static TrainingKey Declare(client::Client& c) {
    client::KeyDecl d;
    d.name = "w";
    d.elements = kElements;
    client::OptimizerSpec adam;
    adam.type = "adam";
    adam.learning_rate = 0.01;
    d.optimizer = adam;
    TrainingKey k;
    k.seed = 3;
    const client::Error e = c.DeclareKey(d, &k.id);
    EXPECT_TRUE(e.ok()) << e.message;
    k.params.assign(kElements, 0.0f);
    k.grad.resize(kElements);
    k.out.resize(kElements);
    k.iteration = c.GetKeyInfo(k.id)->next_iteration;
    return k;
  }

  // One iteration of both ranks (deterministic gradients); rank 0's result.
  static std::vector<float> Step(client::Client& a, TrainingKey& ka, client::Client& b,
                                 TrainingKey& kb) {
    Gradient(ka.seed, ka.iteration, 0, ka.params, ka.grad);
    Gradient(kb.seed, kb.iteration, 1, kb.params, kb.grad);
    const client::Ticket ta = a.PushPull(ka.id, ka.grad, ka.out);
    const client::Ticket tb = b.PushPull(kb.id, kb.grad, kb.out);
    const client::Error ea = a.Wait(ta), eb = b.Wait(tb);
    EXPECT_TRUE(ea.ok()) << ea.message;
    EXPECT_TRUE(eb.ok()) << eb.message;
    if (!ea.ok() || !eb.ok()) return {};
    ka.params.swap(ka.out);
    kb.params.swap(kb.out);
    ++ka.iteration;
    ++kb.iteration;
    EXPECT_EQ(ka.params, kb.params);
    return ka.params;
  }

  Result<pb::Checkpoint> CreateCheckpoint() {
    grpc::ClientContext ctx;
    pb::CreateCheckpointRequest req;
    req.set_tenant("job");
    pb::Checkpoint resp;
    const grpc::Status s = checkpoints_->CreateCheckpoint(&ctx, req, &resp);
    if (!s.ok()) return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
    return resp;
  }

  std::string CheckpointDir() const {
    return daemon_->state_dir() + "/checkpoints/" + std::to_string(handle_) + "-job";
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::TenantService::Stub> tenants_;
  std::unique_ptr<pb::CheckpointService::Stub> checkpoints_;
  uint32_t handle_ = 0;
};

// Job 1 finishes and closes (BYE) rank by rank: nobody is failed. Job 2 on
// the same tenant has rank 1 start late, once rank 0's first push is in at
// the hub: that push waits for it and both continue from where job 1
// stopped.
TEST_F(DurabilityTest, CleanCloseIsNotALossAndALateRankIsFine) {
  {
    auto c0 = Connect(0), c1 = Connect(1);
    ASSERT_TRUE(c0 && c1);
    TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
    for (int i = 0; i < 3; ++i) Step(*c0, k0, *c1, k1);
    c0->Close();
    // Rank 1 closes only once the hub has seen rank 0 leave on both lanes.
    ASSERT_TRUE(WaitForLog(*daemon_, "tenant 'job' rank 0 lane 0 left"));
    ASSERT_TRUE(WaitForLog(*daemon_, "tenant 'job' rank 0 lane 1 left"));
    c1->Close();
  }
  auto c0 = Connect(0);
  ASSERT_TRUE(c0);
  TrainingKey k0 = Declare(*c0);
  client::Error e;
  ASSERT_TRUE(PullKey(*c0, k0, &e)) << e.message;
  EXPECT_EQ(k0.iteration, 3u);
  Gradient(k0.seed, k0.iteration, 0, k0.params, k0.grad);
  const uint64_t pushed = TenantStatsOf(daemon_->admin_address(), "job").pushes();
  const client::Ticket pending = c0->PushPull(k0.id, k0.grad, k0.out);
  ASSERT_TRUE(WaitForPushes(daemon_->admin_address(), "job", pushed + kChunks));
  EXPECT_EQ(c0->WaitFor(pending, std::chrono::milliseconds(0)).code, client::ErrorCode::kTimeout)
      << "rank 0's push waits for rank 1";
  auto c1 = Connect(1);
  ASSERT_TRUE(c1);
  TrainingKey k1 = Declare(*c1);
  ASSERT_TRUE(PullKey(*c1, k1, &e)) << e.message;
  EXPECT_EQ(k1.params, k0.params);
  Gradient(k1.seed, k1.iteration, 1, k1.params, k1.grad);
  const client::Error e1 = c1->Wait(c1->PushPull(k1.id, k1.grad, k1.out));
  const client::Error e0 = c0->Wait(pending);
  ASSERT_TRUE(e0.ok()) << e0.message;
  ASSERT_TRUE(e1.ok()) << e1.message;
  EXPECT_EQ(k0.out, k1.out);
  const std::string log = daemon_->Log();
  EXPECT_NE(log.find("rank 0 lane 0 left"), std::string::npos) << log;
  EXPECT_EQ(log.find("worker lost"), std::string::npos) << log;
  EXPECT_EQ(log.find("closed after a fatal error"), std::string::npos) << log;
}

// A rank that leaves cleanly while another waits on it: the update waits for
// a replacement (like for a rank not connected yet), nothing is failed.
TEST_F(DurabilityTest, ALeavingRankIsWaitedForNotFailed) {
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
  Step(*c0, k0, *c1, k1);
  Gradient(k0.seed, k0.iteration, 0, k0.params, k0.grad);
  const uint64_t pushed = TenantStatsOf(daemon_->admin_address(), "job").pushes();
  const client::Ticket pending = c0->PushPull(k0.id, k0.grad, k0.out);
  // Rank 0's push is in (every chunk) before rank 1 leaves, and the hub has
  // handled that leave on both lanes before the push is checked: still
  // pending. (Were it failed, the reply would come later still; the Wait at
  // the end would then see the error instead of the replacement's result.)
  ASSERT_TRUE(WaitForPushes(daemon_->admin_address(), "job", pushed + kChunks));
  c1->Close();
  ASSERT_TRUE(WaitForLog(*daemon_, "tenant 'job' rank 1 lane 0 left"));
  ASSERT_TRUE(WaitForLog(*daemon_, "tenant 'job' rank 1 lane 1 left"));
  const client::Error still = c0->WaitFor(pending, std::chrono::milliseconds(0));
  EXPECT_EQ(still.code, client::ErrorCode::kTimeout) << still.message;
  client::Error e;
  auto c1b = Connect(1);
  ASSERT_TRUE(c1b);
  TrainingKey k1b = Declare(*c1b);
  ASSERT_TRUE(PullKey(*c1b, k1b, &e)) << e.message;
  Gradient(k1b.seed, k1b.iteration, 1, k1b.params, k1b.grad);
  ASSERT_TRUE(c1b->Wait(c1b->PushPull(k1b.id, k1b.grad, k1b.out)).ok());
  const client::Error e0 = c0->Wait(pending);
  ASSERT_TRUE(e0.ok()) << e0.message;
  EXPECT_EQ(k0.out, k1b.out);
  EXPECT_EQ(c0->GetKeyInfo(k0.id)->next_iteration, 2u);
}

// DeleteTenant while both ranks train: they get a clear error within
// seconds (no hang), the tenant's checkpoints go, another tenant is not
// disturbed, and the name can be used again from scratch.
TEST_F(DurabilityTest, TenantDeletedWhileTraining) {
  CreateTenant("other", 1);
  auto other = Connect(0, "other");
  ASSERT_TRUE(other);
  TrainingKey ko = Declare(*other);
  ASSERT_TRUE(CreateCheckpoint().ok());
  ASSERT_TRUE(fs::exists(CheckpointDir()));

  std::atomic<bool> stop{false};
  std::atomic<int> steps{0};
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto c = Connect(r);
      if (!c) return;
      TrainingKey k = Declare(*c);
      while (!stop) {
        Gradient(k.seed, k.iteration, r, k.params, k.grad);
        const client::Error e = c->Wait(c->PushPull(k.id, k.grad, k.out));
        if (!e.ok()) {
          errors[r] = std::string(client::ErrorCodeName(e.code)) + ": " + e.message;
          return;
        }
        k.params.swap(k.out);
        ++k.iteration;
        ++steps;
      }
    });
  }
  while (steps < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    grpc::ClientContext ctx;
    pb::DeleteTenantRequest req;
    req.set_name("job");
    pb::DeleteTenantResponse resp;
    ASSERT_TRUE(tenants_->DeleteTenant(&ctx, req, &resp).ok());
  }
  const auto deleted = Clock::now();
  for (auto& t : ranks) t.join();
  EXPECT_LT(Clock::now() - deleted, std::chrono::seconds(5));
  for (const std::string& e : errors) {
    EXPECT_FALSE(e.empty());
    // The fatal TENANT_GONE, or (if the connection broke before it was
    // read) the reconnect the hub refused: no retrying until op_timeout.
    EXPECT_TRUE(e.find("TENANT_GONE") != std::string::npos ||
                e.find("unknown tenant") != std::string::npos)
        << e;
  }
  EXPECT_FALSE(fs::exists(CheckpointDir()));
  // The other tenant trains on.
  Gradient(ko.seed, ko.iteration, 0, ko.params, ko.grad);
  const client::Error eo = other->Wait(other->PushPull(ko.id, ko.grad, ko.out));
  EXPECT_TRUE(eo.ok()) << eo.message;
  // The name again, from scratch.
  handle_ = CreateTenant("job", 2);
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
  EXPECT_EQ(k0.iteration, 0u);
  EXPECT_FALSE(Step(*c0, k0, *c1, k1).empty());
}

// CreateCheckpoint while training, train on, RestoreCheckpoint: the clients
// are told (BAD_ITERATION with the restored iteration), Pull the
// checkpoint's parameters, and the same gradients give the same results bit
// for bit (parameters and Adam's moments came back). Then kill -9: the hub
// resumes from the checkpoint at start-up.
TEST_F(DurabilityTest, CheckpointRestoreResumesBitExactly) {
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
  for (int i = 0; i < 5; ++i) Step(*c0, k0, *c1, k1);
  const std::vector<float> at5 = k0.params;
  const Result<pb::Checkpoint> ck = CreateCheckpoint();
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  ASSERT_EQ(ck->keys_size(), 1);
  EXPECT_EQ(ck->keys(0).iteration(), 5u);
  EXPECT_EQ(ck->sequence(), 1u);
  EXPECT_GT(ck->bytes(), kElements * 4 * 3);
  std::vector<std::vector<float>> after;
  for (int i = 0; i < 3; ++i) after.push_back(Step(*c0, k0, *c1, k1));

  {
    grpc::ClientContext ctx;
    pb::RestoreCheckpointRequest req;
    req.set_tenant("job");
    pb::Checkpoint resp;
    const grpc::Status s = checkpoints_->RestoreCheckpoint(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.sequence(), 1u);
  }
  for (auto [c, k, r] : {std::tuple{c0.get(), &k0, 0u}, std::tuple{c1.get(), &k1, 1u}}) {
    Gradient(k->seed, k->iteration, r, k->params, k->grad);
    const client::Error e = c->Wait(c->PushPull(k->id, k->grad, k->out));
    ASSERT_TRUE(NeedsResync(e)) << e.message;
    client::Error pe;
    ASSERT_TRUE(PullKey(*c, *k, &pe)) << pe.message;
    EXPECT_EQ(k->iteration, 5u);
    EXPECT_EQ(k->params, at5);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Step(*c0, k0, *c1, k1), after[i]) << "iteration " << 6 + i;
  }

  EXPECT_EQ(daemon_->Kill(), 128 + SIGKILL);
  ASSERT_TRUE(daemon_->Restart());
  EXPECT_NE(daemon_->Log().find("resumed from ckpt-00000000000000000001.rhc"), std::string::npos)
      << daemon_->Log();
  Gradient(k0.seed, k0.iteration, 0, k0.params, k0.grad);
  const client::Error e = c0->Wait(c0->PushPull(k0.id, k0.grad, k0.out));
  ASSERT_EQ(e.code, client::ErrorCode::kRolledBack) << e.message;
  EXPECT_EQ(e.iteration, 5u);
  client::Error pe;
  ASSERT_TRUE(PullKey(*c0, k0, &pe) && PullKey(*c1, k1, &pe)) << pe.message;
  EXPECT_EQ(k0.params, at5);
  EXPECT_EQ(Step(*c0, k0, *c1, k1), after[0]);
}

// A row-sparse table with row-wise AdaGrad (its per-row accumulators are
// checkpointed too): a checkpoint at iteration 4, two more steps, kill -9
// of the hub, restart: the workers are told to resync (kRolledBack at 4),
// PullRows gives the checkpoint's rows, and the two steps replayed give the
// same rows bit for bit. An uncheckpointed table of the same tenant comes
// back at its init values.
TEST_F(DurabilityTest, TableCheckpointSurvivesKillNine) {
  constexpr uint64_t kRows = 1000;
  constexpr uint32_t kDim = 8;
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  client::KeyDecl d;
  d.name = "emb";
  d.rows = kRows;
  d.dim = kDim;
  d.init = client::Init::kRandom;
  d.init_scale = 0.1f;
  d.init_seed = 9;
  client::OptimizerSpec adagrad;
  adagrad.type = "adagrad";
  adagrad.learning_rate = 0.1;
  d.optimizer = adagrad;
  client::KeyId k = 0, k1 = 0;
  ASSERT_TRUE(c0->DeclareKey(d, &k).ok());
  ASSERT_TRUE(c1->DeclareKey(d, &k1).ok());
  ASSERT_EQ(k, k1);
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  // Step `it` of both ranks: 200 ids each (duplicates, both lanes' ranges);
  // returns rank 0's reply (every row).
  const auto step = [&](uint64_t it) -> std::vector<float> {
    std::vector<uint64_t> ids[2];
    std::vector<float> g[2], out[2];
    client::Ticket t[2];
    client::Client* cs[2] = {c0.get(), c1.get()};
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < 200; ++i) ids[r].push_back((i * 37 + it * 101 + r * 7) % kRows);
      for (size_t i = 0; i < ids[r].size() * kDim; ++i) {
        g[r].push_back(static_cast<float>((i * 13 + it + r) % 29) / 29.0f - 0.5f);
      }
      out[r].resize(kRows * kDim);
      t[r] = cs[r]->PushPullRows(k, ids[r], g[r], all, out[r]);
    }
    for (uint32_t r = 0; r < 2; ++r) {
      const client::Error e = cs[r]->Wait(t[r]);
      EXPECT_TRUE(e.ok()) << "rank " << r << ": " << e.message;
    }
    EXPECT_EQ(out[0], out[1]);
    return out[0];
  };
  for (uint64_t it = 0; it < 4; ++it) step(it);
  std::vector<float> at4(kRows * kDim);
  ASSERT_TRUE(c0->Wait(c0->PullRows(k, all, at4)).ok());
  const Result<pb::Checkpoint> ck = CreateCheckpoint();
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  ASSERT_EQ(ck->keys_size(), 1);
  EXPECT_EQ(ck->keys(0).iteration(), 4u);
  const std::vector<float> at5 = step(4), at6 = step(5);

  EXPECT_EQ(daemon_->Kill(), 128 + SIGKILL);
  ASSERT_TRUE(daemon_->Restart());
  EXPECT_NE(daemon_->Log().find("resumed from ckpt-"), std::string::npos) << daemon_->Log();
  std::vector<float> out(kRows * kDim), g(kDim, 1.0f);
  const client::Error e =
      c0->Wait(c0->PushPullRows(k, std::vector<uint64_t>{3}, g, all, out));
  ASSERT_EQ(e.code, client::ErrorCode::kRolledBack) << e.message;
  EXPECT_EQ(e.iteration, 4u);
  for (client::Client* c : {c0.get(), c1.get()}) {
    ASSERT_TRUE(c->Wait(c->PullRows(k, all, out)).ok());
    EXPECT_EQ(out, at4);
    EXPECT_EQ(c->GetKeyInfo(k)->next_iteration, 4u);
  }
  EXPECT_EQ(step(4), at5);
  EXPECT_EQ(step(5), at6);
}

// A table's row ranges are fixed when it is created: a hub restarted with
// another lane count (2 -> 3) serves the same ranges (two of them now, on
// lanes 0 and 1) from its checkpoint, and training goes on.
TEST_F(DurabilityTest, TableKeepsItsRowRangesWhenTheLaneCountChanges) {
  constexpr uint64_t kRows = 1001;
  constexpr uint32_t kDim = 4;
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<float> before(kRows * kDim);
  {
    auto c0 = Connect(0), c1 = Connect(1);
    ASSERT_TRUE(c0 && c1);
    client::KeyDecl d;
    d.name = "emb";
    d.rows = kRows;
    d.dim = kDim;
    d.init = client::Init::kRandom;
    d.init_scale = 1.0f;
    client::KeyId k = 0;
    ASSERT_TRUE(c0->DeclareKey(d, &k).ok());
    ASSERT_TRUE(c1->DeclareKey(d, &k).ok());
    EXPECT_EQ(c0->GetKeyInfo(k)->rows_per_chunk, 501u);
    const std::vector<uint64_t> ids = {0, 500, 501, 1000};
    std::vector<float> g(ids.size() * kDim, 0.5f), out0(kRows * kDim), out1(kRows * kDim);
    const auto t0 = c0->PushPullRows(k, ids, g, all, out0);
    const auto t1 = c1->PushPullRows(k, ids, g, all, out1);
    ASSERT_TRUE(c0->Wait(t0).ok() && c1->Wait(t1).ok());
    before = out0;
    c0->Close();
    c1->Close();
  }
  EXPECT_EQ(daemon_->Stop(SIGTERM), 0);  // checkpoints every tenant on the way out
  const std::string state = daemon_->state_dir();
  daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
      "--lanes", "3", "--state-dir", state, "--checkpoint-every-iterations", "0",
      "--checkpoint-every-seconds", "0"});
  ASSERT_TRUE(daemon_->started());
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  const auto k = c0->FindKey("emb");
  ASSERT_TRUE(k.has_value());
  const client::KeyInfo info = *c0->GetKeyInfo(*k);
  EXPECT_EQ(info.rows_per_chunk, 501u);
  EXPECT_EQ(info.chunk_count, 2u);
  EXPECT_EQ(info.next_iteration, 1u);
  std::vector<float> out(kRows * kDim);
  ASSERT_TRUE(c1->Wait(c1->PullRows(*k, all, out)).ok());
  EXPECT_EQ(out, before);
  const std::vector<uint64_t> ids = {1000};
  std::vector<float> g(kDim, 0.5f), o0(kDim), o1(kDim);
  const auto t0 = c0->PushPullRows(*k, ids, g, ids, o0);
  const auto t1 = c1->PushPullRows(*k, ids, g, ids, o1);
  ASSERT_TRUE(c0->Wait(t0).ok() && c1->Wait(t1).ok());
  EXPECT_EQ(o0, o1);
  EXPECT_NE(o0[0], before[1000 * kDim]);
}

// Checkpoints taken while both ranks train flat out (no pause between
// steps): every one succeeds, and its parameters are exactly those the
// workers received at the checkpoint's iteration (one consistent version
// for every chunk, though the lanes keep updating meanwhile).
TEST_F(DurabilityTest, CheckpointsWhileTrainingAreConsistent) {
  std::mutex mu;
  std::map<uint64_t, std::string> seen;  // iteration -> params hash (rank 0)
  std::atomic<uint64_t> stop_at{UINT64_MAX};  // both ranks stop after the same iteration
  std::atomic<uint64_t> steps{0};
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto c = Connect(r);
      if (!c) return;
      TrainingKey k = Declare(*c);
      while (k.iteration < stop_at) {
        Gradient(k.seed, k.iteration, r, k.params, k.grad);
        const client::Error e = c->Wait(c->PushPull(k.id, k.grad, k.out));
        if (!e.ok()) {
          ADD_FAILURE() << e.message;
          return;
        }
        k.params.swap(k.out);
        ++k.iteration;
        if (r == 0) {
          std::lock_guard lock(mu);
          seen[k.iteration] = HashFloats(k.params);
          ++steps;
        }
      }
    });
  }
  while (steps < 10) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::vector<std::pair<uint64_t, std::string>> checkpoints;
  for (int i = 0; i < 15; ++i) {
    const Result<pb::Checkpoint> ck = CreateCheckpoint();
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    Result<server::CheckpointImage> image = server::ReadCheckpoint(ck->path());
    ASSERT_TRUE(image.ok()) << image.status().message();
    std::vector<float> params;
    for (const auto& c : image->chunks) params.insert(params.end(), c.params.begin(), c.params.end());
    checkpoints.emplace_back(image->keys.at(0).version, HashFloats(params));
  }
  stop_at = steps + 5;
  for (auto& t : ranks) t.join();
  std::set<uint64_t> distinct;
  for (const auto& [v, hash] : checkpoints) {
    distinct.insert(v);
    if (v == 0) continue;
    std::lock_guard lock(mu);
    ASSERT_TRUE(seen.count(v)) << "iteration " << v;
    EXPECT_EQ(seen[v], hash) << "checkpoint at iteration " << v;
  }
  EXPECT_GT(distinct.size(), 3u) << "training did not go on while checkpointing";
}

// Damaged checkpoints (bit flip, truncation, a format version this build
// does not read) are skipped at start-up with a log line naming the file and
// the reason; the newest valid one is used.
TEST_F(DurabilityTest, DamagedCheckpointsAreSkippedAtStart) {
  StartDaemon({"--checkpoint-keep", "5"});
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
  std::vector<std::vector<float>> at;  // params at the checkpoints
  for (int n = 0; n < 4; ++n) {
    Step(*c0, k0, *c1, k1);
    Step(*c0, k0, *c1, k1);
    ASSERT_TRUE(CreateCheckpoint().ok());
    at.push_back(k0.params);
  }
  EXPECT_EQ(daemon_->Kill(), 128 + SIGKILL);
  const std::string dir = CheckpointDir() + "/";
  const std::string fourth = dir + "ckpt-00000000000000000004.rhc";
  const std::string third = dir + "ckpt-00000000000000000003.rhc";
  const std::string second = dir + "ckpt-00000000000000000002.rhc";
  {
    // Format version 2 with a valid header checksum: a newer format.
    std::fstream f(fourth, std::ios::in | std::ios::out | std::ios::binary);
    char header[64];
    f.read(header, sizeof header);
    const uint32_t version = 2;
    std::memcpy(header + 8, &version, sizeof version);
    const uint64_t sum = XXH3_64bits(header, 56);
    std::memcpy(header + 56, &sum, sizeof sum);
    f.seekp(0);
    f.write(header, sizeof header);
  }
  {
    std::fstream f(third, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(third) - 100));
    f.put('\x5a');
  }
  fs::resize_file(second, fs::file_size(second) / 2);
  ASSERT_TRUE(daemon_->Restart());
  const std::string log = daemon_->Log();
  EXPECT_NE(log.find("skipped damaged checkpoint " + fourth), std::string::npos) << log;
  EXPECT_NE(log.find("version 2"), std::string::npos) << log;
  EXPECT_NE(log.find("skipped damaged checkpoint " + third), std::string::npos) << log;
  EXPECT_NE(log.find("skipped damaged checkpoint " + second), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from ckpt-00000000000000000001.rhc"), std::string::npos) << log;
  Gradient(k0.seed, k0.iteration, 0, k0.params, k0.grad);
  const client::Error e = c0->Wait(c0->PushPull(k0.id, k0.grad, k0.out));
  ASSERT_EQ(e.code, client::ErrorCode::kRolledBack) << e.message;
  EXPECT_EQ(e.iteration, 2u);
  client::Error pe;
  ASSERT_TRUE(PullKey(*c0, k0, &pe) && PullKey(*c1, k1, &pe)) << pe.message;
  EXPECT_EQ(k0.params, at[0]);
  EXPECT_FALSE(Step(*c0, k0, *c1, k1).empty());
}

// A checkpoint file copied under another sequence's name (its manifest says
// 1, its name 9) is refused by `restore 9` as `list` and start-up refuse it,
// and the tenant is not touched (found by fuzz/checkpoint/checkpoint_fuzz).
TEST_F(DurabilityTest, RestoreRefusesAFileUnderAnotherSequence) {
  auto c0 = Connect(0), c1 = Connect(1);
  ASSERT_TRUE(c0 && c1);
  TrainingKey k0 = Declare(*c0), k1 = Declare(*c1);
  Step(*c0, k0, *c1, k1);
  ASSERT_TRUE(CreateCheckpoint().ok());
  Step(*c0, k0, *c1, k1);
  const std::string dir = CheckpointDir() + "/";
  fs::copy_file(dir + server::CheckpointFileName(1), dir + server::CheckpointFileName(9));
  grpc::ClientContext ctx;
  pb::RestoreCheckpointRequest req;
  req.set_tenant("job");
  req.set_sequence(9);
  pb::Checkpoint resp;
  const grpc::Status s = checkpoints_->RestoreCheckpoint(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("manifest says sequence 1"), std::string::npos)
      << s.error_message();
  EXPECT_FALSE(Step(*c0, k0, *c1, k1).empty());  // not rolled back
  EXPECT_EQ(k0.iteration, 3u);
}

}  // namespace
}  // namespace rackhub::testing
