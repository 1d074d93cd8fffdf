// ChunkTable: what one lane knows of its tenants: their worker connections,
// the keys it has seen, and the chunks it owns (tenant-wide index g with
// g % lanes == lane), each with its aggregation state and waiting requests.
// Shared by the lane's worker protocol and its rack exchange; it holds no
// connection logic of its own besides failing waiters.
//
// Ownership: the lane owns the table; chunks and connections are owned here
// (waiters hold weak references to connections).
// Threading: lane thread only. The registry's lock is taken only the first
// time a lane sees a tenant or key.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "config.h"
#include "intake_pacer.h"
#include "key_memory.h"
#include "lane_host.h"
#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/aggregation/row_shard.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"
#include "registry.h"
#include "snapshot_job.h"

namespace rackhub::server {

// A request waiting for a chunk's next version (PUSH) or initial values (PULL).
struct Waiter {
  std::weak_ptr<net::Connection> conn;
  uint64_t request_id = 0;
  // A held PULL: its reply's bytes, reserved in conn's backlog
  // (net::Connection::Reserve) until it is answered or dropped.
  size_t reserved = 0;
  // A PUSH_ROWS: the rows its reply carries (docs/wire-protocol.md).
  std::vector<uint64_t> want;
  // A held PULL: when it began to wait (a relayed one is dropped once its
  // relay expired at its hub: WorkerProtocol::DropExpiredRelayedPulls).
  // Now unless given: never "expired" at birth.
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  // A counted PUSH: its bytes in its connection's IntakePacer account while
  // it waits (empty when not paced).
  IntakeCharge intake{};
};

// Counts a chunk's hub memory (key_memory.h) in its tenant's
// memory_bytes_allocated for as long as the chunk exists. Move-only.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  MemoryCharge(std::shared_ptr<TenantCounters> counters, uint64_t bytes);
  MemoryCharge(MemoryCharge&& other) noexcept { *this = std::move(other); }
  MemoryCharge& operator=(MemoryCharge&& other) noexcept;
  ~MemoryCharge() { Release(); }

 private:
  void Release();
  std::shared_ptr<TenantCounters> counters_;
  uint64_t bytes_ = 0;
};

// A chunk of a bounded or async tenant (docs/consistency.md): each member's
// iteration count on this chunk (contributions applied), the members not
// connected to this lane (not waited for: a member counts as the slowest
// only while connected; one that connects again is brought forward to the
// slowest of the others), and, parallel to Chunk::pushes (the replies held
// back by the bound), the iteration count each held rank reached.
struct UnsyncedClocks {
  explicit UnsyncedClocks(uint32_t members) : clock(members, 0), gone(members, 0) {}
  std::vector<uint64_t> clock;  // by member
  std::vector<uint8_t> gone;    // by member
  std::vector<uint64_t> held;   // parallel to Chunk::pushes
  std::vector<std::chrono::steady_clock::time_point> held_since;  // likewise
  // The smallest clock of the members not gone (UINT64_MAX if all are).
  uint64_t Slowest() const {
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < clock.size(); ++i) {
      if (!gone[i]) m = std::min(m, clock[i]);
    }
    return m;
  }
};

// What an elastic tenant's lane keeps per chunk besides Chunk's fields: the
// membership commit (TenantRuntime::membership_commits) and generation the
// update being formed uses.
struct ElasticForming {
  uint64_t commit = UINT64_MAX;
  uint64_t generation = 0;
  uint32_t total = 0;  // the membership's member count (across racks: the cluster's)
  // Across racks (docs/elastic.md, "Across racks"): the version the chunk's
  // last update produced (its parameters since: a round only skips; known
  // at a non-home hub from RACK_PARAMS or the round's RACK_ALIGN), for
  // WorkerProtocol::AnswerCountedAcrossRacks.
  uint64_t produced = 0;
};

