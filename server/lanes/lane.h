// Lane: everything one lane (one pinned thread, one io_context) serves: the
// chunks it owns (ChunkTable), its worker connections (WorkerProtocol) and
// its links to other racks' hubs (RackExchange), with one gate counting its
// asynchronous work. Acceptors of every transport build a net::Connection
// with worker_handler() or hub_handler() and hand it over with AdoptWorker /
// AdoptHubLink: the lane never names a transport.
//
// Ownership: the DataPlane owns the lanes; a lane borrows the Registry and
// the LaneHost, which outlive it.
// Threading: shared-nothing. Every member runs on the lane's thread (other
// threads reach it through LaneSet::Post or gate().Post); gate().WaitIdle
// and connection counting after shutdown are the exceptions noted below.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "chunk_table.h"
#include "config.h"
#include "lane_gate.h"
#include "lane_host.h"
#include "rack_exchange.h"
#include "worker_protocol.h"

namespace rackhub::server {

class Lane {
 public:
  Lane(uint32_t lane, uint32_t lanes, const Config& config, Registry* registry, LaneHost* host,
       boost::asio::io_context* io);
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  uint32_t index() const { return table_.lane(); }
  boost::asio::io_context& io() { return *io_; }
  LaneGate& gate() { return gate_; }

  // Handlers acceptors build connections with.
  net::FrameHandler* worker_handler() { return &workers_; }
  net::FrameHandler* hub_handler() { return &exchange_; }
  // Take over an authenticated connection built with the matching handler.
  void AdoptWorker(std::shared_ptr<net::Connection> conn, uint64_t seq);
  // A hub link's acceptor handshake is done (hub_handshake.h): `accept` is
  // the HUB_ACCEPT payload, the link's first frame to the opener.
  void AdoptHubLink(std::shared_ptr<net::Connection> conn, std::string accept);
  // Starts the links to the other racks' hubs (hierarchical topology).
  void StartHubLinks() { exchange_.Start(); }

  // Registry changes and cross-lane events (posted by the DataPlane).
  void OnWorkerLost(uint32_t handle, uint32_t member, uint64_t before_seq,
                    const std::string& why);
  void OnTenantDeleted(uint32_t handle);
  // Recovery of a tenant after an aborted iteration (DataPlane::Recover):
  // the newest version of each key here; aligning every chunk to them; the
  // PULLs held meanwhile.
  std::map<uint32_t, uint64_t> KeyVersions(uint32_t handle);
  // `round`: the cross-rack round that agreed on them (0: none), from now
  // on the tenant's LaneTenant::rack_epoch.
  void Align(uint32_t handle, const std::map<uint32_t, uint64_t>& versions, uint64_t round = 0);
  // The tenant's LaneTenant::rack_epoch raised to `round` (before a
  // round's restore: frames of older rounds are stale from then on).
  void RaiseRackEpoch(uint32_t handle, uint64_t round);
  void ReleaseParked(uint32_t handle) { workers_.ReleaseParked(handle); }
  // Rack `rack`'s hub restarted (RackExchange::OfferCopies).
  void OfferCopies(uint32_t rack) { exchange_.OfferCopies(rack); }
  // Rack `rack`'s hub left the cluster: its bounded/async relays end
  // (RackExchange::RackLost).
  void RackLost(uint32_t rack, const std::string& why) { exchange_.RackLost(rack, why); }
  // A cross-rack recovery round's RACK_VERSIONS, or a cluster checkpoint's
  // RACK_CHECKPOINT, to rack `rack` (lane 0).
  void SendRackControl(uint32_t rack, net::Opcode opcode, const std::string& payload) {
    exchange_.SendControl(rack, opcode, payload);
  }
  // Checkpoints (ChunkTable::Snapshot / Restore); Restore loads the tenant
  // from the registry if this lane has not seen it yet.
  void Snapshot(uint32_t handle, const std::shared_ptr<SnapshotJob>& job);
  uint32_t Restore(uint32_t handle, const CheckpointImage& image,
                   const std::unordered_set<uint32_t>& keys);
  // Fails the tenant's pending updates with WORKER_LOST `why`.
  void FailPending(uint32_t handle, const std::string& why);
  // LaneHost::GenerationEnded, on this lane.
  void OnGenerationEnded(uint32_t handle, uint32_t member, const WorkerGeneration& g,
                         const std::string& why, bool close);
  void OnKeyDeleted(uint32_t handle, uint32_t key_id);
  void OnOptimizerChanged(uint32_t handle, uint32_t key_id,
                          const aggregation::OptimizerConfig& optimizer, uint64_t from_update);

  // Closes the gate (timers and posted work stop), fails pending updates and
  // sends SHUTTING_DOWN to every worker, closes the hub links. The host's
  // LaneDrained(lane) runs once the last worker connection is gone (at once
  // if there is none).
  void BeginShutdown();
  // Closes what is still open without waiting for queued frames.
  void ForceClose(const std::string& why = "the hub is shutting down");
  // A crash (DataPlane::Abort): closes the gate and every worker connection
  // and hub link at once, sending nothing (queued frames are dropped, pending
  // updates are never answered), as the kernel closes a killed process's
  // sockets. The host's LaneDrained(lane) runs as after BeginShutdown.
  void Abort();
  size_t connection_count() const { return table_.connection_count(); }
  // Read-only inspection (stall_report.h). Lane thread only.
  ChunkTable& table() { return table_; }

 private:
  void ArmStragglerCheck();

  boost::asio::io_context* io_;
  LaneHost* host_;
  LaneGate gate_;
  ChunkTable table_;
  RackExchange exchange_;
  WorkerProtocol workers_;
};

}  // namespace rackhub::server
