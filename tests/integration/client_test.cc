// librackhub end to end over every transport (hub_under_test.h): a hub with 3
// unpinned lanes and 1 KiB chunks (so keys span several chunks and lanes),
// tenants created with the real rackhubctl, and workers
// (test_worker.h) for the multi-worker scenarios:
//   Memory: the hub runs in this process; every worker is a thread of this
//           process with its own Client over in-memory lanes
//           (rackhub/client/testing.h);
//   Tcp:    the real rackhubd and real worker processes (rackhub-test-worker,
//           rackhub-test-capi-worker);
//   Rdma:   the same with --transport rdma (skipped without a verbs device;
//           tests/rdma/run.sh runs them in a Soft-RoCE VM; every time bound
//           scaled by time_scale()).
// Parameters are checked against an independent double-precision model of
// the hub's update rules (admin.proto, kernels.h).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "hub_under_test.h"
#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/testing.h"
#include "rackhub/data/v1/control.pb.h"
#include "rackhub/net/asio.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/testing/memory_connection.h"
#include "rackhub/net/transport.h"
#include "test_worker.h"
#include "wait.h"
#include "worker_ranks.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::DType;
using client::ErrorCode;
using testing::BinPath;
using testing::ChildProcess;
using testing::HubUnderTest;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::RunCommand;
using testing::Transport;
using testing::HexFloats;
using testing::ParseWorker;
using testing::ProcessRank;
using testing::Rank;
using testing::ThreadRank;
using testing::WorkerOutput;
using testing::Words;
namespace asio = boost::asio;

constexpr uint32_t kChunkBytes = 1024;  // 256 fp32 elements per chunk

// ---- Keep in sync with tests/support/worker_main.cc ----
float Gradient(uint32_t rank, uint64_t iteration, uint64_t index) {
  const int64_t k = static_cast<int64_t>((index * 7 + rank * 13 + iteration * 5) % 101) - 50;
  return static_cast<float>(k) / 64.0f + 0.001f * static_cast<float>(index % 7) +
         0.01f * static_cast<float>(rank);
}
float InitialValue(uint64_t index) {
  return static_cast<float>((static_cast<int64_t>(index % 17) - 8)) * 0.125f +
         0.003f * static_cast<float>(index % 5);
}

// The compiler's own fp16 conversions, as independent references: GCC's
// _Float16; clang 14 has no _Float16 on x86 but a storage-only __fp16
// (converted by compiler-rt's builtins, linked in tests/CMakeLists.txt).
#if defined(__clang__)
using CompilerHalf = __fp16;
#else
using CompilerHalf = _Float16;
#endif
uint16_t CompilerFloatToHalf(float f) {
  const CompilerHalf h = static_cast<CompilerHalf>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}
float CompilerHalfToFloat(uint16_t bits) {
  CompilerHalf h;
  std::memcpy(&h, &bits, sizeof bits);
  return static_cast<float>(h);
}

// Independent narrowing references: the compiler's fp16, and bf16 by
// picking the nearer of the two neighbouring bf16 values in double.
float RefNarrow(DType dtype, float f) {
  if (dtype == DType::kFp16) return CompilerHalfToFloat(CompilerFloatToHalf(f));
  if (dtype == DType::kBf16) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint32_t lo_bits = bits & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    std::memcpy(&lo, &lo_bits, 4);
    std::memcpy(&hi, &hi_bits, 4);
    // Past the largest bf16 the upper neighbour is infinity; for rounding it
    // counts as 2^128 (IEEE 754 overflow rule).
    const double hi_d = std::isinf(hi) ? std::copysign(0x1p128, double{f}) : double{hi};
    const double dl = std::fabs(double{f} - lo), dh = std::fabs(hi_d - f);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo_bits & 0x10000u) ? hi : lo;  // tie: even
  }
  return f;
}

struct Opt {
  std::string type;
  double lr = 0, mom = 0, wd = 0, b1 = 0, b2 = 0, eps = 0, acc = 0;
  bool sum = false;
  std::string Args() const {
    std::ostringstream s;
    s.precision(17);
    s << type << "," << lr << "," << mom << "," << wd << "," << b1 << "," << b2 << "," << eps
      << "," << acc << "," << (sum ? "sum" : "mean");
    return s.str();
  }
};

struct KeySpec {
  std::string name;
  uint64_t elements;
  DType dtype = DType::kFp32;
  bool client_init = false;
  Opt opt;
  std::optional<std::pair<uint64_t, Opt>> switch_at = std::nullopt;  // SetOptimizer(from, opt) by rank 0

  std::string Args() const {
    const char* dt = dtype == DType::kFp16 ? "fp16" : dtype == DType::kBf16 ? "bf16" : "fp32";
    return name + "," + std::to_string(elements) + "," + dt + "," +
           (client_init ? "client" : "zeros") + "," + opt.Args();
  }
};

