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
  const uint64_t commit = t.runtime->membership_commits.load(std::memory_order_acquire);
  if (!t.membership || t.membership_commit != commit) {
    t.membership = t.runtime->membership();
    t.membership_commit = commit;
  }
  return *t.membership;
}

bool WorkerProtocol::Holding(LaneTenant& t) {
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) return true;
  return t.info.elastic && CurrentMembership(t).paused;
}

namespace {

std::string Describe(const LaneTenant& t, const Membership& m) {
  return "membership generation " + Num(m.generation) + " of elastic tenant " +
         QuoteForLog(t.info.name) + " has " + Num(m.count) + " member" +
         (m.count == 1 ? "" : "s");
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
                      (quorum ? "its start quorum of " + Num(t.info.workers_per_rack)
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

bool WorkerProtocol::ApplyMembership(net::Connection& conn, LaneTenant& t, Chunk& c,
                                     const FrameHeader& h) {
  if (CheckMember(conn, t, h) != Verdict::kAccept) return false;
  const uint64_t commit = t.membership_commit;
  ElasticForming& forming = t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)];
  if (forming.commit == commit) return true;
  const Membership& m = *t.membership;
  if (c.state.contributions() != 0) {
    // Cannot happen (a membership is committed only with nothing pending);
    // if it did, this update would mix two memberships: abort it.
    const std::string why = "membership: chunk " + Num(c.index_in_key) + " of key id " +
                            Num(c.key_id) + " has contributions of an older membership";
    host_->AbortIteration(t.info.handle, why, false);
    RefuseIteration(conn, t, h, c.state.version(), why + "; Pull the key and push again");
    return false;
  }
  if (!c.state.SetMembers(m.member)) {
    Reject(conn, WireError::kInternal, "membership: could not be applied to the chunk",
           h.request_id);
    return false;
  }
  forming.commit = commit;
  forming.generation = m.generation;
  return true;
}

void WorkerProtocol::ElasticAdopted(LaneTenant& t, uint32_t member, WorkerGeneration& g) {
  const uint32_t lanes = g.lanes.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (lanes != table_->lanes()) return;
  const Membership& m = CurrentMembership(t);
  if (m.has(member) && g.live()) return;
  host_->MembershipChanged(t.info.handle, "rank " + Num(member) + " (generation " +
                                              Num(g.number) + ") joined: connected on every lane");
}

void WorkerProtocol::RemoveStragglers(LaneTenant& t, const Chunk& c, const std::string& why) {
  for (uint32_t r = 0; r < c.state.workers(); ++r) {
    if (!c.state.is_member(r) || c.state.has_contributed(r)) continue;
    const std::string text = "membership: rank " + Num(r) + " was removed: " + why;
    // Its generation ends (its frames are no longer counted) and every lane
    // closes its connections with a fatal INVALID_ARGUMENT, as for a
    // replaced process: it joins again as a new Client (a new session).
    if (auto g = t.gens.find(r); g != t.gens.end()) {
      auto gen = g->second;
      EndGeneration(t, r, gen, text, true);
    }
  }
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
