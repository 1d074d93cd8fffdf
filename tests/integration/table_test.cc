// Row-sparse tables (issue 16) end to end over every transport
// (hub_under_test.h): a hub with 3 lanes, so a table's rows are split into 3
// row ranges on 3 lanes; workers are threads of this process, each with its
// own librackhub Client. Every PushPullRows reply and every PullRows is
// compared bit for bit with the reference model (tests/support/
// table_reference.h) fed the same pushes: rank-order row sums, duplicates
// summed in push order, each optimizer on touched rows only. Pushes cover
// empty pushes, all-rows pushes, duplicate ids, rows at the range
// boundaries, fp16/bf16 rows; bad requests (client-side and raw frames to
// the hub) are refused with a clear error and change nothing; a rank that
// does not push fails the iteration (straggler) and the job resumes after
// PullRows; a table over the tenant's quota is refused naming its memory.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hub_under_test.h"
#include "process.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/client/client.h"
#include "rackhub/client/rackhub_c.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/frame.h"
#include "table_reference.h"
#include "worker_ranks.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::DType;
using client::ErrorCode;
using testing::BinPath;
using testing::HubUnderTest;
using testing::RunCommand;
using testing::TablePush;
using testing::TableReference;
using testing::ThreadRank;
using testing::Transport;

constexpr uint32_t kLanes = 3;
// 50 rows on 3 lanes: rows per chunk ceil(50 / 3) = 17, ranges [0, 17),
// [17, 34), [34, 50).
constexpr uint64_t kRows = 50;
constexpr uint32_t kDim = 5;
const std::vector<uint64_t> kBoundaryRows = {0, 16, 17, 33, 34, 49};

float Narrow(DType dtype, float f) {
  if (dtype == DType::kFp16) return client::HalfToFloat(client::FloatToHalf(f));
  if (dtype == DType::kBf16) return client::Bfloat16ToFloat(client::FloatToBfloat16(f));
  return f;
}

bool SameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// A table's optimizer for the client (Spec) and the reference (Config).
struct TableOpt {
  std::string type;
  double lr = 0.05, momentum = 0, wd = 0, beta1 = 0, beta2 = 0, eps = 0, acc = 0;
  bool sum = false;
  client::OptimizerSpec Spec() const {
    client::OptimizerSpec s;
    s.type = type;
    s.learning_rate = lr;
    s.momentum = momentum;
    s.weight_decay = wd;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.epsilon = eps;
    s.initial_accumulator = acc;
    s.reduction = sum ? "sum" : "mean";
    return s;
  }
  aggregation::OptimizerConfig Config() const {
    aggregation::OptimizerConfig c;
    for (int t = 1; t <= 7; ++t) {
      const auto candidate = static_cast<aggregation::OptimizerType>(t);
      if (type == aggregation::OptimizerTypeName(candidate)) c.type = candidate;
    }
    c.learning_rate = lr;
    c.momentum = momentum;
    c.weight_decay = wd;
    c.beta1 = beta1;
    c.beta2 = beta2;
    c.epsilon = eps;
    c.initial_accumulator = acc;
    c.reduction = sum ? aggregation::Reduction::kSum : aggregation::Reduction::kMean;
    EXPECT_TRUE(aggregation::NormalizeOptimizer(&c).ok()) << type;
    return c;
  }
};

class TableTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    std::string why;
    // Small shared-memory rings (64 KiB with 1 KiB chunks): row frames larger
    // than half a ring are tested below.
    hub_ = HubUnderTest::Start(GetParam(),
                               {"--lanes", std::to_string(kLanes), "--straggler-timeout-ms",
                                std::to_string(1500 * HubUnderTest::TimeScale(GetParam())),
                                "--shm-ring-bytes", "65536"},
                               &why);
    if (!hub_ && GetParam() == Transport::kRdma) GTEST_SKIP() << why;
    ASSERT_TRUE(hub_) << why;
  }

  std::chrono::milliseconds Scaled(std::chrono::milliseconds d) const {
    return d * hub_->time_scale();
  }

  std::string CreateTenant(const std::string& name, uint32_t workers,
                           std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {BinPath("rackhubctl"), "--admin", hub_->admin_address(),
                                     "tenant", "create", name, "--workers",
                                     std::to_string(workers)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = RunCommand(argv);
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
    o.connect_timeout = Scaled(5s);
    o.op_timeout = Scaled(30s);
    if (GetParam() == Transport::kRdma) {
      o.transport = client::Transport::kRdma;
      o.rdma_hub = hub_->rdma_address();
      o.rdma_ring_bytes = 256 * 1024;
    }
    o.shm = GetParam() == Transport::kShm ? client::Shm::kOn : client::Shm::kOff;
    client::Error e;
    auto c = GetParam() == Transport::kMemory ? ThreadRank::ConnectInMemory(*hub_, o, &e)
                                              : Client::Connect(o, &e);
    EXPECT_NE(c, nullptr) << e.message;
    return c;
  }

  // W clients of a new tenant, each having declared table `name`.
  struct Job {
    std::vector<std::unique_ptr<Client>> ranks;
    client::KeyId key = 0;
  };
  Job StartJob(const std::string& tenant, uint32_t workers, const client::KeyDecl& decl) {
    Job job;
    const std::string token = CreateTenant(tenant, workers);
    for (uint32_t r = 0; r < workers; ++r) {
      job.ranks.push_back(Connect(tenant, token, r));
      if (!job.ranks.back()) return job;
      client::KeyId id = 0;
      const client::Error e = job.ranks.back()->DeclareKey(decl, &id);
      EXPECT_TRUE(e.ok()) << e.message;
      EXPECT_TRUE(r == 0 || id == job.key);
      job.key = id;
    }
    return job;
  }

  std::unique_ptr<HubUnderTest> hub_;
};

// Rank r's push of iteration `it` and the rows it wants back: iteration 0
// pushes nothing, 1 every row (in reverse order), later ones random ids with
// duplicates and the range boundaries; rank 1 pushes nothing at iteration 3.
TablePush MakePush(std::mt19937& rng, uint32_t rank, uint64_t it, DType dtype) {
  TablePush p;
  if (it == 1) {
    for (uint64_t id = kRows; id-- > 0;) p.ids.push_back(id);
  } else if (it >= 2 && !(it == 3 && rank == 1)) {
    std::uniform_int_distribution<uint64_t> id(0, kRows - 1);
    const size_t n = 3 + rng() % 12;
    for (size_t i = 0; i < n; ++i) p.ids.push_back(id(rng));
    p.ids.push_back(kBoundaryRows[(it + rank) % kBoundaryRows.size()]);
    p.ids.push_back(p.ids.front());  // a duplicate
  }
  std::normal_distribution<float> val(0.0f, 1.0f);
  for (size_t i = 0; i < p.ids.size() * kDim; ++i) p.rows.push_back(val(rng));
  (void)dtype;
  return p;
}

std::vector<uint64_t> MakeWant(std::mt19937& rng) {
  std::vector<uint64_t> want = kBoundaryRows;
  std::uniform_int_distribution<uint64_t> id(0, kRows - 1);
  for (int i = 0; i < 6; ++i) want.push_back(id(rng));
  want.push_back(want[2]);  // asked twice
  return want;
}

