#include "checkpointer.h"

#include <algorithm>
#include <filesystem>
#include <future>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "cluster_checkpoints.h"
#include "data_plane.h"

namespace rackhub::server {

namespace fs = std::filesystem;

namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string KeyVersionsText(const std::vector<std::pair<std::string, uint64_t>>& kv) {
  std::string out;
  for (const auto& [name, v] : kv) {
    if (!out.empty()) out += ", ";
    out += name + "@" + std::to_string(v);
  }
  return out.empty() ? "no keys" : out;
}

}  // namespace

// (The lane threads outlive every
// caller: Stop takes the cluster checkpoints' hooks back before the data
// plane stops.)
void Checkpointer::OnEveryLane(const std::function<void(Lane&)>& fn) {
  std::vector<std::future<void>> done;
  for (uint32_t i = 0; i < data_->lane_count(); ++i) {
    auto p = std::make_shared<std::promise<void>>();
    done.push_back(p->get_future());
    data_->OnLane(i, [fn, p](Lane& lane) {
      fn(lane);
      p->set_value();
    });
  }
  for (auto& f : done) f.wait();
}

Checkpointer::Checkpointer(const Config& config, Registry* registry, DataPlane* data)
    : config_(config), registry_(registry), data_(data) {
  if (config.state.in_memory) {
    why_disabled_ = "checkpoints need a state directory (state.in_memory is set)";
  } else if (config.topology.multi_rack_exchange()) {
    cluster_ = std::make_unique<ClusterCheckpoints>(config, registry, data, this);
  }
}

Checkpointer::~Checkpointer() {
  Stop();
  cluster_.reset();
}

bool Checkpointer::Cluster(const TenantInfo& tenant) const {
  return cluster_ && data_->SpansRacks(tenant);
}

std::string Checkpointer::TenantDir(const std::string& tenant, uint32_t handle) const {
  return config_.state.dir + "/checkpoints/" + std::to_string(handle) + "-" + tenant;
}

