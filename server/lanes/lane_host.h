// The narrow interface a lane uses to reach hub-wide state (implemented by
// DataPlane). Lanes include this header, never data_plane.h, so the data
// plane can own the lanes without an include cycle.
//
// Threading: every member may be called from any lane thread; the
// implementation synchronizes (atomics, a concurrent map, LaneSet::Post).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rackhub/common/status.h"
#include "rackhub/net/connector.h"

namespace rackhub::server {

struct TenantInfo;  // state/registry.h

// Key-wide facts shared by the lanes that hold the key's chunks.
struct KeyRuntime {
  // Updates applied to the key's chunk 0 (written by its lane, read by the
  // lane answering DECLARE/WELCOME).
  std::atomic<uint64_t> version{0};
  std::atomic<uint64_t> initialized_chunks{0};
  // Every chunk of the key is at this version or later (raised by recovery
  // after an aborted iteration and by a checkpoint restore): a chunk created
  // later starts here.
  std::atomic<uint64_t> floor{0};
};

// One process of a rank: the connections, on every lane, of one client
// session (Hello.session), reconnects included (docs/durability.md, "Worker
// generations"). Created by TenantRuntime::Enter on a lane adopting a
// connection; shared by the lanes' connection records and the chunks its
// contributions are pending in. `ended` is set once, by the lane that sees
// the generation end (a lost connection, a BYE, or a new session of the same
// rank) and read by every lane on each contribution.
struct WorkerGeneration {
  uint64_t session = 0;
  uint64_t number = 0;  // 1 for a rank's first process, +1 per new session
  std::atomic<bool> ended{false};
  // Elastic tenants: the lanes this generation is connected on (adoptions
  // minus closes); it is present for the membership on every lane.
  std::atomic<uint32_t> lanes{0};
  // Sets `ended`; true for the one call that did.
  bool End() { return !ended.exchange(true, std::memory_order_acq_rel); }
  bool live() const { return !ended.load(std::memory_order_acquire); }
};

// The membership of an elastic tenant (docs/elastic.md): the ranks every
// update started from now on sums. Committed by the data plane at the end of
// a recovery (no update of the tenant pending anywhere, no push accepted),
// so an update never mixes two memberships.
//
// Across racks (docs/elastic.md, "Across racks"): each hub holds its own
// rack's ranks in `member` and `count`; the cluster's membership (every
// rack's count, `total`, the generation) is agreed by a recovery round
// (rack_recovery.h) and is the same on every hub.
struct Membership {
  uint64_t generation = 0;     // 0: the start quorum was never reached
  std::vector<uint8_t> member;  // by rank of this hub's rack: 1 = member
  uint32_t count = 0;           // this hub's members
  uint32_t total = 0;           // the cluster's members (= count on one hub)
  // Across racks: by rack, 1 = the rack has members (its sum is added);
  // empty on one hub.
  std::vector<uint8_t> racks;
  uint64_t round = 0;  // across racks: the recovery round that committed it
  // Fewer members than min_workers (or the start quorum not reached yet):
  // pushes are refused (WORKER_LOST "paused") and PULLs held.
  bool paused = true;
  bool has(uint32_t rank) const { return rank < member.size() && member[rank] != 0; }
};

// Tenant-wide facts shared by the lanes.
struct TenantRuntime {
  TenantRuntime() : membership_(std::make_shared<const Membership>()) {}

  // Recoveries in progress (LaneHost::WorkerLost / AbortIteration): while
  // non-zero, PUSHes are refused (non-fatal WORKER_LOST) and PULLs are held
  // until every chunk is at its key's version again.
  std::atomic<uint32_t> recovering{0};
  // Checkpoint restores into the lanes, as a seqlock (Checkpointer::Install:
  // +1 before, +1 after; odd while one runs): a checkpoint copy taken
  // across a restore mixes two timelines and is void.
  std::atomic<uint64_t> restores{0};

  // Elastic tenants: the committed membership (a snapshot; lanes compare
  // `membership_generation` first, so the per-push cost is one atomic load).
  std::atomic<uint64_t> membership_generation{0};
  std::atomic<uint64_t> membership_commits{0};  // +1 per CommitMembership
  std::shared_ptr<const Membership> membership() const {
    std::lock_guard lock(mu_);
    return membership_;
  }
  void CommitMembership(std::shared_ptr<const Membership> m) {
    std::lock_guard lock(mu_);
    membership_ = std::move(m);
    membership_generation.store(membership_->generation, std::memory_order_release);
    membership_commits.fetch_add(1, std::memory_order_acq_rel);
  }
  // Elastic tenants: the ranks of members `first`..`first + slots - 1` (a
  // rack's ranks: first = rack * slots) present, i.e. whose current
  // generation lives and is connected on every one of `lanes` lanes.
  std::vector<uint8_t> Present(uint32_t first, uint32_t slots, uint32_t lanes) const {
    std::lock_guard lock(mu_);
    std::vector<uint8_t> out(slots, 0);
    for (const auto& [m, g] : generations_) {
      if (m < first || m - first >= slots || !g) continue;
      out[m - first] = g->live() && g->lanes.load(std::memory_order_acquire) >= lanes ? 1 : 0;
    }
    return out;
  }

