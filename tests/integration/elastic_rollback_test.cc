// COMMIT and ROLLBACK of an elastic tenant with a hub optimizer
// (docs/elastic.md, "Hub optimizers"), against a real rackhubd on 127.0.0.1
// (two lanes, 1 KiB chunks: each key of 600 floats is three chunks over
// both lanes). Two ranks, one C++ Client each, push two keys A and B that
// are declared alike (momentum SGD, mean) and always get the same
// gradients, so after any step both ranks completed their replies are
// equal bit for bit. The test commits, runs a step, rolls back and redoes
// the step: the redo's replies equal the first run's bit for bit, which
// holds only if the parameters AND the momentum (and the version the
// optimizer counts) came back exactly. Then a step applied partly (A with
// both ranks, B after rank 1 left, with rank 0 alone), a rollback, rank 1
// back and the step redone: A and B equal A's first result. A rollback
// while the other rank's pushes wait: only those of the chunks it moves
// fail (recognisably), a sum-only key's complete. And the refusals, each
// by name: a rollback before any commit, to another commit, with a chunk
// that has no copy (changing nothing), after an admin checkpoint restore,
// a COMMIT or ROLLBACK on a tenant that is not elastic (C++ API and C ABI).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/rackhub_c.h"
#include "rackhub/net/frame.h"

namespace rackhub::testing {
namespace {

namespace rc = rackhub::client;

constexpr uint32_t kElements = 600;

// Rank r's gradient of step s: uniform in [-1, 1), a stream of its own per
// (rank, step), so another membership or a step applied twice changes bits.
std::vector<float> Grad(uint32_t rank, uint32_t step) {
  std::mt19937 gen(rank * 7919u + step * 104729u + 17u);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(kElements);
  for (float& x : g) x = u(gen);
  return g;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ElasticRollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = MakeTempDir() + "/token";
    WriteFile(token_file_, token_);
    Start({"--in-memory"});
  }