// Elastic tenants with hub optimizers (docs/elastic.md, "Hub optimizers"):
// a chunk's parameters (fp32 master), optimizer state and version at the
// members' last commit (COMMIT), what ROLLBACK puts back. One per chunk,
// its buffers reused from commit to commit.
struct CommitCopy {
  uint64_t version = 0;
  std::vector<float> params;
  std::vector<float> state[2];  // the optimizer's state slots in use
  uint32_t done_generation = 0;
  uint32_t done_members = 0;
};

// Elastic tenants with hub optimizers: after a member's ROLLBACK, the
// members (of that membership generation) that have not sent theirs yet.
// Their pushes to chunks with a copy are past the commit: refused with the
// rollback refusal (WorkerProtocol::CheckFence) until their own ROLLBACK,
// the next COMMIT or another membership. `rolled`: who rolled back since
// (a ROLLBACK asked again after a partial refusal starts no new fence).
struct RollbackFence {
  uint64_t generation = 0;
  uint64_t commit = 0;
  uint32_t first = 0;  // the rank whose ROLLBACK started it
  std::set<uint32_t> waiting;
  std::set<uint32_t> rolled;
};

struct Chunk {
  Chunk(aggregation::ChunkState s, uint32_t key, uint32_t index, net::DType wire_dtype)
      : state(std::move(s)), key_id(key), index_in_key(index), dtype(wire_dtype) {}

  // One rack: the whole update. Several racks, at the chunk's home hub:
  // the cross-rack stage, one fp32 rack sum per rack, then the optimizer.
  aggregation::ChunkState state;
  uint32_t key_id = 0;
  uint32_t index_in_key = 0;
  net::DType dtype = net::DType::kFp32;  // the key's wire dtype
  // Elastic tenants (docs/elastic.md): the membership generation and member
  // count of the update that produced the current version, which every
  // PARAMS carries (kFlagMembership). (Placed to fill padding: the lane's
  // per-chunk bookkeeping is bounded, key_memory.h.)
  uint32_t done_generation = 0;
  std::vector<Waiter> pushes;  // waiting for this update
  std::vector<Waiter> pulls;   // waiting for initial values
  std::chrono::steady_clock::time_point first_contribution;
  // Several racks only: the local sum of each rack served here (by rack;
  // null for racks served elsewhere), the home rack, and the reply bytes
  // (key dtype) of version v in replies[v & 1] with `version` updates done.
  std::vector<std::unique_ptr<aggregation::ChunkState>> stages;
  uint32_t home = 0;
  uint32_t done_members = 0;  // elastic: see done_generation
  uint64_t version = 0;
  std::array<aggregation::SharedAlignedBuffer<std::byte>, 2> replies;
  MemoryCharge charge;  // this chunk in its tenant's memory_bytes_allocated
  // A row-sparse table's row range: everything lives here (`state` is an
  // unused placeholder). A table spanning racks (rack_rows.cc): the rows'
  // contributors are the racks (their row sums, added in rack order at
  // `home`); every hub keeps the values in step with the home's.
  std::unique_ptr<aggregation::RowShard> rows;
  // A table spanning racks: the rows its workers pushed, by rack served
  // here (null for racks served elsewhere); null otherwise. (Behind one
  // pointer: the per-chunk bookkeeping is bounded, key_memory.h.)
  struct RackRowStages {
    std::vector<std::unique_ptr<aggregation::RowSums>> by_rack;
    // By rack: 1 + the version whose rack sum was taken from the stage (it
    // went to the home, or into the home's shard), 0 for none. Until the
    // update completes, that rack's ranks count as contributed although the
    // stage is empty again: a repeated push of the version is a retry or a
    // duplicate, never a second contribution. Cleared when the pending
    // update fails.
    std::vector<uint64_t> taken_for;
  };
  std::unique_ptr<RackRowStages> row_stages;
  // A top-k key: its sum-only replies may be sparse (params_reply.h).
  bool sparse_replies = false;
  bool elastic = false;  // a chunk of an elastic tenant
  // Bounded/async tenants only (null in sync tenants).
  std::unique_ptr<UnsyncedClocks> unsynced;
  // By member: the generation whose contribution to this chunk was counted
  // last (docs/durability.md, "Worker generations"). An update completes
  // only if each of its contributors' generations is still live.
  std::vector<std::shared_ptr<const WorkerGeneration>> contributors;


