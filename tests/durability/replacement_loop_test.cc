// The worker replacement loop of docs/durability.md (issue 26), with real
// processes:
//
// WorkerReplacementLoop{Shm,Tcp}: three processes of the C ABI
// worker (rackhub-generation-worker) iterate on a sum-only key; after 5 to 9
// iterations, at a random point within an iteration (often while pushes are
// in flight, some chunks counted on one lane and not yet on the other), rank
// 1 is killed with SIGKILL; the two survivors get their error and leave (BYE);
// then three fresh processes Pull and PushPull two rounds. Every process
// pushes gradients with its own salt (salted_gradient.h), and every value of
// every reply of the fresh processes must be the sum of the fresh processes'
// gradients of that round; a fresh process must get no error at all (no
// refusal right after its Pull, no stall). Over shared memory (the client's
// default with a local hub) and over TCP (a hub started with --shm off; the C
// ABI has no transport option): each worker reports how many shared-memory
// regions it mapped. Each trial has its own tenant.
//
// Trials: RACKHUB_KILL_TRIALS (default 5 per transport; tests/durability/
// kill_loops.sh runs more), RACKHUB_KILL_ELEMENTS the key's size (default
// 1M elements), RACKHUB_KILL_SEED fixes the random points (default: time;
// the seed is printed).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kill_points.h"
#include "loop_admin.h"
#include "process.h"
#include "salted_gradient.h"
#include "wait.h"

namespace rackhub::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A first-generation survivor whose next push waits for the killed rank (the
// hub holds it for a replacement, up to the straggler timeout) gives up after
// this and leaves. The first generation starts pushing only once all three
// are connected (--go-file), so this bounds one iteration, which takes
// milliseconds (about 100-300 ms for 4M elements over TCP on a loaded 2-core
// host): far below it even under a CPU hog. Fresh processes wait as long as
// the stalled trainers did.
constexpr std::chrono::milliseconds kFirstGenerationOpTimeout{10000};
constexpr std::chrono::milliseconds kFreshOpTimeout{30000};

// Where a trial's time went (ms).
struct TrialTimes {
  double kill = 0;       // the random delay within an iteration before the SIGKILL
  double survivors = 0;  // from the SIGKILL until both survivors left
  double fresh = 0;      // from starting the fresh processes until they exited
};

// The replacement loop's chunks: 128 of them on a 1M-element key, over both
// lanes, so a kill within an iteration often finds some counted and some not.
constexpr uint32_t kReplacementChunkElements = 8192;

// One process of rackhub-generation-worker and its output (--out).
struct GenerationWorker {
  uint32_t rank = 0;
  uint32_t salt = 0;
  std::string out;
  std::unique_ptr<ChildProcess> proc;
  int exit_code = -1;  // once it exited

  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    std::istringstream in(ReadFile(out));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  std::vector<std::string> LinesStarting(const std::string& word) const {
    std::vector<std::string> found;
    for (const auto& l : Lines()) {
      if (l.rfind(word + " ", 0) == 0 || l == word) found.push_back(l);
    }
    return found;
  }
  // Iterations completed (--rounds 0).
  uint64_t Steps() const { return LinesStarting("iter").size(); }
  bool Exited() {
    if (exit_code < 0 && proc) exit_code = proc->Wait(std::chrono::milliseconds(0));
    return exit_code >= 0;
  }
  std::string Describe() const {
    std::string s = "rank " + std::to_string(rank) + " (salt " + std::to_string(salt) + ", exit " +
                    std::to_string(exit_code) + "):";
    const auto lines = Lines();
    // The head (transport) and the tail are what tell a story.
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i < 2 || i + 6 >= lines.size()) {
        s += "\n    " + lines[i];
      } else if (i == 2) {
        s += "\n    ...";
      }
    }
    const std::string log = ReadFile(out + ".log");
    if (!log.empty()) s += "\n    stderr: " + log.substr(0, 600);
    return s;
  }
};

// One trial's processes on its own tenant.
class ReplacementTrial {
 public:
  ReplacementTrial(const std::string& hub, std::string tenant, uint64_t elements, std::string dir)
      : hub_(hub), tenant_(std::move(tenant)), elements_(elements), dir_(std::move(dir)) {}