  // A rackhubd with `flags` (two lanes) and the tenants "job" (elastic,
  // 2 workers) and "plain".
  void Start(std::vector<std::string> flags) {
    daemon_.reset();
    flags.insert(flags.end(), {"--lanes", "2", "--straggler-timeout-ms", "60000"});
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->started());
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"tenant", "create", "job", "--workers", "2", "--elastic",
                                   "--min-workers", "1", "--max-workers", "4"},
          std::vector<std::string>{"tenant", "create", "plain", "--workers", "1"}}) {
      std::vector<std::string> full = {BinPath("rackhubctl"), "--admin", daemon_->admin_address()};
      full.insert(full.end(), args.begin(), args.end());
      full.insert(full.end(), {"--chunk-bytes", "1024", "--tenant-token-file", token_file_});
      const CommandResult r = RunCommand(full);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    }
  }

  std::unique_ptr<rc::Client> Connect(const std::string& tenant, uint32_t rank) {
    rc::Options o;
    o.hub = daemon_->data_address();
    o.tenant = tenant;
    o.token = token_;
    o.rank = rank;
    o.op_timeout = std::chrono::milliseconds(30000);
    rc::Error err;
    auto c = rc::Client::Connect(o, &err);
    EXPECT_TRUE(c) << err.message;
    return c;
  }

  // Keys A and B, declared alike: momentum SGD, the mean of the members.
  std::vector<rc::KeyId> Declare(rc::Client& c) {
    return {DeclareMomentum(c, "A"), DeclareMomentum(c, "B")};
  }

  static rc::KeyId DeclareMomentum(rc::Client& c, const std::string& name) {
    rc::OptimizerSpec spec;
    spec.type = "momentum";
    spec.learning_rate = 0.1;
    spec.momentum = 0.9;
    return DeclareWith(c, name, spec);
  }

  // A key summed on the hub (its optimizer runs on the ranks).
  static rc::KeyId DeclareSum(rc::Client& c, const std::string& name) {
    rc::OptimizerSpec spec;
    spec.type = "sum_only";
    return DeclareWith(c, name, spec);
  }

  static rc::KeyId DeclareWith(rc::Client& c, const std::string& name,
                               const rc::OptimizerSpec& spec) {
    rc::KeyDecl d;
    d.name = name;
    d.elements = kElements;
    d.optimizer = spec;
    rc::KeyId id = 0;
    const rc::Error e = c.DeclareKey(d, &id);
    EXPECT_TRUE(e.ok()) << e.message;
    return id;
  }

  // The client contract after WORKER_LOST / ROLLED_BACK: Pull, push again.
  static rc::Error PushPull(rc::Client& c, rc::KeyId key, const std::vector<float>& g,
                            std::vector<float>& out) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      const rc::Error e = c.Wait(c.PushPull(key, g, out));
      const bool again = e.code == rc::ErrorCode::kRolledBack ||
                         (e.code == rc::ErrorCode::kServer && e.wire == rc::WireError::kWorkerLost);
      if (!again) return e;
      std::vector<float> scratch(kElements);
      if (const rc::Error p = c.Wait(c.Pull(key, scratch)); !p.ok()) return p;
    }
    return {rc::ErrorCode::kTimeout, rc::WireError::kNone, "no PushPull completed in 50 tries"};
  }

  // Step `step` of every key in `keys` by both ranks at once; the replies
  // (rank 0's; rank 1's must be the same bits).
  std::vector<std::vector<float>> Step(rc::Client& r0, rc::Client& r1,
                                       const std::vector<rc::KeyId>& k0,
                                       const std::vector<rc::KeyId>& k1, uint32_t step) {
    const std::vector<float> g0 = Grad(0, step), g1 = Grad(1, step);
    std::vector<std::vector<float>> out0(k0.size(), std::vector<float>(kElements));
    std::vector<std::vector<float>> out1(k0.size(), std::vector<float>(kElements));
    for (size_t k = 0; k < k0.size(); ++k) {
      const rc::Ticket t0 = r0.PushPull(k0[k], g0, out0[k]);
      const rc::Ticket t1 = r1.PushPull(k1[k], g1, out1[k]);
      const rc::Error e0 = r0.Wait(t0), e1 = r1.Wait(t1);
      EXPECT_TRUE(e0.ok()) << "step " << step << " rank 0: " << e0.message;
      EXPECT_TRUE(e1.ok()) << "step " << step << " rank 1: " << e1.message;
      EXPECT_TRUE(SameBits(out0[k], out1[k])) << "step " << step << " key " << k;
    }
    return out0;
  }

  static std::vector<float> Pull(rc::Client& c, rc::KeyId key) {
    std::vector<float> out(kElements);
    const rc::Error e = c.Wait(c.Pull(key, out));
    EXPECT_TRUE(e.ok()) << e.message;
    return out;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  const std::string token_ = std::string(40, 'r');
  std::string token_file_;
};