// Trains `iterations` steps with W threads and checks every reply and the
// whole table against the reference, bit for bit.
void TrainAndCompare(std::vector<std::unique_ptr<Client>>& ranks, client::KeyId key,
                     const TableOpt& opt, DType dtype, uint64_t seed, float scale,
                     uint64_t iterations) {
  const uint32_t workers = static_cast<uint32_t>(ranks.size());
  TableReference ref(opt.Config(), workers, 0, kRows, kDim);
  if (scale > 0) client::TableInitValues(seed, scale, 0, kRows, kDim, ref.values.data());
  std::mt19937 rng(1234);
  for (uint64_t it = 0; it < iterations; ++it) {
    std::vector<TablePush> pushes;
    std::vector<std::vector<uint64_t>> wants;
    for (uint32_t r = 0; r < workers; ++r) {
      pushes.push_back(MakePush(rng, r, it, dtype));
      wants.push_back(MakeWant(rng));
    }
    std::vector<std::vector<float>> outs(workers);
    std::vector<std::future<client::Error>> done;
    for (uint32_t r = 0; r < workers; ++r) {
      outs[r].assign(wants[r].size() * kDim, -1.0f);
      done.push_back(std::async(std::launch::async, [&, r] {
        return ranks[r]->Wait(
            ranks[r]->PushPullRows(key, pushes[r].ids, pushes[r].rows, wants[r], outs[r]));
      }));
    }
    for (uint32_t r = 0; r < workers; ++r) {
      const client::Error e = done[r].get();
      ASSERT_TRUE(e.ok()) << "rank " << r << " iteration " << it << ": " << e.message;
    }
    for (TablePush& p : pushes) {  // what the hub received
      for (float& v : p.rows) v = Narrow(dtype, v);
    }
    ref.Update(pushes);
    for (uint32_t r = 0; r < workers; ++r) {
      for (size_t i = 0; i < wants[r].size(); ++i) {
        for (uint32_t j = 0; j < kDim; ++j) {
          const float want = Narrow(dtype, ref.Row(wants[r][i])[j]);
          ASSERT_TRUE(SameBits(outs[r][i * kDim + j], want))
              << opt.type << " iteration " << it << " rank " << r << " row " << wants[r][i]
              << " col " << j << ": got " << outs[r][i * kDim + j] << ", reference " << want;
        }
      }
    }
    EXPECT_EQ(ranks[0]->GetKeyInfo(key)->next_iteration, it + 1);
  }
  // The whole table, pulled by the last rank.
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<float> got(kRows * kDim);
  const client::Error e = ranks.back()->Wait(ranks.back()->PullRows(key, all, got));
  ASSERT_TRUE(e.ok()) << e.message;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(SameBits(got[i], Narrow(dtype, ref.values[i]))) << opt.type << " element " << i;
  }
}

TEST_P(TableTest, EveryOptimizerBitForBitWithThreeWorkers) {
  const std::vector<TableOpt> opts = {
      {"sgd", 0.1, 0, 0.01},
      {"momentum", 0.05, 0.9},
      {"nesterov", 0.05, 0.8, 0.001},
      {"adam", 0.01},
      {"adamw", 0.01, 0, 0.05},
      {"adagrad", 0.1, 0, 0.001, 0, 0, 0, 0.1},  // row-wise
      {"sum-only", 0, 0, 0, 0, 0, 0, 0, true},
  };
  int n = 0;
  for (const TableOpt& opt : opts) {
    client::KeyDecl decl;
    decl.name = "emb";
    decl.rows = kRows;
    decl.dim = kDim;
    decl.optimizer = opt.Spec();
    decl.init = client::Init::kRandom;
    decl.init_scale = 0.5f;
    decl.init_seed = 42 + n;
    Job job = StartJob("t" + std::to_string(n++), 3, decl);
    ASSERT_EQ(job.ranks.size(), 3u);
    TrainAndCompare(job.ranks, job.key, opt, DType::kFp32, decl.init_seed, 0.5f, 6);
    if (HasFatalFailure()) return;
    const auto info = job.ranks[0]->GetKeyInfo(job.key);
    EXPECT_EQ(info->rows, kRows);
    EXPECT_EQ(info->dim, kDim);
    EXPECT_EQ(info->chunk_count, kLanes);
  }
}

TEST_P(TableTest, Fp16AndBf16Rows) {
  for (const DType dtype : {DType::kFp16, DType::kBf16}) {
    client::KeyDecl decl;
    decl.name = "emb";
    decl.rows = kRows;
    decl.dim = kDim;
    decl.dtype = dtype;
    decl.optimizer = TableOpt{"adagrad", 0.1}.Spec();
    const std::string tenant = dtype == DType::kFp16 ? "half" : "bhalf";
    Job job = StartJob(tenant, 2, decl);
    ASSERT_EQ(job.ranks.size(), 2u);
    TrainAndCompare(job.ranks, job.key, TableOpt{"adagrad", 0.1}, dtype, 0, 0.0f, 4);
  }
}