  bool table() const { return rows != nullptr; }
  bool multi_rack() const { return !stages.empty(); }  // a dense chunk spanning racks
  // Several racks, not its home (`self`): a recovery round agreed on the
  // key's `floor` (KeyRuntime) and the home's RACK_ALIGN with the values at
  // that version has not come yet (rack_realign.cc): PULLs and PULL_ROWS
  // wait in `pulls`.
  bool AwaitsAlign(uint32_t self, uint64_t floor) const {
    return (multi_rack() || rows_across_racks()) && home != self && current_version() < floor;
  }
  bool rows_across_racks() const { return row_stages != nullptr; }
  // The row contributions a worker of `rack` adds to (a table's chunk).
  aggregation::RowSums& RowStage(uint32_t rack) {
    return row_stages ? *row_stages->by_rack[rack] : rows->sums();
  }
  // Whether rank `rank` of `rack` counts in the table update being formed.
  bool RowContributed(uint32_t rack, uint32_t rank) const {
    if (!row_stages) return rows->contributed(rank);
    if (row_stages->taken_for[rack] == rows->version() + 1) return true;
    const auto& stage = row_stages->by_rack[rack];
    return stage && stage->contributed(rank);
  }
  void NoteContributor(uint32_t member, std::shared_ptr<const WorkerGeneration> g) {
    if (contributors.size() <= member) contributors.resize(member + 1);
    contributors[member] = std::move(g);
  }
  // The header of a frame about this chunk: `opcode` for tenant `tenant`
  // at `iteration`, in the key's wire dtype (no payload, no request).
  net::FrameHeader Header(net::Opcode opcode, uint32_t tenant, uint64_t iteration) const {
    net::FrameHeader h;
    h.opcode = opcode;
    h.tenant = tenant;
    h.key = key_id;
    h.chunk = index_in_key;
    h.dtype = dtype;
    h.iteration = iteration;
    return h;
  }
  // The stage a worker of `rack` contributes to.
  aggregation::ChunkState& Stage(uint32_t rack) { return stages.empty() ? state : *stages[rack]; }
  // The newest version workers can be answered with.
  uint64_t current_version() const {
    return rows ? rows->version() : multi_rack() ? version : state.version();
  }
  // Parameters of `v` in the key's wire dtype, and the reference a queued
  // reply holds to keep them alive and unchanged (see params_reply.h).
  std::span<const std::byte> reply_bytes(uint64_t v) const {
    if (multi_rack()) return {replies[v & 1].data(), replies[v & 1].size()};
    return state.wire_params(v);
  }
  std::shared_ptr<const void> reply_owner(uint64_t v) const {
    if (multi_rack()) return replies[v & 1].Share();
    return state.wire_params_ref(v);
  }
  // What one PARAMS reply of this chunk adds to a connection's backlog.
  size_t reply_frame_bytes() const {
    return net::kHeaderBytes + size_t{state.elements()} * net::DTypeBytes(dtype);
  }
};

// A PULL held while its tenant recovers (answered by ReleaseParked).
struct ParkedPull {
  std::weak_ptr<net::Connection> conn;
  net::FrameHeader header;
  std::vector<uint64_t> ids;  // PULL_ROWS: the rows asked for
  size_t reserved = 0;  // its reply's bytes, reserved in conn's backlog
};

struct LaneKey {
  KeyInfo info;
  std::shared_ptr<KeyRuntime> runtime;
};

