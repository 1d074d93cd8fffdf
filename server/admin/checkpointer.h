// Checkpointer: the tenants' checkpoints (docs/durability.md, Checkpoints).
// Takes a consistent copy of a tenant's parameters and optimizer state (every
// chunk of a key at the same version) through the lanes (SnapshotJob), writes
// it with checkpoint_file.h on the calling thread while training goes on,
// restores tenants at start-up and on request, and runs the periodic
// triggers (checkpoint.every_iterations / every_seconds) on its own thread.
//
// Files live in <state.dir>/checkpoints/<handle>-<tenant>/: the handle is
// never reused, so a tenant deleted and re-created under the same name never
// sees its predecessor's checkpoints.
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
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_file.h"
#include "config.h"
#include "rackhub/common/status.h"
#include "registry.h"

namespace rackhub::server {

class DataPlane;

class Checkpointer {
 public:
  Checkpointer(const Config& config, Registry* registry, DataPlane* data);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // False in state.in_memory mode or on a multi-rack hub: every call below
  // then fails with FAILED_PRECONDITION / UNIMPLEMENTED naming why.
  bool enabled() const { return why_disabled_.empty(); }

  // Start-up, before the data plane serves: every tenant resumes from its
  // newest valid checkpoint (damaged ones are skipped with a log line naming
  // the file and the reason); checkpoint directories of tenants that no
  // longer exist are removed.
  void RestoreAll();
  // Starts / stops the periodic trigger thread. Stop is idempotent.
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
  std::string TenantDir(const std::string& tenant, uint32_t handle) const;
  static Status CheckSync(const TenantInfo& tenant);
  Result<CheckpointInfo> CreateLocked(const TenantInfo& tenant, std::chrono::milliseconds timeout);
  // Loads `image` into the lanes (blocking); FROM_CLIENT keys become ready.
  void Install(const TenantInfo& tenant, const CheckpointImage& image);
  // The newest version of each key over every lane (blocking).
  std::map<uint32_t, uint64_t> KeyVersions(uint32_t handle);
  // The newest version over the tenant's keys (what the triggers count).
  uint64_t TenantIteration(const TenantInfo& tenant);
  void WaitRecovered(uint32_t handle, std::chrono::steady_clock::time_point deadline);
  void TriggerLoop();

  const Config config_;
  Registry* registry_;
  DataPlane* data_;
  std::string why_disabled_;
  std::mutex mu_;  // one checkpoint (or restore) at a time
  // TenantIteration at the last checkpoint or restore, by tenant handle.
  std::map<uint32_t, uint64_t> last_iterations_;  // GUARDED_BY(mu_)

  std::mutex trigger_mu_;
  std::condition_variable trigger_cv_;
  bool stopping_ = false;  // GUARDED_BY(trigger_mu_)
  std::thread trigger_;
};

}  // namespace rackhub::server
