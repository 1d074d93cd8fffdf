// DataPlane: the lanes' services (one Lane per lane thread), the hub-wide
// state they share (key runtimes, rack-link counters, the hub secret and the
// connector for outgoing hub links), registry events fanned out to every
// lane, and the one shutdown path of the data plane. Acceptors (TCP, RDMA,
// in-memory for tests) authenticate connections and hand them to lane(i) on
// that lane's thread.
//
// Its part in recovery across racks and in cluster checkpoints lives in
// data_plane_racks.cc.
//
// Thread safety: construction, StartHubLinks and Shutdown from the main
// thread. LaneHost members from any lane. The RegistryObserver callbacks run
// under the registry's lock and only post.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/thread_pool.hpp>
#include <tbb/concurrent_hash_map.h>

#include "config.h"
#include "lane.h"
#include "lane_host.h"
#include "lanes.h"
#include "rack_recovery.h"
#include "registry.h"
#include "stall_report.h"

namespace rackhub::server {

class DataPlane final : public RegistryObserver, public LaneHost {
 public:
  // `hub_connector` opens links to other racks' hubs (TCP or RDMA).
  DataPlane(const Config& config, Registry* registry, LaneSet* lanes,
            std::unique_ptr<net::Connector> hub_connector);
  ~DataPlane() override;
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  const Config& config() const { return config_; }
  Registry& registry() { return *registry_; }
  uint32_t lane_count() const { return static_cast<uint32_t>(lanes_.size()); }
  // Lane `i`: its members run on its thread only (see lane.h).
  Lane& lane(uint32_t i) { return *lanes_[i]; }
  // Runs `fn(lane)` on lane `i`'s thread (uncounted: hand-overs of new
  // connections must reach the lane even while it shuts down).
  void OnLane(uint32_t i, std::function<void(Lane&)> fn);

  // Starts every lane's links to the other racks' hubs (hierarchical topology).
  void StartHubLinks();
  // Another rack's hub left the cluster (cluster_membership.h): every
  // pending update fails with WORKER_LOST naming the rack, as when its link
  // breaks; the links reconnect when it is back. Any thread.
  void RackLost(uint32_t rack);
  // Every lane tells its workers SHUTTING_DOWN and closes its hub links; waits
  // up to `grace` for the last frames to go out, then closes what is left and
  // waits for every lane's timers and posted work to finish. Idempotent.
  void Shutdown(std::chrono::milliseconds grace);
  // A crash instead (Hub::Crash): every lane closes its workers' connections
  // and hub links at once and tells nobody (Lane::Abort); then waits for
  // every lane's timers and posted work as Shutdown does. Idempotent; once
  // either ran, the other does nothing.
  void Abort();

