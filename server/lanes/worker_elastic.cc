// WorkerProtocol: elastic tenants (docs/elastic.md). The membership of an
// update is the tenant's committed Membership when the update's first
// contribution arrives; memberships are committed by the data plane only at
// the end of a recovery (nothing pending anywhere, no push accepted), so an
// update never mixes two. Here: which pushes a membership refuses, applying
// it to a chunk's next update, joins (a generation connected on every lane),
// stragglers removed from the membership, and COMMIT / ROLLBACK of tenants
// with hub optimizers (the copies: chunk_commit.cc).
#include <spdlog/spdlog.h>

#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

const Membership& WorkerProtocol::CurrentMembership(LaneTenant& t) {
  return ChunkTable::MembershipOf(t);
}

bool WorkerProtocol::Holding(LaneTenant& t) {
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) return true;
  return t.info.elastic && CurrentMembership(t).paused;
}

namespace {

std::string Describe(const LaneTenant& t, const Membership& m) {
  return "membership generation " + Num(m.generation) + " of elastic tenant " +
         QuoteForLog(t.info.name) + " has " + Num(m.total) + " member" +
         (m.total == 1 ? "" : "s") +
         (m.racks.empty() ? std::string() : " over its racks, " + Num(m.count) + " on this one");
}

}  // namespace

Verdict WorkerProtocol::CheckMember(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  const Membership& m = CurrentMembership(t);
  const uint32_t rank = conn.id().rank;
  if (m.paused) {
    t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
    const bool quorum = m.generation == 0;
    return Refuse(conn, WireError::kWorkerLost,
                  "paused: " + Describe(t, m) + ", below " +
                      (quorum ? "its start quorum of " +
                                    Num(t.info.workers_per_rack * table_->racks()) +
                                    (table_->racks() > 1 ? " members in total over its racks"
                                                         : std::string())
                              : "min_workers " + Num(t.info.min_workers)) +
                      "; pushes resume once enough ranks are connected: Pull the key (held "
                      "until then) and push again",
                  h.request_id);
  }
  if (!m.has(rank)) {
    t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
    return Refuse(conn, WireError::kWorkerLost,
                  "membership: rank " + Num(rank) + " is not a member yet (" + Describe(t, m) +
                      "); a rank joins at the next iteration boundary once it is connected "
                      "on every lane: Pull the key and push again",
                  h.request_id);
  }
  return Verdict::kAccept;
}

Verdict WorkerProtocol::CheckFence(net::Connection& conn, LaneTenant& t, const Chunk& c,
                                   const FrameHeader& h) {
  if (!t.fence) return Verdict::kAccept;
  const RollbackFence& f = *t.fence;
  const uint32_t rank = conn.id().rank;
  if (f.generation != CurrentMembership(t).generation) {
    t.fence.reset();  // a new membership: its recovery failed every push past the commit
    return Verdict::kAccept;
  }
  if (!f.waiting.contains(rank) || !ChunkTable::HubOptimized(c)) return Verdict::kAccept;
  t.runtime->PushFailed(ChunkTable::Member(t, conn.id()), conn.id().session, h.key, h.iteration);
  return Refuse(conn, WireError::kWorkerLost,
                std::string(net::kRollbackRefusal) + Num(f.first) + " restored commit " +
                    Num(f.commit) + " of elastic tenant " + QuoteForLog(t.info.name) +
                    "; rank " + Num(rank) + " has not rolled back yet, so its push of chunk " +
                    Num(c.index_in_key) + " of key id " + Num(c.key_id) + " (iteration " +
                    Num(h.iteration) + ") is past the commit: restore the commit too",
                h.request_id);
}

void WorkerProtocol::Fence(LaneTenant& t, uint32_t rank) {
  const Membership& m = CurrentMembership(t);
  if (t.fence && t.fence->generation == m.generation && t.fence->commit == t.commit_number) {
    t.fence->waiting.erase(rank);
    t.fence->rolled.insert(rank);
    return;
  }
  RollbackFence& f = t.fence.emplace();
  f.generation = m.generation;
  f.commit = t.commit_number;
  f.first = rank;
  f.rolled.insert(rank);
  for (uint32_t r = 0; r < m.member.size(); ++r) {
    if (r != rank && m.has(r)) f.waiting.insert(r);
  }
}

bool WorkerProtocol::ApplyMembership(net::Connection& conn, LaneTenant& t, Chunk& c,
                                     const FrameHeader& h) {
  if (CheckMember(conn, t, h) != Verdict::kAccept) return false;
  if (CheckFence(conn, t, c, h) != Verdict::kAccept) return false;
  const Status applied = table_->ApplyMembership(t, c);
  if (applied.code() == StatusCode::kFailedPrecondition) {
    // Contributions of an older membership: abort the update.
    host_->AbortIteration(t.info.handle, applied.message(), false);
    RefuseIteration(conn, t, h, c.current_version(),
                    applied.message() + "; Pull the key and push again");
    return false;
  }
  if (!applied.ok()) {
    Reject(conn, WireError::kInternal, applied.message(), h.request_id);
    return false;
  }
  return true;
}

void WorkerProtocol::ElasticAdopted(LaneTenant& t, uint32_t member, WorkerGeneration& g) {
  const uint32_t lanes = g.lanes.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (lanes != table_->lanes()) return;
  const Membership& m = CurrentMembership(t);
  if (m.has(member % t.info.rank_slots()) && g.live()) return;
  host_->MembershipChanged(t.info.handle, "rank " + Num(member) + " (generation " +
                                              Num(g.number) + ") joined: connected on every lane");
}