TEST_F(ElasticRollbackTest, RollbackRestoresParametersAndMomentumBitForBit) {
  auto r0 = Connect("job", 0), r1 = Connect("job", 1);
  ASSERT_TRUE(r0 && r1);
  const auto k0 = Declare(*r0), k1 = Declare(*r1);
  ASSERT_EQ(k0, k1);

  // Nothing committed yet: a rollback is refused by name.
  rc::Error e = r0->Wait(r0->RollbackElastic(0));
  EXPECT_EQ(e.wire, rc::WireError::kInvalidArgument) << e.message;
  EXPECT_NE(e.message.find("rollback: elastic tenant 'job' has no commit on this hub"),
            std::string::npos)
      << e.message;

  for (uint32_t s = 0; s < 3; ++s) Step(*r0, *r1, k0, k1, s);
  ASSERT_TRUE(r0->Wait(r0->CommitElastic(1)).ok());
  ASSERT_TRUE(r1->Wait(r1->CommitElastic(1)).ok());  // the second member's: a no-op
  const std::vector<float> committed = Pull(*r0, k0[0]);

  // A full step past the commit, rolled back (both members ask; the
  // second finds every chunk there already), and redone.
  const auto first = Step(*r0, *r1, k0, k1, 3);
  EXPECT_TRUE(SameBits(first[0], first[1]));
  ASSERT_TRUE(r0->Wait(r0->RollbackElastic(1)).ok());
  ASSERT_TRUE(r1->Wait(r1->RollbackElastic(1)).ok());
  for (const rc::KeyId k : k0) EXPECT_TRUE(SameBits(Pull(*r0, k), committed));
  for (const rc::KeyId k : k1) EXPECT_TRUE(SameBits(Pull(*r1, k), committed));
  EXPECT_EQ(r0->GetKeyInfo(k0[0])->next_iteration, 3u);
  const auto redo = Step(*r0, *r1, k0, k1, 3);
  EXPECT_TRUE(SameBits(redo[0], first[0])) << "the momentum did not come back exactly";
  EXPECT_TRUE(SameBits(redo[1], first[1]));
  ASSERT_TRUE(r0->Wait(r0->CommitElastic(2)).ok());
  ASSERT_TRUE(r1->Wait(r1->CommitElastic(2)).ok());
  const std::vector<float> committed2 = Pull(*r0, k0[1]);

  // Another commit than the hub's last: refused by name.
  e = r0->Wait(r0->RollbackElastic(1));
  EXPECT_EQ(e.wire, rc::WireError::kInvalidArgument) << e.message;
  EXPECT_NE(e.message.find("rollback: commit 1 asked for, but the last commit of elastic "
                           "tenant 'job' on this hub is 2"),
            std::string::npos)
      << e.message;

  // A step applied partly: A with both ranks; rank 1 leaves (BYE), so B
  // completes with rank 0 alone (another mean: other bits).
  // (PushPull borrows its input until it completes: the gradients stay.)
  const std::vector<float> g0 = Grad(0, 4), g1 = Grad(1, 4);
  std::vector<float> a(kElements), b(kElements), scratch(kElements);
  {
    const rc::Ticket t0 = r0->PushPull(k0[0], g0, a);
    const rc::Ticket t1 = r1->PushPull(k1[0], g1, scratch);
    ASSERT_TRUE(r0->Wait(t0).ok());
    ASSERT_TRUE(r1->Wait(t1).ok());
  }
  r1->Close();
  r1.reset();
  ASSERT_TRUE(PushPull(*r0, k0[1], g0, b).ok());
  EXPECT_FALSE(SameBits(a, b));
  // Rank 0 restores the commit: every chunk of A and B back to commit 2.
  ASSERT_TRUE(r0->Wait(r0->RollbackElastic(2)).ok());
  for (const rc::KeyId k : k0) EXPECT_TRUE(SameBits(Pull(*r0, k), committed2));
  // Rank 1 comes back (a new process: a new session) and the step is
  // redone with both: A and B equal A's first result, bit for bit.
  r1 = Connect("job", 1);
  ASSERT_TRUE(r1);
  const auto k1b = Declare(*r1);
  for (const rc::KeyId k : k1b) Pull(*r1, k);
  std::vector<std::vector<float>> again(2, std::vector<float>(kElements));
  for (size_t k = 0; k < 2; ++k) {
    std::vector<float> other(kElements);
    const rc::Ticket t1 = r1->PushPull(k1b[k], g1, other);
    ASSERT_TRUE(PushPull(*r0, k0[k], g0, again[k]).ok());
    ASSERT_TRUE(r1->Wait(t1).ok());
    EXPECT_TRUE(SameBits(other, again[k]));
  }
  EXPECT_TRUE(SameBits(again[0], a)) << "key A after the rollback and the redo";
  EXPECT_TRUE(SameBits(again[1], a)) << "key B after the rollback and the redo";
}

