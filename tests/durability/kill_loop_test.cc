// The kill loops of docs/durability.md, with real processes:
//
// HubKill9Loop: two trainer threads train two keys (Adam, momentum) on a real
// rackhubd that checkpoints on every trigger poll; the hub is killed with
// SIGKILL at random points (half of them while a checkpoint file is being
// written) and restarted. After every kill: every checkpoint file on disk
// verifies, the newest one never goes back, and its parameters and optimizer
// state are bit-identical to an uninterrupted reference hub's at the same
// iterations; after the restart every PushPull result and every Pull is
// bit-identical to the reference, and training moves on.
//
// WorkerKill9Loop: three worker processes (rackhub-durability-worker) train
// over the client's default transport, shared memory with the local hub
// (checked: every generation reports "transport shm"),
// a 4 MiB key; one rank at random is killed with SIGKILL at a random point
// (mostly while it pushes) and a replacement process starts after a random
// delay; the survivors and the replacement continue with no admin action,
// and every rank of every generation saw the same parameters at every
// iteration (every chunk of the key at one version).
//
// WorkerKill9LoopTable: the same with a row-sparse table (rackhub-durability-
// worker --table-rows): every rank pushes rows of the table each step and
// asks for all of them back; every rank of every generation saw the same
// table at every iteration.
//
// WorkerReplacementLoop{Shm,Tcp} (issue 26): three processes of the C ABI
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
// Trials: RACKHUB_KILL_TRIALS (default 20, the replacement loops 5 per
// transport; tests/durability/kill_loops.sh runs 100). RACKHUB_KILL_ELEMENTS
// sets the dense keys' size (default 1M elements; kill_loops.sh: 4M).
// RACKHUB_KILL_SEED fixes the random points (default: time; the seed is
// printed).
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_file.h"
#include "kill_points.h"
#include "process.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"
#include "rackhub/client/client.h"
#include "salted_gradient.h"
#include "training.h"
#include "worker_set.h"