  // `go_file`: the worker waits for it after connecting ("" starts at once).
  GenerationWorker& Start(uint32_t rank, uint32_t salt, uint32_t rounds,
                          std::chrono::milliseconds op_timeout, const std::string& go_file = "") {
    auto w = std::make_unique<GenerationWorker>();
    w->rank = rank;
    w->salt = salt;
    w->out = dir_ + "/salt" + std::to_string(salt) + "-rank" + std::to_string(rank) + ".out";
    std::vector<std::string> args = {BinPath("rackhub-generation-worker"),
                                     "--hub",
                                     hub_,
                                     "--tenant",
                                     tenant_,
                                     "--token",
                                     kLoopToken,
                                     "--rank",
                                     std::to_string(rank),
                                     "--salt",
                                     std::to_string(salt),
                                     "--elements",
                                     std::to_string(elements_),
                                     "--rounds",
                                     std::to_string(rounds),
                                     "--op-timeout-ms",
                                     std::to_string(op_timeout.count()),
                                     "--out",
                                     w->out};
    if (!go_file.empty()) {
      args.push_back("--go-file");
      args.push_back(go_file);
    }
    w->proc = std::make_unique<ChildProcess>(std::move(args), w->out + ".log");
    workers_.push_back(std::move(w));
    return *workers_.back();
  }
  // Waits until every worker of `set` exited or `limit` passed; true if all did.
  static bool WaitExit(const std::vector<GenerationWorker*>& set, std::chrono::milliseconds limit) {
    return static_cast<bool>(WaitUntil(
        "the workers' exits",
        [&] {
          bool all = true;
          for (GenerationWorker* w : set) all = w->Exited() && all;
          return all;
        },
        limit));
  }
  std::string Describe(const std::vector<GenerationWorker*>& set) const {
    std::string s;
    for (const GenerationWorker* w : set) s += "  " + w->Describe() + "\n";
    return s;
  }

 private:
  const std::string hub_, tenant_;
  const uint64_t elements_;
  const std::string dir_;
  std::vector<std::unique_ptr<GenerationWorker>> workers_;
};

// The expected reply of every fresh process at `step`: the sum of the fresh
// processes' gradients (a sum-only key with sum reduction replies with the
// reduced gradient: docs/wire-protocol.md, SUM-ONLY keys). Exact in fp32.
std::vector<float> FreshSum(const std::vector<GenerationWorker*>& fresh, uint64_t step,
                            uint64_t elements) {
  std::vector<float> sum(elements, 0.0f);
  for (const GenerationWorker* w : fresh) {
    for (uint64_t i = 0; i < elements; ++i) sum[i] += SaltedGradient(w->salt, w->rank, step, i);
  }
  return sum;
}

// What a wrong value at element `i` of a round-`step` reply is explained by:
// one process's gradient of some step (a departed process's, or a fresh
// process's of another round) summed in place of one fresh process's.
std::string ExplainWrong(float got, float want, uint64_t i, uint64_t step,
                         const std::vector<GenerationWorker*>& fresh,
                         const std::vector<GenerationWorker*>& departed) {
  const double diff = static_cast<double>(got) - want;
  const auto explain = [&](const GenerationWorker* by, const std::string& who,
                           uint64_t steps) -> std::string {
    for (uint64_t t = 0; t < steps; ++t) {
      for (const GenerationWorker* f : fresh) {
        if (by == f && t == step) continue;
        if (static_cast<double>(SaltedGradient(by->salt, by->rank, t, i)) -
                SaltedGradient(f->salt, f->rank, step, i) ==
            diff) {
          return who + " rank " + std::to_string(by->rank) + " (salt " + std::to_string(by->salt) +
                 ")'s gradient of its step " + std::to_string(t) +
                 " was summed in place of fresh rank " + std::to_string(f->rank) + "'s";
        }
      }
    }
    return "";
  };
  for (const GenerationWorker* d : departed) {
    if (std::string e = explain(d, "departed", d->Steps() + 2); !e.empty()) return e;
  }
  for (const GenerationWorker* f : fresh) {
    if (std::string e = explain(f, "fresh", 3); !e.empty()) return e;
  }
  return "not one other gradient in place of a fresh one";
}

