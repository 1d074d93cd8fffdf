// Participant sets end to end (the keys of a process set, docs/client.md):
// a real rackhubd (TCP, 2 lanes, 1 KiB chunks so keys span several chunks
// and both lanes), a tenant of 4 workers made with the real rackhubctl, the
// ranks as librackhub clients of this process. Two disjoint sets, {0, 2, 3}
// and {1}, push their keys at once; each result is compared bit for bit
// with a reference computed here from the inputs (the set's ranks in rank
// order, fp32). The set of one completes while the other is still waiting
// for its members (keys of disjoint sets complete independently). Refused
// by name: a push of a rank outside the set, a declaration naming another
// set, ranks out of range or repeated, the C ABI's NULL ranks. The set
// survives a restart of the hub on its state directory.
#include <bit>
#include <chrono>
#include <filesystem>
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

constexpr uint32_t kRanks = 4;
constexpr uint64_t kN = 1000;  // 4 chunks of 256 fp32
const std::vector<uint32_t> kSetA = {0, 2, 3};
const std::vector<uint32_t> kSetB = {1};

// Rank r's input at iteration `it`: values whose sums round differently by
// order (thirds, sevenths and large/small magnitudes).
float Input(uint32_t rank, uint32_t it, uint64_t i) {
  const float big = ((i + rank) % 5 == 0) ? 1.0e7f : 1.0f;
  return big * (1.0f / static_cast<float>(3 + (i * 7 + rank * 11 + it) % 17)) *
         ((rank + it) % 2 ? -1.0f : 1.0f);
}

class ParticipantsHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = testing::MakeTempDir();
    StartHub();
  }
  void TearDown() override {
    clients_.clear();
    StopHub();
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(state_dir_, ec);
  }

  void StartHub() {
    std::string why;
    hub_ = HubUnderTest::Start(Transport::kTcp, {"--lanes", "2", "--state-dir", state_dir_},
                               &why);
    ASSERT_TRUE(hub_) << why;
  }
  void StopHub() {
    if (!hub_) return;
    hub_->BeginShutdown();
    EXPECT_EQ(hub_->FinishShutdown(), 0);
    hub_.reset();
  }

  std::string CreateTenant(const std::string& name) {
    const auto r = RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(), "tenant",
                               "create", name, "--workers", std::to_string(kRanks),
                               "--chunk-bytes", "1024"});
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

  static KeyDecl Decl(const std::string& name, const std::string& reduction,
                      std::vector<uint32_t> participants) {
    KeyDecl d;
    d.name = name;
    d.elements = kN;
    client::OptimizerSpec o;
    o.type = "sum-only";
    o.reduction = reduction;
    d.optimizer = o;
    d.participants = std::move(participants);
    return d;
  }

  // Declares `name` on every rank of `set`; ids[r] is rank r's id.
  void DeclareOn(const std::vector<uint32_t>& set, const KeyDecl& d, std::vector<KeyId>* ids) {
    ids->assign(kRanks, 0);
    for (uint32_t r : set) {
      const client::Error e = clients_[r]->DeclareKey(d, &(*ids)[r]);
      ASSERT_TRUE(e.ok()) << "rank " << r << ": " << e.message;
    }
  }

  // The set's rank-order fp32 sum of iteration `it`, times `scale` (1 for sum).
  static std::vector<float> Reference(const std::vector<uint32_t>& set, uint32_t it,
                                      float scale) {
    std::vector<float> want(kN);
    for (uint64_t i = 0; i < kN; ++i) {
      float s = Input(set[0], it, i);
      for (size_t k = 1; k < set.size(); ++k) s += Input(set[k], it, i);
      want[i] = scale == 1.0f ? s : s * scale;
    }
    return want;
  }

  static void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what) {
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << what << " element " << i << ": got " << got[i] << " want " << want[i];
    }
  }

  std::unique_ptr<HubUnderTest> hub_;
  std::string state_dir_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(ParticipantsHubTest, DisjointSetsCompleteIndependentlyWithTheirOwnRankOrderSums) {
  ConnectRanks("ps", CreateTenant("ps"));
  std::vector<KeyId> a, b;
  DeclareOn(kSetA, Decl("ps/a", "mean", kSetA), &a);
  DeclareOn(kSetB, Decl("ps/b", "sum", kSetB), &b);
  ASSERT_EQ(clients_[0]->GetKeyInfo(a[0])->participants, kSetA);
  const float third = static_cast<float>(1.0 / 3);
  for (uint32_t it = 0; it < 3; ++it) {
    std::vector<std::vector<float>> in(kRanks, std::vector<float>(kN)),
        out(kRanks, std::vector<float>(kN, 7.0f));
    for (uint32_t r = 0; r < kRanks; ++r) {
      for (uint64_t i = 0; i < kN; ++i) in[r][i] = Input(r, it, i);
    }
    // Set A's highest rank first (parked until the lower ones), then set B's
    // only rank, whose update completes while A still waits for ranks 0, 2.
    const client::Ticket a3 = clients_[3]->PushPull(a[3], in[3], out[3]);
    const client::Ticket b1 = clients_[1]->PushPull(b[1], in[1], out[1]);
    const client::Error eb = clients_[1]->Wait(b1);
    ASSERT_TRUE(eb.ok()) << eb.message;
    ExpectBitEqual(out[1], Reference(kSetB, it, 1.0f), "set {1}");
    const client::Ticket a2 = clients_[2]->PushPull(a[2], in[2], out[2]);
    const client::Ticket a0 = clients_[0]->PushPull(a[0], in[0], out[0]);
    for (auto [r, t] : {std::pair{0u, a0}, std::pair{2u, a2}, std::pair{3u, a3}}) {
      const client::Error e = clients_[r]->Wait(t);
      ASSERT_TRUE(e.ok()) << "rank " << r << ": " << e.message;
      ExpectBitEqual(out[r], Reference(kSetA, it, third), "set {0,2,3} rank " + std::to_string(r));
    }
  }
}