namespace rackhub::testing {
namespace {

namespace fs = std::filesystem;
namespace pb = rackhub::admin::v1;
using Clock = std::chrono::steady_clock;
using server::CheckpointImage;
using server::ReadCheckpoint;

constexpr char kToken[] = "durability-loop-token-0123456789abcdef";

bool WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// The admin API of one daemon (the channel outlives restarts).
struct Admin {
  explicit Admin(const std::string& address)
      : channel(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        tenants(pb::TenantService::NewStub(channel)),
        checkpoints(pb::CheckpointService::NewStub(channel)) {}

  pb::Tenant CreateTenant(const std::string& name, uint32_t workers, uint32_t chunk_bytes,
                          int64_t bounded = -1) {
    grpc::ClientContext ctx;
    pb::CreateTenantRequest req;
    if (bounded >= 0) {
      req.set_consistency(pb::BOUNDED);
      req.set_staleness(static_cast<uint32_t>(bounded));
    }
    req.set_name(name);
    req.set_workers_per_rack(workers);
    req.set_chunk_bytes(chunk_bytes);
    req.set_token(kToken);
    pb::CreateTenantResponse resp;
    const grpc::Status s = tenants->CreateTenant(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.tenant();
  }
  // "" or the error.
  std::string DeleteTenant(const std::string& name) {
    grpc::ClientContext ctx;
    pb::DeleteTenantRequest req;
    req.set_name(name);
    pb::DeleteTenantResponse resp;
    const grpc::Status s = tenants->DeleteTenant(&ctx, req, &resp);
    return s.ok() ? "" : s.error_message();
  }

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::TenantService::Stub> tenants;
  std::unique_ptr<pb::CheckpointService::Stub> checkpoints;
};

// One key's training state as a checkpoint holds it.
struct KeyState {
  std::vector<float> params;
  std::vector<std::vector<float>> state;  // optimizer slots
};

// Key name -> state, from a checkpoint image (chunks concatenated in order).
std::map<std::string, std::pair<uint64_t, KeyState>> KeysOf(const CheckpointImage& image) {
  std::map<uint32_t, std::string> names;
  std::map<std::string, std::pair<uint64_t, KeyState>> out;
  for (const auto& k : image.keys) {
    names[k.id] = k.name;
    out[k.name].first = k.version;
    out[k.name].second.state.resize(k.state_slots);
  }
  for (const auto& c : image.chunks) {
    KeyState& s = out[names[c.key_id]].second;
    s.params.insert(s.params.end(), c.params.begin(), c.params.end());
    for (size_t i = 0; i < c.state.size(); ++i) {
      s.state[i].insert(s.state[i].end(), c.state[i].begin(), c.state[i].end());
    }
  }
  return out;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct KeySpec {
  std::string name;
  uint64_t elements;
  client::OptimizerSpec optimizer;
  uint32_t seed;
};

std::vector<KeySpec> HubLoopKeys() {
  client::OptimizerSpec adam;
  adam.type = "adam";
  adam.learning_rate = 0.01;
  client::OptimizerSpec momentum;
  momentum.type = "momentum";
  momentum.learning_rate = 0.05;
  momentum.momentum = 0.9;
  return {{"w", 3000, adam, 11}, {"m", 700, momentum, 12}};
}

// A worker (one rank, its own Client) of the hub-kill loop.
struct Trainer {
  std::unique_ptr<client::Client> client;
  std::vector<TrainingKey> keys;

  static std::unique_ptr<Trainer> Start(const std::string& hub, const std::string& tenant,
                                        uint32_t rank, const std::vector<KeySpec>& specs) {
    auto t = std::make_unique<Trainer>();
    client::Options o;
    o.hub = hub;
    o.tenant = tenant;
    o.token = kToken;
    o.rank = rank;
    o.op_timeout = std::chrono::seconds(30);
    client::Error e;
    t->client = client::Client::Connect(o, &e);
    if (!t->client) {
      ADD_FAILURE() << "connect rank " << rank << ": " << e.message;
      return nullptr;
    }
    for (const KeySpec& s : specs) {
      client::KeyDecl d;
      d.name = s.name;
      d.elements = s.elements;
      d.optimizer = s.optimizer;
      TrainingKey k;
      k.seed = s.seed;
      if (e = t->client->DeclareKey(d, &k.id); !e.ok()) {
        ADD_FAILURE() << "declare " << s.name << ": " << e.message;
        return nullptr;
      }
      k.params.assign(s.elements, 0.0f);
      k.grad.resize(s.elements);
      k.out.resize(s.elements);
      t->keys.push_back(std::move(k));
    }
    return t;
  }

  // One iteration of every key (pipelined: no order between keys to agree
  // on). Returns the errors of the keys that failed (index, error).
  std::vector<std::pair<size_t, client::Error>> Step(uint32_t rank) {
    std::vector<client::Ticket> tickets;
    for (TrainingKey& k : keys) {
      Gradient(k.seed, k.iteration, rank, k.params, k.grad);
      tickets.push_back(client->PushPull(k.id, k.grad, k.out));
    }
    std::vector<std::pair<size_t, client::Error>> failed;
    for (size_t i = 0; i < keys.size(); ++i) {
      const client::Error e = client->Wait(tickets[i]);
      if (e.ok()) {
        keys[i].params.swap(keys[i].out);
        ++keys[i].iteration;
      } else {
        failed.emplace_back(i, e);
      }
    }
    return failed;
  }
};

// The uninterrupted reference: its own rackhubd (state on tmpfs), two ranks
// stepped in lockstep by whoever asks for a version not computed yet, and a
// checkpoint after every step from which params and optimizer state are read.
class Reference {
 public:
  explicit Reference(const std::vector<KeySpec>& specs) : specs_(specs) {
    const std::string shm = fs::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    state_dir_ = shm + "/rackhub-reference-" + std::to_string(::getpid());
    fs::remove_all(state_dir_);
    daemon_ = std::make_unique<DaemonProcess>(std::vector<std::string>{
        "--lanes", "2", "--state-dir", state_dir_, "--checkpoint-every-iterations", "0",
        "--checkpoint-every-seconds", "0", "--checkpoint-keep", "1"});
    if (!daemon_->started()) return;
    admin_ = std::make_unique<Admin>(daemon_->admin_address());
    admin_->CreateTenant("ref", 2, 4096);
    for (uint32_t r = 0; r < 2; ++r) {
      ranks_.push_back(Trainer::Start(daemon_->data_address(), "ref", r, specs));
      if (!ranks_.back()) return;
    }
    Checkpoint();  // version 0
  }
  ~Reference() {
    ranks_.clear();
    daemon_.reset();
    fs::remove_all(state_dir_);
  }
  bool ok() const { return ok_ && states_.size() == 1 + steps_; }

  // The state of key `name` after `version` updates (computed on demand).
  KeyState At(const std::string& name, uint64_t version) {
    std::lock_guard lock(mu_);
    while (ok_ && states_.size() <= version) StepLocked();
    if (!ok_ || version >= states_.size()) return {};
    return states_[version].at(name);
  }

 private:
  void StepLocked() {
    std::vector<std::thread> threads;
    std::vector<std::vector<std::pair<size_t, client::Error>>> failed(ranks_.size());
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      threads.emplace_back([&, r] { failed[r] = ranks_[r]->Step(r); });
    }
    for (auto& t : threads) t.join();
    for (const auto& f : failed) {
      if (!f.empty()) {
        ADD_FAILURE() << "reference step: " << f.front().second.message;
        ok_ = false;
        return;
      }
    }
    ++steps_;
    Checkpoint();
  }
  void Checkpoint() {
    grpc::ClientContext ctx;
    pb::CreateCheckpointRequest req;
    req.set_tenant("ref");
    pb::Checkpoint resp;
    const grpc::Status s = admin_->checkpoints->CreateCheckpoint(&ctx, req, &resp);
    if (!s.ok()) {
      ADD_FAILURE() << "reference checkpoint: " << s.error_message();
      ok_ = false;
      return;
    }
    Result<CheckpointImage> image = ReadCheckpoint(resp.path());
    if (!image.ok()) {
      ADD_FAILURE() << image.status().message();
      ok_ = false;
      return;
    }
    std::map<std::string, KeyState> keys;
    for (auto& [name, vs] : KeysOf(*image)) {
      if (vs.first != steps_) {
        ADD_FAILURE() << "reference key " << name << " at " << vs.first << ", expected " << steps_;
        ok_ = false;
      }
      keys[name] = std::move(vs.second);
    }
    states_.push_back(std::move(keys));
  }

  const std::vector<KeySpec> specs_;
  std::string state_dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Admin> admin_;
  std::vector<std::unique_ptr<Trainer>> ranks_;
  std::mutex mu_;
  bool ok_ = true;
  uint64_t steps_ = 0;
  std::vector<std::map<std::string, KeyState>> states_;  // by version
};

// Failures seen on trainer threads, reported on the main thread.
class Failures {
 public:
  void Add(const std::string& what) {
    std::lock_guard lock(mu_);
    if (list_.size() < 20) list_.push_back(what);
    ++count_;
  }
  size_t count() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  std::string Text() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& s : list_) out += s + "\n";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> list_;
  size_t count_ = 0;
};

TEST(DurabilityLoop, HubKill9Loop) {
  const uint64_t trials = EnvOr("RACKHUB_KILL_TRIALS", 20);
  auto rng = Rng();
  const std::vector<KeySpec> specs = HubLoopKeys();
  Reference ref(specs);
  ASSERT_TRUE(ref.ok());

  DaemonProcess hub({"--lanes", "2", "--checkpoint-every-iterations", "1",
                     "--checkpoint-every-seconds", "0", "--checkpoint-keep", "2",
                     "--straggler-timeout-ms", "20000"});
  ASSERT_TRUE(hub.started());
  Admin admin(hub.admin_address());
  const pb::Tenant tenant = admin.CreateTenant("loop", 2, 4096);
  const std::string ckpt_dir = hub.state_dir() + "/checkpoints/" +
                               std::to_string(tenant.handle()) + "-loop";

  Failures failures;
  // Both ranks stop after the same iteration (a rank that stopped alone
  // would leave the other's push waiting for it).
  std::atomic<uint64_t> stop_at{UINT64_MAX};
  std::atomic<uint64_t> steps[2] = {0, 0};
  std::atomic<uint64_t> key0_iteration{0};  // rank 0's iteration of the first key
  std::atomic<uint64_t> resyncs{0};
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = Trainer::Start(hub.data_address(), "loop", rank, specs);
      if (!t) {
        failures.Add("rank " + std::to_string(rank) + " could not start");
        return;
      }
      while (t->keys[0].iteration < stop_at.load()) {
        for (const auto& [i, e] : t->Step(rank)) {
          TrainingKey& k = t->keys[i];
          if (!NeedsResync(e)) {
            failures.Add("rank " + std::to_string(rank) + " key " + specs[i].name + ": " +
                         e.message);
            return;
          }
          client::Error pe;
          if (!PullKey(*t->client, k, &pe)) {
            failures.Add("rank " + std::to_string(rank) + " pull: " + pe.message);
            return;
          }
          ++resyncs;
          if (!BitEqual(k.params, ref.At(specs[i].name, k.iteration).params)) {
            failures.Add("rank " + std::to_string(rank) + " key " + specs[i].name +
                         ": pulled params at iteration " + std::to_string(k.iteration) +
                         " differ from the reference");
          }
        }
        for (size_t i = 0; i < t->keys.size(); ++i) {
          // Completed keys: compare with the reference (resynced ones were).
          const TrainingKey& k = t->keys[i];
          if (!BitEqual(k.params, ref.At(specs[i].name, k.iteration).params)) {
            failures.Add("rank " + std::to_string(rank) + " key " + specs[i].name +
                         ": params at iteration " + std::to_string(k.iteration) +
                         " differ from the reference");
          }
        }
        if (rank == 0) key0_iteration = t->keys[0].iteration;
        ++steps[rank];
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      }
    });
  }

