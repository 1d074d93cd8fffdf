// Elastic tenants end to end (docs/elastic.md): a real rackhubd on
// 127.0.0.1, workers are forked child processes of this test, each one C++
// Client (one rank) driven over a socketpair: the test tells a worker which
// step to push, the worker pushes its gradient of that step to two sum-only
// keys (reduction sum and mean), retries after WORKER_LOST (Pull, push the
// same gradient again) and reports the reply with the membership the hub
// named. Workers are killed with SIGKILL between steps and in the middle of
// steps, and new ones join; every reply is
// compared bit for bit with a reference
// this test computes from the gradients and the membership it expects (the
// ranks alive: the sum in rank order over them, the mean that sum times
// float(1/count)). Every wait is for an event (a worker's report, a child's
// exit, a log line); the straggler timeout is 60 s, so a survivor that
// waited for it would show in the measured times.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "elastic_fixture.h"
#include "process.h"
#include "rackhub/client/client.h"
#include "rackhub/client/rackhub_c.h"
#include "wait.h"

namespace rackhub::testing {
namespace {

namespace rc = rackhub::client;
using namespace elastic;  // NOLINT: the shared worker and fixture (elastic_fixture.h)

constexpr uint32_t kMaxWorkers = 8;
constexpr uint32_t kMinWorkers = 2;
constexpr uint32_t kStartWorkers = 4;

// ---- The test side --------------------------------------------------------

class ElasticTest : public ::testing::TestWithParam<bool> {  // true: shared memory
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--in-memory", "--lanes", "2", "--straggler-timeout-ms", "60000"});
    ASSERT_TRUE(daemon_->started());
    token_ = std::string(40, 'e');
    const std::string token_file = MakeTempDir() + "/token";
    WriteFile(token_file, token_);
    const CommandResult r = Ctl({"tenant", "create", "job", "--workers",
                                 std::to_string(kStartWorkers), "--elastic", "--min-workers",
                                 std::to_string(kMinWorkers), "--max-workers",
                                 std::to_string(kMaxWorkers), "--chunk-bytes", "1024",
                                 "--tenant-token-file", token_file});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  void TearDown() override { workers_.KillAll(); }

  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {BinPath("rackhubctl"), "--admin", daemon_->admin_address()});
    return RunCommand(args);
  }

  void Join(const std::vector<uint32_t>& ranks) { workers_.Join(ranks); }
  std::vector<uint32_t> Alive() const { return workers_.Alive(); }
  int CountLog(const std::string& needle) const { return CountOf(daemon_->Log(), needle); }
  // kill -9 between iterations, then waits for the event: the hub committed
  // the membership without it (so the next step runs with no barrier in
  // flight).
  void KillAndWaitLeft(uint32_t rank) {
    std::vector<uint32_t> rest = Alive();
    rest.erase(std::find(rest.begin(), rest.end(), rank));
    std::string ranks;
    for (uint32_t r : rest) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    const std::string needle = " member(s) [" + ranks + "]";
    const int before = CountLog(needle);
    workers_.Kill(rank);
    ASSERT_TRUE(WaitForLog(*daemon_, needle, before + 1));
  }

  // Checks one key's replies of a step against the reference of `members`
  // (the sum in rank order; the mean that sum times float(1/count)).
  static void CheckKey(const std::vector<Report>& reports, bool mean_key,
                       const std::vector<uint32_t>& members, uint32_t step) {
    CheckReplies(reports, mean_key,
                 mean_key ? ReferenceMean(members, step) : ReferenceSum(members, step),
                 members.size(), step);
  }

  // Runs `step` on every alive worker. The membership each key's replies
  // name must be the alive ranks and the values that membership's
  // reference. Returns the seconds until the last report.
  double Step(uint32_t step) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<Report> reports = workers_.RunStep(step);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (bool mean_key : {false, true}) CheckKey(reports, mean_key, Alive(), step);
    return seconds;
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::string token_;
  WorkerPool workers_{
      [this](uint32_t rank) {
        return WorkerConfig{daemon_->data_address(), "job", token_, rank, GetParam(), 0, rank};
      },
      [this] { return "\n--- hub log:\n" + daemon_->Log(); }};
};

