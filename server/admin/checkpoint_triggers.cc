// Checkpointer, when checkpoints are taken (checkpointer.h): the periodic
// triggers (checkpoint.every_iterations / every_seconds) on the trigger
// thread, and the checkpoint of every single-rack tenant at shutdown.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "checkpointer.h"
#include "cluster_checkpoints.h"
#include "data_plane.h"

namespace rackhub::server {

namespace {

constexpr auto kTriggerPoll = std::chrono::milliseconds(100);

}  // namespace

void Checkpointer::CheckpointAll() {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  for (const TenantInfo& t : registry_->ListTenants()) {
    if (t.consistency != Consistency::kSync) continue;  // not checkpointed (CheckSync)
    if (Cluster(t)) {
      // Its other hubs go on training: a cut of the cluster now would wait
      // for an iteration this hub's workers (told SHUTTING_DOWN) never push.
      // The periodic checkpoints are its restart points.
      spdlog::info(
          "checkpoint: tenant '{}' spans racks: no checkpoint at shutdown (it resumes "
          "from the newest cluster checkpoint)",
          t.name);
      continue;
    }
    const uint64_t now = TenantIteration(t);
    const auto it = last_iterations_.find(t.handle);
    if (now == (it == last_iterations_.end() ? 0 : it->second)) {
      continue;  // nothing new since the last checkpoint (or the restore)
    }
    // The data plane has failed every pending update: the iteration in
    // progress ends as a skipped step, as after a lost worker.
    const auto versions = KeyVersions(t.handle);
    OnEveryLane([&](Lane& lane) { lane.Align(t.handle, versions); });
    Result<CheckpointInfo> r = CreateLocked(t, std::chrono::seconds(5));
    if (!r.ok()) spdlog::error("checkpoint: tenant '{}': {}", t.name, r.status().message());
  }
}

uint64_t Checkpointer::TenantIteration(const TenantInfo& tenant) {
  std::vector<KeyInfo> keys;
  registry_->ListKeys(tenant.name, &keys);
  uint64_t v = 0;
  for (const KeyInfo& k : keys) {
    v = std::max(v, data_->KeyRuntimeFor(tenant.handle, k.id)->version.load());
  }
  return v;
}

void Checkpointer::Start() {
  if (!enabled()) return;
  if (config_.checkpoint.every_iterations == 0 && config_.checkpoint.every_seconds == 0) return;
  trigger_ = std::thread([this] { TriggerLoop(); });
}

void Checkpointer::Stop() {
  {
    std::lock_guard lock(trigger_mu_);
    stopping_ = true;
  }
  trigger_cv_.notify_all();
  if (cluster_) cluster_->Cancel();  // a cluster checkpoint the trigger coordinates ends now
  if (trigger_.joinable()) trigger_.join();
  if (cluster_) cluster_->Stop();  // its thread is joined: no copy of another hub's runs
  std::lock_guard lock(job_mu_);
  cancelled_ = false;  // CheckpointAll (shutdown) comes next
}

void Checkpointer::CancelCopy() {
  std::lock_guard lock(job_mu_);
  cancelled_ = true;
  if (job_) job_->Fail("the hub is shutting down");
}

void Checkpointer::TriggerLoop() {
  const auto every = std::chrono::seconds(config_.checkpoint.every_seconds);
  std::map<uint32_t, std::chrono::steady_clock::time_point> last_time;
  std::unique_lock lock(trigger_mu_);
  while (!trigger_cv_.wait_for(lock, kTriggerPoll, [this] { return stopping_; })) {
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    for (const TenantInfo& t : registry_->ListTenants()) {
      // A cluster checkpoint is coordinated by rack 0's hub (one at a time).
      if (Cluster(t) && config_.topology.rack != 0) continue;
      const uint64_t done = TenantIteration(t);
      uint64_t last;
      {
        std::unique_lock l(mu_, std::try_to_lock);
        if (!l.owns_lock()) continue;  // a checkpoint or restore runs: the next tick
        const auto [it, first] = last_iterations_.try_emplace(t.handle, done);
        // A tenant spanning racks first seen here resumed (or started) at
        // `done`: nothing new since.
        if (first && Cluster(t)) continue;
        uint64_t& at = it->second;
        if (done < at) at = done;  // rolled back (a cluster checkpoint's restore): count from there
        last = at;
      }
      if (done == last) continue;  // idle since the last checkpoint
      auto [since, fresh] = last_time.try_emplace(t.handle, now);
      const bool by_iterations = config_.checkpoint.every_iterations > 0 &&
                                 done - last >= config_.checkpoint.every_iterations;
      const bool by_time =
          config_.checkpoint.every_seconds > 0 && !fresh && now - since->second >= every;
      if (!by_iterations && !by_time) continue;
      last_time[t.handle] = now;
      Result<CheckpointInfo> r = Create(t.name);
      if (!r.ok() && r.status().code() != StatusCode::kNotFound) {
        spdlog::warn("checkpoint: periodic checkpoint of tenant '{}' failed: {}", t.name,
                     r.status().message());
      }
    }
    lock.lock();
  }
}

}  // namespace rackhub::server
