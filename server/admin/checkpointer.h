// Checkpointer: the tenants' checkpoints (docs/durability.md, Checkpoints).
// Takes a consistent copy of a tenant's parameters and optimizer state (every
// chunk of a key at the same version) through the lanes (SnapshotJob), writes
// it with checkpoint_file.h on the calling thread while training goes on,
// restores tenants at start-up and on request, and runs the periodic
// triggers (checkpoint.every_iterations / every_seconds) on its own thread
// (checkpoint_triggers.cc).
//
// Files live in <state.dir>/checkpoints/<handle>-<tenant>/: the handle is
// never reused, so a tenant deleted and re-created under the same name never
// sees its predecessor's checkpoints.
//
// Tenants spanning racks (hierarchical topology) get cluster checkpoints:
// ClusterCheckpoints (cluster_checkpoints.h) coordinates every hub's cut at
// one sequence and version per key, and their restores.
//
// Ownership: the Hub owns it; it borrows the Registry and the DataPlane.
// Threading: every public member may be called from any thread (admin gRPC
// threads, the trigger thread, the main thread); checkpoints are taken one
// at a time (mu_). Never from a lane thread: it waits on the lanes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <memory>
#include <set>

#include "checkpoint_file.h"
#include "config.h"
#include "rackhub/common/status.h"
#include "registry.h"

namespace rackhub::server {

class ClusterCheckpoints;
class DataPlane;
class Lane;
class SnapshotJob;

class Checkpointer {
 public:
  Checkpointer(const Config& config, Registry* registry, DataPlane* data);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // False in state.in_memory mode: every call below then fails with
  // FAILED_PRECONDITION naming why.
  bool enabled() const { return why_disabled_.empty(); }

  // Start-up, before the data plane serves: every tenant resumes from its
  // newest valid checkpoint (damaged ones are skipped with a log line naming
  // the file and the reason); a tenant spanning racks with checkpoints here
  // resumes from the newest one every hub has instead, in the recovery round
  // this starts (ClusterCheckpoints). Checkpoint directories of tenants that
  // no longer exist are removed.
  void RestoreAll();
  // Starts / stops the periodic trigger thread (and, on a hub with several
  // racks, the cluster checkpoints' thread; a copy in progress fails). Stop
  // is idempotent; call it before the data plane shuts down.
  void Start();
  void Stop();

  // Checkpoints `tenant` now; returns once the file is durable. Waits at most
  // `timeout` for every chunk to reach one version per key.
  Result<CheckpointInfo> Create(const std::string& tenant,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10));
  Result<std::vector<CheckpointInfo>> List(const std::string& tenant);
  Status Delete(const std::string& tenant, uint64_t sequence);
  // Puts the tenant back to checkpoint `sequence` (0: the newest valid one)
  // while the hub runs: pending updates fail with WORKER_LOST, workers see
  // BAD_ITERATION carrying the restored version and resynchronize.
  Result<CheckpointInfo> Restore(const std::string& tenant, uint64_t sequence);
  // The tenant (by handle) is gone: removes its checkpoints.
  void TenantDeleted(uint32_t handle);
  // Shutdown (checkpoint.on_shutdown), after DataPlane::Shutdown failed
  // every pending update: every tenant with updates since its last
  // checkpoint; the iteration that was in progress ends as a skipped step
  // (as after a lost worker) and the checkpoint is taken after it.
  void CheckpointAll();

 private:
  friend class ClusterCheckpoints;  // a cluster checkpoint is every hub's cut (below)
  using Versions = std::map<uint32_t, uint64_t>;  // key id -> version