// One trial on tenant `tenant`: "" if the fresh processes were right, else
// what went wrong. *times: where its time went.
std::string RunReplacementTrial(LoopAdmin& admin, const std::string& hub, const std::string& tenant,
                                const std::string& transport, uint64_t elements,
                                std::mt19937_64& rng, TrialTimes* times) {
  const std::string dir = MakeTempDir();
  admin.CreateTenant(tenant, 3, static_cast<uint32_t>(kReplacementChunkElements * sizeof(float)));
  ReplacementTrial trial(hub, tenant, elements, dir);
  std::set<uint32_t> used;
  const auto salt = [&] {
    uint32_t s;
    do {
      s = 1 + static_cast<uint32_t>(rng() % kMaxSalt);
    } while (!used.insert(s).second);
    return s;
  };
  const auto fail = [&](const std::string& what) { return what + "\n(outputs in " + dir + ")"; };

  // The first generation iterates; rank 1 is killed after 5 to 9 iterations,
  // at a random point within an iteration.
  std::vector<GenerationWorker*> first;
  const std::string go = dir + "/go";
  for (uint32_t r = 0; r < 3; ++r) {
    first.push_back(&trial.Start(r, salt(), 0, kFirstGenerationOpTimeout, go));
  }
  const auto min_steps = [&] {
    uint64_t m = UINT64_MAX;
    for (GenerationWorker* w : first) m = std::min(m, w->Steps());
    return m;
  };
  const auto any_exited = [&] {
    for (GenerationWorker* w : first) {
      if (w->Exited()) return true;
    }
    return false;
  };
  const uint64_t target = 5 + rng() % 5;
  const auto all_ready = [&] {
    for (GenerationWorker* w : first) {
      if (w->LinesStarting("ready").empty()) return false;
    }
    return true;
  };
  if (!WaitUntil(
          "the first generation ready", [&] { return all_ready() || any_exited(); },
          std::chrono::seconds(60)) ||
      any_exited()) {
    return fail("the first generation did not connect:\n" + trial.Describe(first));
  }
  if (!std::ofstream(go).good()) return fail("cannot create " + go);
  if (!WaitUntil(
          "a first iteration", [&] { return min_steps() >= 1 || any_exited(); },
          std::chrono::seconds(60)) ||
      any_exited()) {
    return fail("the first generation did not start iterating:\n" + trial.Describe(first));
  }
  const auto t1 = Clock::now();
  if (!WaitUntil(
          "the target iteration", [&] { return min_steps() >= target || any_exited(); },
          std::chrono::seconds(60)) ||
      any_exited()) {
    return fail("the first generation did not reach iteration " + std::to_string(target) + ":\n" +
                trial.Describe(first));
  }
  const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count() /
                         static_cast<double>(target - 1);
  times->kill = std::uniform_real_distribution<double>(0.0, 2.0 * step_ms)(rng);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(times->kill));
  const auto killed = Clock::now();
  first[1]->proc->Kill(SIGKILL);
  first[1]->exit_code = first[1]->proc->Wait(std::chrono::seconds(10));
  if (!ReplacementTrial::WaitExit({first[0], first[2]}, std::chrono::seconds(30))) {
    return fail("the survivors did not leave within 30 s of rank 1's SIGKILL:\n" +
                trial.Describe(first));
  }
  times->survivors = std::chrono::duration<double, std::milli>(Clock::now() - killed).count();

  // The fresh generation: Pull, then two PushPulls.
  std::vector<GenerationWorker*> fresh;
  const auto fresh_start = Clock::now();
  for (uint32_t r = 0; r < 3; ++r) fresh.push_back(&trial.Start(r, salt(), 2, kFreshOpTimeout));
  // The limit only turns a hang into a failure (a round takes milliseconds).
  const bool finished = ReplacementTrial::WaitExit(fresh, std::chrono::seconds(60));
  times->fresh = std::chrono::duration<double, std::milli>(Clock::now() - fresh_start).count();
  std::string problems;
  if (!finished) problems += "stall: not every fresh process finished within 60 s\n";
  const std::string want_transport = "transport " + transport + (transport == "shm" ? " 2" : " 0");
  for (GenerationWorker* w : first) {
    const auto t = w->LinesStarting("transport");
    if (t.empty() || t.front() != want_transport) {
      problems += "first-generation rank " + std::to_string(w->rank) + ": '" +
                  (t.empty() ? "no transport line" : t.front()) + "', expected '" + want_transport +
                  "'\n";
    }
  }
  std::vector<std::vector<float>> want;  // by step
  for (uint64_t step = 0; step < 2; ++step) want.push_back(FreshSum(fresh, step, elements));
  for (GenerationWorker* w : fresh) {
    const std::string who =
        "fresh rank " + std::to_string(w->rank) + " (salt " + std::to_string(w->salt) + ")";
    if (w->Exited() && w->exit_code != 0) {
      problems += who + " exited with " + std::to_string(w->exit_code) + "\n";
    }
    const auto t = w->LinesStarting("transport");
    if (t.empty() || t.front() != want_transport) {
      problems += who + ": '" + (t.empty() ? "no transport line" : t.front()) + "', expected '" +
                  want_transport + "'\n";
    }
    // A replacement never needs a second resync: no refusal after its Pull.
    for (const std::string& l : w->Lines()) {
      if (l.rfind("resync ", 0) == 0 || l.rfind("error ", 0) == 0) {
        problems += who + " was refused: " + l + "\n";
      }
    }
    for (const std::string& l : w->LinesStarting("reply")) {
      const uint64_t step = std::stoull(l.substr(6));
      const std::string path = w->out + ".reply" + std::to_string(step);
      const std::string bytes = ReadFile(path);
      if (step >= want.size() || bytes.size() != elements * sizeof(float)) {
        problems += who + ": reply " + std::to_string(step) + " has " +
                    std::to_string(bytes.size()) + " bytes in " + path + "\n";
        continue;
      }
      std::vector<float> got(elements);
      std::memcpy(got.data(), bytes.data(), bytes.size());
      uint64_t wrong = 0;
      for (uint64_t i = 0; i < elements; ++i) {
        if (got[i] == want[step][i]) continue;
        if (++wrong <= 3) {
          problems += who + " round " + std::to_string(step) + " element " + std::to_string(i) +
                      " (chunk " + std::to_string(i / kReplacementChunkElements) + "): expected " +
                      std::to_string(want[step][i]) + ", got " + std::to_string(got[i]) + ": " +
                      ExplainWrong(got[i], want[step][i], i, step, fresh, first) + "\n";
        }
      }
      if (wrong > 0) {
        problems += who + " round " + std::to_string(step) + ": " + std::to_string(wrong) + " of " +
                    std::to_string(elements) + " values wrong\n";
      }
    }
    if (w->LinesStarting("reply").size() != 2) {
      problems +=
          who + " got " + std::to_string(w->LinesStarting("reply").size()) + " replies of 2\n";
    }
  }
  if (!problems.empty()) {
    return fail(problems + "first generation (rank 1 killed " + std::to_string(times->kill) +
                " ms into iteration " + std::to_string(target) + "):\n" + trial.Describe(first) +
                "fresh processes:\n" + trial.Describe(fresh));
  }
  if (const std::string e = admin.DeleteTenant(tenant); !e.empty()) {
    return "delete tenant " + tenant + ": " + e;
  }
  fs::remove_all(dir);
  return "";
}