TEST_P(ElasticTest, KillJoinPauseResume) {
  // Ranks 0..3 make the start quorum; the first three are held until the
  // fourth connects.
  Join({0, 1, 2, 3});
  uint32_t step = 0;
  EXPECT_LT(Step(step++), 20.0);
  EXPECT_LT(Step(step++), 20.0);

  // kill -9 between iterations: the survivors' next iteration completes
  // without a replacement (the straggler timeout is 60 s). Measured from the
  // kill to the survivors' completed iteration, which is sent once the hub
  // committed the membership without the dead rank.
  const auto killed_at = std::chrono::steady_clock::now();
  KillAndWaitLeft(3);
  Step(step++);
  const double after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(after_kill, 20.0) << "the survivors waited for the dead rank";
  std::printf("kill -9 to the survivors' completed iteration: %.1f ms\n", after_kill * 1e3);
  EXPECT_LT(Step(step++), 20.0);

  // A rank leaves and another joins, waiting for the hub's commits.
  Join({3});
  EXPECT_LT(Step(step++), 20.0);
  KillAndWaitLeft(1);
  EXPECT_LT(Step(step++), 20.0);
  EXPECT_EQ(Alive().size(), 3u);

  // Two joiners: 5 members.
  Join({1, 4});
  EXPECT_LT(Step(step++), 20.0);
  EXPECT_EQ(Alive().size(), 5u);

  // Below min_workers (2): the tenant pauses, tenant get and the metrics say
  // so, the last rank's push is held until a rank joins.
  for (uint32_t r : {0u, 1u, 2u, 4u}) KillAndWaitLeft(r);
  ASSERT_EQ(Alive(), std::vector<uint32_t>{3});
  ASSERT_TRUE(WaitForLog(*daemon_, "1 member(s) [3] (paused: below min_workers 2)"));
  workers_.SendStep(3, step);
  Report rep;
  ASSERT_TRUE(workers_.Next(3, &rep));
  ASSERT_EQ(rep.kind, kPausedSeen) << rep.message;
  EXPECT_NE(std::string(rep.message).find("below min_workers 2"), std::string::npos)
      << rep.message;
  const CommandResult get = Ctl({"tenant", "get", "job"});
  EXPECT_NE(get.out.find("PAUSED"), std::string::npos) << get.out;
  EXPECT_NE(get.out.find("1 member"), std::string::npos) << get.out;
  const CommandResult top = Ctl({"top", "--once"});
  EXPECT_NE(top.out.find("PAUSED 1"), std::string::npos) << top.out << top.err;
  // Resume: rank 0 joins; rank 3's held push completes with it.
  Join({0});
  workers_.SendStep(0, step);
  std::vector<Report> reports;
  for (uint32_t r : {0u, 3u}) {
    ASSERT_TRUE(workers_.Next(r, &rep));
    ASSERT_EQ(rep.kind, kStepDone);
    reports.push_back(rep);
  }
  CheckKey(reports, false, {0, 3}, step);
  CheckKey(reports, true, {0, 3}, step);
  const CommandResult running = Ctl({"tenant", "get", "job"});
  EXPECT_NE(running.out.find("running"), std::string::npos) << running.out;
  ++step;
  EXPECT_LT(Step(step++), 20.0);
}

// At least 20 membership changes in a random order (kills between steps,
// joins of the lowest free rank), each followed by the hub's commit: every
// step completes (nothing hangs), every reply names one generation per key
// and step and equals the reference of the ranks alive. The seed is
// printed. (Kills in the middle of a step: KillsInTheMiddleOfSteps.)
TEST_P(ElasticTest, RandomMembershipLoop) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Join({0, 1, 2, 3});
  uint32_t step = 0, changes = 0;
  while (changes < 24 && !HasFailure()) {
    const std::vector<uint32_t> alive = Alive();
    const uint32_t choice = rng() % 2;
    if (choice == 0 && alive.size() > kMinWorkers) {
      KillAndWaitLeft(alive[rng() % alive.size()]);  // between steps
      ++changes;
      Step(step++);
    } else if (alive.size() < kMaxWorkers) {
      uint32_t free_rank = 0;
      while (workers_.Has(free_rank)) ++free_rank;  // the lowest free rank
      Join({free_rank});
      ++changes;
      Step(step++);
    } else {
      Step(step++);
    }
  }
  EXPECT_GE(changes, 20u);
  // The hub named every change: one committed generation per change at least.
  const CommandResult get = Ctl({"tenant", "get", "job"});
  EXPECT_EQ(get.exit_code, 0) << get.err;
}