// The hub's update in double precision: parameters after each iteration.
std::vector<std::vector<double>> Reference(const KeySpec& k, uint32_t workers,
                                           uint64_t iterations) {
  std::vector<double> p(k.elements, 0.0), s0(k.elements, 0.0), s1(k.elements, 0.0);
  if (k.client_init) {
    for (uint64_t i = 0; i < k.elements; ++i) p[i] = RefNarrow(k.dtype, InitialValue(i));
  }
  for (uint64_t i = 0; i < k.elements; ++i) s0[i] = k.opt.type == "adagrad" ? k.opt.acc : 0.0;
  std::vector<std::vector<double>> out;
  for (uint64_t it = 0; it < iterations; ++it) {
    const Opt& o = (k.switch_at && it >= k.switch_at->first) ? k.switch_at->second : k.opt;
    const double b1 = o.b1 ? o.b1 : 0.9, b2 = o.b2 ? o.b2 : 0.999;
    const double eps = o.eps ? o.eps : (o.type == "adagrad" ? 1e-10 : 1e-8);
    const double t = static_cast<double>(it + 1);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (uint64_t i = 0; i < k.elements; ++i) {
      double g = 0;
      for (uint32_t r = 0; r < workers; ++r) g += RefNarrow(k.dtype, Gradient(r, it, i));
      if (!o.sum) g /= workers;
      double& x = p[i];
      if (o.type == "sum-only") {
        x = g;
      } else if (o.type == "sgd") {
        x -= o.lr * (g + o.wd * x);
      } else if (o.type == "momentum" || o.type == "nesterov") {
        const double d = g + o.wd * x;
        s0[i] = o.mom * s0[i] + d;
        x -= o.type == "momentum" ? o.lr * s0[i] : o.lr * (d + o.mom * s0[i]);
      } else if (o.type == "adam" || o.type == "adamw") {
        const double d = o.type == "adam" ? g + o.wd * x : g;
        s0[i] = b1 * s0[i] + (1 - b1) * d;
        s1[i] = b2 * s1[i] + (1 - b2) * d * d;
        const double step = (o.lr / bc1) * s0[i] / (std::sqrt(s1[i] / bc2) + eps);
        x = (o.type == "adamw" ? x * (1 - o.lr * o.wd) : x) - step;
      } else if (o.type == "adagrad") {
        const double d = g + o.wd * x;
        s0[i] += d * d;
        x -= o.lr * d / (std::sqrt(s0[i]) + eps);
      } else {
        ADD_FAILURE() << "unknown optimizer " << o.type;
      }
    }
    out.push_back(p);
  }
  return out;
}

// Checks `got` (fp32 values the client returned) against `ref`.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& ref, DType dtype,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  // fp32: the 1e-5 relative tolerance; fp16/bf16: one unit in the last place
  // of the wire type (the reply is the fp32 master rounded to it).
  const double rel = dtype == DType::kFp32 ? 1e-5 : dtype == DType::kFp16 ? 1e-3 : 8e-3;
  const double abs = dtype == DType::kFp32 ? 1e-6 : 1e-5;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (std::fabs(got[i] - ref[i]) > rel * std::fabs(ref[i]) + abs) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
      ++bad;
    }
  }
}