  // Recovery rounds' agreed versions of keys this hub does not have yet
  // (across racks: a home whose rack never declared them): the key's floor
  // once it is declared here (DataPlane::KeyRuntimeFor). Per key id, the
  // newest round's (a rollback round's is lower than an earlier round's;
  // `round` 0: one hub, kept only if no round's is); at most the key ids the
  // rounds' reports carry, until the tenant is deleted.
  void PendFloor(uint32_t key, uint64_t v, uint64_t round) {
    std::lock_guard lock(mu_);
    auto& [at, f] = pending_floors_[key];
    if (round >= at) {
      at = round;
      f = v;
    }
  }
  uint64_t TakeFloor(uint32_t key) {
    std::lock_guard lock(mu_);
    const auto it = pending_floors_.find(key);
    if (it == pending_floors_.end()) return 0;
    const uint64_t v = it->second.second;
    pending_floors_.erase(it);
    return v;
  }

  // Why the newest recovery started (named in the refusals while it runs).
  // Not on the per-chunk path: read only to refuse a push.
  void SetCause(std::string why) {
    std::lock_guard lock(mu_);
    cause_ = std::move(why);
  }
  std::string cause() const {
    std::lock_guard lock(mu_);
    return cause_;
  }

  // Failed pushes (docs/durability.md, Recovery). When the hub fails or
  // refuses (non-fatal) a member's push of a key for an iteration, other
  // chunks of that PushPull may already be counted, on other lanes, or still
  // arrive. The client Pulls and pushes the same iteration again; for those
  // chunks the hub keeps the first contribution and answers the new push
  // with the chunk's result (instead of a fatal DUPLICATE_PUSH). Not on the
  // per-chunk path: consulted only when a rank pushes a chunk twice.
  // Only the same session (process) may claim it: a replacement of the rank
  // never inherits its predecessor's failed pushes.
  void PushFailed(uint32_t member, uint64_t session, uint32_t key, uint64_t iteration) {
    std::lock_guard lock(mu_);
    failed_[{member, key}] = {iteration, session};
  }
  bool PushFailedAt(uint32_t member, uint64_t session, uint32_t key, uint64_t iteration) const {
    std::lock_guard lock(mu_);
    const auto it = failed_.find({member, key});
    return it != failed_.end() && it->second.first == iteration && it->second.second == session;
  }

  // The generation of a connection of `member` whose HELLO named `session`
  // (docs/durability.md, "Worker generations"): the member's current one
  // while it lives and names the same session (another lane, or a reconnect,
  // of the same process); after it ended, a new one with the same number for
  // the same session (the process reconnecting after a lost connection);
  // for another session, the next number. In that last case the member's
  // previous generation, if still live, is returned in *replaced (not yet
  // ended: the caller ends it and tells every lane). Session 0 (a client
  // naming none: raw test clients) cannot be told from another process: each
  // such connection is a generation of its own (as before generations), and
  // replaces nothing. Not on the per-chunk path: called when a lane adopts a
  // connection.
  std::shared_ptr<WorkerGeneration> Enter(uint32_t member, uint64_t session,
                                          std::shared_ptr<WorkerGeneration>* replaced) {
    std::lock_guard lock(mu_);
    if (session == 0) {
      auto own = std::make_shared<WorkerGeneration>();
      own->number = 0;
      return own;
    }
    std::shared_ptr<WorkerGeneration>& cur = generations_[member];
    if (cur && cur->session == session && cur->live()) return cur;
    auto next = std::make_shared<WorkerGeneration>();
    next->session = session;
    next->number = !cur ? 1 : cur->session == session ? cur->number : cur->number + 1;
    if (cur && cur->live()) *replaced = cur;
    cur = next;
    return next;
  }

 private:
  mutable std::mutex mu_;
  std::string cause_;  // GUARDED_BY(mu_)
  // (member, key) -> the iteration and session of its newest failed push.
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, uint64_t>> failed_;  // GUARDED_BY(mu_)
  // member -> its newest generation.
  std::map<uint32_t, std::shared_ptr<WorkerGeneration>> generations_;  // GUARDED_BY(mu_)
  std::shared_ptr<const Membership> membership_;  // GUARDED_BY(mu_)
  // key id -> (round, agreed version).
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> pending_floors_;  // GUARDED_BY(mu_)
};

class LaneHost {
 public:
  virtual ~LaneHost() = default;

