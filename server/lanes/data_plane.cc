#include "data_plane.h"

#include <algorithm>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "token.h"

namespace rackhub::server {

DataPlane::DataPlane(const Config& config, Registry* registry, LaneSet* lanes,
                     std::unique_ptr<net::Connector> hub_connector)
    : config_(config),
      registry_(registry),
      lane_threads_(lanes),
      hub_connector_(std::move(hub_connector)),
      drained_(lanes->size(), false) {
  blocking_ = std::make_unique<boost::asio::thread_pool>(2);
  realign_strand_ = std::make_unique<boost::asio::thread_pool>(1);
  for (uint32_t r = 0; r < config.topology.rack_count(); ++r) {
    link_counters_.push_back(std::make_unique<LinkCounters>());
  }
  if (!config.topology.secret_file.empty()) {
    // Validated at start-up (Hub::Start); left empty, every hub link is refused.
    if (Result<std::string> secret = ReadHubSecret(config.topology.secret_file); secret.ok()) {
      hub_secret_ = *std::move(secret);
    }
  }
  for (uint32_t i = 0; i < lanes->size(); ++i) {
    lanes_.push_back(
        std::make_unique<Lane>(i, lanes->size(), config, registry, this, &lanes->context(i)));
  }
  if (config.topology.multi_rack_exchange()) {
    RackRecovery::Hooks hooks;
    hooks.send = [this](uint32_t rack, std::string payload) {
      Lane* lane0 = lanes_[0].get();
      lane0->gate().Post([lane0, rack, payload = std::move(payload)] {
        lane0->SendRackControl(rack, net::Opcode::kRackVersions, payload);
      });
    };
    hooks.checkpoints = [this](uint32_t handle) {
      return WithCheckpointHooks([handle](const CheckpointHooks& h) {
        return h.sequences ? h.sequences(handle) : std::vector<uint64_t>{};
      });
    };
    hooks.recover = [this](uint32_t handle, const std::string& why) {
      Recover(handle, why, [handle, why](Lane& lane) { lane.FailPending(handle, why); });
    };
    hooks.handle_of = [this](const std::string& name) -> std::optional<uint32_t> {
      TenantInfo info;
      if (!registry_->GetTenant(name, &info).ok() || !SpansRacks(info)) return std::nullopt;
      return info.handle;
    };
    hooks.elastic = [this](uint32_t handle) {
      TenantInfo info;
      return registry_->GetTenantByHandle(handle, &info).ok() && info.elastic;
    };
    hooks.rank_slots = [this](uint32_t handle) -> uint32_t {
      TenantInfo info;
      return registry_->GetTenantByHandle(handle, &info).ok() ? info.rank_slots() : 0;
    };
    hooks.elastic_flags = [this](uint32_t handle) -> std::optional<RackElasticFlags> {
      TenantInfo info;
      if (!registry_->GetTenantByHandle(handle, &info).ok() || !info.elastic) return std::nullopt;
      return ElasticFlagsOf(info);
    };
    hooks.restarted = [this](uint32_t rack) {
      OnEveryLane([rack](Lane& lane) { lane.OfferCopies(rack); });
      // Its frames carry epoch 0 now and ours a newer one: a round puts every
      // hub of every tenant spanning racks in step again (it may not have
      // started one: without checkpoints, a link that broke half-open).
      const std::string why = "rack " + std::to_string(rack) + "'s hub restarted";
      for (const TenantInfo& t : registry_->ListTenants()) {
        if (SpansRacks(t)) {
          // A round of its own: one that ends now may have used the old
          // process's report.
          Recover(
              t.handle, why, [h = t.handle, why](Lane& lane) { lane.FailPending(h, why); },
              /*own_round=*/true);
        }
      }
    };
    rack_recovery_ = std::make_unique<RackRecovery>(config.topology.rack,
                                                    config.topology.rack_count(), std::move(hooks));
  }
  registry_->SetObserver(this);
}

DataPlane::~DataPlane() {
  registry_->SetObserver(nullptr);
  Shutdown(std::chrono::milliseconds(0));
  realign_strand_->join();  // its waits on the lanes give up once the hub stops
  blocking_->join();        // its tasks may still report to the lanes
}

void DataPlane::RunBlocking(std::function<void()> fn) {
  boost::asio::post(*blocking_, std::move(fn));
}

void DataPlane::OnLane(uint32_t i, std::function<void(Lane&)> fn) {
  Lane* lane = lanes_[i].get();
  lane_threads_->Post(i, [lane, fn = std::move(fn)] { fn(*lane); });
}

void DataPlane::RackLost(uint32_t rack) {
  const std::string why = "rack link: the hub of rack " + std::to_string(rack) +
                          " left the cluster (its etcd lease is gone)";
  OnEveryLane([this, rack, why](Lane& lane) {
    for (auto& [handle, t] : lane.table().tenants()) {
      if (!t.pending.empty() && t.info.consistency == Consistency::kSync) {
        AbortIteration(handle, why, false);
      }
    }
    // Bounded/async tenants: the rack's relayed members are gone at this
    // home and the relays to it fail (its links may be half-open for long).
    lane.RackLost(rack, why);
  });
}

bool DataPlane::SpansRacks(const TenantInfo& info) const {
  return rack_recovery_ && info.consistency == Consistency::kSync;
}

void DataPlane::OnEveryLane(std::function<void(Lane&)> fn) {
  for (auto& l : lanes_) {
    Lane* lane = l.get();
    lane->gate().Post([lane, fn] { fn(*lane); });
  }
}

std::vector<StallEntry> DataPlane::Stalls(uint32_t handle, std::chrono::nanoseconds min_wait,
                                          std::chrono::milliseconds timeout,
                                          std::vector<uint32_t>* unanswered) {
  // Shared with the posted work, which may run after this returned.
  struct Gather {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<StallEntry> entries;  // GUARDED_BY(mu)
    std::vector<bool> answered;       // GUARDED_BY(mu)
  };
  auto g = std::make_shared<Gather>();
  g->answered.assign(lane_count(), false);
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [g, handle, min_wait](Lane& lane) {
      std::vector<StallEntry> mine;
      ReportStalls(lane.table(), handle, min_wait, &mine);
      std::lock_guard lock(g->mu);
      for (auto& e : mine) g->entries.push_back(std::move(e));
      g->answered[lane.index()] = true;
      g->cv.notify_all();
    });
  }
  std::unique_lock lock(g->mu);
  g->cv.wait_for(lock, timeout, [&] {
    return std::all_of(g->answered.begin(), g->answered.end(), [](bool a) { return a; });
  });
  for (uint32_t i = 0; i < lane_count(); ++i) {
    if (!g->answered[i]) unanswered->push_back(i);
  }
  std::vector<StallEntry> out = std::move(g->entries);
  g->entries.clear();
  lock.unlock();
  std::stable_sort(out.begin(), out.end(),
                   [](const StallEntry& a, const StallEntry& b) { return a.waiting > b.waiting; });
  return out;
}