// Refusals change nothing: the table is pulled before and after.
TEST_P(TableTest, BadRequestsAreRefusedAndChangeNothing) {
  client::KeyDecl decl;
  decl.name = "emb";
  decl.rows = kRows;
  decl.dim = kDim;
  decl.optimizer = TableOpt{"sgd", 0.5}.Spec();
  decl.init = client::Init::kRandom;
  decl.init_scale = 1.0f;
  Job job = StartJob("bad", 1, decl);
  ASSERT_EQ(job.ranks.size(), 1u);
  Client& c = *job.ranks[0];
  std::vector<uint64_t> all(kRows);
  for (uint64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<float> before(kRows * kDim), after(kRows * kDim);
  ASSERT_TRUE(c.Wait(c.PullRows(job.key, all, before)).ok());

  const auto expect_invalid = [&](client::Error e, const std::string& words) {
    EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << e.message;
    EXPECT_NE(e.message.find(words), std::string::npos) << e.message;
  };
  std::vector<float> g(2 * kDim, 1.0f), out(kDim);
  const std::vector<uint64_t> bad = {3, kRows};
  expect_invalid(c.Wait(c.PushPullRows(job.key, bad, g, {}, {})), "ids[1] = 50 is out of range");
  expect_invalid(c.Wait(c.PushPullRows(job.key, std::vector<uint64_t>{1}, g, {}, {})),
                 "1 row ids need 5 gradient values, got 10");
  expect_invalid(c.Wait(c.PullRows(job.key, std::vector<uint64_t>{kRows + 7}, out)),
                 "out of range");
  expect_invalid(c.Wait(c.PullRows(job.key, std::vector<uint64_t>{1, 2}, out)),
                 "an output of 10 values, got 5");
  client::KeyId dense = 0;
  ASSERT_TRUE(c.DeclareKey({"dense", 10}, &dense).ok());
  expect_invalid(c.Wait(c.PullRows(dense, std::vector<uint64_t>{1}, out)), "the key is dense");
  // A table cannot change shape; a dense key of the same name is refused.
  client::KeyDecl other = decl;
  other.dim = kDim + 1;
  client::KeyId x = 0;
  client::Error e = c.DeclareKey(other, &x);
  EXPECT_EQ(e.code, ErrorCode::kServer);
  EXPECT_NE(e.message.find("already exists as a 50 x 5 table"), std::string::npos) << e.message;
  e = c.DeclareKey({"emb", kRows * kDim}, &x);
  EXPECT_EQ(e.code, ErrorCode::kServer) << e.message;

  // Raw frames the client would never send reach the hub's own checks.
  std::unique_ptr<testing::DataLink> link = hub_->Connect();
  const std::string token = CreateTenant("raw", 1);
  // (The raw tenant has its own table; "bad" keeps rank 0's client.)
  const auto w = link->Hello("raw", token, 0, 0);
  ASSERT_NE(w.tenant_handle(), 0u);
  data::v1::KeyDeclaration d;
  d.set_name("t");
  d.set_rows(kRows);
  d.set_dim(kDim);
  net::FrameHeader h;
  h.opcode = net::Opcode::kDeclare;
  h.tenant = w.tenant_handle();
  link->Send(h, d.SerializeAsString());
  auto info = link->Receive();
  ASSERT_TRUE(info && info->h.opcode == net::Opcode::kKeyInfo) << testing::Describe(info);
  const uint32_t key = info->h.key;
  const auto push = [&](std::vector<uint64_t> ids, std::vector<uint64_t> want, size_t rows,
                        uint64_t request) {
    std::string payload = net::EncodeRowsRequest(ids, want);
    payload.append(rows * kDim * 4, '\0');
    net::FrameHeader p;
    p.opcode = net::Opcode::kPushRows;
    p.dtype = net::DType::kFp32;
    p.tenant = w.tenant_handle();
    p.key = key;
    p.chunk = 0;  // rows [0, 17) on lane 0
    p.request_id = request;
    link->Send(p, payload);
    return link->Receive();
  };
  const auto expect_error = [&](const std::optional<testing::Frame>& f, const std::string& words) {
    ASSERT_TRUE(f.has_value());
    ASSERT_EQ(f->h.opcode, net::Opcode::kError) << testing::Describe(f);
    EXPECT_NE(testing::Describe(f).find(words), std::string::npos) << testing::Describe(f);
  };
  expect_error(push({20}, {}, 1, 1), "row id 20 is not in [0, 17)");  // on lane 1's range
  expect_error(push({1}, {}, 2, 2), "need 36 bytes, got 56");
  expect_error(push({1}, {40}, 1, 3), "row id 40 is not in [0, 17)");
  // A good push after the refusals is the rank's first contribution.
  auto ok = push({1, 1}, {1}, 2, 4);
  ASSERT_TRUE(ok && ok->h.opcode == net::Opcode::kRows) << testing::Describe(ok);
  EXPECT_EQ(ok->h.iteration, 1u);

  // Nothing of the refused client calls reached "bad"'s table.
  ASSERT_TRUE(c.Wait(c.PullRows(job.key, all, after)).ok());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0);
  EXPECT_EQ(c.GetKeyInfo(job.key)->next_iteration, 0u);
}