// Every scenario on the data path runs over every transport: in-memory (an
// in-process hub; the ranks are threads of this process), TCP and RDMA (a
// real rackhubd and real worker processes). RDMA instances skip without a
// verbs device; tests/rdma/run.sh runs them in a Soft-RoCE VM.
class ClientTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    std::string why;
    hub_ = HubUnderTest::Start(GetParam(), {"--lanes", "3"}, &why);
    if (!hub_ && GetParam() == Transport::kRdma) GTEST_SKIP() << why;
    ASSERT_TRUE(hub_) << why;
    ASSERT_FALSE(hub_->data_address().empty()) << "the hub names no data address";
    dir_ = MakeTempDir();
  }
  void TearDown() override {
    std::error_code ec;  // keep the worker outputs of failed tests for a look
    if (!HasFailure() && !dir_.empty() && dir_ != "/tmp") std::filesystem::remove_all(dir_, ec);
  }

  bool in_memory() const { return GetParam() == Transport::kMemory; }
  // Emulated Soft-RoCE is slow: every time bound is scaled.
  std::chrono::milliseconds Scaled(std::chrono::milliseconds d) const {
    return d * hub_->time_scale();
  }
  std::string HubLog() const {
    if (testing::DaemonProcess* d = hub_->daemon()) return d->Log().substr(0, 8000);
    return "(in-process hub: its log is this test's stderr)";
  }

  // Creates a tenant with rackhubctl and returns its data-plane token.
  std::string CreateTenant(const std::string& name, uint32_t workers,
                           std::vector<std::string> extra = {},
                           uint32_t chunk_bytes = kChunkBytes) {
    std::vector<std::string> argv = {BinPath("rackhubctl"), "--admin", hub_->admin_address(),
                                     "tenant", "create", name, "--workers",
                                     std::to_string(workers), "--chunk-bytes",
                                     std::to_string(chunk_bytes)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string token = testing::OutputField(r.out, "data-plane token");
    EXPECT_FALSE(token.empty()) << "no token line in:\n" << r.out;
    return token;
  }

  client::Options ClientOptions(const std::string& tenant, const std::string& token,
                                uint32_t rank = 0) {
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
      o.rdma_ring_bytes = kRdmaRingBytes;
    }
    o.shm = GetParam() == Transport::kShm ? client::Shm::kOn : client::Shm::kOff;
    return o;
  }
  // A client of this process over the instance's transport.
  std::unique_ptr<Client> Connect(const client::Options& o, client::Error* e) {
    if (in_memory()) return ThreadRank::ConnectInMemory(*hub_, o, e);
    return Client::Connect(o, e);
  }

  std::unique_ptr<Rank> SpawnWorker(const std::string& tenant, const std::string& token,
                                    uint32_t rank, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--hub", hub_->data_address(), "--tenant", tenant,
                                     "--token", token, "--rank", std::to_string(rank),
                                     "--out", OutPath(rank),
                                     "--connect-timeout-ms", std::to_string(Scaled(10s).count()),
                                     "--op-timeout-ms", std::to_string(Scaled(60s).count())};
    if (GetParam() == Transport::kRdma) {
      args.insert(args.end(), {"--transport", "rdma", "--rdma-hub", hub_->rdma_address(),
                               "--rdma-ring-bytes", std::to_string(kRdmaRingBytes)});
    }
    if (GetParam() == Transport::kShm) args.insert(args.end(), {"--transport", "shm"});
    args.insert(args.end(), extra.begin(), extra.end());
    if (in_memory()) return std::make_unique<ThreadRank>(*hub_, args);
    args.insert(args.begin(), BinPath("rackhub-test-worker"));
    return std::make_unique<ProcessRank>(args, dir_ + "/worker" + std::to_string(rank) + ".log");
  }
  std::string OutPath(uint32_t rank) const { return dir_ + "/out" + std::to_string(rank); }
  std::string WorkerLog(uint32_t rank) const {
    return ReadFile(dir_ + "/worker" + std::to_string(rank) + ".log");
  }

  // Runs `workers` workers on `keys` for `iterations` and checks every
  // dumped iteration against the reference and across ranks.
  void RunTraining(uint32_t workers, const std::vector<KeySpec>& keys, uint64_t iterations,
                   std::vector<std::string> extra = {}, bool dump_all = false);

  // Per lane, for RDMA clients: small, so that replies wrap around the ring.
  static constexpr uint32_t kRdmaRingBytes = 256 * 1024;

  std::unique_ptr<HubUnderTest> hub_;
  std::string dir_;
};

void ClientTest::RunTraining(uint32_t workers, const std::vector<KeySpec>& keys,
                             uint64_t iterations, std::vector<std::string> extra,
                             bool dump_all) {
  const std::string tenant = "train" + std::to_string(workers);
  const std::string token = CreateTenant(tenant, workers);
  ASSERT_FALSE(token.empty());
  std::vector<std::string> args = {"--iterations", std::to_string(iterations)};
  for (const auto& k : keys) {
    args.push_back("--key");
    args.push_back(k.Args());
    if (k.switch_at) {
      args.push_back("--set-optimizer");
      args.push_back(k.name + "," + std::to_string(k.switch_at->first) + "," +
                     k.switch_at->second.Args());
    }
  }
  if (dump_all) args.push_back("--dump-all");
  std::vector<std::unique_ptr<Rank>> procs;
  for (uint32_t r = 0; r < workers; ++r) {
    std::vector<std::string> a = args;
    if (r == 1) a.insert(a.end(), extra.begin(), extra.end());
    procs.push_back(SpawnWorker(tenant, token, r, a));
  }
  for (uint32_t r = 0; r < workers; ++r) {
    EXPECT_EQ(procs[r]->Wait(Scaled(120s)), 0) << "rank " << r << ":\n"
                                               << ReadFile(OutPath(r)).substr(0, 4000)
                                               << WorkerLog(r) << "\n--- hub log:\n"
                                               << HubLog();
  }
  std::vector<WorkerOutput> outs;
  for (uint32_t r = 0; r < workers; ++r) outs.push_back(ParseWorker(OutPath(r)));
  for (uint32_t r = 0; r < workers; ++r) {
    ASSERT_TRUE(outs[r].done) << "rank " << r << ": " << outs[r].text.substr(0, 4000);
    EXPECT_TRUE(outs[r].errors.empty()) << outs[r].errors.front();
    // Every rank declared the same keys concurrently: same ids.
    EXPECT_EQ(outs[r].key_ids, outs[0].key_ids) << "rank " << r;
  }
  for (const auto& k : keys) {
    const auto ref = Reference(k, workers, iterations);
    if (k.client_init) {
      std::vector<double> want;
      for (uint64_t i = 0; i < k.elements; ++i) want.push_back(RefNarrow(k.dtype, InitialValue(i)));
      for (uint32_t r = 0; r < workers; ++r) {
        ExpectClose(outs[r].init[k.name], want, DType::kFp32, k.name + " init rank " +
                                                                   std::to_string(r));
      }
    }
    for (uint64_t it = dump_all ? 0 : iterations - 1; it < iterations; ++it) {
      const auto& got0 = outs[0].iters[{it, k.name}];
      ExpectClose(got0, ref[it], k.dtype, k.name + " iteration " + std::to_string(it));
      for (uint32_t r = 1; r < workers; ++r) {
        const auto& got = outs[r].iters[{it, k.name}];
        ASSERT_EQ(got.size(), got0.size());
        EXPECT_EQ(0, std::memcmp(got.data(), got0.data(), got.size() * 4))
            << k.name << " iteration " << it << ": rank " << r << " got other bits than rank 0";
      }
    }
  }
}