  uint64_t newest_seen = 0;
  uint64_t during_write = 0;
  for (uint64_t trial = 0; trial < trials && failures.count() == 0; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const uint64_t before = std::min(steps[0].load(), steps[1].load());
    ASSERT_TRUE(WaitUntil([&] { return std::min(steps[0].load(), steps[1].load()) >= before + 2; },
                          std::chrono::seconds(30)))
        << "training does not move on after the restart\n"
        << failures.Text() << hub.Log();
    if (trial % 2 == 1) {
      // Kill while a checkpoint file is being written, if one shows up.
      const bool seen = WaitUntil(
          [&] {
            std::error_code ec;
            for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
              if (e.path().extension() == ".tmp") return true;
            }
            return false;
          },
          std::chrono::milliseconds(400));
      during_write += seen;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 250));
    }
    ASSERT_EQ(hub.Kill(), 128 + SIGKILL);

    // Every complete checkpoint verifies; the newest never goes back and
    // equals the reference, parameters and optimizer state, bit for bit.
    std::vector<uint64_t> sequences;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
      if (e.path().extension() != ".rhc") continue;
      Result<CheckpointImage> image = ReadCheckpoint(e.path().string());
      ASSERT_TRUE(image.ok()) << image.status().message();
      sequences.push_back(image->sequence);
    }
    if (!sequences.empty()) {
      const uint64_t newest = *std::max_element(sequences.begin(), sequences.end());
      EXPECT_GE(newest, newest_seen) << "the newest checkpoint went back";
      newest_seen = newest;
      Result<CheckpointImage> image =
          ReadCheckpoint(ckpt_dir + "/" + server::CheckpointFileName(newest));
      ASSERT_TRUE(image.ok());
      for (const auto& [name, vs] : KeysOf(*image)) {
        const KeyState want = ref.At(name, vs.first);
        EXPECT_TRUE(BitEqual(vs.second.params, want.params))
            << name << " params at " << vs.first << " differ from the reference";
        ASSERT_EQ(vs.second.state.size(), want.state.size()) << name;
        for (size_t s = 0; s < want.state.size(); ++s) {
          EXPECT_TRUE(BitEqual(vs.second.state[s], want.state[s]))
              << name << " optimizer state " << s << " at " << vs.first
              << " differs from the reference";
        }
      }
    }
    ASSERT_TRUE(hub.Restart()) << hub.Log();
  }
  // Training goes on after the last restart too.
  const uint64_t last = std::min(steps[0].load(), steps[1].load());
  EXPECT_TRUE(WaitUntil([&] { return std::min(steps[0].load(), steps[1].load()) >= last + 2; },
                        std::chrono::seconds(30)));
  stop_at = key0_iteration.load() + 10;
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.count(), 0u) << failures.Text();
  EXPECT_GT(newest_seen, 0u) << "no checkpoint was ever written";
  EXPECT_GT(resyncs.load(), 0u) << "no kill ever rolled a key back";
  std::printf("hub kill loop: %llu trials (%llu during a checkpoint write), %llu resyncs, "
              "newest checkpoint #%llu, %llu steps\n",
              static_cast<unsigned long long>(trials),
              static_cast<unsigned long long>(during_write),
              static_cast<unsigned long long>(resyncs.load()),
              static_cast<unsigned long long>(newest_seen),
              static_cast<unsigned long long>(steps[0].load()));
}