// A rank that does not push: the others' PushPullRows fail (WORKER_LOST
// after the straggler timeout), PullRows resynchronizes, and training goes
// on with results equal to a reference that skipped the aborted step.
TEST_P(TableTest, StragglerAbortsTheIterationAndTheJobResumes) {
  client::KeyDecl decl;
  decl.name = "emb";
  decl.rows = kRows;
  decl.dim = kDim;
  decl.optimizer = TableOpt{"adam", 0.01}.Spec();
  Job job = StartJob("slow", 2, decl);
  ASSERT_EQ(job.ranks.size(), 2u);
  const std::vector<uint64_t> ids = {0, 17, 49}, want = {0, 17, 49};
  std::vector<float> g(ids.size() * kDim, 0.25f), out(want.size() * kDim);
  // Only rank 0 pushes iteration 0.
  const client::Error e = job.ranks[0]->Wait(job.ranks[0]->PushPullRows(job.key, ids, g, want, out));
  EXPECT_EQ(e.code, ErrorCode::kServer) << e.message;
  EXPECT_EQ(e.wire, client::WireError::kWorkerLost) << e.message;
  EXPECT_NE(e.message.find("straggler: rank(s) 1"), std::string::npos) << e.message;
  // Until a PullRows, the table needs a resync.
  const client::Error again =
      job.ranks[0]->Wait(job.ranks[0]->PushPullRows(job.key, ids, g, want, out));
  EXPECT_EQ(again.code, ErrorCode::kRolledBack) << again.message;
  for (auto& c : job.ranks) {
    ASSERT_TRUE(c->Wait(c->PullRows(job.key, want, out)).ok());
  }
  // Both ranks now train from the hub's version; nothing of rank 0's aborted
  // push is in the rows (they are still zeros, Adam's t still counts from 1).
  for (float v : out) EXPECT_EQ(v, 0.0f);
  std::vector<std::vector<float>> outs(2, std::vector<float>(want.size() * kDim));
  std::vector<std::future<client::Error>> done;
  for (uint32_t r = 0; r < 2; ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      return job.ranks[r]->Wait(job.ranks[r]->PushPullRows(job.key, ids, g, want, outs[r]));
    }));
  }
  for (auto& d : done) ASSERT_TRUE(d.get().ok());
  TableReference ref(TableOpt{"adam", 0.01}.Config(), 2, 0, kRows, kDim);
  ref.t = job.ranks[0]->GetKeyInfo(job.key)->version - 1;
  ref.Update({{ids, g}, {ids, g}});
  for (size_t i = 0; i < want.size(); ++i) {
    for (uint32_t j = 0; j < kDim; ++j) {
      EXPECT_TRUE(SameBits(outs[0][i * kDim + j], ref.Row(want[i])[j])) << i << "," << j;
      EXPECT_TRUE(SameBits(outs[1][i * kDim + j], ref.Row(want[i])[j])) << i << "," << j;
    }
  }
}