std::vector<KeySpec> EveryOptimizer() {
  const Opt sgd{"sgd", 0.1, 0, 0.01};
  const Opt momentum{"momentum", 0.05, 0.9, 0.001};
  const Opt nesterov{"nesterov", 0.05, 0.8, 0.002};
  const Opt adam{"adam", 0.01, 0, 0.01, 0.9, 0.999, 1e-8};
  const Opt adamw{"adamw", 0.01, 0, 0.05, 0.85, 0.99, 1e-7};
  const Opt adagrad{"adagrad", 0.1, 0, 0.001, 0, 0, 1e-10, 0.1};
  Opt sum_only{"sum-only"};
  Opt sum_only_sum{"sum-only"};
  sum_only_sum.sum = true;
  Opt sgd_sum = sgd;
  sgd_sum.sum = true;
  std::vector<KeySpec> keys = {
      {"sgd/a", 1000, DType::kFp32, false, sgd},  // 4 chunks, the last 232 elements
      {"sgd/b", 256, DType::kFp32, false, sgd},   // exactly one chunk
      {"momentum/a", 700, DType::kFp32, false, momentum},
      {"nesterov/a", 513, DType::kFp32, false, nesterov},
      {"adam/a", 1000, DType::kFp32, false, adam},
      {"adamw/a", 300, DType::kFp32, false, adamw},
      {"adagrad/a", 777, DType::kFp32, false, adagrad},
      {"sumonly/mean", 600, DType::kFp32, false, sum_only},
      {"sumonly/sum", 37, DType::kFp32, false, sum_only_sum},
      {"sgd/sum", 300, DType::kFp32, false, sgd_sum},
      {"fp16/sgd", 1000, DType::kFp16, false, sgd},
      {"bf16/adam", 600, DType::kBf16, false, adam},
      {"fp16/sumonly", 300, DType::kFp16, false, sum_only},
      {"init/fp32", 600, DType::kFp32, true, momentum},
      {"init/bf16", 300, DType::kBf16, true, sgd},
  };
  return keys;
}

// ---------------------------------------------------------------------------