  struct RackLinkStats {
    uint32_t rack = 0;
    uint64_t bytes_out = 0;
    uint64_t bytes_in = 0;
    uint64_t chunk_bytes_out = 0;
  };
  std::vector<RackLinkStats> RackLinks() const;
  // The updates of tenant `handle` (0: all) waiting for contributions for
  // at least `min_wait` on every lane (stall_report.h), oldest first. A lane
  // that does not answer within `timeout` (hung, or shutting down) is named
  // in *unanswered instead of blocking the caller. Any thread but a lane's.
  std::vector<StallEntry> Stalls(uint32_t handle, std::chrono::nanoseconds min_wait,
                                 std::chrono::milliseconds timeout,
                                 std::vector<uint32_t>* unanswered);
  // Cluster checkpoints (tenants spanning racks; the Checkpointer's
  // ClusterCheckpoints lends these). Each runs on the thread that needs it,
  // never under a lock of the data plane; SetCheckpointHooks({}) waits for
  // calls in progress, so they never outlive their owner.
  struct CheckpointHooks {
    // A RACK_CHECKPOINT from rack `rack`'s hub (lane 0's thread: must not block).
    std::function<void(uint32_t rack, std::string payload)> on_message;
    // The sequences of the tenant's checkpoint files here (for round reports).
    std::function<std::vector<uint64_t>(uint32_t handle)> sequences;
    // Round `round`'s restore: loads checkpoint `sequence` into the lanes
    // (blocking, not on a lane); the restored key versions. A load that
    // fails is INTERNAL, DATA_LOSS or the like, never FAILED_PRECONDITION
    // (that is: checkpoints are off here).
    std::function<Result<std::map<uint32_t, uint64_t>>(uint32_t handle, uint64_t sequence,
                                                       uint64_t round)>
        restore;
  };
  void SetCheckpointHooks(CheckpointHooks hooks);
  // A RACK_CHECKPOINT to rack `rack`'s hub on lane 0's link (dropped while it
  // is down). Any thread.
  void SendRackCheckpoint(uint32_t rack, std::string payload);
  // This hub started with the tenant's checkpoint on disk (it restarted): its
  // hubs run a recovery round in which every hub rolls back to the newest
  // checkpoint they all have (rack_recovery.h). Any thread.
  void ResumeAcrossRacks(uint32_t handle, const std::string& why);
  // An admin restore of checkpoint `sequence` on every hub of the tenant: a
  // recovery round that restores it. UNAVAILABLE while a round of the tenant
  // is reporting (ask again once it ended). Any thread.
  Status RestoreAcrossRacks(uint32_t handle, uint64_t sequence, const std::string& why);
  // The tenant spans racks with hubs of its own (recovery rounds apply).
  bool SpansRacks(const TenantInfo& info) const;
  // "rack 2's hub" (or "racks 1 and 2's hubs"): those the tenant's recovery
  // round still waits for; empty when none is under way. Any thread.
  std::string RoundWaitsFor(uint32_t handle);

  // Whether key or tenant runtimes of `handle` exist, or of its key `key_id`
  // (tests: nothing of a deleted tenant or key stays behind).
  bool HasRuntimes(uint32_t handle, std::optional<uint32_t> key_id = std::nullopt) const;