TEST_P(TableTest, QuotaCountsTheTablesMemory) {
  const std::string token = CreateTenant("quota", 1, {"--max-param-bytes", "1MiB"});
  auto c = Connect("quota", token, 0);
  ASSERT_NE(c, nullptr);
  client::KeyDecl decl;
  decl.name = "big";
  decl.rows = 10000;
  decl.dim = 16;  // 640 KB of rows, x2 with momentum's state
  decl.optimizer = TableOpt{"momentum", 0.1, 0.9}.Spec();
  client::KeyId id = 0;
  client::Error e = c->DeclareKey(decl, &id);
  EXPECT_EQ(e.code, ErrorCode::kServer) << e.message;
  EXPECT_EQ(e.wire, client::WireError::kQuotaExceeded) << e.message;
  EXPECT_NE(e.message.find("fp32 rows"), std::string::npos) << e.message;
  decl.optimizer = TableOpt{"sgd", 0.1}.Spec();  // 640 KB fits
  e = c->DeclareKey(decl, &id);
  EXPECT_TRUE(e.ok()) << e.message;
}

// Row frames of 39-59 KiB, larger than half a 64 KiB shared-memory ring
// (a record never wraps: the pad goes ahead alone), at every ring position,
// bit for bit; a frame larger than the whole ring is refused by the client
// with a clear error over shared memory (and fine over the other transports).
TEST_P(TableTest, RowFramesLargerThanHalfTheShmRing) {
  constexpr uint64_t kBigRows = 3000;  // 1000 rows per range
  constexpr uint32_t kBigDim = 16;     // 64 bytes per row
  const std::string token = CreateTenant("ring", 1, {"--chunk-bytes", "1024"});
  auto c = Connect("ring", token, 0);
  ASSERT_NE(c, nullptr);
  client::KeyDecl decl;
  decl.name = "emb";
  decl.rows = kBigRows;
  decl.dim = kBigDim;
  decl.optimizer = TableOpt{"sum-only", 0, 0, 0, 0, 0, 0, 0, true}.Spec();
  client::KeyId key = 0;
  ASSERT_TRUE(c->DeclareKey(decl, &key).ok());
  std::mt19937 rng(7);
  for (int it = 0; it < 12; ++it) {
    // 500..750 rows of range 0, pushed and wanted: 80 bytes a row, 39-59 KiB.
    const size_t n = 500 + rng() % 251;
    std::vector<uint64_t> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = (i * 7 + it) % 1000;
    std::vector<float> g(n * kBigDim), out(n * kBigDim);
    for (float& v : g) v = static_cast<float>(rng() % 1000) / 8.0f;
    const client::Error e = c->Wait(c->PushPullRows(key, ids, g, ids, out));
    ASSERT_TRUE(e.ok()) << "iteration " << it << " (" << n << " rows): " << e.message;
    TableReference ref(TableOpt{"sum-only", 0, 0, 0, 0, 0, 0, 0, true}.Config(), 1, 0, kBigRows,
                       kBigDim);
    ref.Update({{ids, g}});
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t j = 0; j < kBigDim; ++j) {
        ASSERT_TRUE(SameBits(out[i * kBigDim + j], ref.Row(ids[i])[j])) << it << " " << i;
      }
    }
  }
  // 1000 rows of range 0: 78 KiB in one frame.
  std::vector<uint64_t> ids(1000);
  for (uint64_t i = 0; i < 1000; ++i) ids[i] = i;
  std::vector<float> g(ids.size() * kBigDim, 1.0f), out(ids.size() * kBigDim);
  const client::Error e = c->Wait(c->PushPullRows(key, ids, g, ids, out));
  if (GetParam() == Transport::kShm) {
    EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << e.message;
    EXPECT_NE(e.message.find("raise the hub's data.shm_ring_bytes"), std::string::npos)
        << e.message;
    EXPECT_STREQ(c->transport(), "shm");  // nothing broke
    std::vector<float> two(2 * kBigDim);
    const client::Error again = c->Wait(c->PullRows(key, std::vector<uint64_t>{0, 999}, two));
    EXPECT_TRUE(again.ok()) << again.message;
  } else {
    EXPECT_TRUE(e.ok()) << e.message;
  }
}