TEST(ClientConversionTest, HalfAndBfloat16RoundToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every half: widen then narrow is identity
    const float f = client::HalfToFloat(static_cast<uint16_t>(h));
    const float want = CompilerHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(want)) << h;
    ASSERT_EQ(client::FloatToHalf(f), h) << h;
  }
  uint32_t x = 12345;
  for (int i = 0; i < 2000000; ++i) {  // random bit patterns, all exponents
    x = x * 1664525u + 1013904223u;
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(client::FloatToHalf(f), CompilerFloatToHalf(f))
        << std::hexfloat << f;
    ASSERT_EQ(client::Bfloat16ToFloat(client::FloatToBfloat16(f)), RefNarrow(DType::kBf16, f))
        << std::hexfloat << f;
  }
  EXPECT_TRUE(std::isnan(client::HalfToFloat(client::FloatToHalf(NAN))));
  EXPECT_TRUE(std::isnan(client::Bfloat16ToFloat(client::FloatToBfloat16(NAN))));
  EXPECT_EQ(client::FloatToHalf(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(client::FloatToHalf(65519.0f), 0x7bff);
}


TEST_P(ClientTest, WrongTokenIsUnauthenticated) {
  const std::string token = CreateTenant("auth", 1);
  client::Error e;
  auto c = Connect(ClientOptions("auth", token + "x"), &e);
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(e.code, ErrorCode::kUnauthenticated) << e.message;
  EXPECT_EQ(e.wire, client::WireError::kUnauthenticated);
  c = Connect(ClientOptions("nosuchtenant", token), &e);
  EXPECT_EQ(e.code, ErrorCode::kUnauthenticated) << e.message;
  c = Connect(ClientOptions("auth", token), &e);
  ASSERT_NE(c, nullptr) << e.message;
  EXPECT_EQ(c->lanes(), 3u);
  EXPECT_EQ(c->workers(), 1u);
  EXPECT_EQ(c->chunk_elements(), kChunkBytes / 4);
}

// Not on the data path (no hub at all): runs once, over TCP.
TEST(ClientConnectTest, ConnectToNothingFailsFast) {
  client::Error e;
  client::Options o;
  o.tenant = "x";
  o.token = "y";
  o.connect_timeout = 5s;
  o.hub = "127.0.0.1:1";
  EXPECT_EQ(Client::Connect(o, &e), nullptr);
  EXPECT_EQ(e.code, ErrorCode::kConnectFailed) << e.message;
  o.hub = "not an address";
  EXPECT_EQ(Client::Connect(o, &e), nullptr);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << e.message;
}

TEST_P(ClientTest, TwoWorkersEveryOptimizer) { RunTraining(2, EveryOptimizer(), 5); }
TEST_P(ClientTest, FourWorkersEveryOptimizer) { RunTraining(4, EveryOptimizer(), 5); }

// Rank 0 sends SetOptimizer(from 3) before iteration 0: updates 0..2 use the
// declared hyperparameters, 3.. the new ones.
TEST_P(ClientTest, SetOptimizerAppliesFromItsIteration) {
  KeySpec sgd{"switch/sgd", 520, DType::kFp32, false, {"sgd", 0.1}};
  sgd.switch_at = std::make_pair(uint64_t{3}, Opt{"sgd", 0.02, 0, 0.01});
  KeySpec adam{"switch/adam", 300, DType::kFp32, false, {"adam", 0.01, 0, 0, 0.9, 0.999, 1e-8}};
  adam.switch_at = std::make_pair(uint64_t{2}, Opt{"adam", 0.005, 0, 0.01, 0.9, 0.999, 1e-8});
  RunTraining(2, {sgd, adam}, 5, {}, /*dump_all=*/true);
}

TEST_P(ClientTest, ZeroGapIterationsWithARandomlySleepingWorker) {
  Opt sum_only{"sum-only"};
  sum_only.sum = true;
  const std::vector<KeySpec> keys = {{"gap/sum", 600, DType::kFp32, false, sum_only},
                                     {"gap/sgd", 300, DType::kFp32, false, {"sgd", 0.01}}};
  RunTraining(2, keys, 200, {"--sleep-max-ms", "3"}, /*dump_all=*/true);
}

// In-memory, rank 2 is a thread: "killed" closes its connections abruptly
// instead (ThreadRank::Kill), which is what the hub sees of a SIGKILL.
TEST_P(ClientTest, KilledWorkerFailsTheOthersPromptly) {
  const std::string token = CreateTenant("kill", 3);
  const std::vector<std::string> args = {"--iterations", "10", "--key",
                                         KeySpec{"k/a", 1000, DType::kFp32, false, {"sgd", 0.1}}.Args()};
  std::vector<std::unique_ptr<Rank>> procs;
  for (uint32_t r = 0; r < 3; ++r) {
    auto a = args;
    if (r == 2) a.insert(a.end(), {"--hang-at", "2"});
    procs.push_back(SpawnWorker("kill", token, r, a));
  }
  // Wait until rank 2 stops before iteration 2 and the others' pushes of it
  // are at the hub: iterations 0 and 1 of all three ranks and iteration 2 of
  // ranks 0 and 1, 4 chunks each.
  const auto deadline = std::chrono::steady_clock::now() + Scaled(30s);
  while (ReadFile(OutPath(2)).find("hanging") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << ReadFile(OutPath(2)) << WorkerLog(2);
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(testing::WaitForPushes(hub_->admin_address(), "kill", (3 * 2 + 2) * 4));
  const auto killed_at = std::chrono::steady_clock::now();
  procs[2]->Kill();
  for (uint32_t r = 0; r < 2; ++r) {
    const int code = procs[r]->Wait(Scaled(10s));
    const auto took = std::chrono::steady_clock::now() - killed_at;
    EXPECT_EQ(code, 4) << "rank " << r << " should fail iteration 2:\n" << ReadFile(OutPath(r));
    EXPECT_LT(took, Scaled(10s));
    const auto out = ParseWorker(OutPath(r));
    ASSERT_EQ(out.errors.size(), 1u) << out.text;
    const auto w = Words(out.errors[0]);  // error K CODE WIRE MS MSG
    ASSERT_GE(w.size(), 5u);
    EXPECT_EQ(w[1], "2");
    const bool worker_lost =
        w[2] == std::to_string(static_cast<int>(ErrorCode::kServer)) &&
        w[3] == std::to_string(static_cast<int>(net::WireError::kWorkerLost));
    const bool lost = w[2] == std::to_string(static_cast<int>(ErrorCode::kConnectionLost));
    EXPECT_TRUE(worker_lost || lost) << out.errors[0];
  }
}

TEST_P(ClientTest, SecondPushPullOfAPendingKeyIsRejected) {
  const std::string token = CreateTenant("busy", 2);  // rank 1 never comes: push 1 stays pending
  client::Error e;
  auto c = Connect(ClientOptions("busy", token), &e);
  ASSERT_NE(c, nullptr) << e.message;
  client::KeyId a = 0, b = 0;
  ASSERT_TRUE(c->DeclareKey({"a", 600}, &a).ok());
  ASSERT_TRUE(c->DeclareKey({"b", 10}, &b).ok());
  std::vector<float> grad(600, 1.0f), out(600), out2(600), small(10), small_out(10);
  const auto first = c->PushPull(a, grad, out);
  const auto second = c->PushPull(a, grad, out2);
  e = c->Wait(second);
  EXPECT_EQ(e.code, ErrorCode::kInvalidArgument) << e.message;
  // Another key may be pipelined meanwhile.
  std::atomic<int> callback_code{-1};
  c->PushPull(b, small, small_out,
              [&](const client::Error& r) { callback_code = static_cast<int>(r.code); });
  EXPECT_EQ(c->WaitFor(first, 200ms).code, ErrorCode::kTimeout);  // still pending
  // Local argument checks fail at once and send nothing.
  EXPECT_EQ(c->Wait(c->PushPull(b, std::span(grad).first(9), small_out)).code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->Wait(c->Pull(12345, out)).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->Wait(987654).code, ErrorCode::kInvalidArgument);
  c->Close();
  e = c->Wait(first);
  EXPECT_TRUE(e.code == ErrorCode::kClosed) << e.message;
  EXPECT_EQ(callback_code.load(), static_cast<int>(ErrorCode::kClosed));
  EXPECT_EQ(c->Wait(c->PushPull(a, grad, out)).code, ErrorCode::kClosed);
}

TEST_P(ClientTest, DeclareQuotaAndContradictions) {
  const std::string token = CreateTenant("quota", 1, {"--max-keys", "2"});
  client::Error e;
  auto c = Connect(ClientOptions("quota", token), &e);
  ASSERT_NE(c, nullptr) << e.message;
  client::KeyId a = 0, a2 = 0, b = 0, x = 0;
  ASSERT_TRUE(c->DeclareKey({"a", 100}, &a).ok());
  ASSERT_TRUE(c->DeclareKey({"a", 100}, &a2).ok());
  EXPECT_EQ(a, a2);
  e = c->DeclareKey({"a", 101}, &x);
  EXPECT_EQ(e.code, ErrorCode::kServer) << e.message;
  ASSERT_TRUE(c->DeclareKey({"b", 100, DType::kFp16}, &b).ok());
  e = c->DeclareKey({"c", 100}, &x);
  EXPECT_EQ(e.code, ErrorCode::kServer) << e.message;
  EXPECT_EQ(e.wire, client::WireError::kQuotaExceeded) << e.message;
  EXPECT_EQ(c->FindKey("b"), b);
  EXPECT_FALSE(c->FindKey("c").has_value());
  // The client keeps working after refusals; a new client sees the keys in WELCOME.
  std::vector<float> g(100, 0.5f), out(100);
  EXPECT_TRUE(c->Wait(c->PushPull(a, g, out)).ok());
  c->Close();
  // The hub drops rank 0's old connections asynchronously after BYE (a
  // HELLO of the same rank that comes first waits up to 1 s on the lane):
  // wait until it counts the worker gone.
  ASSERT_TRUE(testing::WaitUntil("rank 0 of 'quota' gone from the hub", [&] {
    return testing::TenantStatsOf(hub_->admin_address(), "quota").workers_connected() == 0;
  }));
  auto c2 = Connect(ClientOptions("quota", token), &e);
  ASSERT_NE(c2, nullptr) << e.message;
  ASSERT_EQ(c2->FindKey("a"), a);
  EXPECT_EQ(c2->GetKeyInfo(a)->next_iteration, 1u);
  EXPECT_EQ(c2->GetKeyInfo(b)->dtype, DType::kFp16);
}

// Gradients in leased memory (Client::Lease): over shared memory the hub
// reads them in place (net/shm/lend.h; the mechanism's own tests are in
// shm_channel_test), over the other transports a lease is ordinary memory.
// Two ranks of this process push from leases, three iterations, a key of
// 13 chunks of 16 KiB (the last of 4004 bytes, below the lending threshold:
// copied); every reply equals the rank-order fp32 sum computed here, and a
// lease is reused once its PushPull completed.
TEST_P(ClientTest, LeasedGradientsGiveTheReferenceSums) {
  const std::string token = CreateTenant("lease", 2, {}, 16384);
  client::Error e;
  std::unique_ptr<Client> c[2];
  for (uint32_t r = 0; r < 2; ++r) {
    c[r] = Connect(ClientOptions("lease", token, r), &e);
    ASSERT_NE(c[r], nullptr) << e.message;
  }
  constexpr uint64_t kElements = 12 * 4096 + 1001;
  client::OptimizerSpec sum;
  sum.type = "sum-only";
  sum.reduction = "sum";
  client::KeyId key[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(c[r]->DeclareKey({"leased", kElements, DType::kFp32, sum}, &key[r]).ok());
  }
  client::LeasedBuffer lease[2];
  for (uint32_t r = 0; r < 2; ++r) {
    e = c[r]->Lease(key[r], &lease[r]);
    ASSERT_TRUE(e.ok()) << e.message;
    ASSERT_EQ(lease[r].floats().size(), kElements);
  }
  client::LeasedBuffer none;
  EXPECT_EQ(Client::LeaseElements(0, &none).code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(c[0]->Lease(client::KeyId{4242}, &none).code, ErrorCode::kInvalidArgument);
  std::vector<float> out[2] = {std::vector<float>(kElements), std::vector<float>(kElements)};
  for (uint64_t it = 1; it <= 3; ++it) {
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < kElements; ++i) lease[r].floats()[i] = Gradient(r, it, i);
    }
    const client::Ticket t0 = c[0]->PushPull(key[0], lease[0].floats(), out[0]);
    const client::Ticket t1 = c[1]->PushPull(key[1], lease[1].floats(), out[1]);
    ASSERT_TRUE((e = c[0]->Wait(t0)).ok()) << e.message;
    ASSERT_TRUE((e = c[1]->Wait(t1)).ok()) << e.message;
    for (uint32_t r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < kElements; ++i) {
        const float want = Gradient(0, it, i) + Gradient(1, it, i);
        ASSERT_EQ(std::bit_cast<uint32_t>(out[r][i]), std::bit_cast<uint32_t>(want))
            << "rank " << r << " iteration " << it << " element " << i;
      }
    }
  }
}