  // How long an admin restore waits (for the lock, and across racks for the
  // recovery round that restores it).
  static constexpr auto kRestoreTimeout = std::chrono::seconds(60);
  std::string TenantDir(const std::string& tenant, uint32_t handle) const;
  Status Busy() const;
  // The tenant spans racks with hubs of its own: cluster checkpoints.
  bool Cluster(const TenantInfo& tenant) const;
  // One cut at `targets` (key id -> version) of `keys` written as checkpoint
  // `sequence` (0: the next free one), or UNAVAILABLE if a chunk was past
  // its target; then the oldest files beyond `keep` are deleted (a cluster
  // checkpoint's hubs prune once it is complete instead: keep = UINT32_MAX).
  // REQUIRES mu_.
  Result<CheckpointInfo> WriteCut(const TenantInfo& tenant, const std::vector<KeyInfo>& keys,
                                  const Versions& targets, uint64_t sequence,
                                  std::chrono::steady_clock::time_point deadline, uint32_t keep);
  // The copy WriteCut waits for (if any) fails: the hub is shutting down.
  void CancelCopy();
  // The keys a checkpoint holds: FROM_CLIENT keys without values have none yet.
  Result<std::vector<KeyInfo>> CheckpointedKeys(const TenantInfo& tenant);
  // Each key's newest version over the lanes, at least its floor.
  Versions NewestVersions(const TenantInfo& tenant);
  // The sequences of the tenant's checkpoint files here (by name) but those
  // that failed to load (damaged_).
  std::vector<uint64_t> Sequences(const TenantInfo& tenant);
  // Loads checkpoint `sequence` into the lanes (a recovery round's restore:
  // the tenant is recovering): the versions of the keys it restored. A file
  // that fails to load is named in the log and never offered again.
  Result<Versions> InstallSequence(const TenantInfo& tenant, uint64_t sequence);
  // Counters and the log line of a checkpoint written; `iterations` is the
  // tenant's iteration when it began.
  void Written(const TenantInfo& tenant, const CheckpointInfo& info, uint64_t iterations,
               std::chrono::steady_clock::time_point start,
               std::chrono::steady_clock::time_point copied);
  static Status CheckSync(const TenantInfo& tenant);
  Result<CheckpointInfo> CreateLocked(const TenantInfo& tenant, std::chrono::milliseconds timeout);
  // Loads `image` into the lanes (blocking); FROM_CLIENT keys become ready.
  // The versions of the keys it restored.
  Versions Install(const TenantInfo& tenant, const CheckpointImage& image);
  // The newest version of each key over every lane (blocking).
  std::map<uint32_t, uint64_t> KeyVersions(uint32_t handle);
  // The newest version over the tenant's keys (what the triggers count).
  uint64_t TenantIteration(const TenantInfo& tenant);
  void WaitRecovered(uint32_t handle, std::chrono::steady_clock::time_point deadline);
  // Runs fn(lane) on every lane's thread (uncounted posts: also during
  // shutdown) and waits for all of them.
  void OnEveryLane(const std::function<void(Lane&)>& fn);
  // The periodic triggers (checkpoint_triggers.cc, the trigger thread).
  void TriggerLoop();

  const Config config_;
  Registry* registry_;
  DataPlane* data_;
  std::string why_disabled_;
  // One checkpoint (or restore) at a time; admin calls wait for it at most
  // their timeout (another hub's cluster checkpoint may hold it for long).
  std::timed_mutex mu_;
  // TenantIteration at the last checkpoint or restore, by tenant handle.
  std::map<uint32_t, uint64_t> last_iterations_;  // GUARDED_BY(mu_)
  std::mutex damaged_mu_;
  std::set<std::pair<uint32_t, uint64_t>> damaged_;  // (handle, sequence); GUARDED_BY(damaged_mu_)
  std::unique_ptr<ClusterCheckpoints> cluster_;  // hierarchical hubs only
  std::mutex job_mu_;
  std::shared_ptr<SnapshotJob> job_;  // GUARDED_BY(job_mu_): the copy WriteCut waits for
  bool cancelled_ = false;  // GUARDED_BY(job_mu_): during Stop, copies fail at once

  std::mutex trigger_mu_;
  std::condition_variable trigger_cv_;
  bool stopping_ = false;  // GUARDED_BY(trigger_mu_)
  std::thread trigger_;
};

}  // namespace rackhub::server
