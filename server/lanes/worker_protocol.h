// WorkerProtocol: one lane's side of the worker connections: adoption after
// HELLO (WELCOME), header checks before a payload is read, and one function
// per opcode (PUSH, INIT, PULL, DECLARE, SET_OPTIMIZER, HEARTBEAT, BYE).
// Completed updates are answered through params_reply.h; a tenant spanning
// racks hands its rack sums to the RackExchange. The transport is whatever
// net::Connection the acceptor built: this code never sees a socket.
//
// Ownership: the Lane owns it; it borrows the lane's ChunkTable, gate and
// exchange, and the hub's Registry and LaneHost (all outlive it).
// Threading: lane thread only (FrameHandler callbacks and the lane's posts).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chunk_table.h"
#include "config.h"
#include "fair_scheduler.h"
#include "intake_pacer.h"
#include "lane_gate.h"
#include "lane_host.h"
#include "rackhub/common/status.h"
#include "rackhub/net/frame.h"
#include "rackhub/net/transport.h"
#include "registry.h"

namespace rackhub::server {

class RackExchange;

// The SendLimits of a worker connection of a tenant with `chunk_bytes`
// chunks: data.max_queued_bytes_per_connection, but at least four reply
// frames; reading pauses above half of it.
net::SendLimits WorkerSendLimits(const DataConfig& config, uint32_t chunk_bytes);

class WorkerProtocol final : public net::FrameHandler {
 public:
  WorkerProtocol(const DataConfig& config, ChunkTable* table, Registry* registry, LaneHost* host,
                 LaneGate* gate, RackExchange* exchange);

  // Takes over an authenticated worker connection (built with this handler):
  // sends WELCOME and starts it. A rank still connected on this lane is
  // waited for (its close may be in flight) for a bounded time.
  void Adopt(std::shared_ptr<net::Connection> conn, uint64_t seq);

  // net::FrameHandler.
  Verdict AcceptHeader(net::Connection& conn, const net::FrameHeader& h) override;
  void HandleFrame(net::Connection& conn, const net::FrameHeader& h,
                   std::span<const std::byte> payload) override;
  void OnConnectionClosed(net::Connection& conn, const std::string& why) override;
  void OnBytesSent(net::Connection& conn, size_t bytes) override;

  // A connection of member `member` adopted with sequence < `before_seq` was
  // lost: close this lane's older connections of that member and fail the
  // tenant's pending updates.
  void OnWorkerLost(uint32_t handle, uint32_t member, uint64_t before_seq,
                    const std::string& why);
  // LaneHost::GenerationEnded on this lane: aborts the tenant's iteration if
  // a pending update here holds a contribution of `g`; with `close`, closes
  // this lane's connection of `g`.
  void OnGenerationEnded(uint32_t handle, uint32_t member, const WorkerGeneration& g,
                         const std::string& why, bool close);
  // Aborts the tenant's iteration (LaneHost::AbortIteration) when an update's
  // first contribution is older than the straggler timeout.
  void CheckStragglers();
  // The tenant's recovery finished: answers the PULLs held meanwhile.
  void ReleaseParked(uint32_t handle);
  // Fatal `code` to every worker connection of the tenant (or all tenants).
  void CloseTenant(LaneTenant& t, net::WireError code, const std::string& text);
  void CloseAll(net::WireError code, const std::string& text);
  // After a big release (a connection with a large backlog closed, a key or
  // tenant deleted): hands the freed heap back to the system shortly
  // (malloc_trim; glibc keeps freed chunks inside its arenas otherwise), at
  // most once per kTrimDelay.
  void TrimMemorySoon();
  // The lane's scheduler of its workers' frames; null with data.scheduler =
  // "fifo" (frames are handled as they arrive).
  FairScheduler* scheduler() { return scheduler_.get(); }