void DataPlane::StartHubLinks() {
  if (!config_.topology.multi_rack_exchange()) return;
  OnEveryLane([](Lane& lane) { lane.StartHubLinks(); });
}

bool DataPlane::BeginStop() {
  std::lock_guard lock(shutdown_mu_);
  if (shut_down_) return false;
  shut_down_ = true;
  return true;
}

void DataPlane::Shutdown(std::chrono::milliseconds grace) {
  if (!BeginStop()) return;
  stopping_ = true;
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [](Lane& lane) { lane.BeginShutdown(); });
  }
  // Wait for every lane's SHUTTING_DOWN frames to go out and its
  // connections to close (LaneDrained), at most `grace`.
  const auto deadline = std::chrono::steady_clock::now() + grace;
  {
    std::unique_lock lock(shutdown_mu_);
    drained_cv_.wait_until(lock, deadline, [this] {
      return std::all_of(drained_.begin(), drained_.end(), [](bool d) { return d; });
    });
  }
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [](Lane& lane) { lane.ForceClose(); });
  }
  WaitLanesIdle();
}

void DataPlane::Abort() {
  if (!BeginStop()) return;
  stopping_ = true;
  for (uint32_t i = 0; i < lane_count(); ++i) {
    OnLane(i, [](Lane& lane) { lane.Abort(); });
  }
  // Every lane ran its Abort and its connections are gone (closing sends
  // nothing, so this is quick; bounded all the same).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  {
    std::unique_lock lock(shutdown_mu_);
    if (!drained_cv_.wait_until(lock, deadline, [this] {
          return std::all_of(drained_.begin(), drained_.end(), [](bool d) { return d; });
        })) {
      spdlog::error("data: a lane still has connections 5 s after the crash");
    }
  }
  WaitLanesIdle();
}