// A rollback while the other member's pushes wait for it (the member that
// asks lost its step alone): the pushes to a chunk it moves fail with
// WORKER_LOST naming the rollback (net::kRollbackRefusal: the pusher
// restores the commit too), those of a sum-only key stay and complete.
TEST_F(ElasticRollbackTest, RollbackFailsOnlyThePushesOfTheChunksItMoves) {
  auto r0 = Connect("job", 0), r1 = Connect("job", 1);
  ASSERT_TRUE(r0 && r1);
  const auto k0 = Declare(*r0), k1 = Declare(*r1);
  const rc::KeyId s0 = DeclareSum(*r0, "S"), s1 = DeclareSum(*r1, "S");
  Step(*r0, *r1, k0, k1, 0);
  Step(*r0, *r1, {s0}, {s1}, 0);
  ASSERT_TRUE(r0->Wait(r0->CommitElastic(1)).ok());
  ASSERT_TRUE(r1->Wait(r1->CommitElastic(1)).ok());
  const std::vector<float> committed = Pull(*r0, k0[0]);

  // Rank 1 pushes A and S; its Pull of B after them (every key spans both
  // lanes; a connection's frames are handled in order) returns once both
  // pushes wait on the hub for rank 0.
  const std::vector<float> g0 = Grad(0, 1), g1 = Grad(1, 1);
  std::vector<float> a1(kElements), s1_out(kElements), s0_out(kElements);
  const rc::Ticket ta = r1->PushPull(k1[0], g1, a1);
  const rc::Ticket ts = r1->PushPull(s1, g1, s1_out);
  Pull(*r1, k1[1]);
  ASSERT_TRUE(r0->Wait(r0->RollbackElastic(1)).ok());
  const rc::Error ea = r1->Wait(ta);
  EXPECT_EQ(ea.wire, rc::WireError::kWorkerLost) << ea.message;
  EXPECT_NE(ea.message.find(std::string(net::kRollbackRefusal) + "0 restores commit 1"),
            std::string::npos)
      << ea.message;
  // The sum-only key's update was not the rollback's: it completes.
  ASSERT_TRUE(r0->Wait(r0->PushPull(s0, g0, s0_out)).ok());
  const rc::Error es = r1->Wait(ts);
  ASSERT_TRUE(es.ok()) << "the rollback failed a sum-only key's push: " << es.message;
  EXPECT_TRUE(SameBits(s0_out, s1_out));
  for (const rc::KeyId k : k0) EXPECT_TRUE(SameBits(Pull(*r0, k), committed));
  // Both ranks redo the step of A (rank 1 pulls first, as the client
  // contract asks after a WORKER_LOST): the same bits on both.
  Pull(*r1, k1[0]);
  std::vector<float> a0(kElements);
  const rc::Ticket t1 = r1->PushPull(k1[0], g1, a1);
  ASSERT_TRUE(r0->Wait(r0->PushPull(k0[0], g0, a0)).ok());
  ASSERT_TRUE(r1->Wait(t1).ok());
  EXPECT_TRUE(SameBits(a0, a1));
}

// A key whose chunks got their values after the last COMMIT (declared in
// the failed step) is copied then: the rollback returns it to its initial
// values on every lane (before, the lanes without a copy refused while the
// others rolled back, leaving the hub mixed), and the redo of the step is
// the first run's, bit for bit.
TEST_F(ElasticRollbackTest, AKeyDeclaredAfterTheCommitRollsBackToItsInitialValues) {
  auto r0 = Connect("job", 0), r1 = Connect("job", 1);
  ASSERT_TRUE(r0 && r1);
  const auto k0 = Declare(*r0), k1 = Declare(*r1);
  Step(*r0, *r1, k0, k1, 0);
  ASSERT_TRUE(r0->Wait(r0->CommitElastic(1)).ok());
  const std::vector<float> committed = Pull(*r0, k0[0]);
  const rc::KeyId c0 = DeclareMomentum(*r0, "C"), c1 = DeclareMomentum(*r1, "C");
  const std::vector<float> initial = Pull(*r0, c0);
  const auto stepped = Step(*r0, *r1, {k0[0], c0}, {k1[0], c1}, 1);
  EXPECT_FALSE(SameBits(stepped[1], initial)) << "the step did not move key C";
  ASSERT_TRUE(r0->Wait(r0->RollbackElastic(1)).ok());
  ASSERT_TRUE(r1->Wait(r1->RollbackElastic(1)).ok());
  EXPECT_TRUE(SameBits(Pull(*r0, k0[0]), committed)) << "key A was not rolled back";
  EXPECT_TRUE(SameBits(Pull(*r0, c0), initial)) << "key C was not rolled back to its values";
  EXPECT_TRUE(SameBits(Pull(*r1, k1[0]), committed));
  EXPECT_TRUE(SameBits(Pull(*r1, c1), initial));
  const auto redo = Step(*r0, *r1, {k0[0], c0}, {k1[0], c1}, 1);
  EXPECT_TRUE(SameBits(redo[0], stepped[0]));
  EXPECT_TRUE(SameBits(redo[1], stepped[1])) << "key C's momentum did not start over";
}