  // The runtime of (tenant handle, key id), created on first use.
  virtual std::shared_ptr<KeyRuntime> KeyRuntimeFor(uint32_t handle, uint32_t key_id) = 0;
  // Across racks: key `key_id` was just declared on this hub from another
  // hub's KEY_BIND (RackExchange::AdoptKey). If a recovery round agreed on a
  // version of it before (TenantRuntime::PendFloor), every lane brings the
  // chunks it is home to there and sends them to the other racks.
  virtual void KeyAdopted(uint32_t handle, uint32_t key_id) = 0;
  // Counts an initialized chunk; marks the key ready when all are.
  virtual void ChunkInitialized(uint32_t handle, uint32_t key_id, uint64_t chunk_count) = 0;
  virtual std::shared_ptr<TenantRuntime> TenantRuntimeFor(uint32_t handle) = 0;
  // A worker connection of tenant `handle`, member `member` (rack * W + rank)
  // closed on lane `from_lane` without BYE: every other lane fails the
  // tenant's pending updates and closes that worker's older connections,
  // then the tenant is recovered (AbortIteration). Returns the sequence
  // bound ("adopted before") the calling lane applies itself, at once, so its
  // own failures name this cause even if another lane's reaction arrives
  // first.
  virtual uint64_t WorkerLost(uint32_t handle, uint32_t member, const std::string& why,
                              uint32_t from_lane) = 0;
  // The tenant's iteration in progress is aborted (a straggler, or a
  // contribution of a generation that ended): every lane fails its pending
  // updates with WORKER_LOST `why`; then every chunk of every key is brought
  // to its key's newest version as a skipped step (docs/durability.md,
  // Recovery), and held PULLs are answered. `straggler`: counted in the
  // tenant's stragglers. `own_round` (a hub link lost: its frames are lost,
  // and the peer may not know yet): across racks, a recovery round of its
  // own even if a round ends meanwhile (DataPlane::Recover).
  virtual void AbortIteration(uint32_t handle, const std::string& why, bool straggler,
                              bool own_round = false) = 0;
  // Generation `g` of member `member` ended without a lost connection (a BYE,
  // or a new session of the rank): every lane aborts the tenant's iteration
  // if one of its pending updates holds a contribution of `g`, and, with
  // `close`, closes its connections of `g` (WorkerProtocol::OnGenerationEnded).
  virtual void GenerationEnded(uint32_t handle, uint32_t member,
                               std::shared_ptr<const WorkerGeneration> g, const std::string& why,
                               bool close) = 0;
  // Elastic tenants (docs/elastic.md): the ranks present changed (a rank is
  // now connected on every lane, or a member left): every lane fails the
  // tenant's pending updates with WORKER_LOST `why`, every chunk is brought
  // to its key's version (as AbortIteration), then the membership of the
  // ranks present is committed and the held PULLs are answered.
  virtual void MembershipChanged(uint32_t handle, const std::string& why) = 0;
  // Sequence number for a newly adopted worker connection.
  virtual uint64_t NextSeq() = 0;
  // A tenant spanning racks: this hub process's random incarnation, which
  // its WELCOMEs carry (a client that reconnects to another one Pulls every
  // key before it pushes again); 0 for other tenants.
  virtual uint64_t WelcomeIncarnation(const TenantInfo& info) const = 0;

  // Rack exchange: the hub secret (topology.secret_file), the transport for
  // outgoing hub links, and per-peer-rack byte counters.
  virtual const std::string& hub_secret() const = 0;
  virtual net::Connector& hub_connector() = 0;
  virtual void CountRackBytes(uint32_t rack, uint64_t out, uint64_t in) = 0;
  // RACK_SUM / RACK_PARAMS frames (header + payload) queued to `rack`.
  virtual void CountRackChunkBytes(uint32_t rack, uint64_t out) = 0;
  // Cross-rack recovery rounds (rack_recovery.h), from lane 0's links: a
  // RACK_VERSIONS from rack `rack`'s hub (an error names what is wrong with
  // it), and lane 0's outgoing link to `rack` being up (again).
  virtual Status OnRackVersions(uint32_t rack, std::span<const std::byte> payload) = 0;
  // A RACK_CHECKPOINT from rack `rack`'s hub (lane 0's link): for the
  // Checkpointer (cluster checkpoints); never blocks.
  virtual void OnRackCheckpoint(uint32_t rack, std::span<const std::byte> payload) = 0;
  virtual void RackLinkUp(uint32_t rack) = 0;
  // Lane 0, periodically: reports of rounds still waiting go again.
  virtual void ResendRackReports() = 0;

  // Shutdown: the lane has closed its last connection.
  virtual void LaneDrained(uint32_t lane) = 0;
  // True from the moment the hub begins to shut down, before every lane has
  // heard (lanes close one after another, and a worker that got SHUTTING_DOWN
  // on one lane closes its others at once): a connection lost meanwhile is
  // part of the shutdown, not a lost worker. Any thread.
  virtual bool stopping() const = 0;

  // Runs `fn` on a thread that may block (a registry write to etcd), never
  // on a lane. `fn` must hold a LaneGate-wrapped handler for whatever it
  // reports back to a lane. Any thread.
  virtual void RunBlocking(std::function<void()> fn) = 0;
};

}  // namespace rackhub::server