void WorkerReplacementLoop(const std::string& transport) {
  const uint64_t trials = EnvOr("RACKHUB_KILL_TRIALS", 5);
  const uint64_t elements = EnvOr("RACKHUB_KILL_ELEMENTS", uint64_t{1} << 20);
  auto rng = Rng();
  // The straggler timeout stays out of the way: a fresh process that waits
  // for a push that never comes is the stall this loop looks for.
  std::vector<std::string> args{"--lanes", "2", "--in-memory", "--straggler-timeout-ms", "20000"};
  if (transport == "tcp") args.insert(args.end(), {"--shm", "off"});
  DaemonProcess hub(args);
  ASSERT_TRUE(hub.started());
  LoopAdmin admin(hub.admin_address());
  uint64_t failed = 0;
  double total_ms = 0, slowest_ms = 0;
  TrialTimes sum;
  uint64_t ran = 0;
  for (uint64_t trial = 0; trial < trials; ++trial) {
    const auto start = Clock::now();
    TrialTimes times;
    const std::string why = RunReplacementTrial(
        admin, hub.data_address(), "rep" + std::to_string(trial), transport, elements, rng, &times);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    total_ms += ms;
    slowest_ms = std::max(slowest_ms, ms);
    sum.kill += times.kill;
    sum.survivors += times.survivors;
    sum.fresh += times.fresh;
    ++ran;
    if (!why.empty()) {
      ADD_FAILURE() << transport << " trial " << trial << " (RACKHUB_KILL_SEED=" << Seed() << ", "
                    << elements << " elements): " << why;
      // Each failure may cost a stall's timeout: three tell enough.
      if (++failed == 3) break;
    }
  }
  const double n = static_cast<double>(ran);
  std::printf(
      "worker replacement loop (%s): %llu trials, %llu failed, %.0f ms per trial (slowest %.0f "
      "ms; on average %.0f ms kill delay, %.0f ms until the survivors left, %.0f ms of fresh "
      "processes)\n",
      transport.c_str(), static_cast<unsigned long long>(ran),
      static_cast<unsigned long long>(failed), total_ms / n, slowest_ms, sum.kill / n,
      sum.survivors / n, sum.fresh / n);
}

TEST(DurabilityLoop, WorkerReplacementLoopShm) { WorkerReplacementLoop("shm"); }

TEST(DurabilityLoop, WorkerReplacementLoopTcp) { WorkerReplacementLoop("tcp"); }

}  // namespace
}  // namespace rackhub::testing