TEST_F(ParticipantsHubTest, OutsidersAndOtherSetsAreRefusedByName) {
  ConnectRanks("refuse", CreateTenant("refuse"));
  std::vector<KeyId> a;
  DeclareOn(kSetA, Decl("ps/a", "sum", kSetA), &a);
  // Rank 1 declares the key with the same set (it may know it), but its
  // push is refused: it is not a participant.
  KeyId outsider = 0;
  ASSERT_TRUE(clients_[1]->DeclareKey(Decl("ps/a", "sum", kSetA), &outsider).ok());
  std::vector<float> in(kN, 1.0f), out(kN);
  client::Error e = clients_[1]->Wait(clients_[1]->PushPull(outsider, in, out));
  EXPECT_EQ(e.code, client::ErrorCode::kServer);
  EXPECT_NE(e.message.find("participants: rank 1 is not a participant of key 'ps/a' (declared "
                           "for ranks 0,2,3)"),
            std::string::npos)
      << e.message;
  // Another set under the same name, ranks out of range, a repeated rank.
  KeyId id = 0;
  e = clients_[0]->DeclareKey(Decl("ps/a", "sum", {0, 3}), &id);
  EXPECT_EQ(e.code, client::ErrorCode::kServer);
  EXPECT_NE(e.message.find("participants: key 'ps/a' already exists with participants [0,2,3], "
                           "not with participants [0,3]"),
            std::string::npos)
      << e.message;
  e = clients_[0]->DeclareKey(Decl("ps/x", "sum", {0, 4}), &id);
  EXPECT_NE(e.message.find("participants: rank 4 of key 'ps/x' is out of range: tenant 'refuse' "
                           "has 4 workers"),
            std::string::npos)
      << e.message;
  e = clients_[0]->DeclareKey(Decl("ps/x", "sum", {2, 2}), &id);
  EXPECT_NE(e.message.find("must be strictly ascending (no duplicates), got 2 then 2"),
            std::string::npos)
      << e.message;
  // The members' round is unharmed by the refused push.
  std::vector<std::vector<float>> outs(kRanks, std::vector<float>(kN));
  std::vector<std::vector<float>> ins(kRanks, std::vector<float>(kN));
  std::vector<client::Ticket> t(kRanks);
  for (uint32_t r : kSetA) {
    for (uint64_t i = 0; i < kN; ++i) ins[r][i] = Input(r, 0, i);
    t[r] = clients_[r]->PushPull(a[r], ins[r], outs[r]);
  }
  for (uint32_t r : kSetA) {
    const client::Error done = clients_[r]->Wait(t[r]);
    ASSERT_TRUE(done.ok()) << "rank " << r << ": " << done.message;
    ExpectBitEqual(outs[r], Reference(kSetA, 0, 1.0f), "after refusal");
  }
}