bool WorkerProtocol::RemoveStragglers(LaneTenant& t, Chunk& c, const std::string& why) {
  // Across racks: this rack's committed members (a straggler of another
  // rack is that hub's to remove).
  const uint32_t rack = table_->self_rack();
  const aggregation::ChunkState* stage =
      !c.multi_rack() ? &c.state : rack < c.stages.size() ? c.stages[rack].get() : nullptr;
  const Membership& m = CurrentMembership(t);
  // No member on this rack (its stage keeps a default or stale member set),
  // or this rack's sum of the update is in (sent, or added at the home).
  if (!stage || m.count == 0 ||
      (c.multi_rack() && stage->version() > c.current_version())) {
    return false;
  }
  const uint32_t first = c.multi_rack() ? rack * t.info.rank_slots() : 0;
  bool removed = false;
  for (uint32_t r = 0; r < m.member.size(); ++r) {
    if (!m.has(r) || (r < stage->workers() && stage->has_contributed(r))) continue;
    const auto g = t.gens.find(first + r);
    if (g == t.gens.end() || !g->second->live()) continue;  // nothing to end
    const std::string text = "membership: rank " + Num(r) +
                             (c.multi_rack() ? " of rack " + Num(rack) : std::string()) +
                             " was removed: " + why;
    // Its generation ends (its frames are no longer counted) and every lane
    // closes its connections with a fatal INVALID_ARGUMENT, as for a
    // replaced process: it joins again as a new Client (a new session).
    removed = true;
    auto gen = g->second;
    EndGeneration(t, first + r, gen, text, true);
  }
  return removed;
}

void WorkerProtocol::OnCommitFrame(net::Connection& conn, LaneTenant& t, const FrameHeader& h) {
  const bool commit = h.opcode == net::Opcode::kCommit;
  const char* what = commit ? "commit" : "rollback";
  if (h.payload_bytes != 0) {
    Reject(conn, WireError::kMalformed,
           std::string("payload_bytes: ") + net::OpcodeName(h.opcode) +
               " carries no payload, got " + Num(h.payload_bytes) + " bytes",
           h.request_id);
    return;
  }
  if (!t.info.elastic) {
    Refuse(conn, WireError::kInvalidArgument,
           std::string(what) + ": tenant " + QuoteForLog(t.info.name) +
               " is not elastic; COMMIT and ROLLBACK are for elastic tenants (docs/elastic.md)",
           h.request_id);
    return;
  }
  if (table_->racks() > 1) {
    // The copies are per hub and the homes' optimizer state is not copied
    // across racks: refused rather than a rollback that misses chunks.
    Refuse(conn, WireError::kInvalidArgument,
           std::string(what) + ": elastic tenant " + QuoteForLog(t.info.name) +
               " spans racks; COMMIT and ROLLBACK (hub optimizers in elastic jobs) are built "
               "for single-rack hubs only (docs/elastic.md, Limits)",
           h.request_id);
    return;
  }
  // A generation that ended (a removed member, a replaced process) or a
  // rank that is no member: its frame is not honoured, as its pushes.
  if (const auto* gen = GenerationOf(t, conn); !gen || !(*gen)->live()) {
    RefuseEnded(conn, t, h);
    return;
  }
  if (!CurrentMembership(t).has(conn.id().rank)) {
    Refuse(conn, WireError::kWorkerLost,
           std::string(what) + ": rank " + Num(conn.id().rank) + " is not a member (" +
               Describe(t, CurrentMembership(t)) + "); only members commit or roll back",
           h.request_id);
    return;
  }
  if (!commit) {
    if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
      Refuse(conn, WireError::kWorkerLost,
             "recovering: the tenant's iteration in progress was aborted (" +
                 t.runtime->cause() + "); Pull a key (held until the recovery ends) and send "
                 "ROLLBACK again",
             h.request_id);
      return;
    }
    if (!t.committed) {
      Refuse(conn, WireError::kInvalidArgument,
             "rollback: elastic tenant " + QuoteForLog(t.info.name) +
                 " has no commit on this hub (no COMMIT reached lane " + Num(table_->lane()) +
                 " since the hub started or restored a checkpoint): nothing to roll back to",
             h.request_id);
      return;
    }
    if (h.iteration != t.commit_number) {
      Refuse(conn, WireError::kInvalidArgument,
             "rollback: commit " + Num(h.iteration) + " asked for, but the last commit of "
                 "elastic tenant " + QuoteForLog(t.info.name) + " on this hub is " +
                 Num(t.commit_number) + " (lane " + Num(table_->lane()) + ")",
             h.request_id);
      return;
    }
    // The pushes it fails are told to restore the commit (not to push the
    // same gradient again): clients recognise net::kRollbackRefusal.
    const std::string refused = table_->Rollback(
        t, std::string(net::kRollbackRefusal) + Num(conn.id().rank) + " restores commit " +
               Num(h.iteration) + " of elastic tenant " + QuoteForLog(t.info.name) +
               "; this update past the commit was discarded: restore the commit too");
    if (!refused.empty()) {
      Refuse(conn, WireError::kInvalidArgument, refused, h.request_id);
      return;
    }
    Fence(t, conn.id().rank);
  } else {
    if (t.committed && h.iteration < t.commit_number) {
      spdlog::warn(
          "data: elastic tenant '{}' lane {}: rank {} commits {} after commit {} (the "
          "commit number went back; a rollback now asks for {})",
          t.info.name, table_->lane(), conn.id().rank, h.iteration, t.commit_number, h.iteration);
    }
    table_->Commit(t, h.iteration);
  }
  FrameHeader r;
  r.opcode = net::Opcode::kAck;
  r.tenant = t.info.handle;
  r.iteration = t.commit_number;
  r.request_id = h.request_id;
  conn.SendOwned(r, {});
}

}  // namespace rackhub::server