// The C ABI over TCP (the functions of rackhub_c.h for tables): the same
// results as the reference, and its argument checks.
TEST_P(TableTest, CApi) {
  if (GetParam() != Transport::kTcp) GTEST_SKIP() << "the C ABI dials TCP only";
  const std::string token = CreateTenant("capi", 1);
  const std::string hub = hub_->data_address();
  rackhub_options o{};
  o.hub = hub.c_str();
  o.tenant = "capi";
  o.token = token.c_str();
  rackhub_client* c = nullptr;
  char err[256] = "";
  ASSERT_EQ(rackhub_connect(&o, &c, err, sizeof err), RACKHUB_OK) << err;
  rackhub_optimizer sgd{};
  sgd.type = "sgd";
  sgd.learning_rate = 0.5;
  uint32_t key = 0;
  ASSERT_EQ(rackhub_declare_table(c, "emb", kRows, kDim, RACKHUB_FP32, &sgd, RACKHUB_INIT_RANDOM,
                                  0.25f, 5, &key),
            RACKHUB_OK)
      << rackhub_last_error(c);
  EXPECT_EQ(rackhub_declare_table(c, "x", kRows, kDim, RACKHUB_FP32, &sgd,
                                  RACKHUB_INIT_FROM_CLIENT, 0, 0, &key),
            RACKHUB_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rackhub_last_error(c)).find("RACKHUB_INIT_ZEROS or _RANDOM"),
            std::string::npos);
  TableReference ref(TableOpt{"sgd", 0.5}.Config(), 1, 0, kRows, kDim);
  client::TableInitValues(5, 0.25f, 0, kRows, kDim, ref.values.data());
  const std::vector<uint64_t> ids = {49, 0, 49}, want = {49, 16, 17};
  std::vector<float> g(ids.size() * kDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.125f * static_cast<float>(i % 7);
  std::vector<float> out(want.size() * kDim);
  ASSERT_EQ(rackhub_push_pull_rows(c, key, ids.data(), ids.size(), g.data(), want.data(),
                                   want.size(), out.data()),
            RACKHUB_OK)
      << rackhub_last_error(c);
  ref.Update({{ids, g}});
  for (size_t i = 0; i < want.size(); ++i) {
    for (uint32_t j = 0; j < kDim; ++j) {
      EXPECT_TRUE(SameBits(out[i * kDim + j], ref.Row(want[i])[j])) << i << "," << j;
    }
  }
  std::vector<float> one(kDim);
  const uint64_t bad = kRows;
  EXPECT_EQ(rackhub_pull_rows(c, key, &bad, 1, one.data()), RACKHUB_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rackhub_last_error(c)).find("out of range"), std::string::npos);
  EXPECT_EQ(rackhub_pull_rows(c, key, &bad, 1, nullptr), RACKHUB_INVALID_ARGUMENT);
  const uint64_t row = 0;
  ASSERT_EQ(rackhub_pull_rows(c, key, &row, 1, one.data()), RACKHUB_OK);
  for (uint32_t j = 0; j < kDim; ++j) EXPECT_TRUE(SameBits(one[j], ref.Row(0)[j]));
  rackhub_close(c);
}

INSTANTIATE_TEST_SUITE_P(Transports, TableTest, ::testing::ValuesIn(testing::AllTransports()),
                         testing::TransportParamName);

}  // namespace
}  // namespace rackhub
