// DataPlane: the lanes' services (one Lane per lane thread), the hub-wide
// state they share (key runtimes, rack-link counters, the hub secret and the
// connector for outgoing hub links), registry events fanned out to every
// lane, and the one shutdown path of the data plane. Acceptors (TCP, RDMA,
// in-memory for tests) authenticate connections and hand them to lane(i) on
// that lane's thread.
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
  // Whether key or tenant runtimes of `handle` exist, or of its key `key_id`
  // (tests: nothing of a deleted tenant or key stays behind).
  bool HasRuntimes(uint32_t handle, std::optional<uint32_t> key_id = std::nullopt) const;

  // LaneHost.
  std::shared_ptr<KeyRuntime> KeyRuntimeFor(uint32_t handle, uint32_t key_id) override;
  void ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) override;
  std::shared_ptr<TenantRuntime> TenantRuntimeFor(uint32_t handle) override;
  uint64_t WorkerLost(uint32_t handle, uint32_t member, const std::string& why,
                      uint32_t from_lane) override;
  void AbortIteration(uint32_t handle, const std::string& why, bool straggler) override;
  void MembershipChanged(uint32_t handle, const std::string& why) override;
  void GenerationEnded(uint32_t handle, uint32_t member, std::shared_ptr<const WorkerGeneration> g,
                       const std::string& why, bool close) override;
  uint64_t NextSeq() override { return seq_.fetch_add(1) + 1; }
  const std::string& hub_secret() const override { return hub_secret_; }
  net::Connector& hub_connector() override { return *hub_connector_; }
  void CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) override;
  void CountRackChunkBytes(uint32_t rack, uint64_t out) override;
  Status OnRackVersions(uint32_t rack, std::span<const std::byte> payload) override;
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
  // Erases the runtimes just made for `handle` (and `key_id`) if the tenant
  // (or key) is no longer in the registry (see data_plane.cc).
  void ForgetIfDeleted(uint32_t handle, std::optional<uint32_t> key_id);
  // Runs fn(lane) on every lane through its gate (skipped once it closed).
  void OnEveryLane(std::function<void(Lane&)> fn);
  // Recovery after an aborted iteration: `first` on every lane (fail the
  // pending updates), then every chunk aligned to its key's newest version,
  // then the held PULLs answered. Asynchronous; see docs/durability.md.
  // True when no other recovery of the tenant was running.
  bool Recover(uint32_t handle, const std::string& why, std::function<void(Lane&)> first);
  // Recovery, phase 2: with `realign`, every lane aligns its chunks to
  // `versions` (then Finish); without, only Finish (a recovery whose
  // realignment another one of the same cross-rack round does).
  void Realign(uint32_t handle, std::shared_ptr<TenantRuntime> tenant,
               std::map<uint32_t, uint64_t> versions, bool realign);
  // The end of one recovery: the membership commit (elastic tenants), and
  // once no other recovery runs, the held PULLs answered.
  void FinishRecovery(uint32_t handle, TenantRuntime& tenant);
  // The tenant spans racks with hubs of its own (recovery rounds apply).
  bool SpansRacks(const TenantInfo& info) const;
  // Elastic tenants, at the end of a recovery (nothing pending, no push
  // accepted): commits the membership of the ranks present now
  // (docs/elastic.md) and publishes it in the tenant's counters.
  void CommitMembership(uint32_t handle, TenantRuntime& tenant);
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

}  // namespace rackhub::server