struct LaneTenant {
  TenantInfo info;
  // This lane's figures of the tenant (info.counters->lanes.ForLane).
  TenantLaneMetrics* metrics = nullptr;
  std::map<uint32_t, std::shared_ptr<net::Connection>> conns;  // by member
  std::map<uint32_t, uint64_t> conn_seq;                      // by member
  // By member: the generation of conns[member] (TenantRuntime::Enter).
  std::map<uint32_t, std::shared_ptr<WorkerGeneration>> gens;
  std::unordered_map<uint32_t, LaneKey> keys;                 // by id
  std::unordered_map<uint64_t, std::unique_ptr<Chunk>> chunks;  // by ChunkId
  std::unordered_set<uint64_t> pending;  // chunks with some contributions
  std::shared_ptr<TenantRuntime> runtime;
  std::vector<ParkedPull> parked;      // PULLs held during a recovery (or a pause)
  // Elastic tenants: the membership as this lane last read it, and the
  // commit it was read at (TenantRuntime::membership_commits).
  std::shared_ptr<const Membership> membership;
  uint64_t membership_commit = UINT64_MAX;
  std::unordered_map<uint64_t, ElasticForming> forming;  // by ChunkId
  // Elastic tenants: the chunks with a hub optimizer at the members' last
  // commit (by ChunkId), and that commit's number (COMMIT's iteration);
  // `committed` false until the first COMMIT reached this lane.
  std::unordered_map<uint64_t, CommitCopy> commits;
  uint64_t commit_number = 0;
  bool committed = false;
  std::optional<RollbackFence> fence;
  std::unordered_set<uint32_t> leaving;  // members whose connection here said BYE
  // Chunks one version short of a checkpoint's target, by ChunkId.
  std::unordered_map<uint64_t, std::shared_ptr<SnapshotJob>> armed;
  // Across racks: the number of the last recovery round whose realignment
  // this lane did. Its RACK_SUM, RACK_PARAMS and RACK_ALIGN carry it (in
  // request_id); those of an older round are stale, those of a newer one
  // wait for that round to end here (RackExchange::Stale, HeldByRecovery).
  uint64_t rack_epoch = 0;

  // Counts an ERROR frame of `code` sent to one of the tenant's workers.
  void CountError(net::WireError code) const {
    metrics->CountError(static_cast<uint32_t>(code));
  }
};

class ChunkTable {
 public:
  ChunkTable(uint32_t lane, uint32_t lanes, const TopologyConfig& topology, Registry* registry,
             LaneHost* host);

  uint32_t lane() const { return lane_; }
  uint32_t lanes() const { return lanes_; }
  // Racks a tenant spans (1: single rack), and whether other racks' hubs
  // hold some chunks' homes (hierarchical exchange).
  uint32_t racks() const { return racks_; }
  bool exchange() const { return exchange_; }
  uint32_t self_rack() const { return self_rack_; }

  static uint64_t ChunkId(uint32_t key, uint32_t chunk) {
    return (static_cast<uint64_t>(key) << 32) | chunk;
  }
  // Workers of a tenant are indexed rack * rank_slots + rank (an elastic
  // tenant's rank_slots is its max_workers: the global rank users see).
  static uint32_t Member(const LaneTenant& t, const net::ConnectionIdentity& id) {
    return id.rack * t.info.rank_slots() + id.rank;
  }

  LaneTenant* FindTenant(uint32_t handle);
  // The tenant, loaded from the registry on first use; null if it is gone.
  LaneTenant* LoadTenant(uint32_t handle);
  // Adds a tenant this hub knows by name (rack exchange binding).
  void EnsureTenant(const TenantInfo& info);
  void EraseTenant(uint32_t handle) { tenants_.erase(handle); }
  std::unordered_map<uint32_t, LaneTenant>& tenants() { return tenants_; }