TEST_F(ParticipantsHubTest, ASetSurvivesARestartAndTheCApiDeclaresOne) {
  const std::string token = CreateTenant("keep");
  ConnectRanks("keep", token);
  std::vector<KeyId> b;
  DeclareOn({1, 3}, Decl("ps/b", "sum", {1, 3}), &b);
  clients_.clear();
  StopHub();
  StartHub();
  // rackhubctl shows the stored set.
  const auto shown = RunCommand({BinPath("rackhubctl"), "--admin", hub_->admin_address(), "key",
                                 "get", "keep", "ps/b"});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("participants"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("1,3"), std::string::npos) << shown.out;
  ConnectRanks("keep", token);
  KeyId id = 0;
  const client::Error e = clients_[1]->DeclareKey(Decl("ps/b", "sum", {1}), &id);
  EXPECT_NE(e.message.find("already exists with participants [1,3], not with participants [1]"),
            std::string::npos)
      << e.message;
  // The C ABI, on the restarted hub: the stored set, and NULL ranks refused.
  clients_.clear();  // ranks 1 and 3 are C clients from here on
  const std::string hub = hub_->data_address();
  rackhub_client* c[2] = {nullptr, nullptr};
  const uint32_t ranks[2] = {1, 3};
  for (uint32_t k = 0; k < 2; ++k) {
    rackhub_options o{};
    o.hub = hub.c_str();
    o.tenant = "keep";
    o.token = token.c_str();
    o.rank = ranks[k];
    char err[256] = "";
    ASSERT_EQ(rackhub_connect(&o, &c[k], err, sizeof err), RACKHUB_OK) << err;
  }
  rackhub_optimizer sum{};
  sum.type = "sum-only";
  uint32_t key[2];
  for (uint32_t k = 0; k < 2; ++k) {
    ASSERT_EQ(rackhub_declare_key_participants(c[k], "ps/b", kN, RACKHUB_FP32, &sum,
                                               RACKHUB_INIT_ZEROS, ranks, 2, &key[k]),
              RACKHUB_OK)
        << rackhub_last_error(c[k]);
  }
  std::vector<float> in[2] = {std::vector<float>(kN), std::vector<float>(kN)};
  std::vector<float> out[2] = {std::vector<float>(kN), std::vector<float>(kN)};
  uint64_t ticket[2];
  for (uint32_t k = 0; k < 2; ++k) {
    for (uint64_t i = 0; i < kN; ++i) in[k][i] = Input(ranks[k], 5, i);
    ASSERT_EQ(rackhub_push_pull_async(c[k], key[k], in[k].data(), out[k].data(), kN, &ticket[k]),
              RACKHUB_OK);
  }
  for (uint32_t k = 0; k < 2; ++k) {
    ASSERT_EQ(rackhub_wait(c[k], ticket[k]), RACKHUB_OK) << rackhub_last_error(c[k]);
    ExpectBitEqual(out[k], Reference({1, 3}, 5, 1.0f), "C ABI");
  }
  uint32_t ignored = 0;
  EXPECT_EQ(rackhub_declare_key_participants(c[0], "ps/c", kN, RACKHUB_FP32, &sum,
                                             RACKHUB_INIT_ZEROS, nullptr, 2, &ignored),
            RACKHUB_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rackhub_last_error(c[0])).find("ranks is NULL with n_ranks 2"),
            std::string::npos)
      << rackhub_last_error(c[0]);
  for (rackhub_client* x : c) rackhub_close(x);
}

}  // namespace
}  // namespace rackhub