// --- worker kill loop -------------------------------------------------------

// `bound` >= 0: a bounded:S tenant (every reply's versions keep the bound;
// parameters are not compared between workers).
void WorkerKill9Loop(const std::vector<std::string>& what, int64_t bound = -1,
                     uint64_t default_trials = 20) {
  const uint64_t trials = EnvOr("RACKHUB_KILL_TRIALS", default_trials);
  auto rng = Rng();
  DaemonProcess hub({"--lanes", "2", "--straggler-timeout-ms", "15000",
                     "--checkpoint-every-iterations", "0", "--checkpoint-every-seconds", "0"});
  ASSERT_TRUE(hub.started());
  Admin admin(hub.admin_address());
  admin.CreateTenant("wk", 3, 0, bound);
  std::vector<std::string> args = what;
  if (bound >= 0) {
    args.push_back("--bounded");
    args.push_back(std::to_string(bound));
  }
  WorkerSet workers({MakeTempDir(), "wk", kToken, {hub.data_address()}, args, bound});
  for (uint32_t r = 0; r < 3; ++r) workers.Start(r);

  for (uint64_t trial = 0; trial < trials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const uint64_t before = workers.MaxIteration();
    ASSERT_TRUE(WaitUntil([&] { return workers.MinCurrent() >= before + 1; },
                          std::chrono::seconds(60)))
        << workers.Problems() << hub.Log();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 60));
    const uint32_t victim = rng() % 3;
    workers.Kill(victim);
    const uint64_t at_kill = workers.MaxIteration();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    workers.Start(victim);
    ASSERT_TRUE(WaitUntil([&] { return workers.MinCurrent() >= at_kill + 2; },
                          std::chrono::seconds(60)))
        << "the survivors and the replacement did not resume\n"
        << workers.Problems() << hub.Log();
    const std::string problems = workers.Problems();
    ASSERT_TRUE(problems.empty()) << problems;
  }
  EXPECT_EQ(workers.Transports(), std::set<std::string>{"shm"})
      << "workers on the hub's host should all have used shared memory";
  std::printf("worker kill loop (%s): %llu trials, %zu resyncs, iteration %llu\n",
              what.front().c_str(), static_cast<unsigned long long>(trials), workers.Resyncs(),
              static_cast<unsigned long long>(workers.MaxIteration()));
}