// TCP: the C ABI worker process, linked against librackhub.so alone.
// In-memory: the same worker on this thread, through this program's static
// copy of the C ABI (rackhub_c.cc), its connects dialed in-memory.
TEST_P(ClientTest, CApiRoundTrip) {
  if (GetParam() == Transport::kRdma) {
    GTEST_SKIP() << "the C ABI cannot select RDMA: rackhub_options (rackhub_c.h) has no "
                    "transport field and rackhub_connect always connects over TCP, so this "
                    "instance would only repeat the TCP one against an RDMA-enabled hub";
  }
  const std::string token = CreateTenant("capi", 1);
  const std::string out_path = dir_ + "/capi.out";
  const std::vector<std::string> args = {"--hub", hub_->data_address(), "--tenant", "capi",
                                         "--token", token, "--out", out_path};
  if (in_memory()) {
    std::atomic<int> dials{0};
    const auto dial = hub_->memory_dialer();
    client::testing::ScopedLaneDialer in_memory(
        *hub_->link_io(), [&](const net::FrameHeader& h, const std::string& payload,
                              asio::io_context& io, net::FrameHandler* handler) {
          ++dials;
          return dial(h, payload, io, handler);
        });
    ASSERT_EQ(testing::RunCApiWorker(args), 0) << ReadFile(out_path);
    // Wrong token (1 lane) + the real connect (3 lanes): all in-memory.
    EXPECT_EQ(dials.load(), 4) << "rackhub_connect did not go through the in-memory seam";
  } else {
    std::vector<std::string> argv = args;
    argv.insert(argv.begin(), BinPath("rackhub-test-capi-worker"));
    ChildProcess p(argv, dir_ + "/capi.log");
    ASSERT_EQ(p.Wait(60s), 0) << ReadFile(out_path) << ReadFile(dir_ + "/capi.log");
  }
  std::map<std::string, std::vector<std::string>> lines;
  std::map<std::string, std::vector<float>> params;
  std::istringstream in(ReadFile(out_path));
  for (std::string line; std::getline(in, line);) {
    auto w = Words(line);
    if (w.size() >= 2 && w[0] == "params") params[w[1]] = HexFloats(w, 2);
    else if (!w.empty()) lines[w[0]] = w;
  }
  const auto status = [&](const std::string& name) {
    return lines.count(name) ? std::stoi(lines[name].at(1)) : -1;
  };
  EXPECT_EQ(status("connect_wrong_token"), static_cast<int>(ErrorCode::kUnauthenticated));
  EXPECT_EQ(status("connect"), 0);
  EXPECT_EQ(status("declare"), 0);
  EXPECT_EQ(status("find"), 0);
  EXPECT_EQ(lines["find"].at(2), "same");
  EXPECT_EQ(status("find_missing"), static_cast<int>(ErrorCode::kInvalidArgument));
  EXPECT_EQ(status("push_pull"), 0);
  EXPECT_EQ(status("wait"), 0);
  EXPECT_EQ(status("wait_again"), static_cast<int>(ErrorCode::kInvalidArgument));
  EXPECT_EQ(status("push_pull_bad_size"), static_cast<int>(ErrorCode::kInvalidArgument));
  EXPECT_GT(lines["push_pull_bad_size"].size(), 2u) << "rackhub_last_error gives a message";
  EXPECT_EQ(status("set_optimizer"), 0);
  EXPECT_EQ(status("push_pull2"), 0);
  EXPECT_EQ(status("pull"), 0);
  EXPECT_EQ(status("lanes"), 3);
  EXPECT_TRUE(lines.count("done"));
  KeySpec k{"capi/a", 300, DType::kFp32, false, {"sgd", 0.5}};
  k.switch_at = std::make_pair(uint64_t{2}, Opt{"sgd", 0.25});
  const auto ref = Reference(k, 1, 3);
  ExpectClose(params["iter0"], ref[0], DType::kFp32, "iter0");
  ExpectClose(params["iter1"], ref[1], DType::kFp32, "iter1");
  ExpectClose(params["iter2"], ref[2], DType::kFp32, "iter2");
  EXPECT_EQ(params["pulled"], params["iter2"]);
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientTest, ::testing::ValuesIn(testing::AllTransports()),
                         testing::TransportParamName);