// An admin checkpoint restore drops the commit copies (they predate the
// restored state): a ROLLBACK is then refused by name instead of undoing
// the restore.
TEST_F(ElasticRollbackTest, CheckpointRestoreDropsTheCommit) {
  Start({});  // checkpoints need a data directory
  auto r0 = Connect("job", 0), r1 = Connect("job", 1);
  ASSERT_TRUE(r0 && r1);
  const auto k0 = Declare(*r0), k1 = Declare(*r1);
  Step(*r0, *r1, k0, k1, 0);
  const auto ctl = [&](const std::vector<std::string>& args) {
    std::vector<std::string> full = {BinPath("rackhubctl"), "--admin", daemon_->admin_address()};
    full.insert(full.end(), args.begin(), args.end());
    const CommandResult r = RunCommand(full);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  };
  ctl({"checkpoint", "create", "job"});
  const std::vector<float> checkpointed = Pull(*r0, k0[0]);
  Step(*r0, *r1, k0, k1, 1);
  ASSERT_TRUE(r0->Wait(r0->CommitElastic(1)).ok());
  ctl({"checkpoint", "restore", "job"});
  const rc::Error e = r0->Wait(r0->RollbackElastic(1));
  EXPECT_EQ(e.wire, rc::WireError::kInvalidArgument) << e.message;
  EXPECT_NE(e.message.find("has no commit on this hub"), std::string::npos) << e.message;
  EXPECT_TRUE(SameBits(Pull(*r0, k0[0]), checkpointed)) << "the rollback undid the restore";
}

// The C++ API and the C ABI on a tenant that is not elastic: refused by
// name, the connection stays usable.
TEST_F(ElasticRollbackTest, RefusedForATenantThatIsNotElastic) {
  auto c = Connect("plain", 0);
  ASSERT_TRUE(c);
  for (const bool commit : {true, false}) {
    const rc::Error e = c->Wait(commit ? c->CommitElastic(1) : c->RollbackElastic(1));
    EXPECT_EQ(e.wire, rc::WireError::kInvalidArgument) << e.message;
    const std::string want =
        std::string(commit ? "commit" : "rollback") + ": tenant 'plain' is not elastic";
    EXPECT_NE(e.message.find(want), std::string::npos) << e.message;
  }
  c->Close();  // rank 0 again, through the C ABI
  rackhub_options o{};
  const std::string hub = daemon_->data_address();
  o.hub = hub.c_str();
  o.tenant = "plain";
  o.token = token_.c_str();
  char err[256] = {0};
  rackhub_client* cc = nullptr;
  ASSERT_EQ(rackhub_connect(&o, &cc, err, sizeof err), RACKHUB_OK) << err;
  for (const bool commit : {true, false}) {
    EXPECT_EQ(commit ? rackhub_commit_elastic(cc, 3) : rackhub_rollback_elastic(cc, 3),
              RACKHUB_SERVER);
    EXPECT_EQ(rackhub_last_wire_error(cc), 11u);  // INVALID_ARGUMENT
    EXPECT_NE(std::string(rackhub_last_error(cc)).find("is not elastic"), std::string::npos)
        << rackhub_last_error(cc);
  }
  rackhub_close(cc);
  EXPECT_EQ(rackhub_commit_elastic(nullptr, 1), RACKHUB_INVALID_ARGUMENT);
  EXPECT_EQ(rackhub_rollback_elastic(nullptr, 1), RACKHUB_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace rackhub::testing