// kill -9 in the middle of steps, 20 times at random points (before the
// victim got the step, right after, or once a survivor has completed it),
// with joins between: no survivor waits for the straggler timeout (60 s; a
// report is waited for 30 s), and every chunk of every reply equals the
// reference of the members before the kill (the update completed with the
// victim) or after it (the update aborted and the survivors retried without
// it), in rank order, bit for bit; the step after each kill equals the
// reference of the ranks alive. This is the interleaving of a PushPull that
// straddles the barrier (docs/elastic.md): a retry of a chunk whose push was
// counted in an update completed since is answered with its result.
TEST_P(ElasticTest, KillsInTheMiddleOfSteps) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Join({0, 1, 2, 3});
  uint32_t step = 0, kills = 0;
  while (kills < 20 && !HasFailure()) {
    std::vector<uint32_t> before = Alive();
    if (before.size() <= kMinWorkers) {
      uint32_t free_rank = 0;
      while (workers_.Has(free_rank)) ++free_rank;
      Join({free_rank});
      Step(step++);
      continue;
    }
    const uint32_t victim = before[rng() % before.size()];
    std::vector<uint32_t> after = before;
    after.erase(std::find(after.begin(), after.end(), victim));
    const uint32_t point = rng() % 3;
    const std::vector<Report> reports = workers_.KillDuringStep(victim, point, step);
    ++kills;
    ASSERT_EQ(reports.size(), after.size());
    const std::string what = "step " + std::to_string(step) + ", kill point " +
                             std::to_string(point) + ", victim " + std::to_string(victim);
    CheckWithOrWithout(reports, false, ReferenceSum(before, step), ReferenceSum(after, step),
                       what);
    CheckWithOrWithout(reports, true, ReferenceMean(before, step), ReferenceMean(after, step),
                       what);
    ++step;
    // The membership without the victim is committed by now or soon; the
    // next step (its pushes held or retried until then) has exactly it.
    Step(step++);
    if (rng() % 2 == 0) {
      uint32_t free_rank = 0;
      while (workers_.Has(free_rank)) ++free_rank;
      if (free_rank < kMaxWorkers) {
        Join({free_rank});
        Step(step++);
      }
    }
  }
  EXPECT_EQ(kills, 20u);
}

INSTANTIATE_TEST_SUITE_P(Transports, ElasticTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Shm" : "Tcp";
                         });

// ---- Creation: flags, validation, persistence -------------------------------