TEST(DurabilityLoop, WorkerKill9Loop) {
  WorkerKill9Loop(
      {"--elements", std::to_string(EnvOr("RACKHUB_KILL_ELEMENTS", uint64_t{1} << 20))});
}

// A top-k key (ratio 0.01, error feedback): the hub's rank-order sums keep
// every worker on the same parameters through kills and replacements.
TEST(DurabilityLoop, WorkerKill9LoopTopK) {
  WorkerKill9Loop({"--elements", std::to_string(EnvOr("RACKHUB_KILL_ELEMENTS", uint64_t{1} << 20)),
                   "--topk", "0.01"},
                  -1, 10);
}

// A bounded:2 tenant: no hang, no error, every reply within the bound, and
// the survivors and the replacement keep training.
TEST(DurabilityLoop, WorkerKill9LoopBounded) {
  WorkerKill9Loop({"--elements", std::to_string(EnvOr("RACKHUB_KILL_ELEMENTS", uint64_t{1} << 20))},
                  2, 10);
}

TEST(DurabilityLoop, WorkerKill9LoopTable) {
  WorkerKill9Loop({"--table-rows", std::to_string(EnvOr("RACKHUB_KILL_ROWS", uint64_t{20000}))});
}

// --- worker replacement loop (issue 26) -------------------------------------

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
    std::vector<std::string> args = {
        BinPath("rackhub-generation-worker"), "--hub", hub_, "--tenant", tenant_, "--token",
        kToken, "--rank", std::to_string(rank), "--salt", std::to_string(salt), "--elements",
        std::to_string(elements_), "--rounds", std::to_string(rounds), "--op-timeout-ms",
        std::to_string(op_timeout.count()), "--out", w->out};
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
    return WaitUntil(
        [&] {
          bool all = true;
          for (GenerationWorker* w : set) all = w->Exited() && all;
          return all;
        },
        limit);
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
std::string RunReplacementTrial(Admin& admin, const std::string& hub, const std::string& tenant,
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
  if (!WaitUntil([&] { return all_ready() || any_exited(); }, std::chrono::seconds(60)) ||
      any_exited()) {
    return fail("the first generation did not connect:\n" + trial.Describe(first));
  }
  if (!std::ofstream(go).good()) return fail("cannot create " + go);
  if (!WaitUntil([&] { return min_steps() >= 1 || any_exited(); }, std::chrono::seconds(60)) ||
      any_exited()) {
    return fail("the first generation did not start iterating:\n" + trial.Describe(first));
  }
  const auto t1 = Clock::now();
  if (!WaitUntil([&] { return min_steps() >= target || any_exited(); }, std::chrono::seconds(60)) ||
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
  Admin admin(hub.admin_address());
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
