// ClusterCheckpoints: the checkpoints of tenants spanning racks
// (docs/cluster.md, "Cluster checkpoints"). A cluster checkpoint is one
// consistent cut: every hub of the tenant writes its file of the same
// sequence with every key at the same version. The hub whose admin API (or
// whose trigger: rack 0's) asks coordinates over lane 0's hub links
// (RACK_CHECKPOINT, docs/wire-protocol.md section 7c):
//   1. QUERY every other hub: each key's newest version there and the
//      sequences of its checkpoint files.
//   2. The sequence is 1 + the newest any hub has; each key's target is the
//      newest version any hub has (two ahead on a retry: training moved on
//      meanwhile).
//   3. PREPARE: every hub (this one too) copies its chunks at the targets
//      (Checkpointer::WriteCut) and writes its file; each answers once it is
//      durable, or why not.
//   4. All answered OK: done. Otherwise ABORT: every hub deletes the
//      sequence. A hub that misses the ABORT keeps a file the others do not
//      have, which no restore picks: restores take a sequence every hub has.
// Restores are recovery rounds (rack_recovery.h): the coordinator's round
// report asks for the sequence, and every hub loads its own file of it. A
// hub restarted from a checkpoint asks for the newest one every hub has
// (DataPlane::ResumeAcrossRacks, from Checkpointer::RestoreAll).
//
// Ownership: the Checkpointer owns it and calls Create / Restore with its
// mutex held; it lends the DataPlane its hooks and takes them back (waiting
// for calls in progress) in its destructor.
// Threading: Create / Restore on the Checkpointer's callers' threads;
// frames from other hubs arrive on lane 0 (never blocked) and their requests
// are served on this object's own thread (they wait on the lanes and write
// files).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "checkpoint_file.h"
#include "config.h"
#include "rackhub/common/status.h"
#include "registry.h"

namespace rackhub::data::v1 {
class RackCheckpoint;
}

namespace rackhub::server {

class Checkpointer;
class DataPlane;

class ClusterCheckpoints {
 public:
  ClusterCheckpoints(const Config& config, Registry* registry, DataPlane* data,
                     Checkpointer* owner);
  ~ClusterCheckpoints();
  ClusterCheckpoints(const ClusterCheckpoints&) = delete;
  // Shutdown, before the data plane stops: Cancel first (no more requests
  // are served: queued and new ones are answered UNAVAILABLE, a coordinator
  // waiting here gives up, the copy in progress fails), then Stop (the
  // DataPlane's hooks are taken back, the threads joined). Idempotent.
  void Cancel();
  void Stop();
  ClusterCheckpoints& operator=(const ClusterCheckpoints&) = delete;

  // A cluster checkpoint of `tenant` (steps above); the local file's info.
  // Fails naming the rack whose hub did not answer or could not write, and
  // then no hub keeps the sequence. REQUIRES the owner's mutex.
  Result<CheckpointInfo> Create(const TenantInfo& tenant, std::chrono::milliseconds timeout);
  // Every hub back to checkpoint `sequence` (0: the newest every hub has).
  // REQUIRES the owner's mutex.
  Result<CheckpointInfo> Restore(const TenantInfo& tenant, uint64_t sequence,
                                 std::chrono::milliseconds timeout);

  // How long a hub has to answer a QUERY (a hub that does not is down or cut
  // off), and how long after the copy's deadline a PREPARE may take to write.
  static constexpr auto kQueryTimeout = std::chrono::seconds(5);
  static constexpr auto kWriteGrace = std::chrono::seconds(60);
  // The longest copy a PREPARE may ask for (and a coordinator wait for).
  static constexpr auto kMaxCopy = std::chrono::minutes(10);

 private:
  using Message = rackhub::data::v1::RackCheckpoint;
  using Clock = std::chrono::steady_clock;
  struct Pending {
    int reply_op = 0;  // the op its replies have
    std::string tenant;
    uint64_t sequence = 0;
    std::map<uint32_t, std::string> replies;  // by rack, serialized
  };

  // Lane 0: a frame from another hub. Replies are filed for the waiting
  // coordinator (if they match its request); QUERYs are queued for one
  // thread, PREPAREs and ABORTs for another (a long PREPARE never delays
  // another coordinator's QUERY).
  void OnMessage(uint32_t rack, std::string payload);
  using Queue = std::deque<std::pair<uint32_t, std::string>>;
  void Serve(Queue* queue);
  // A request from rack `rack`'s hub (QUERY, PREPARE, ABORT); answers it.
  void Answer(uint32_t rack, const Message& request);
  // Sends `request` to every other hub (its request id set here).
  uint64_t Send(Message& request);
  // The replies to request `id` (by rack) once every other hub answered or
  // at `deadline`; a rack missing from the map did not answer.
  std::map<uint32_t, Message> Await(uint64_t id, Clock::time_point deadline);
  // Every other hub's reply to a QUERY of `tenant`, or an error naming the
  // first that did not answer (or failed).
  Result<std::map<uint32_t, Message>> QueryAll(const TenantInfo& tenant,
                                               Clock::time_point deadline);
  // A request that will not be served (the hub stops): UNAVAILABLE.
  void AnswerStopping(uint32_t rack, const Message& request);
  // After a restore here in `round`: every other hub restored `sequence`
  // in that round too (asked until `deadline`), or why not.
  Status ConfirmRestored(const TenantInfo& tenant, uint64_t round, uint64_t sequence,
                         Clock::time_point deadline);
  // Deletes checkpoint `sequence` of `tenant` on every hub (a failed cut;
  // `prepare`: the PREPARE's request id, which the hubs check).
  void AbortAll(const TenantInfo& tenant, uint64_t sequence, uint64_t prepare, bool here);
  std::string TenantDir(const TenantInfo& tenant) const;

  const Config config_;
  Registry* registry_;
  DataPlane* data_;
  Checkpointer* owner_;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_request_ = 0;                 // GUARDED_BY(mu_)
  std::map<uint64_t, Pending> pending_;       // GUARDED_BY(mu_): by request id
  Queue queries_;                             // GUARDED_BY(mu_)
  Queue requests_;                            // GUARDED_BY(mu_): PREPARE, ABORT
  bool stopping_ = false;                     // GUARDED_BY(mu_)
  // By handle: the (round, sequence) of the last restore here.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> installed_;  // GUARDED_BY(mu_)
  // PREPAREs this hub wrote, by (rack, request): the sequence an ABORT of
  // that request may delete (no other).
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> prepared_;  // GUARDED_BY(mu_)
  std::deque<std::pair<uint32_t, uint64_t>> prepared_order_;     // GUARDED_BY(mu_): oldest first
  static constexpr size_t kRememberPrepared = 64;
  std::thread query_server_;
  std::thread server_;
};

}  // namespace rackhub::server