void DataPlane::WaitLanesIdle() {
  // Nothing a lane scheduled may outlive it: wait for the counted work
  // (cancelled timers complete at once).
  const auto idle_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& lane : lanes_) {
    if (!lane->gate().WaitIdle(idle_deadline)) {
      spdlog::error("data: lane {} still has {} pending handlers at shutdown", lane->index(),
                    lane->gate().pending());
    }
  }
}

void DataPlane::LaneDrained(uint32_t lane) {
  std::lock_guard lock(shutdown_mu_);
  drained_[lane] = true;
  drained_cv_.notify_all();
}

void DataPlane::CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) {
  if (rack >= link_counters_.size()) return;
  link_counters_[rack]->bytes_out.fetch_add(out, std::memory_order_relaxed);
  link_counters_[rack]->bytes_in.fetch_add(in, std::memory_order_relaxed);
}

void DataPlane::CountRackChunkBytes(uint32_t rack, uint64_t out) {
  if (rack < link_counters_.size()) {
    link_counters_[rack]->chunk_bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
}

std::vector<DataPlane::RackLinkStats> DataPlane::RackLinks() const {
  std::vector<RackLinkStats> out;
  if (!config_.topology.multi_rack_exchange()) return out;
  for (uint32_t r = 0; r < link_counters_.size(); ++r) {
    if (r == config_.topology.rack) continue;
    out.push_back({r, link_counters_[r]->bytes_out.load(), link_counters_[r]->bytes_in.load(),
                   link_counters_[r]->chunk_bytes_out.load()});
  }
  return out;
}

uint64_t DataPlane::WorkerLost(uint32_t handle, uint32_t member, const std::string& why,
                               uint32_t from_lane) {
  const uint64_t before = seq_.load() + 1;
  Recover(handle, "worker lost: " + why, [handle, member, before, why, from_lane](Lane& lane) {
    if (lane.index() != from_lane) lane.OnWorkerLost(handle, member, before, why);
  });
  return before;
}

void DataPlane::AbortIteration(uint32_t handle, const std::string& why, bool straggler,
                               bool own_round) {
  // Lanes that find the same straggler at once abort once each; the one that
  // started the recovery counts it.
  if (!Recover(
          handle, why, [handle, why](Lane& lane) { lane.FailPending(handle, why); }, own_round)) {
    return;
  }
  if (!straggler) return;
  TenantInfo info;
  if (registry_->GetTenantByHandle(handle, &info).ok()) {
    info.counters->stragglers.fetch_add(1, std::memory_order_relaxed);
  }
}

void DataPlane::MembershipChanged(uint32_t handle, const std::string& why) {
  Recover(handle, "membership: " + why, [handle, why](Lane& lane) {
    lane.FailPending(handle, "membership: " + why +
                                 "; the iteration in progress was aborted (its partial sums "
                                 "were discarded): Pull and push again");
  });
}

void DataPlane::CommitMembership(uint32_t handle, TenantRuntime& tenant,
                                 const RackRecovery::Outcome* cluster) {
  TenantInfo info;
  if (!registry_->GetTenantByHandle(handle, &info).ok() || !info.elastic) return;
  if (SpansRacks(info)) {
    // The round's members (RealignAcrossRacks, or a recovery of the round
    // that does not realign); none when the tenant went meanwhile.
    if (cluster && !cluster->members.empty()) CommitClusterMembership(info, tenant, *cluster);
    return;
  }
  const std::shared_ptr<const Membership> cur = tenant.membership();
  auto next = std::make_shared<Membership>();
  next->member = tenant.Present(0, info.rank_slots(), lane_count());
  next->count = static_cast<uint32_t>(std::count(next->member.begin(), next->member.end(), 1));
  next->total = next->count;
  const bool started = cur->generation > 0 || next->count >= info.workers_per_rack;
  next->paused = !started || next->count < std::max<uint32_t>(info.min_workers, 1);
  if (next->member == cur->member && next->paused == cur->paused && cur->generation > 0) return;
  if (!started && next->member == cur->member) return;
  next->generation = started ? cur->generation + 1 : 0;
  PublishMembership(info, tenant, std::move(next),
                    !started ? " (paused: waiting for the start quorum of " +
                                   std::to_string(info.workers_per_rack) + ")"
                             : std::string());
}

void DataPlane::PublishMembership(const TenantInfo& info, TenantRuntime& tenant,
                                  std::shared_ptr<Membership> next, const std::string& note) {
  std::string ranks;
  for (uint32_t r = 0; r < next->member.size(); ++r) {
    if (next->member[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  }
  TenantCounters& c = *info.counters;
  c.members.store(next->total, std::memory_order_relaxed);
  c.paused.store(next->paused, std::memory_order_relaxed);
  c.membership_generation.store(next->generation, std::memory_order_relaxed);
  const std::string line = fmt::format(
      "data: elastic tenant '{}': membership generation {}: {} member(s){} [{}]{}", info.name,
      next->generation, next->total,
      next->racks.empty() ? std::string() : fmt::format(", {} on this rack", next->count), ranks,
      !note.empty()  ? note
      : next->paused ? " (paused: below min_workers " + std::to_string(info.min_workers) + ")"
                     : std::string());
  tenant.CommitMembership(std::move(next));
  spdlog::info("{}", line);  // after the commit: a push from now on sees it
}

// Phase 1 on every lane: `first`, then report the newest version of each key
// among the lane's chunks. Once every lane has (no lane accepts a PUSH of
// the tenant meanwhile: `recovering`), phase 2 (Realign) with the newest
// versions, or for a tenant spanning racks with the versions its hubs agree
// on in a recovery round (rack_recovery.h).
bool DataPlane::Recover(uint32_t handle, const std::string& why,
                        std::function<void(Lane&)> first, bool own_round) {
  struct Job {
    std::mutex mu;
    std::map<uint32_t, uint64_t> versions;  // GUARDED_BY(mu) during phase 1
    std::atomic<uint32_t> remaining;
  };
  const auto tenant = TenantRuntimeFor(handle);
  tenant->SetCause(why);
  const bool started = tenant->recovering.fetch_add(1) == 0;
  TenantInfo info;
  if (rack_recovery_ && registry_->GetTenantByHandle(handle, &info).ok() && SpansRacks(info)) {
    // Every rack's hub takes part: the versions are agreed first. The
    // pending updates fail at once; the versions are read on the strand,
    // after the realignment of any earlier round (a restore moves them
    // back: a report of the versions before it would undo the rollback).
    if (first) OnEveryLane(first);
    // Every round that ends from now on realigns the lanes after `first`.
    std::optional<uint64_t> failed_at;
    if (!own_round) failed_at = rack_recovery_->FinishedRounds(handle);
    ReportAcrossRacks(handle, tenant, why, info.name, failed_at);
    return started;
  }
  auto job = std::make_shared<Job>();
  job->remaining = lane_count();
  OnEveryLane([this, handle, first, job, tenant, why](Lane& lane) {
    if (first) first(lane);
    {
      const auto mine = lane.KeyVersions(handle);
      std::lock_guard lock(job->mu);
      for (const auto& [key, v] : mine) job->versions[key] = std::max(job->versions[key], v);
    }
    if (job->remaining.fetch_sub(1) != 1) return;
    // Every lane failed its part of the iteration; job->versions is final.
    if (config_.topology.rack_count() > 1) {
      // Flat (one hub serving every rack): as across racks, every chunk skips
      // past the newest version (a rack's stage may be one ahead of its
      // chunk's version: its sum was taken), so both modes give the same bits.
      for (auto& [key, v] : job->versions) ++v;
    }
    RackRecovery::Outcome outcome;
    outcome.agreed = std::move(job->versions);
    Realign(handle, tenant, std::move(outcome), true);
  });
  return started;
}

// Phase 2 on every lane: chunks below their key's version finish the aborted
// iteration as a skipped step (across racks: every chunk, and the homes send
// their parameters). Once every lane has, the recovery finishes.
void DataPlane::Realign(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                        RackRecovery::Outcome outcome, bool realign) {
  if (!realign) return FinishRecovery(handle, *tenant, &outcome);
  if (outcome.round == 0) {  // one hub: no round
    return AlignLanes(handle, std::move(tenant), std::move(outcome.agreed), 0);
  }
  boost::asio::post(*realign_strand_,
                    [this, handle, tenant = std::move(tenant), outcome = std::move(outcome)]() mutable {
                      RealignAcrossRacks(handle, std::move(tenant), std::move(outcome));
                    });
}

void DataPlane::AlignLanes(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                           std::map<uint32_t, uint64_t> versions, uint64_t round) {
  for (const auto& [key, v] : versions) {
    KeyInfo info;
    if (!registry_->GetKeyById(handle, key, &info).ok()) {
      // Not declared here yet (across racks: no worker of this rack declared
      // it): the floor waits for the key. Declared meanwhile: it is raised
      // below too.
      tenant->PendFloor(key, v, round);
      if (!registry_->GetKeyById(handle, key, &info).ok()) continue;
      tenant->TakeFloor(key);
    }
    RaiseFloor(*KeyRuntimeFor(handle, key), v);
  }
  auto remaining = std::make_shared<std::atomic<uint32_t>>(lane_count());
  auto shared = std::make_shared<const std::map<uint32_t, uint64_t>>(std::move(versions));
  OnEveryLane([this, handle, shared, remaining, tenant, round](Lane& l) {
    l.Align(handle, *shared, round);
    if (remaining->fetch_sub(1) != 1) return;
    FinishRecovery(handle, *tenant);
  });
}

void DataPlane::FinishRecovery(uint32_t handle, TenantRuntime& tenant,
                               const RackRecovery::Outcome* cluster) {
  // Every chunk is aligned and nothing is pending: a new membership of an
  // elastic tenant applies from each chunk's next update.
  CommitMembership(handle, tenant, cluster);
  if (tenant.recovering.fetch_sub(1) != 1) return;  // another recovery runs
  OnEveryLane([handle](Lane& l2) { l2.ReleaseParked(handle); });
}

void DataPlane::GenerationEnded(uint32_t handle, uint32_t member,
                                std::shared_ptr<const WorkerGeneration> g, const std::string& why,
                                bool close) {
  OnEveryLane([handle, member, g, why, close](Lane& lane) {
    lane.OnGenerationEnded(handle, member, *g, why, close);
  });
}

bool DataPlane::HasRuntimes(uint32_t handle, std::optional<uint32_t> key_id) const {
  std::shared_ptr<KeyRuntimes> keys;
  {
    decltype(runtimes_)::const_accessor k;
    if (runtimes_.find(k, handle)) keys = k->second;
  }
  if (key_id) {
    KeyRuntimes::const_accessor k;
    return keys && keys->find(k, *key_id);
  }
  if (keys) return true;
  decltype(tenant_runtimes_)::const_accessor t;
  return tenant_runtimes_.find(t, handle);
}

namespace {

// The value of `key` in `map` (a tbb::concurrent_hash_map of shared_ptrs),
// made with make_shared if absent; *made is set when this call made it. The
// entry's lock is held only while it is read or made.
template <typename Map>
typename Map::mapped_type FindOrMake(Map& map, const typename Map::key_type& key, bool* made) {
  typename Map::accessor a;
  if (map.insert(a, key)) {
    a->second = std::make_shared<typename Map::mapped_type::element_type>();
    *made = true;
  }
  return a->second;
}

}  // namespace

std::shared_ptr<TenantRuntime> DataPlane::TenantRuntimeFor(uint32_t handle) {
  bool made = false;
  std::shared_ptr<TenantRuntime> rt = FindOrMake(tenant_runtimes_, handle, &made);
  if (made) ForgetIfDeleted(handle, std::nullopt);
  return rt;
}

std::shared_ptr<KeyRuntime> DataPlane::KeyRuntimeFor(uint32_t handle, uint32_t key_id) {
  bool made_map = false, made = false;  // the tenant's map, the key's runtime
  const std::shared_ptr<KeyRuntimes> keys = FindOrMake(runtimes_, handle, &made_map);
  std::shared_ptr<KeyRuntime> rt = FindOrMake(*keys, key_id, &made);
  if (made_map || made) ForgetIfDeleted(handle, key_id);
  KeyInfo info;
  if (made && registry_->GetKeyById(handle, key_id, &info).ok()) {
    // A round's agreed version from before the key was declared here (by a
    // peer's KEY_BIND, a worker, the admin or etcd): the key's chunks this
    // hub is home to go there and are sent to the other racks, whose copies
    // wait for them (posted: every lane, as a round's realignment does).
    if (const uint64_t v = TenantRuntimeFor(handle)->TakeFloor(key_id)) {
      RaiseFloor(*rt, v);
      auto one = std::make_shared<const std::map<uint32_t, uint64_t>>(
          std::map<uint32_t, uint64_t>{{key_id, v}});
      OnEveryLane([handle, one](Lane& lane) { lane.Align(handle, *one); });
    }
  }
  return rt;
}

void DataPlane::RaiseFloor(KeyRuntime& rt, uint64_t v) {
  uint64_t floor = rt.floor.load();
  while (floor < v && !rt.floor.compare_exchange_weak(floor, v)) {
  }
}

void DataPlane::OnKeyCreated(uint32_t handle, uint32_t key_id) {
  // (Under the registry's lock: only posted. KeyRuntimeFor reads it.)
  if (!rack_recovery_ || lanes_.empty()) return;
  OnLane(0, [this, handle, key_id](Lane&) { KeyRuntimeFor(handle, key_id); });
}

void DataPlane::KeyAdopted(uint32_t handle, uint32_t key_id) {
  // Makes the key's runtime if no lane did yet: that takes a round's agreed
  // version of it (KeyRuntimeFor); whoever makes it does.
  KeyRuntimeFor(handle, key_id);
}

// Runtimes are made on first use, on lanes, while deletions erase them from
// the admin thread (OnTenantDeleted, OnKeyDeleted, under the registry's
// lock). One made for a tenant or key deleted just before (a worker lost, a
// WELCOME or DECLARE racing with the deletion) would never be erased, so
// each new one is checked against the registry after it was inserted: a
// deletion before the check is seen here, one after it erases it itself.
// Found by fuzz/hub/hub_lane_fuzz (LeakSanitizer).
void DataPlane::ForgetIfDeleted(uint32_t handle, std::optional<uint32_t> key_id) {
  TenantInfo tenant;
  if (!registry_->GetTenantByHandle(handle, &tenant).ok()) {
    runtimes_.erase(handle);
    tenant_runtimes_.erase(handle);
    return;
  }
  KeyInfo key;
  if (key_id && !registry_->GetKeyById(handle, *key_id, &key).ok()) {
    decltype(runtimes_)::const_accessor t;
    if (runtimes_.find(t, handle)) t->second->erase(*key_id);
  }
}

void DataPlane::ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) {
  const auto rt = KeyRuntimeFor(handle, key_id);
  if (rt->initialized_chunks.fetch_add(1) + 1 == chunk_count) {
    registry_->MarkKeyReady(handle, key_id);
  }
}

void DataPlane::OnTenantDeleted(uint32_t handle) {
  OnEveryLane([handle](Lane& lane) { lane.OnTenantDeleted(handle); });
  if (rack_recovery_) {
    // Not under the registry's lock: ending the round finishes recoveries.
    lanes_[0]->gate().Post([this, handle] { rack_recovery_->Forget(handle); });
  }
  runtimes_.erase(handle);
  tenant_runtimes_.erase(handle);
}

void DataPlane::OnKeyDeleted(uint32_t handle, uint32_t key_id) {
  OnEveryLane([handle, key_id](Lane& lane) { lane.OnKeyDeleted(handle, key_id); });
  decltype(runtimes_)::const_accessor t;
  if (runtimes_.find(t, handle)) t->second->erase(key_id);
}

void DataPlane::OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                                   const aggregation::OptimizerConfig& optimizer,
                                   uint64_t from_update) {
  OnEveryLane([handle, key_id, optimizer, from_update](Lane& lane) {
    lane.OnOptimizerChanged(handle, key_id, optimizer, from_update);
  });
}

}  // namespace rackhub::server