  // The key (cached, else from the registry); null if unknown.
  // Called for each chunk of a key spanning racks GetChunk makes (the
  // lane's RackExchange::OnNewChunk), after it is set up. Set once, by the
  // Lane, before any chunk is made.
  using NewChunkHook = std::function<void(LaneTenant&, LaneKey&, Chunk&)>;
  void SetNewChunkHook(NewChunkHook hook) { new_chunk_hook_ = std::move(hook); }
  LaneKey* FindKey(LaneTenant& t, uint32_t key_id);
  // The lane owning chunk `chunk` of `key`.
  uint32_t OwnerLane(const KeyInfo& key, uint32_t chunk) const {
    return static_cast<uint32_t>((key.placement.first_chunk + chunk) % lanes_);
  }
  // A worker of another rack served here through its hub's relays (a
  // RelayConnection at a chunk's home): not counted in this hub's workers.
  bool RelayedWorker(const net::ConnectionIdentity& id) const {
    return exchange_ && id.rack != self_rack_;
  }
  // The elements of chunk `chunk` of a dense key.
  static uint32_t ChunkElements(const KeyInfo& key, uint32_t chunk) {
    const uint64_t first = uint64_t{chunk} * key.chunk_elements;
    return static_cast<uint32_t>(std::min<uint64_t>(key.chunk_elements, key.elements - first));
  }
  // The rack whose hub is home to chunk `chunk` of `key` (tenant-wide index
  // g = first_chunk + chunk: rack (g / lanes) % racks; this rack in flat mode).
  uint32_t HomeRack(const KeyInfo& key, uint32_t chunk) const {
    const uint64_t g = uint64_t{key.placement.first_chunk} + chunk;
    return exchange_ ? static_cast<uint32_t>((g / lanes_) % racks_) : self_rack_;
  }
  // A bounded/async tenant's chunk homed on another rack's hub: this hub
  // keeps no state of it and relays its workers' frames there (rack_relay.cc).
  bool Relayed(const LaneTenant& t, const KeyInfo& key, uint32_t chunk) const {
    return exchange_ && t.info.consistency != Consistency::kSync &&
           HomeRack(key, chunk) != self_rack_;
  }
  // The chunk's state, created on first use with the key's optimizer
  // schedule (and, for tenants spanning racks, its stages and home).
  Chunk& GetChunk(LaneTenant& t, LaneKey& key, uint32_t chunk);

  // Several racks, a `from_client` key: the chunk's initial values arrived
  // (`payload`, the key's wire dtype: rank 0's INIT on this hub or another
  // hub's INIT frame). The home stage, the rack stages served here and the
  // version-0 reply get them, as one hub's INIT would (fp32 master, reply
  // converted back). False if the chunk already has values or the size is
  // wrong (nothing changed).
  bool SetInitialMultiRack(const LaneKey& key, Chunk& c, std::span<const std::byte> payload);