TEST(ElasticCreateTest, ValidatesAndPersists) {
  DaemonProcess daemon({"--lanes", "2"});
  ASSERT_TRUE(daemon.started());
  const auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {BinPath("rackhubctl"), "--admin", daemon.admin_address()});
    return RunCommand(args);
  };
  struct Bad {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Bad> bad = {
      {{"--workers", "2", "--elastic", "--min-workers", "3", "--max-workers", "8"},
       "min_workers: 3 is above workers_per_rack 2"},
      {{"--workers", "9", "--elastic", "--max-workers", "8"},
       "workers_per_rack: 9 is above max_workers 8"},
      {{"--workers", "2", "--min-workers", "1"}, "--min-workers: only with --elastic"},
      {{"--workers", "2", "--elastic", "--consistency", "bounded:1"},
       "elastic: an elastic tenant is sync"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> args = {"tenant", "create", "x"};
    args.insert(args.end(), b.args.begin(), b.args.end());
    const CommandResult r = ctl(args);
    EXPECT_NE(r.exit_code, 0) << r.out;
    EXPECT_NE(r.err.find(b.error), std::string::npos) << r.err;
  }
  CommandResult r = ctl({"tenant", "create", "job", "--workers", "4", "--elastic",
                         "--min-workers", "2", "--max-workers", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ranks 0..7, start quorum 4 (x racks, in total), min 2"),
            std::string::npos)
      << r.out;
  // The rank limit of an elastic tenant is fixed.
  r = ctl({"tenant", "update-quotas", "job", "--max-workers", "6"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("fixed"), std::string::npos) << r.err;
  // A plain tenant is not elastic.
  ASSERT_EQ(ctl({"tenant", "create", "plain", "--workers", "2"}).exit_code, 0);
  // Persisted in the registry: the same after a restart.
  ASSERT_EQ(daemon.Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon.Restart());
  r = ctl({"tenant", "get", "job"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ranks 0..7, start quorum 4 (x racks, in total), min 2"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("PAUSED"), std::string::npos) << r.out;  // no worker yet
  r = ctl({"tenant", "get", "plain"});
  EXPECT_EQ(r.out.find("elastic"), std::string::npos) << r.out;
}

// ---- The C ABI reports the membership (rackhub_key_membership) -------------

// Two ranks (one C client each, in two threads) of an elastic tenant push
// to a sum-only key; after the PushPull each client's rackhub_key_membership
// names the update's generation and its 2 members, and the values are the
// rank-order sum. Then rank 1 closes (BYE): rank 0's next PushPull is the
// value of rank 0 alone with 1 member and a newer generation. An unknown key
// and a NULL client are refused by name.
TEST(ElasticCApiTest, KeyMembershipAfterPushPull) {
  DaemonProcess daemon({"--in-memory", "--lanes", "2", "--straggler-timeout-ms", "60000"});
  ASSERT_TRUE(daemon.started());
  const std::string token(40, 'c');
  const std::string token_file = MakeTempDir() + "/token";
  WriteFile(token_file, token);
  const CommandResult r = RunCommand(
      {BinPath("rackhubctl"), "--admin", daemon.admin_address(), "tenant", "create", "job",
       "--workers", "2", "--elastic", "--min-workers", "1", "--max-workers", "4",
       "--tenant-token-file", token_file});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  constexpr uint64_t kN = 64;
  rackhub_client* clients[2] = {nullptr, nullptr};
  uint32_t keys[2] = {0, 0};
  const std::string hub = daemon.data_address();
  for (uint32_t rank = 0; rank < 2; ++rank) {
    rackhub_options o{};
    o.hub = hub.c_str();
    o.tenant = "job";
    o.token = token.c_str();
    o.rank = rank;
    char err[256] = {0};
    ASSERT_EQ(rackhub_connect(&o, &clients[rank], err, sizeof err), RACKHUB_OK) << err;
    rackhub_optimizer spec{};
    spec.type = "sum-only";
    spec.reduction = RACKHUB_REDUCTION_SUM;
    ASSERT_EQ(rackhub_declare_key(clients[rank], "k", kN, RACKHUB_FP32, &spec,
                                  RACKHUB_INIT_ZEROS, &keys[rank]),
              RACKHUB_OK)
        << rackhub_last_error(clients[rank]);
  }
  // Before any update: zeros.
  uint64_t gen = 7;
  uint32_t members = 7;
  int mixed = 7;
  ASSERT_EQ(rackhub_key_membership(clients[0], keys[0], &gen, &members, &mixed), RACKHUB_OK);
  EXPECT_EQ(gen, 0u);
  EXPECT_EQ(members, 0u);
  EXPECT_EQ(mixed, 0);
  std::vector<float> grads[2], outs[2];
  for (uint32_t rank = 0; rank < 2; ++rank) {
    grads[rank].resize(kN);
    outs[rank].assign(kN, -1.0f);
    for (uint64_t i = 0; i < kN; ++i) grads[rank][i] = Gradient(rank, 1, static_cast<uint32_t>(i));
  }
  int status[2] = {-1, -1};
  std::thread t1([&] {
    status[1] = rackhub_push_pull(clients[1], keys[1], grads[1].data(), outs[1].data(), kN);
  });
  status[0] = rackhub_push_pull(clients[0], keys[0], grads[0].data(), outs[0].data(), kN);
  t1.join();
  uint64_t first_gen = 0;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(status[rank], RACKHUB_OK) << rackhub_last_error(clients[rank]);
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(outs[rank][i], grads[0][i] + grads[1][i]) << "rank " << rank << " element " << i;
    }
    ASSERT_EQ(rackhub_key_membership(clients[rank], keys[rank], &gen, &members, &mixed),
              RACKHUB_OK);
    EXPECT_GE(gen, 1u);
    EXPECT_EQ(members, 2u);
    EXPECT_EQ(mixed, 0);
    if (rank == 0) first_gen = gen;
    EXPECT_EQ(gen, first_gen);
  }
  // NULL outputs are allowed.
  EXPECT_EQ(rackhub_key_membership(clients[0], keys[0], nullptr, nullptr, nullptr), RACKHUB_OK);
  // Rank 1 leaves (BYE): rank 0 goes on alone (min 1) with a newer generation.
  rackhub_close(clients[1]);
  clients[1] = nullptr;
  int st = RACKHUB_OK;
  for (int attempt = 0; attempt < 100; ++attempt) {  // WORKER_LOST: pull, push again
    st = rackhub_push_pull(clients[0], keys[0], grads[0].data(), outs[0].data(), kN);
    if (st == RACKHUB_OK) break;
    ASSERT_EQ(st, RACKHUB_SERVER) << rackhub_last_error(clients[0]);
    std::vector<float> scratch(kN);
    ASSERT_EQ(rackhub_pull(clients[0], keys[0], scratch.data(), kN), RACKHUB_OK)
        << rackhub_last_error(clients[0]);
  }
  ASSERT_EQ(st, RACKHUB_OK) << rackhub_last_error(clients[0]);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(outs[0][i], grads[0][i]) << "element " << i;
  ASSERT_EQ(rackhub_key_membership(clients[0], keys[0], &gen, &members, &mixed), RACKHUB_OK);
  EXPECT_GT(gen, first_gen);
  EXPECT_EQ(members, 1u);
  // Bad input: an unknown key, a NULL client.
  EXPECT_EQ(rackhub_key_membership(clients[0], 9999, &gen, &members, &mixed),
            RACKHUB_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rackhub_last_error(clients[0])).find("unknown key 9999"),
            std::string::npos)
      << rackhub_last_error(clients[0]);
  EXPECT_EQ(rackhub_key_membership(nullptr, 0, &gen, &members, &mixed),
            RACKHUB_INVALID_ARGUMENT);
  rackhub_close(clients[0]);
}

}  // namespace
}  // namespace rackhub::testing
