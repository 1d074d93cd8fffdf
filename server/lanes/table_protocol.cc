// WorkerProtocol, part 3: row-sparse tables (issue 16; docs/wire-protocol.md
// section 6b): PUSH_ROWS (a rank's gradient rows for an iteration plus the
// rows it wants back) and PULL_ROWS, answered with ROWS. A table's chunk is
// a range of whole rows held by an aggregation::RowShard; the math (rank
// order sums, duplicates, lazy optimizers) lives there.
#include <cstring>
#include <optional>

#include "element_type.h"
#include "rack_exchange.h"
#include "rackhub/common/number.h"
#include "rows_reply.h"
#include "wire_names.h"
#include "worker_protocol.h"

namespace rackhub::server {

namespace {

// What a ROWS reply of `rows` rows of the chunk adds to a connection's backlog.
size_t RowsReplyBytes(const Chunk& c, size_t rows) {
  return net::kHeaderBytes + net::kRowsPrefixBytes + rows * c.rows->dim() * net::DTypeBytes(c.dtype);
}

}  // namespace

Verdict WorkerProtocol::CheckRowsFrame(net::Connection& conn, LaneTenant& t, const LaneKey& key,
                                       Chunk& c, const FrameHeader& h) {
  const uint64_t rid = h.request_id;
  const KeyInfo& k = key.info;
  if (h.payload_bytes < net::kRowsPrefixBytes) {
    return Reject(conn, WireError::kMalformed,
                  "payload_bytes: " + Num(h.payload_bytes) + " is shorter than the row counts",
                  rid);
  }
  if (h.opcode == Opcode::kPullRows) return Verdict::kAccept;
  const uint32_t rank = conn.id().rank;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  const aggregation::RowShard& r = *c.rows;
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    return RefuseRecovering(conn, t, h, "table");
  }
  if (RefuseBeforeAlign(conn, t, key, c, h)) return Verdict::kDiscard;
  if (h.iteration != r.version()) {
    RefuseIteration(conn, t, h, r.version(),
                    "iteration: " + Num(h.iteration) + " for rows " + Num(r.first_row()) + ".." +
                        Num(r.first_row() + r.row_count()) + " of table '" + k.name +
                        "', the hub expects " + Num(r.version()) +
                        (h.iteration < r.version() ? " (stale)" : " (ahead)") +
                        "; Pull the table to resynchronize");
    return Verdict::kDiscard;
  }
  if (c.RowContributed(conn.id().rack, rank) &&
      !t.runtime->PushFailedAt(member, conn.id().session, h.key, h.iteration)) {
    return Reject(conn, WireError::kDuplicatePush,
                  "iteration: rank " + Num(rank) + " already pushed rows of chunk " +
                      Num(h.chunk) + " of table '" + k.name + "' for iteration " +
                      Num(h.iteration),
                  rid);
  }
  return Verdict::kAccept;
}

// Non-fatal: a bad row request changes nothing and the connection stays.
Status WorkerProtocol::CheckRowsPayload(const Chunk& c, const KeyInfo& k, const FrameHeader& h,
                                        std::span<const std::byte> payload,
                                        std::optional<uint32_t> contributor,
                                        net::RowsPayload* rows) {
  const aggregation::RowShard& r = *c.rows;
  Status s;
  if (Result<net::RowsPayload> parsed = net::ParseRowsPayload(h.opcode, payload, r.dim(), c.dtype);
      parsed.ok()) {
    *rows = *std::move(parsed);
  } else {
    s = parsed.status();
  }
  const std::vector<uint64_t>& asked = h.opcode == Opcode::kPushRows ? rows->want : rows->ids;
  if (s.ok() && contributor && !c.rows_across_racks()) {
    s = r.CheckContribution(*contributor, rows->ids, rows->row_bytes, ElementTypeOf(c.dtype));
  } else if (s.ok() && h.opcode == Opcode::kPushRows) {
    s = r.CheckRows(rows->ids);
  }
  if (s.ok()) s = r.CheckRows(asked);
  const uint64_t reply =
      net::kRowsPrefixBytes + uint64_t{asked.size()} * r.dim() * net::DTypeBytes(c.dtype);
  if (s.ok() && reply > net::kMaxDataPayload) {
    s = InvalidArgument("want: " + Num(asked.size()) + " rows of " + Num(r.dim()) + " " +
                        net::DTypeName(c.dtype) + " make a reply of " + Num(reply) +
                        " bytes, above " + Num(net::kMaxDataPayload) +
                        "; ask for fewer rows at once");
  }
  if (s.ok()) return s;
  return s.WithContext(std::string(net::OpcodeName(h.opcode)) + " for chunk " + Num(h.chunk) +
                       " of table '" + k.name + "'");
}

