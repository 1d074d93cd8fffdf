// Element-wise reductions (min, max, product) end to end: a real rackhubd
// (TCP, 2 lanes, 1 KiB chunks so keys span several chunks and both lanes),
// a tenant made with the real rackhubctl, three ranks as librackhub clients
// of this process, sum-only keys declared with reduction min/max/product in
// every wire type. Results are compared with a reference computed here from
// the inputs (rank order, fp32, the wire type's rounding; the rules of
// kernels.h written independently). Also: what is refused (an optimizer with
// min, top-k with max, an unknown name, a reduction change) and that
// `rackhubctl key get` shows the reduction, also after a restart of the hub
// on the same state; the C ABI's RACKHUB_REDUCTION_MAX and a bad value.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hub_under_test.h"
#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/rackhub_c.h"

namespace rackhub {
namespace {

using namespace std::chrono_literals;
using client::Client;
using client::DType;
using client::KeyDecl;
using client::KeyId;
using testing::BinPath;
using testing::HubUnderTest;
using testing::RunCommand;
using testing::Transport;

constexpr uint32_t kRanks = 3;
constexpr uint32_t kChunkBytes = 1024;

// Rank r's input at iteration `it`, element i: small multiples of 1/4 (exact
// in fp16 and bf16, products of three stay exact), with NaN, +-inf and +-0
// planted at places that depend on the rank.
float Input(uint32_t rank, uint32_t it, uint64_t i) {
  const uint64_t special = (i + 5 * rank + 3 * it) % 53;
  if (special == 0) return std::numeric_limits<float>::quiet_NaN();
  if (special == 1) return std::numeric_limits<float>::infinity();
  if (special == 2) return -std::numeric_limits<float>::infinity();
  if (special == 3) return 0.0f;
  if (special == 4) return -0.0f;
  const int k = static_cast<int>((i * 7 + rank * 13 + it * 5) % 33) - 16;
  return static_cast<float>(k) * 0.25f;
}

// The value after the wire type's round to nearest even (NaN stays NaN).
float Narrow(DType dtype, float f) {
  if (dtype == DType::kFp32 || !std::isfinite(f)) return f;  // NaN, +-inf: as they are
  if (dtype == DType::kBf16) {
    // The inputs and results here are exact in bf16 except for products
    // that need more bits: round by picking the nearer neighbour in double.
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const float lo = std::bit_cast<float>(bits & 0xffff0000u);
    const float hi = std::bit_cast<float>((bits & 0xffff0000u) + 0x10000u);
    const double dl = std::fabs(double{f} - lo), dh = std::fabs(double{hi} - f);
    if (dl != dh) return dl < dh ? lo : hi;
    return (std::bit_cast<uint32_t>(lo) & 0x10000u) ? hi : lo;
  }
#if defined(__clang__)
  return static_cast<float>(static_cast<__fp16>(f));
#else
  return static_cast<float>(static_cast<_Float16>(f));
#endif
}

// a op b per docs/admin.md: min/max propagate the first NaN, -0 < +0.
float Combine(const std::string& op, float a, float b) {
  if (op == "product") return a * b;
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) return (std::signbit(a) == (op == "min")) ? a : b;
  if (op == "min") return a < b ? a : b;
  return a > b ? a : b;
}

class ReductionTest : public ::testing::Test {
 protected:
  void SetUp() override { StartHub(); }
  void TearDown() override {
    clients_.clear();
    if (hub_) {
      hub_->BeginShutdown();
      hub_->FinishShutdown();
    }
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(state_dir_, ec);
  }

  void StartHub() {
    if (state_dir_.empty()) state_dir_ = testing::MakeTempDir();
    std::string why;
    hub_ = HubUnderTest::Start(Transport::kTcp, {"--lanes", "2", "--state-dir", state_dir_},
                               &why);
    ASSERT_TRUE(hub_) << why;
  }