  // LaneHost.
  void KeyAdopted(uint32_t handle, uint32_t key_id) override;
  // RegistryObserver: across racks, a round's agreed version of the key
  // from before it existed here is taken (KeyRuntimeFor, on lane 0).
  void OnKeyCreated(uint32_t handle, uint32_t key_id) override;
  std::shared_ptr<KeyRuntime> KeyRuntimeFor(uint32_t handle, uint32_t key_id) override;
  void ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) override;
  std::shared_ptr<TenantRuntime> TenantRuntimeFor(uint32_t handle) override;
  uint64_t WorkerLost(uint32_t handle, uint32_t member, const std::string& why,
                      uint32_t from_lane) override;
  void AbortIteration(uint32_t handle, const std::string& why, bool straggler,
                      bool own_round = false) override;
  void MembershipChanged(uint32_t handle, const std::string& why) override;
  void GenerationEnded(uint32_t handle, uint32_t member, std::shared_ptr<const WorkerGeneration> g,
                       const std::string& why, bool close) override;
  uint64_t NextSeq() override { return seq_.fetch_add(1) + 1; }
  uint64_t WelcomeIncarnation(const TenantInfo& info) const override {
    return SpansRacks(info) ? rack_recovery_->incarnation() : 0;
  }
  const std::string& hub_secret() const override { return hub_secret_; }
  net::Connector& hub_connector() override { return *hub_connector_; }
  void CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) override;
  void CountRackChunkBytes(uint32_t rack, uint64_t out) override;
  Status OnRackVersions(uint32_t rack, std::span<const std::byte> payload) override;
  void OnRackCheckpoint(uint32_t rack, std::span<const std::byte> payload) override;
  void RackLinkUp(uint32_t rack) override;
  void ResendRackReports() override;
  void LaneDrained(uint32_t lane) override;
  bool stopping() const override { return stopping_.load(); }
  void RunBlocking(std::function<void()> fn) override;

  // RegistryObserver.
  void OnTenantDeleted(uint32_t handle) override;
  void OnKeyDeleted(uint32_t handle, uint32_t key_id) override;
  void OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                          const aggregation::OptimizerConfig& optimizer,
                          uint64_t from_update) override;

 private:
  // Raises `rt`'s floor to `v` (never lowers it).
  static void RaiseFloor(KeyRuntime& rt, uint64_t v);
  // An elastic tenant's flags its recovery rounds compare between hubs.
  static RackElasticFlags ElasticFlagsOf(const TenantInfo& info) {
    return {info.workers_per_rack, info.min_workers, info.quotas.max_workers};
  }
  // Erases the runtimes just made for `handle` (and `key_id`) if the tenant
  // (or key) is no longer in the registry (see data_plane.cc).
  void ForgetIfDeleted(uint32_t handle, std::optional<uint32_t> key_id);
  // Runs fn(lane) on every lane through its gate (skipped once it closed).
  void OnEveryLane(std::function<void(Lane&)> fn);
  // Recovery after an aborted iteration: `first` on every lane (fail the
  // pending updates), then every chunk aligned to its key's newest version,
  // then the held PULLs answered. Asynchronous; see docs/durability.md.
  // True when no other recovery of the tenant was running. Across racks, a
  // round that ends after `first` was queued covers the recovery (no round
  // of its own: RackRecovery::Reported) unless `own_round`.
  bool Recover(uint32_t handle, const std::string& why, std::function<void(Lane&)> first,
               bool own_round = false);
  // Recovery, phase 2: with `realign`, every lane aligns its chunks to
  // the outcome's versions (then Finish), after restoring its checkpoint if
  // the round decided so; without, only Finish (a recovery whose
  // realignment another one of the same cross-rack round does).
  void Realign(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
               RackRecovery::Outcome outcome, bool realign);
  // Every lane aligns to `versions`; the tenant's rack epoch becomes `round`.
  void AlignLanes(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                  std::map<uint32_t, uint64_t> versions, uint64_t round);
  // A cross-rack recovery's phase 1, on realign_strand_: reads the versions
  // and reports them into a round (again if a round ended meanwhile),
  // unless a round that ended since `failed_at` covers it
  // (RackRecovery::Reported).
  void ReportAcrossRacks(uint32_t handle, std::shared_ptr<TenantRuntime> tenant, std::string why,
                         std::string name, std::optional<uint64_t> failed_at);
  // A cross-rack round's realignment, on realign_strand_ (blocking: a
  // restore loads its file here).
  void RealignAcrossRacks(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
                          RackRecovery::Outcome outcome);
  // Every lane's rack epoch of the tenant raised to `round`; the newest
  // version of each key over the lanes. Both wait (on the strand, never on
  // a lane); false if the hub stops meanwhile.
  bool RaiseEpochAndWait(uint32_t handle, uint64_t round);
  bool KeyVersionsAndWait(uint32_t handle, std::map<uint32_t, uint64_t>* out);
  // Runs fn(lane) on every lane and waits (see KeyVersionsAndWait).
  bool OnEveryLaneAndWait(std::function<void(Lane&)> fn);
  // The checkpoint hooks, held for the call (see SetCheckpointHooks).
  template <typename Fn>
  auto WithCheckpointHooks(Fn&& fn);
  // The end of one recovery: the membership commit (elastic tenants), and
  // once no other recovery runs, the held PULLs answered.
  // `cluster`: across racks, the round's outcome (its members).
  void FinishRecovery(uint32_t handle, TenantRuntime& tenant,
                      const RackRecovery::Outcome* cluster = nullptr);
  // Elastic tenants, at the end of a recovery (nothing pending, no push
  // accepted): commits the membership of the ranks present now
  // (docs/elastic.md) and publishes it in the tenant's counters; across
  // racks the one the round agreed (CommitClusterMembership).
  void CommitMembership(uint32_t handle, TenantRuntime& tenant,
                        const RackRecovery::Outcome* cluster);
  // Across racks (data_plane_racks.cc): this rack's members as reported in
  // the round, the cluster's total and generation; if the ranks present
  // changed since the report, another round follows at once.
  void CommitClusterMembership(const TenantInfo& info, TenantRuntime& tenant,
                               const RackRecovery::Outcome& cluster);
  // Publishes a committed membership (counters, log line) and commits it.
  void PublishMembership(const TenantInfo& info, TenantRuntime& tenant,
                         std::shared_ptr<Membership> next, const std::string& note);
  // Shutdown and Abort: true for the first call of either.
  bool BeginStop();
  // Shutdown and Abort: waits (bounded) for every lane's counted work.
  void WaitLanesIdle();

  const Config config_;
  Registry* registry_;
  LaneSet* lane_threads_;
  std::unique_ptr<net::Connector> hub_connector_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  // RunBlocking's threads; after lanes_: joined before the lanes go.
  std::unique_ptr<boost::asio::thread_pool> blocking_;
  // Cross-rack rounds' work one at a time, in order, on a thread of its own
  // (never behind an etcd call): phase 1's version reads and the
  // realignments, so neither overtakes a restore's file load.
  std::unique_ptr<boost::asio::thread_pool> realign_strand_;
  std::atomic<uint64_t> seq_{0};
  std::string hub_secret_;
  struct LinkCounters {
    std::atomic<uint64_t> bytes_out{0};
    std::atomic<uint64_t> bytes_in{0};
    std::atomic<uint64_t> chunk_bytes_out{0};
  };
  std::vector<std::unique_ptr<LinkCounters>> link_counters_;  // by rack
  // Hierarchical topology only: the tenants' cross-rack recovery rounds.
  std::unique_ptr<RackRecovery> rack_recovery_;
  std::mutex ckpt_mu_;
  std::condition_variable ckpt_cv_;
  CheckpointHooks ckpt_hooks_;  // GUARDED_BY(ckpt_mu_)
  uint32_t ckpt_calls_ = 0;     // GUARDED_BY(ckpt_mu_): hook calls in progress
  // Key runtimes by tenant handle, then key id: looked up by every lane,
  // erased on registry events (a whole tenant without iterating, which TBB's
  // map does not allow concurrently with inserts).
  using KeyRuntimes = tbb::concurrent_hash_map<uint32_t, std::shared_ptr<KeyRuntime>>;
  tbb::concurrent_hash_map<uint32_t, std::shared_ptr<KeyRuntimes>> runtimes_;
  tbb::concurrent_hash_map<uint32_t, std::shared_ptr<TenantRuntime>> tenant_runtimes_;

  std::mutex shutdown_mu_;
  std::condition_variable drained_cv_;
  std::vector<bool> drained_;  // GUARDED_BY(shutdown_mu_), by lane
  bool shut_down_ = false;     // GUARDED_BY(shutdown_mu_)
  std::atomic<bool> stopping_{false};  // set by Shutdown before any lane hears
};

// (Private: the constructor's round hooks and data_plane_racks.cc use it.)
template <typename Fn>
inline auto DataPlane::WithCheckpointHooks(Fn&& fn) {
  CheckpointHooks hooks;
  {
    std::lock_guard lock(ckpt_mu_);
    hooks = ckpt_hooks_;
    ++ckpt_calls_;
  }
  struct Done {
    DataPlane* plane;
    ~Done() {
      std::lock_guard lock(plane->ckpt_mu_);
      if (--plane->ckpt_calls_ == 0) plane->ckpt_cv_.notify_all();
    }
  } done{this};
  return fn(hooks);
}

}  // namespace rackhub::server