void WorkerProtocol::OnPushRows(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                std::span<const std::byte> payload) {
  const Contribution to = ContributionOf(conn, t, h);
  if (!to.chunk) return;
  Chunk& c = *to.chunk;
  aggregation::RowShard& r = *c.rows;
  const uint32_t rank = conn.id().rank;
  const uint32_t member = ChunkTable::Member(t, conn.id());
  const bool again = c.RowContributed(conn.id().rack, rank);
  if (!StillCurrent(conn, t, h, r.version(), again, "table")) return;
  if (RefuseBeforeAlign(conn, t, *to.key, c, h)) return;  // a round ended meanwhile
  net::RowsPayload rows;
  if (Status s = CheckRowsPayload(c, to.key->info, h, payload,
                                  again ? std::nullopt : std::optional(rank), &rows);
      !s.ok()) {
    t.runtime->PushFailed(member, conn.id().session, h.key, h.iteration);
    Refuse(conn, WireError::kInvalidArgument, s.message(), h.request_id);
    return;
  }
  if (again) {
    // A retry after a failed PushPullRows whose earlier push here is counted:
    // that one stays, this one gets the result (with the rows it wants now).
    c.pushes.push_back(Waiter{conn.weak_from_this(), h.request_id, 0, std::move(rows.want)});
    return;
  }
  // One rack: the shard's own contributions. Across racks: this rack's
  // stage, whose sums go to the rows' home (rack_rows.cc).
  aggregation::RowSums& stage = c.RowStage(conn.id().rack);
  stage.Contribute(rank, rows.ids, rows.rows, ElementTypeOf(c.dtype));
  CountContribution(conn, t, c, member, *to.gen, h, payload.size(), std::move(rows.want));
  if (!stage.ready()) return;
  if (!ContributorsLive(t, c, conn.id().rack, t.info.workers_per_rack)) return;
  if (c.rows_across_racks()) {
    exchange_->OnRackRows(t, *to.key, c, conn.id().rack);
    return;
  }
  r.Update();
  table_->Completed(t, *to.key, c, r.version());
  AnswerRowPushes(t, c);
}

void WorkerProtocol::OnPullRows(net::Connection& conn, LaneTenant& t, const FrameHeader& h,
                                std::span<const std::byte> payload) {
  LaneKey* key = KeyOrReject(conn, t, h);
  if (!key) return;
  Chunk& c = table_->GetChunk(t, *key, h.chunk);
  net::RowsPayload rows;
  if (Status s = CheckRowsPayload(c, key->info, h, payload, std::nullopt, &rows); !s.ok()) {
    Refuse(conn, WireError::kInvalidArgument, s.message(), h.request_id);
    return;
  }
  if (t.runtime->recovering.load(std::memory_order_acquire) > 0) {
    // Answered at the recovered version (ReleaseParked), as a dense PULL.
    Park(conn, t, h, rows.ids, RowsReplyBytes(c, rows.ids.size()));
    return;
  }
  if (HoldForAlign(conn, *key, c, h.request_id, rows.ids)) return;
  SendTableRows(conn, t, c, rows.ids, h.request_id);
}

void WorkerProtocol::ReleaseParkedRows(net::Connection& conn, LaneTenant& t, const ParkedPull& p) {
  LaneKey* key = table_->FindKey(t, p.header.key);
  if (!key) {
    conn.SendError(WireError::kUnknownKey, "key: was deleted", p.header.request_id, false);
    return;
  }
  Chunk& c = table_->GetChunk(t, *key, p.header.chunk);
  if (HoldForAlign(conn, *key, c, p.header.request_id, p.ids)) return;
  SendTableRows(conn, t, c, p.ids, p.header.request_id);
}

bool WorkerProtocol::RefuseBeforeAlign(net::Connection& conn, LaneTenant& t, const LaneKey& key,
                                       const Chunk& c, const FrameHeader& h) {
  const uint64_t floor = key.runtime->floor.load(std::memory_order_acquire);
  if (!c.AwaitsAlign(table_->self_rack(), floor)) return false;
  // Its rows here are still the old version's: a push of that version is
  // from before the round, one of the agreed version must wait for them.
  RefuseIteration(conn, t, h, floor,
                  "iteration: " + Num(h.iteration) + " for table '" + key.info.name +
                      "': a recovery across racks moved it to " + Num(floor) +
                      " and its home's rows are not here yet; Pull the table to resynchronize");
  return true;
}

bool WorkerProtocol::HoldForAlign(net::Connection& conn, const LaneKey& key, Chunk& c,
                                  uint64_t request_id, const std::vector<uint64_t>& ids) {
  if (!c.AwaitsAlign(table_->self_rack(), key.runtime->floor.load(std::memory_order_acquire))) {
    return false;
  }
  // Across racks, after a recovery round: answered once the home's rows are
  // here (RACK_ALIGN). Its reply's bytes are reserved on the connection
  // meanwhile, so held pulls count against its limit like queued replies.
  const size_t reply_bytes = RowsReplyBytes(c, ids.size());
  if (conn.Reserve(reply_bytes)) {
    c.pulls.push_back(Waiter{conn.weak_from_this(), request_id, reply_bytes, ids});
  }
  return true;
}

}  // namespace rackhub::server