// What only the in-memory transport can show: each lane's stream can be held.
class ClientInMemoryTest : public ClientTest {};

// Lanes in step (client/api/lane.h): a lane hands a push to its connection
// only while it is less than Lane::kLookaheadBytes past the oldest push no
// lane has written. With every lane's stream held, the lanes together hand
// exactly the pushes that start within 256 KiB of the first one (and not the
// whole key, as they would without pacing); released, everything completes
// with the right values.
TEST_P(ClientInMemoryTest, LanesStayInStep) {
  const std::string token = CreateTenant("step", 1, {"--optimizer", "sum-only"});
  client::Error e;
  constexpr uint64_t kChunks = 1200;
  constexpr uint64_t kElements = kChunks * kChunkBytes / 4;
  std::vector<float> grad(kElements), out(kElements, -1.0f);
  for (uint64_t i = 0; i < kElements; ++i) grad[i] = Gradient(0, 0, i);

  // The client's end of each lane, in lane order (ScopedLaneDialer dials
  // them in order); their client-to-hub streams held from the start.
  std::mutex mu;
  std::vector<std::shared_ptr<net::testing::MemoryConnection>> ends;
  const auto dial = hub_->memory_dialer();
  client::testing::ScopedLaneDialer held(
      *hub_->link_io(), [&](const net::FrameHeader& h, const std::string& payload,
                            asio::io_context& io, net::FrameHandler* handler) {
        auto conn = dial(h, payload, io, handler);
        auto end = std::dynamic_pointer_cast<net::testing::MemoryConnection>(conn);
        if (end) {
          end->faults().Stall(true);
          std::lock_guard lock(mu);
          ends.push_back(end);
        }
        return conn;
      });
  auto paced = Client::Connect(ClientOptions("step", token), &e);
  ASSERT_NE(paced, nullptr) << e.message;
  ASSERT_EQ(ends.size(), 3u) << "the hub runs 3 lanes";
  client::KeyId same = 0;
  // DECLARE goes out on a held stream too: release, declare, hold again.
  for (auto& end : ends) end->faults().Stall(false);
  ASSERT_TRUE(paced->DeclareKey({"big", kElements}, &same).ok());
  for (auto& end : ends) end->faults().Stall(true);

  const client::Ticket t = paced->PushPull(same, grad, out);
  // A push frame is a header and a chunk; chunk c starts at c * frame in the
  // stream of pushed bytes. The pushes within the lookahead of chunk 0:
  const uint64_t frame = net::kHeaderBytes + kChunkBytes;
  const uint64_t allowed = (256 * 1024 + frame - 1) / frame;  // chunks 0 .. allowed-1
  ASSERT_LT(allowed, kChunks);
  const auto queued = [&] {
    std::vector<uint64_t> q;
    for (auto& end : ends) q.push_back(end->queued_bytes());
    return q;
  };
  const auto total = [&] {
    uint64_t sum = 0;
    for (uint64_t b : queued()) sum += b;
    return sum;
  };
  ASSERT_TRUE(testing::WaitUntil("the lanes to hand over the first pushes",
                                 [&] { return total() >= allowed * frame; }, 10s));
  std::vector<uint64_t> per_lane = queued();
  std::sort(per_lane.begin(), per_lane.end());
  // Chunk c goes to lane (first + c) % 3: of chunks 0 .. allowed-1 the
  // lanes hold ceil/floor thirds.
  std::vector<uint64_t> expect;
  for (uint64_t l = 0; l < 3; ++l) expect.push_back((allowed + 2 - l) / 3 * frame);
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(per_lane, expect) << "the lanes handed over pushes past the lookahead";
  EXPECT_EQ(paced->WaitFor(t, 0ms).code, ErrorCode::kTimeout);

  for (auto& end : ends) end->faults().Stall(false);
  e = paced->Wait(t);
  ASSERT_TRUE(e.ok()) << e.message;
  // One worker, sum-only: the reply is its own gradient, bit for bit.
  EXPECT_EQ(std::memcmp(out.data(), grad.data(), grad.size() * sizeof(float)), 0);
  paced->Close();
}

INSTANTIATE_TEST_SUITE_P(Memory, ClientInMemoryTest, ::testing::Values(Transport::kMemory),
                         testing::TransportParamName);

}  // namespace
}  // namespace rackhub