  // A contribution of an update arrived (at `now`); the first one marks the
  // chunk pending and starts the update's clock (first_contribution).
  void MarkPending(LaneTenant& t, Chunk& c,
                   std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());
  // Version `v` of the chunk is done: bookkeeping (pending, the key's
  // version, the tenant's iteration counter).
  void Completed(LaneTenant& t, LaneKey& key, Chunk& c, uint64_t v);
  // Fails every waiting push of the tenant with `code` and discards the
  // partial sums of its pending updates.
  void FailPending(LaneTenant& t, net::WireError code, const std::string& why);
  // The same for one chunk (its entry in t.pending stays).
  void FailChunk(LaneTenant& t, Chunk& c, net::WireError code, const std::string& why);
  // The newest version of each key among this lane's chunks (recovery).
  std::map<uint32_t, uint64_t> KeyVersions(const LaneTenant& t) const;
  // Brings every chunk of key k below versions[k] to versions[k] (a skipped
  // step; single-rack tenants only). REQUIRES: no update pending.
  void Align(LaneTenant& t, const std::map<uint32_t, uint64_t>& versions);
  // Checkpoints: copies this lane's chunks of each of job's keys that are at
  // the target version, arms those below it (copied by Capture when they get
  // there), fails the job (moved on) if one is past it.
  void Snapshot(LaneTenant& t, const std::shared_ptr<SnapshotJob>& job);
  // A chunk reached a new version (update, skipped step): feeds an armed job.
  void Capture(LaneTenant& t, Chunk& c);
  // Restores this lane's chunks of `keys` (ids) from a checkpoint image;
  // returns how many chunks failed to restore (logged). REQUIRES: no update
  // pending for those keys.
  uint32_t Restore(LaneTenant& t, const CheckpointImage& image,
                   const std::unordered_set<uint32_t>& keys);
  // Elastic tenants (chunk_membership.cc): the committed membership as this
  // lane last read it (one atomic load when unchanged).
  static const Membership& MembershipOf(LaneTenant& t);
  // The membership applies to the chunk's next update unless it does
  // already (ElasticForming): the members it sums, across racks the racks
  // the home adds and the mean's divisor (the cluster's total). REQUIRES:
  // nothing of the update counted yet; else FAILED_PRECONDITION (the update
  // would mix memberships), INTERNAL if the chunk refuses it.
  Status ApplyMembership(LaneTenant& t, Chunk& c);
  // Elastic tenants (chunk_commit.cc): copies every chunk of the tenant
  // with a hub optimizer whose copy is not at its version (the members'
  // commit `number`); returns how many were copied.
  uint32_t Commit(LaneTenant& t, uint64_t number);
  // A chunk of a committed elastic tenant with a hub optimizer got its
  // values only now (created for a zeros key, or INIT): its copy is taken
  // at them, so a rollback returns it to its initial values.
  void CommitNew(LaneTenant& t, const Chunk& c);
  // True for a chunk that COMMIT copies (a hub optimizer, dense, one rack).
  static bool HubOptimized(const Chunk& c);
  // Puts every chunk with a hub optimizer back to its copy (parameters,
  // optimizer state, version) unless it is at the copy's version with
  // nothing pending already; the pushes waiting on a chunk it moves fail
  // with WORKER_LOST `why` (other chunks' pushes stay). Returns "" when
  // done, else (nothing changed) the refusal naming the key and chunk that
  // has no copy or whose copy no longer fits it. REQUIRES: t.committed.
  std::string Rollback(LaneTenant& t, const std::string& why);
  // Drops the key's chunks, failing their waiting pushes.
  void DropKey(LaneTenant& t, uint32_t key_id);
  // New hyperparameters for the key's chunks from update `from_update` on.
  void ApplyOptimizer(uint32_t handle, uint32_t key_id,
                      const aggregation::OptimizerConfig& optimizer, uint64_t from_update);

  size_t connection_count() const;

 private:
  NewChunkHook new_chunk_hook_;
  void InitMultiRackChunk(LaneTenant& t, LaneKey& key, Chunk& c, uint32_t chunk);
  // A row-sparse table's row range `chunk` (rows, init, optimizer schedule).
  std::unique_ptr<Chunk> NewTableChunk(LaneTenant& t, LaneKey& key, uint32_t chunk);
  static void RestoreRackStages(const LaneKey& key, Chunk& c, std::span<const float> params);
  // Restore and Rollback: fails the armed checkpoint jobs (the tenant moved
  // on); a chunk put at another version: its bookkeeping (pending, the
  // key's version, the PULLs it now answers).
  void FailArmed(LaneTenant& t, const std::string& why);
  void Restored(LaneTenant& t, LaneKey& key, Chunk& c);
  static bool RestoreTableChunk(aggregation::RowShard& r, uint64_t version,
                                const CheckpointChunk& cc);

  const uint32_t lane_;
  const uint32_t lanes_;
  const uint32_t racks_;
  const bool exchange_;
  const uint32_t self_rack_;
  const MemoryModel memory_model_;
  Registry* registry_;
  LaneHost* host_;
  std::unordered_map<uint32_t, LaneTenant> tenants_;  // by handle
};

}  // namespace rackhub::server