 private:
  void AdoptOrRetry(std::shared_ptr<net::Connection> conn, uint64_t seq, int retries_left);
  // Non-fatal refusal: ERROR without closing; the payload is dropped.
  Verdict Refuse(net::Connection& conn, net::WireError code, const std::string& text,
                 uint64_t request_id);
  // Fatal refusal: ERROR, then the connection closes.
  Verdict Reject(net::Connection& conn, net::WireError code, const std::string& text,
                 uint64_t request_id);
  // Non-fatal BAD_ITERATION whose header carries the chunk's `current`
  // version (the worker resynchronizes with a Pull).
  void RefuseIteration(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                       uint64_t current, const std::string& text);
  // AcceptHeader, by kind of frame.
  Verdict CheckChunkFrame(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  Verdict CheckInit(net::Connection& conn, const KeyInfo& k, Chunk& c,
                    const net::FrameHeader& h);
  Verdict CheckPush(net::Connection& conn, LaneTenant& t, const KeyInfo& k, Chunk& c,
                    const net::FrameHeader& h);
  // Bounded/async tenants (unsynced_protocol.cc, docs/consistency.md): a
  // PUSH's iteration is the worker's own count on the chunk (or the one
  // before, a retry of an applied push: answered, not applied again).
  Verdict CheckUnsyncedPush(net::Connection& conn, LaneTenant& t, const KeyInfo& k, Chunk& c,
                            const net::FrameHeader& h);
  // Applies the contribution at once, then answers it unless the bound
  // holds it back (`sparse`: the parsed sparse payload, else dense).
  void OnUnsyncedPush(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
                      const net::FrameHeader& h, std::span<const std::byte> payload,
                      const net::SparsePayload* sparse);
  // Answers the held replies the bound now allows (and drops those of
  // closed connections).
  void ReleaseHeld(LaneTenant& t, Chunk& c);
  // A member's connection to this lane closed / was adopted.
  void UnsyncedMemberGone(LaneTenant& t, uint32_t member);
  void UnsyncedMemberBack(LaneTenant& t, uint32_t member);
  // Fails held replies older than the straggler timeout, naming the ranks
  // they wait for.
  void CheckHeldReplies(LaneTenant& t, std::chrono::steady_clock::time_point now);
  // PUSH_ROWS / PULL_ROWS of a table's chunk (table_protocol.cc).
  Verdict CheckRowsFrame(net::Connection& conn, LaneTenant& t, const LaneKey& key, Chunk& c,
                         const net::FrameHeader& h);
  // Parses and checks a row request's payload: OK, or INVALID_ARGUMENT with
  // the refusal's text. `contributor`: the rank whose new contribution it is
  // (PUSH_ROWS).
  Status CheckRowsPayload(const Chunk& c, const KeyInfo& k, const net::FrameHeader& h,
                          std::span<const std::byte> payload, std::optional<uint32_t> contributor,
                          net::RowsPayload* rows);

  // What the opcode handlers share (worker_data.cc). Each one that can fail
  // has answered the frame when it returns null / false.
  // The key of `h`, or null after a fatal TENANT_GONE (deleted since
  // AcceptHeader).
  LaneKey* KeyOrReject(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  // Where a PUSH or PUSH_ROWS whose payload is in goes: its key, its chunk
  // and the connection's generation; all null after the frame was refused
  // (the key was deleted: KeyOrReject; the generation ended while the
  // payload was read: RefuseEnded).
  struct Contribution {
    LaneKey* key = nullptr;
    Chunk* chunk = nullptr;
    const std::shared_ptr<WorkerGeneration>* gen = nullptr;
  };
  Contribution ContributionOf(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  // A PUSH or PUSH_ROWS whose payload is in: true if its iteration is still
  // the chunk's `version`, it is no duplicate (`again`: the rank already
  // contributed, allowed only as the retry of a failed push) and no
  // recovery runs; else false after a BAD_ITERATION telling the worker to
  // Pull the `what` ("key", "table").
  bool StillCurrent(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                    uint64_t version, bool again, const char* what);
  // An elastic chunk spanning racks, after a round cut an update that the
  // home completed (its answer reached one rack's workers, not another's):
  // a push at the chunk's version of a process whose PushPull of that
  // update's iteration failed (TenantRuntime::PushFailed) and that
  // contributed to the chunk (a member of the update: counted in it) gets
  // that update's result, the chunk's parameters (the round only skipped
  // since: ElasticForming::produced), instead of being counted again, as
  // the ranks of the rack that got the answer moved on. True if it answered.
  bool AnswerCountedAcrossRacks(net::Connection& conn, LaneTenant& t, Chunk& c,
                                const net::FrameHeader& h);
  // Both: this connection's process, still live, made the chunk's newest
  // counted contribution of its member, and its PushPull of `key` at
  // `iteration` failed (TenantRuntime::PushFailedAt).
  bool FailedAfterCounted(net::Connection& conn, LaneTenant& t, const Chunk& c, uint32_t key,
                          uint64_t iteration);
  // A PUSH one version behind a one-rack dense chunk of a sync tenant that
  // retries a failed PushPull (TenantRuntime::PushFailed) whose earlier push
  // of this chunk was counted in the update that produced the chunk's
  // version: the other ranks completed that update between the worker's
  // Pull and its retry. Answered with that update's parameters, as a retry
  // of a chunk still pending is (OnPush), and true; false (nothing sent)
  // when the push is not such a retry. Counted means: this connection's
  // generation, still live, made the chunk's newest counted contribution
  // of this member, and the version came from an update (not a recovery's
  // skipped step or a restore); a live generation is a member of every
  // update from its first contribution on (docs/elastic.md), so it
  // contributed to that update.
  bool AnswerCountedRetry(net::Connection& conn, LaneTenant& t, Chunk& c,
                          const net::FrameHeader& h);
  // A PUSH one version behind its rack's stage of a dense chunk spanning
  // racks (sync, not elastic) whose update of that version is still under
  // way: the stage completed (every rank of the rack counted: a sync stage
  // completes with all of them) and its sum went to the home. Such a push
  // retries a PushPull that failed after this chunk's push was counted
  // (another chunk's push was refused: TenantRuntime::PushFailed), by this
  // process (FailedAfterCounted). While that update is pending here and no
  // recovery runs, it waits for the update's result like the pushes counted
  // in it (with the counted push's own waiter, at most two per connection)
  // and true; false (nothing done)
  // otherwise. Without
  // it the retry was refused as stale, and the worker's Pull gave the same
  // version again, until the update ended.
  bool WaitCountedAcrossRacks(net::Connection& conn, LaneTenant& t, Chunk& c,
                              const net::FrameHeader& h);
  // Before the payload: a PUSH or PUSH_ROWS while the tenant recovers is a
  // failed push, refused with WORKER_LOST (Pull the `what` and push the
  // next iteration).
  Verdict RefuseRecovering(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                           const char* what);
  // An applied contribution of `member` (generation `gen`) to `c`: counts
  // it (metrics, pending, the rank's latency) and queues the push for the
  // update's reply (`want`: the rows a PUSH_ROWS asks back).
  // Workers in step (IntakePacer): the push of waiter `w` (its last in
  // c.pushes) waits for its update: charged to its connection's lead; a
  // hold it starts is checked for progress (ArmPacerCheck).
  void Pace(net::Connection& conn, LaneTenant& t, Waiter& w, size_t payload_bytes);
  // Releases the holds without progress for the pacer's max_hold (and
  // those ahead for its max_age), checked every quarter of max_hold while
  // any connection is held.
  void ArmPacerCheck();
  void CountContribution(net::Connection& conn, LaneTenant& t, Chunk& c, uint32_t member,
                         const std::shared_ptr<WorkerGeneration>& gen, const net::FrameHeader& h,
                         size_t payload_bytes, std::vector<uint64_t> want);
  // Elastic tenants (docs/elastic.md; worker_elastic.cc). The tenant's
  // committed membership as this lane last read it (refreshed when a new
  // one was committed).
  const Membership& CurrentMembership(LaneTenant& t);
  // True while PULLs are held: a recovery runs, or an elastic tenant is
  // paused.
  bool Holding(LaneTenant& t);
  // Before the payload: a PUSH of a paused tenant or of a rank that is not
  // a member is a failed push (non-fatal WORKER_LOST); kAccept otherwise.
  Verdict CheckMember(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  // With the payload, before it is counted: CheckMember again (a
  // membership may have been committed meanwhile), then the chunk's update
  // takes the membership if it has no contribution yet. False after a
  // refusal.
  bool ApplyMembership(net::Connection& conn, LaneTenant& t, Chunk& c, const net::FrameHeader& h);
  // A push to a chunk with a hub optimizer by a member that has not rolled
  // back while another member did (LaneTenant::fence): a failed push
  // (non-fatal WORKER_LOST opening with net::kRollbackRefusal); kAccept
  // otherwise.
  Verdict CheckFence(net::Connection& conn, LaneTenant& t, const Chunk& c,
                     const net::FrameHeader& h);
  // A member's ROLLBACK succeeded on this lane: starts the fence or takes
  // the member off it.
  void Fence(LaneTenant& t, uint32_t rank);
  // A member's generation is connected on one more lane / one fewer.
  void ElasticAdopted(LaneTenant& t, uint32_t member, WorkerGeneration& g);
  // Straggler timeout of an elastic tenant: the members that did not push
  // `c` are removed (their generation ends, their connections get a fatal
  // WORKER_LOST) and the iteration is aborted without them. Across racks,
  // this rack's members only, none if this rack's sum of `c` is in; true if
  // it removed one.
  bool RemoveStragglers(LaneTenant& t, Chunk& c, const std::string& why);

  // A PULL or PULL_ROWS while the tenant recovers: held (ParkedPull, its
  // reply's `reply_bytes` reserved on the connection) until ReleaseParked,
  // or refused when too many are held.
  void Park(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
            std::vector<uint64_t> ids, size_t reply_bytes);

  // One per opcode (AcceptHeader has vetted the header).
  void OnPush(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
              std::span<const std::byte> payload);
  void OnInit(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
              std::span<const std::byte> payload);
  void OnPull(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  // Before another rack's PULL joins `c`'s waiters for initial values: the
  // relayed waiters older than the relay deadline (their hubs failed those
  // relays and would drop the answers) and the waiters of closed
  // connections are dropped, so a worker that Pulls again after each
  // failure does not pile up answers for the INIT.
  void DropExpiredRelayedPulls(const LaneKey& key, Chunk& c);
  void OnDeclare(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                 std::span<const std::byte> payload);
  // The KEY_INFO (or ERROR) answering a DECLARE (worker_control.cc).
  void AnswerDeclare(net::Connection& conn, uint32_t handle, uint64_t request_id,
                     const Status& s, const KeyInfo& info, bool created);
  void OnSetOptimizer(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                      std::span<const std::byte> payload);
  void OnHeartbeat(net::Connection& conn, const net::FrameHeader& h);
  // COMMIT / ROLLBACK of an elastic tenant (worker_elastic.cc; ChunkTable::
  // Commit and Rollback): ACK with the lane's commit number, or a
  // non-fatal INVALID_ARGUMENT naming the problem.
  void OnCommitFrame(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  void OnPushRows(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                  std::span<const std::byte> payload);
  void OnPullRows(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h,
                  std::span<const std::byte> payload);
  // A PULL_ROWS held during a recovery, answered now.
  // A PULL_ROWS of a table chunk spanning racks whose home's values after a
  // recovery round are not here yet (Chunk::AwaitsAlign): held in the
  // chunk's `pulls` (true; answered by RackExchange::OnAlign).
  bool HoldForAlign(net::Connection& conn, const LaneKey& key, Chunk& c, uint64_t request_id,
                    const std::vector<uint64_t>& ids);
  // A PUSH_ROWS of such a chunk is refused (BAD_ITERATION carrying the
  // agreed version; true): the rows here are not the agreed version's yet.
  bool RefuseBeforeAlign(net::Connection& conn, LaneTenant& t, const LaneKey& key, const Chunk& c,
                         const net::FrameHeader& h);
  void ReleaseParkedRows(net::Connection& conn, LaneTenant& t, const ParkedPull& p);

  std::string WelcomePayload(const LaneTenant& t, uint64_t generation);

  // Worker generations (docs/durability.md): the generation of `conn` if it
  // is this lane's adopted connection of its member, else null.
  const std::shared_ptr<WorkerGeneration>* GenerationOf(LaneTenant& t,
                                                        const net::Connection& conn);
  // Non-fatal WORKER_LOST for a contribution of a connection whose
  // generation ended (or that is not adopted here): nothing is counted.
  Verdict RefuseEnded(net::Connection& conn, LaneTenant& t, const net::FrameHeader& h);
  // Ends `g` of `member` if still live and tells every lane (LaneHost::
  // GenerationEnded) with `why`; `close`: its connections are closed.
  void EndGeneration(LaneTenant& t, uint32_t member, const std::shared_ptr<WorkerGeneration>& g,
                     const std::string& why, bool close);
  // Before an update of `c` completes: true if every contribution to it
  // belongs to a live generation. Otherwise the update is never applied:
  // the tenant's iteration is aborted (its waiters get WORKER_LOST).
  bool ContributorsLive(LaneTenant& t, Chunk& c, uint32_t rack, uint32_t workers);

  const DataConfig config_;
  ChunkTable* table_;
  Registry* registry_;
  LaneHost* host_;
  LaneGate* gate_;
  RackExchange* exchange_;
  bool trim_armed_ = false;
  std::unique_ptr<FairScheduler> scheduler_;
  IntakePacer pacer_;  // workers in step (data.intake_lead_bytes)
  bool pacer_armed_ = false;
};

}  // namespace rackhub::server