  testing::CommandResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {BinPath("rackhubctl"), "--admin", hub_->admin_address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  std::string CreateTenant(const std::string& name) {
    const auto r = Ctl({"tenant", "create", name, "--workers", std::to_string(kRanks),
                        "--chunk-bytes", std::to_string(kChunkBytes)});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    const std::string token = testing::OutputField(r.out, "data-plane token");
    EXPECT_FALSE(token.empty()) << "no token line in:\n" << r.out;
    return token;
  }

  void ConnectRanks(const std::string& tenant, const std::string& token) {
    clients_.clear();
    for (uint32_t r = 0; r < kRanks; ++r) {
      client::Options o;
      o.hub = hub_->data_address();
      o.tenant = tenant;
      o.token = token;
      o.rank = r;
      o.connect_timeout = 10s;
      o.op_timeout = 60s;
      o.shm = client::Shm::kOff;
      client::Error e;
      clients_.push_back(Client::Connect(o, &e));
      ASSERT_TRUE(clients_.back()) << e.message;
    }
  }

  static KeyDecl Decl(const std::string& name, uint64_t n, DType dtype, const std::string& type,
                      const std::string& reduction) {
    KeyDecl d;
    d.name = name;
    d.elements = n;
    d.dtype = dtype;
    client::OptimizerSpec o;
    o.type = type;
    if (type != "sum-only") o.learning_rate = 0.1;
    o.reduction = reduction;
    d.optimizer = o;
    return d;
  }

  std::unique_ptr<HubUnderTest> hub_;
  std::string state_dir_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(ReductionTest, MinMaxProductOfThreeRanksMatchTheReference) {
  ConnectRanks("red", CreateTenant("red"));
  constexpr uint64_t kN = 1000;  // 4 chunks of 256 fp32 (8 of 512 fp16/bf16 elements: 2)
  for (const std::string op : {"min", "max", "product"}) {
    for (DType dtype : {DType::kFp32, DType::kFp16, DType::kBf16}) {
      const std::string name = "r/" + op + "/" + std::to_string(static_cast<int>(dtype));
      std::vector<KeyId> ids(kRanks);
      for (uint32_t r = 0; r < kRanks; ++r) {
        const client::Error e = clients_[r]->DeclareKey(Decl(name, kN, dtype, "sum-only", op),
                                                        &ids[r]);
        ASSERT_TRUE(e.ok()) << e.message;
      }
      for (uint32_t it = 0; it < 3; ++it) {
        std::vector<std::vector<float>> in(kRanks, std::vector<float>(kN)),
            out(kRanks, std::vector<float>(kN, 7.0f));
        for (uint32_t r = 0; r < kRanks; ++r) {
          for (uint64_t i = 0; i < kN; ++i) in[r][i] = Input(r, it, i);
        }
        // Highest rank first: its contribution waits (parked) for the lower ones.
        std::vector<client::Ticket> tickets(kRanks);
        for (uint32_t r = kRanks; r-- > 0;) {
          tickets[r] = clients_[r]->PushPull(ids[r], in[r], out[r]);
        }
        for (uint32_t r = 0; r < kRanks; ++r) {
          const client::Error e = clients_[r]->Wait(tickets[r]);
          ASSERT_TRUE(e.ok()) << op << " rank " << r << ": " << e.message;
        }
        for (uint64_t i = 0; i < kN; ++i) {
          float want = Narrow(dtype, in[0][i]);
          for (uint32_t r = 1; r < kRanks; ++r) want = Combine(op, want, Narrow(dtype, in[r][i]));
          want = Narrow(dtype, want);
          for (uint32_t r = 0; r < kRanks; ++r) {
            const float got = out[r][i];
            if (std::isnan(want)) {
              ASSERT_TRUE(std::isnan(got)) << op << " dtype " << static_cast<int>(dtype)
                                           << " it " << it << " rank " << r << " i " << i
                                           << ": got " << got;
            } else {
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << op << " dtype " << static_cast<int>(dtype) << " it " << it << " rank " << r
                  << " i " << i << ": got " << got << " want " << want;
            }
          }
        }
      }
    }
  }
  // rackhubctl shows the reduction of a key.
  const auto got = Ctl({"key", "get", "red", "r/product/1"});
  EXPECT_EQ(got.exit_code, 0) << got.err;
  EXPECT_NE(got.out.find("reduction=product"), std::string::npos) << got.out;
}

TEST_F(ReductionTest, RefusedByName) {
  ConnectRanks("refuse", CreateTenant("refuse"));
  KeyId id = 0;
  // An optimizer with an element-wise reduction.
  client::Error e = clients_[0]->DeclareKey(Decl("a", 10, DType::kFp32, "sgd", "min"), &id);
  EXPECT_EQ(e.code, client::ErrorCode::kServer);
  EXPECT_NE(e.message.find("reduction: min needs optimizer type sum-only"), std::string::npos)
      << e.message;
  // Top-k compression of a max key.
  KeyDecl topk = Decl("b", 1000, DType::kFp32, "sum-only", "max");
  topk.topk_ratio = 0.1;
  e = clients_[0]->DeclareKey(topk, &id);
  EXPECT_EQ(e.code, client::ErrorCode::kServer);
  EXPECT_NE(e.message.find("topk_ratio"), std::string::npos) << e.message;
  // A name the client does not know.
  e = clients_[0]->DeclareKey(Decl("c", 10, DType::kFp32, "sum-only", "median"), &id);
  EXPECT_EQ(e.code, client::ErrorCode::kInvalidArgument);
  EXPECT_NE(e.message.find("reduction 'median'"), std::string::npos) << e.message;
  // rackhubctl: --reduction min with an optimizer, and changing a min key to sum.
  auto r = Ctl({"key", "create", "refuse", "d", "--elements", "10", "--optimizer", "adam",
                "--lr", "0.01", "--reduction", "min"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("reduction: min needs optimizer type sum-only"),
            std::string::npos)
      << r.out << r.err;
  r = Ctl({"key", "create", "refuse", "e", "--elements", "10", "--optimizer", "sum-only",
           "--reduction", "min"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = Ctl({"key", "set-optimizer", "refuse", "e", "--reduction", "sum"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("optimizer.reduction: cannot change min to sum"),
            std::string::npos)
      << r.out << r.err;
}

TEST_F(ReductionTest, ReductionSurvivesARestart) {
  const std::string token = CreateTenant("keep");
  auto r = Ctl({"key", "create", "keep", "k", "--elements", "300", "--optimizer", "sum-only",
                "--reduction", "max"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  hub_->BeginShutdown();
  ASSERT_EQ(hub_->FinishShutdown(), 0);
  hub_.reset();
  StartHub();
  r = Ctl({"key", "get", "keep", "k"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("reduction=max"), std::string::npos) << r.out;
  // And the restarted hub reduces with it.
  ConnectRanks("keep", token);
  std::vector<KeyId> ids(kRanks);
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(clients_[rank]->FindKey("k")) << "the key is in the WELCOME table";
    ids[rank] = *clients_[rank]->FindKey("k");
  }
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(300)),
      out(kRanks, std::vector<float>(300));
  std::vector<client::Ticket> tickets(kRanks);
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    for (uint64_t i = 0; i < 300; ++i) in[rank][i] = Input(rank, 9, i);
    tickets[rank] = clients_[rank]->PushPull(ids[rank], in[rank], out[rank]);
  }
  for (uint32_t rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(clients_[rank]->Wait(tickets[rank]).ok());
  }
  for (uint64_t i = 0; i < 300; ++i) {
    float want = in[0][i];
    for (uint32_t rank = 1; rank < kRanks; ++rank) want = Combine("max", want, in[rank][i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(out[1][i])) << i;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[1][i]), std::bit_cast<uint32_t>(want)) << i;
    }
  }
}

// The C ABI: RACKHUB_REDUCTION_MAX on a sum-only key reduces element-wise
// (two ranks, asynchronous push_pulls); a value that is none of
// RACKHUB_REDUCTION_* is refused, naming the field.
TEST_F(ReductionTest, CApiMaxAndAnUnknownValue) {
  const auto created = Ctl({"tenant", "create", "capi", "--workers", "2", "--chunk-bytes",
                            std::to_string(kChunkBytes)});
  ASSERT_EQ(created.exit_code, 0) << created.out << created.err;
  const std::string label = "data-plane token:";
  const auto at = created.out.find(label);
  ASSERT_NE(at, std::string::npos) << created.out;
  std::string token =
      created.out.substr(at + label.size(), created.out.find('\n', at) - at - label.size());
  token.erase(0, token.find_first_not_of(" \t"));
  token.erase(token.find_last_not_of(" \t\r") + 1);
  const std::string hub = hub_->data_address();
  rackhub_client* c[2] = {nullptr, nullptr};
  for (uint32_t r = 0; r < 2; ++r) {
    rackhub_options o{};
    o.hub = hub.c_str();
    o.tenant = "capi";
    o.token = token.c_str();
    o.rank = r;
    char err[256] = "";
    ASSERT_EQ(rackhub_connect(&o, &c[r], err, sizeof err), RACKHUB_OK) << err;
  }
  rackhub_optimizer max{};
  max.type = "sum-only";
  max.reduction = RACKHUB_REDUCTION_MAX;
  constexpr uint64_t kN = 600;
  uint32_t key[2];
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(rackhub_declare_key(c[r], "m", kN, RACKHUB_BF16, &max, RACKHUB_INIT_ZEROS, &key[r]),
              RACKHUB_OK)
        << rackhub_last_error(c[r]);
  }
  std::vector<float> in[2] = {std::vector<float>(kN), std::vector<float>(kN)};
  std::vector<float> out[2] = {std::vector<float>(kN), std::vector<float>(kN)};
  uint64_t ticket[2];
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < kN; ++i) in[r][i] = Input(r, 4, i);
    ASSERT_EQ(rackhub_push_pull_async(c[r], key[r], in[r].data(), out[r].data(), kN, &ticket[r]),
              RACKHUB_OK);
  }
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(rackhub_wait(c[r], ticket[r]), RACKHUB_OK) << rackhub_last_error(c[r]);
  }
  for (uint64_t i = 0; i < kN; ++i) {
    const float want = Narrow(DType::kBf16, Combine("max", Narrow(DType::kBf16, in[0][i]),
                                                    Narrow(DType::kBf16, in[1][i])));
    for (uint32_t r = 0; r < 2; ++r) {
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[r][i])) << i;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(out[r][i]), std::bit_cast<uint32_t>(want))
            << i << ": " << out[r][i] << " vs " << want;
      }
    }
  }
  rackhub_optimizer bad = max;
  bad.reduction = 7;
  uint32_t ignored = 0;
  EXPECT_EQ(rackhub_declare_key(c[0], "n", 10, RACKHUB_FP32, &bad, RACKHUB_INIT_ZEROS, &ignored),
            RACKHUB_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rackhub_last_error(c[0])).find("optimizer->reduction must be"),
            std::string::npos)
      << rackhub_last_error(c[0]);
  for (rackhub_client* x : c) rackhub_close(x);
}

}  // namespace
}  // namespace rackhub