void Checkpointer::RestoreAll() {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  const std::vector<TenantInfo> tenants = registry_->ListTenants();
  std::unordered_set<std::string> live;
  for (const TenantInfo& t : tenants) {
    const std::string dir = TenantDir(t.name, t.handle);
    live.insert(fs::path(dir).filename().string());
    if (Cluster(t)) {
      // Not its own newest: the newest every hub has (a round decides it).
      if (const std::vector<uint64_t> seqs = Sequences(t); !seqs.empty()) {
        spdlog::info("checkpoint: tenant '{}' spans racks: it resumes from the newest checkpoint "
                     "every hub has (here: {} .. {})",
                     t.name, seqs.front(), seqs.back());
        data_->ResumeAcrossRacks(t.handle, "rack " + std::to_string(config_.topology.rack) +
                                               "'s hub restarted");
      }
      continue;
    }
    std::vector<std::string> skipped;
    Result<CheckpointImage> image = LoadNewestValid(dir, &skipped);
    for (const std::string& s : skipped) {
      spdlog::error("checkpoint: tenant '{}': skipped damaged checkpoint {}", t.name, s);
    }
    if (!image.ok()) {
      if (image.status().code() != StatusCode::kNotFound) {
        spdlog::error("checkpoint: tenant '{}': {}", t.name, image.status().message());
      }
      spdlog::info("checkpoint: tenant '{}' has no valid checkpoint; its keys start fresh",
                   t.name);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    Install(t, *image);
    std::vector<std::pair<std::string, uint64_t>> kv;
    for (const CheckpointKey& k : image->keys) kv.emplace_back(k.name, k.version);
    spdlog::info("checkpoint: tenant '{}' resumed from {} ({}) in {} ms", t.name,
                 CheckpointFileName(image->sequence), KeyVersionsText(kv),
                 std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count());
    last_iterations_[t.handle] = TenantIteration(t);
  }
  // Directories of tenants deleted while the hub was down (or whose removal
  // was cut short by a crash).
  std::error_code ec;
  std::vector<fs::path> dead;
  for (const auto& entry : fs::directory_iterator(config_.state.dir + "/checkpoints", ec)) {
    if (entry.is_directory() && !live.count(entry.path().filename().string())) {
      dead.push_back(entry.path());
    }
  }
  for (const fs::path& dir : dead) {
    spdlog::info("checkpoint: removing {} (its tenant no longer exists)", dir.string());
    fs::remove_all(dir, ec);
  }
}

Checkpointer::Versions Checkpointer::Install(const TenantInfo& tenant,
                                             const CheckpointImage& image) {
  // Only keys that still exist with the same shape are restored.
  std::unordered_set<uint32_t> keys;
  std::vector<KeyInfo> live;
  registry_->ListKeys(tenant.name, &live);
  for (const CheckpointKey& ck : image.keys) {
    const auto it = std::find_if(live.begin(), live.end(),
                                 [&](const KeyInfo& k) { return k.id == ck.id; });
    if (it == live.end() || it->name != ck.name || it->elements != ck.elements ||
        it->placement.chunk_count != ck.chunk_count || it->chunk_elements != ck.chunk_elements) {
      spdlog::warn("checkpoint: tenant '{}' key '{}' (id {}) no longer matches the checkpoint "
                   "(deleted or re-created); not restored",
                   tenant.name, ck.name, ck.id);
      continue;
    }
    keys.insert(ck.id);
  }
  // Odd while the lanes restore (a seqlock: a copy that began or ended
  // meanwhile is void).
  const auto runtime = data_->TenantRuntimeFor(tenant.handle);
  runtime->restores.fetch_add(1);
  struct Even {
    TenantRuntime& rt;
    ~Even() { rt.restores.fetch_add(1); }
  } even{*runtime};
  // Fresh chunks of these keys start at the restored version.
  for (const CheckpointKey& ck : image.keys) {
    if (!keys.count(ck.id)) continue;
    const auto rt = data_->KeyRuntimeFor(tenant.handle, ck.id);
    rt->floor.store(ck.version);
    rt->version.store(ck.version);
  }
  std::atomic<uint32_t> failed{0};
  OnEveryLane([&](Lane& lane) {
    failed += lane.Restore(tenant.handle, image, keys);
  });
  Versions restored;
  for (const CheckpointKey& ck : image.keys) {
    if (!keys.count(ck.id)) continue;
    const auto rt = data_->KeyRuntimeFor(tenant.handle, ck.id);
    rt->initialized_chunks.store(ck.chunk_count);
    registry_->MarkKeyReady(tenant.handle, ck.id);  // FROM_CLIENT keys have their values
    restored[ck.id] = ck.version;
  }
  if (failed > 0) {
    spdlog::error("checkpoint: tenant '{}': {} chunk(s) could not be restored", tenant.name,
                  failed.load());
  }
  return restored;
}

Checkpointer::Versions Checkpointer::NewestVersions(const TenantInfo& tenant) {
  Versions out = KeyVersions(tenant.handle);
  std::vector<KeyInfo> keys;
  registry_->ListKeys(tenant.name, &keys);
  for (const KeyInfo& k : keys) {
    out[k.id] = std::max(out[k.id], data_->KeyRuntimeFor(tenant.handle, k.id)->floor.load());
  }
  return out;
}

std::vector<uint64_t> Checkpointer::Sequences(const TenantInfo& tenant) {
  // Names only (a lane may ask, in every recovery round): a file that is
  // damaged is found when a round restores it, and not offered again.
  std::vector<uint64_t> out = CheckpointSequences(TenantDir(tenant.name, tenant.handle));
  std::lock_guard lock(damaged_mu_);
  std::erase_if(out, [&](uint64_t seq) { return damaged_.count({tenant.handle, seq}) > 0; });
  return out;
}

Result<Checkpointer::Versions> Checkpointer::InstallSequence(const TenantInfo& tenant,
                                                             uint64_t sequence) {
  const std::string path =
      TenantDir(tenant.name, tenant.handle) + "/" + CheckpointFileName(sequence);
  Result<CheckpointImage> image = ReadCheckpoint(path);
  if (image.ok() && image->sequence != sequence) {
    image = FailedPrecondition(path + ": manifest says sequence " +
                               std::to_string(image->sequence));
  }
  if (!image.ok()) {
    spdlog::error("checkpoint: tenant '{}': cannot restore {}: {}", tenant.name, path,
                  image.status().message());
    std::lock_guard lock(damaged_mu_);
    damaged_.insert({tenant.handle, sequence});
    return Internal("cannot restore " + path + ": " + image.status().message());
  }
  // Chunks newer than the checkpoint go back: the floor is the image's.
  for (const CheckpointKey& ck : image->keys) {
    data_->KeyRuntimeFor(tenant.handle, ck.id)->floor.store(ck.version);
  }
  Versions restored = Install(tenant, *image);
  std::vector<std::pair<std::string, uint64_t>> kv;
  for (const CheckpointKey& k : image->keys) kv.emplace_back(k.name, k.version);
  spdlog::warn("checkpoint: tenant '{}' restored to {} ({}) with every rack's hub", tenant.name,
               CheckpointFileName(sequence), KeyVersionsText(kv));
  return restored;
}

std::map<uint32_t, uint64_t> Checkpointer::KeyVersions(uint32_t handle) {
  std::mutex mu;
  std::map<uint32_t, uint64_t> out;
  OnEveryLane([&](Lane& lane) {
    const auto mine = lane.KeyVersions(handle);
    std::lock_guard lock(mu);
    for (const auto& [k, v] : mine) out[k] = std::max(out[k], v);
  });
  return out;
}

void Checkpointer::WaitRecovered(uint32_t handle, std::chrono::steady_clock::time_point deadline) {
  const auto rt = data_->TenantRuntimeFor(handle);
  while (rt->recovering.load() > 0 && std::chrono::steady_clock::now() < deadline &&
         !data_->stopping()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// A checkpoint is every key at one version; the chunks of a bounded or
// async tenant move one contribution at a time, each at its own pace, so
// there is no such version to save or restore (docs/consistency.md).
Status Checkpointer::CheckSync(const TenantInfo& tenant) {
  if (tenant.consistency == Consistency::kSync) return Status::Ok();
  return FailedPrecondition("consistency: tenant '" + tenant.name + "' is " +
                            ConsistencyName(tenant.consistency, tenant.staleness) +
                            "; checkpoints are for sync tenants (docs/consistency.md)");
}

Result<CheckpointInfo> Checkpointer::Create(const std::string& tenant,
                                            std::chrono::milliseconds timeout) {
  if (!enabled()) return FailedPrecondition(why_disabled_);
  TenantInfo info;
  if (Status s = registry_->GetTenant(tenant, &info); !s.ok()) return s;
  std::unique_lock lock(mu_, std::defer_lock);
  if (!lock.try_lock_for(timeout)) return Busy();
  return CreateLocked(info, timeout);
}

Status Checkpointer::Busy() const {
  return Status(StatusCode::kAborted,
                "another checkpoint or restore is in progress on this hub (rack " +
                    std::to_string(config_.topology.rack) + "'s); try again");
}

Result<CheckpointInfo> Checkpointer::CreateLocked(const TenantInfo& tenant,
                                                  std::chrono::milliseconds timeout) {
  if (Status s = CheckSync(tenant); !s.ok()) return s;
  if (Cluster(tenant)) return cluster_->Create(tenant, timeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Result<std::vector<KeyInfo>> keys = CheckpointedKeys(tenant);
  if (!keys.ok()) return keys.status();
  // Target: each key's newest version now (every chunk gets there at once
  // when the tenant is idle, after at most one update while it trains). If
  // training outruns the copy (a chunk went past the target before its lane
  // saw the job), try again one version ahead: the chunks are copied as
  // their updates reach it.
  for (uint64_t ahead = 0;; ahead = 1) {
    WaitRecovered(tenant.handle, deadline);
    Versions targets = NewestVersions(tenant);
    for (auto& [key, v] : targets) v += ahead;
    Result<CheckpointInfo> r = WriteCut(tenant, *keys, targets, 0, deadline, config_.checkpoint.keep);
    if (r.ok() || r.status().code() != StatusCode::kUnavailable) return r;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, r.status().message());
    }
  }
}

Result<std::vector<KeyInfo>> Checkpointer::CheckpointedKeys(const TenantInfo& tenant) {
  std::vector<KeyInfo> keys;
  if (Status s = registry_->ListKeys(tenant.name, &keys); !s.ok()) return s;
  // A FROM_CLIENT key without its initial values has nothing to save yet.
  std::erase_if(keys, [](const KeyInfo& k) { return !k.ready; });
  return keys;
}

Result<CheckpointInfo> Checkpointer::WriteCut(const TenantInfo& tenant,
                                              const std::vector<KeyInfo>& keys,
                                              const Versions& targets, uint64_t sequence,
                                              std::chrono::steady_clock::time_point deadline,
                                              uint32_t keep) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t iterations = TenantIteration(tenant);
  Versions wanted;
  size_t expected = 0;
  for (const KeyInfo& k : keys) {
    const auto it = targets.find(k.id);
    wanted[k.id] = it == targets.end() ? 0 : it->second;
    expected += k.placement.chunk_count;
  }
  // A restore while the chunks are copied voids the copy (two timelines).
  const auto runtime = data_->TenantRuntimeFor(tenant.handle);
  const uint64_t restores = runtime->restores.load();
  auto job = std::make_shared<SnapshotJob>(tenant.handle, wanted, expected);
  {
    std::lock_guard lock(job_mu_);
    job_ = job;
    if (cancelled_) job->Fail("the hub is shutting down");
  }
  for (uint32_t i = 0; i < data_->lane_count(); ++i) {
    data_->OnLane(i, [job](Lane& lane) { lane.Snapshot(job->handle(), job); });
  }
  Status s = job->Wait(deadline);
  {
    std::lock_guard lock(job_mu_);
    job_.reset();
  }
  if (s.ok() && (restores % 2 != 0 || runtime->restores.load() != restores)) {
    s = Unavailable("the tenant was restored while its chunks were copied");
  }
  if (!s.ok()) {
    return Status(s.code(), "checkpoint of tenant '" + tenant.name + "': " + s.message());
  }
  const auto copied = std::chrono::steady_clock::now();

  CheckpointImage image;
  image.tenant = tenant.name;
  image.created_unix_ms = NowUnixMs();
  const std::string dir = TenantDir(tenant.name, tenant.handle);
  image.sequence = std::max<uint64_t>(sequence, 1);
  if (sequence == 0) {
    for (const CheckpointInfo& c : ListCheckpoints(dir)) {
      image.sequence = std::max(image.sequence, c.sequence + 1);
    }
  }
  image.chunks = job->Take();
  std::sort(image.chunks.begin(), image.chunks.end(), [](const auto& a, const auto& b) {
    return std::tie(a.key_id, a.chunk) < std::tie(b.key_id, b.chunk);
  });
  std::map<uint32_t, uint32_t> slots;
  for (const CheckpointChunk& c : image.chunks) slots[c.key_id] = c.state.size();
  for (const KeyInfo& k : keys) {
    image.keys.push_back(CheckpointKey{k.id, k.name, k.elements,
                                       static_cast<uint32_t>(k.placement.chunk_count),
                                       k.chunk_elements, wanted[k.id],
                                       aggregation::OptimizerTypeName(k.optimizer.type),
                                       slots[k.id]});
  }
  Result<CheckpointInfo> info = WriteCheckpoint(dir, image, keep);
  if (!info.ok()) {
    spdlog::error("checkpoint: tenant '{}': {}", tenant.name, info.status().message());
    return info;
  }
  {
    std::lock_guard lock(damaged_mu_);  // a damaged file of that name was replaced
    damaged_.erase({tenant.handle, image.sequence});
  }
  Written(tenant, *info, iterations, start, copied);
  return info;
}

void Checkpointer::Written(const TenantInfo& tenant, const CheckpointInfo& info,
                           uint64_t iterations, std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point copied) {
  last_iterations_[tenant.handle] = iterations;
  if (tenant.counters) {
    TenantCounters& c = *tenant.counters;
    c.checkpoints.fetch_add(1, std::memory_order_relaxed);
    c.last_checkpoint_us.store(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count(),
                               std::memory_order_relaxed);
    c.last_checkpoint_bytes.store(info.bytes, std::memory_order_relaxed);
  }
  const auto ms = [](auto d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  spdlog::info("checkpoint: tenant '{}' wrote {} ({}; {:.1f} MiB; copy {} ms, write {} ms)",
               tenant.name, CheckpointFileName(info.sequence), KeyVersionsText(info.key_versions),
               info.bytes / 1048576.0, ms(copied - start),
               ms(std::chrono::steady_clock::now() - copied));
}

Result<std::vector<CheckpointInfo>> Checkpointer::List(const std::string& tenant) {
  if (!enabled()) return FailedPrecondition(why_disabled_);
  TenantInfo info;
  if (Status s = registry_->GetTenant(tenant, &info); !s.ok()) return s;
  return ListCheckpoints(TenantDir(info.name, info.handle));
}

Status Checkpointer::Delete(const std::string& tenant, uint64_t sequence) {
  if (!enabled()) return FailedPrecondition(why_disabled_);
  TenantInfo info;
  if (Status s = registry_->GetTenant(tenant, &info); !s.ok()) return s;
  std::lock_guard lock(mu_);
  return DeleteCheckpoint(TenantDir(info.name, info.handle), sequence);
}

Result<CheckpointInfo> Checkpointer::Restore(const std::string& tenant, uint64_t sequence) {
  if (!enabled()) return FailedPrecondition(why_disabled_);
  TenantInfo info;
  if (Status s = registry_->GetTenant(tenant, &info); !s.ok()) return s;
  if (Status s = CheckSync(info); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + kRestoreTimeout;
  std::unique_lock lock(mu_, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return Busy();
  if (Cluster(info)) {
    Result<CheckpointInfo> out = cluster_->Restore(
        info, sequence,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                              std::chrono::steady_clock::now()));
    if (out.ok()) last_iterations_[info.handle] = TenantIteration(info);
    return out;
  }
  const std::string dir = TenantDir(info.name, info.handle);
  Result<CheckpointImage> image = NotFound("");
  std::vector<std::string> skipped;
  if (sequence == 0) {
    image = LoadNewestValid(dir, &skipped);
  } else {
    const std::string path = dir + "/" + CheckpointFileName(sequence);
    image = ReadCheckpoint(path);
    // As LoadNewestValid and ListCheckpoints: a file whose manifest names
    // another sequence (copied or renamed) is not checkpoint `sequence`.
    if (image.ok() && image->sequence != sequence) {
      image = FailedPrecondition(path + ": manifest says sequence " +
                                 std::to_string(image->sequence));
    }
  }
  for (const std::string& s : skipped) {
    spdlog::error("checkpoint: tenant '{}': skipped damaged checkpoint {}", info.name, s);
  }
  if (!image.ok()) {
    return Status(image.status().code(),
                  "tenant '" + tenant + "': " +
                      (image.status().message().empty() ? "has no valid checkpoint"
                                                        : image.status().message()));
  }
  // Hold the tenant's pushes and pulls, fail what is pending, then replace.
  const auto rt = data_->TenantRuntimeFor(info.handle);
  rt->recovering.fetch_add(1);
  const std::string why = "the tenant is being restored to " + CheckpointFileName(image->sequence);
  OnEveryLane([&](Lane& lane) { lane.FailPending(info.handle, why); });
  // Chunks newer than the checkpoint go back: the floor is the image's.
  for (const CheckpointKey& ck : image->keys) {
    data_->KeyRuntimeFor(info.handle, ck.id)->floor.store(ck.version);
  }
  Install(info, *image);
  if (rt->recovering.fetch_sub(1) == 1) {
    OnEveryLane([&](Lane& lane) { lane.ReleaseParked(info.handle); });
  }
  last_iterations_[info.handle] = TenantIteration(info);
  CheckpointInfo out;
  out.path = dir + "/" + CheckpointFileName(image->sequence);
  out.sequence = image->sequence;
  out.created_unix_ms = image->created_unix_ms;
  std::error_code ec;
  out.bytes = fs::file_size(out.path, ec);
  for (const CheckpointKey& k : image->keys) out.key_versions.emplace_back(k.name, k.version);
  spdlog::warn("checkpoint: tenant '{}' restored to {} ({})", info.name,
               CheckpointFileName(image->sequence), KeyVersionsText(out.key_versions));
  return out;
}

void Checkpointer::TenantDeleted(uint32_t handle) {
  if (!enabled()) return;
  std::lock_guard lock(mu_);
  last_iterations_.erase(handle);
  // The directory is "<handle>-<name>"; handles are never reused.
  const std::string prefix = std::to_string(handle) + "-";
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(config_.state.dir + "/checkpoints", ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) dirs.push_back(entry.path());
  }
  for (const fs::path& dir : dirs) {
    fs::remove_all(dir, ec);
    if (ec) spdlog::warn("checkpoint: cannot remove {}: {}", dir.string(), ec.message());
  }
}

}  // namespace rackhub::server
