// RackExchange: the lane's part of a cross-rack recovery round
// (rack_recovery.h; docs/cluster.md, "Recovery across racks"): sending the
// hub's RACK_VERSIONS, realigning the chunks to the agreed versions, and the
// homes' RACK_ALIGN frames that bring the other hubs' copies along.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/common/number.h"
#include "rows_reply.h"
#include "wire_names.h"

namespace rackhub::server {

namespace {

// The key's version as DECLARE / WELCOME report it: an older round's
// realignment running after a newer one's must not move it back.
void RaiseTo(std::atomic<uint64_t>& version, uint64_t v) {
  uint64_t cur = version.load(std::memory_order_relaxed);
  while (cur < v && !version.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

bool RackExchange::HeldByRecovery(const LaneTenant& t, const FrameHeader& h) {
  if (EpochTagged(h.opcode) && h.request_id > t.rack_epoch) return true;  // a round not ended here
  return (h.opcode == Opcode::kRackSum || h.opcode == Opcode::kRackParams) && t.runtime &&
         t.runtime->recovering.load(std::memory_order_acquire) > 0;
}

bool RackExchange::EpochTagged(Opcode op) {
  return op == Opcode::kRackSum || op == Opcode::kRackParams || op == Opcode::kRackAlign;
}

bool RackExchange::Stale(const LaneTenant& t, const FrameHeader& h) {
  return EpochTagged(h.opcode) && h.request_id < t.rack_epoch;
}

void RackExchange::SendControl(uint32_t rack, Opcode opcode, const std::string& payload) {
  if (rack >= links_.size() || rack == topology_.rack) return;
  PeerLink& link = links_[rack];
  if (!link.out || !link.out->open() || !link.ready) {
    Connect(rack);  // RackLinkUp sends the round's report once it is up
    return;
  }
  FrameHeader h;
  h.opcode = opcode;
  link.out->SendOwned(h, payload);
}

void RackExchange::Realign(LaneTenant& t, const std::map<uint32_t, uint64_t>& agreed) {
  // One rack: ChunkTable::Align. Flat (one hub serving every rack): the
  // same skip as across racks, with every rack's stage here and no frames.
  if (table_->racks() == 1) return;
  const uint32_t lanes = table_->lanes(), lane = table_->lane(), self = topology_.rack;
  uint64_t homed = 0, waiting = 0;
  for (const auto& [key_id, v] : agreed) {
    LaneKey* key = table_->FindKey(t, key_id);
    if (!key) continue;
    const uint32_t chunks = key->info.placement.chunk_count;
    // This lane's chunks of the key: (first_chunk + i) % lanes == lane.
    const uint32_t first =
        static_cast<uint32_t>((lane + lanes - key->info.placement.first_chunk % lanes) % lanes);
    for (uint32_t i = first; i < chunks; i += lanes) {
      Chunk& c = table_->GetChunk(t, *key, i);
      if (c.rows_across_racks()) {
        if (c.home == self) {
          if (c.rows->version() < v) c.rows->set_version(v);  // untouched rows: a skipped step
          SendAlign(t, *key, c, v);
          if (!t.armed.empty()) table_->Capture(t, c);
          ++homed;
        } else if (c.rows->version() < v) {
          ++waiting;  // PULL_ROWS wait for the home's RACK_ALIGN (Chunk::AwaitsAlign)
          BindAtHome(t, *key, c.home);
        }
      } else if (c.multi_rack() && c.state.initialized()) {  // else: never updated anywhere
        for (auto& stage : c.stages) {  // this rack's (every rack's when flat)
          if (stage && stage->version() < v) stage->SkipTo(v);
        }
        if (c.home == self) {
          if (c.state.version() < v) c.state.SkipTo(v);
          PublishHomeParams(*key, c);
          SendAlign(t, *key, c, v);
          if (!t.armed.empty()) table_->Capture(t, c);
          ++homed;
        } else if (c.version < v) {
          ++waiting;  // PULLs wait for the home's RACK_ALIGN (Chunk::AwaitsAlign)
          BindAtHome(t, *key, c.home);
        }
      }
      if (i == 0) RaiseTo(key->runtime->version, v);
    }
  }
  spdlog::info("rack recovery: tenant '{}' lane {}: {} chunk(s) homed here skipped to the agreed "
               "versions and sent to the other racks; {} chunk(s) wait for their home's values",
               t.info.name, lane, homed, waiting);
}

void RackExchange::BindAtHome(LaneTenant& t, LaneKey& key, uint32_t home) {
  // A home that has no such key yet (no worker of its rack declared it)
  // declares it from this KEY_BIND and then sends its RACK_ALIGN
  // (TryBind, DataPlane::KeyAdopted); one that has it ignores it. Sent
  // now, not with a data frame: these PULLs wait for that RACK_ALIGN, and
  // a worker Pulls before it pushes again.
  if (table_->exchange() && LinkUp(home)) SendKeyBind(links_[home], t, key);
}

void RackExchange::SendAlign(LaneTenant& t, LaneKey& key, Chunk& c, uint64_t v) {
  if (!table_->exchange()) return;  // flat: no other hub
  FrameHeader h = c.Header(Opcode::kRackAlign, t.info.handle, v);
  if (c.table()) {
    // Every row of the range, fp32, in row payloads of consecutive rows that
    // each fit a frame; the receiver's copy is at `v` once the last row came.
    h.dtype = net::DType::kFp32;
    const aggregation::RowShard& r = *c.rows;
    const uint64_t per_row = sizeof(uint64_t) + uint64_t{r.dim()} * sizeof(float);
    const uint64_t per_frame =
        std::max<uint64_t>(1, (net::kMaxDataPayload - net::kRowsPrefixBytes) / per_row);
    for (uint64_t first = 0; first < r.row_count(); first += per_frame) {
      std::vector<uint64_t> ids(std::min(per_frame, r.row_count() - first));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = r.first_row() + first + i;
      auto frame = EncodeRackRowsPayload(ids, r.values().data() + first * r.dim(), r.dim());
      const auto bytes = RackRowsSpan(*frame);
      for (uint32_t peer = 0; peer < table_->racks(); ++peer) {
        if (peer != topology_.rack) SendToPeer(peer, t, key, h, bytes, frame);
      }
    }
    return;
  }
  if (c.elastic) {
    // The membership suffix of the update that produced these parameters,
    // its reserved word the versions skipped since (OnAlign).
    const uint64_t produced = t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)].produced;
    std::string bytes = WithMembershipSuffix(c.reply_bytes(v), c.done_generation, c.done_members);
    const uint32_t skipped = static_cast<uint32_t>(std::min<uint64_t>(v - std::min(v, produced), UINT32_MAX));
    std::memcpy(bytes.data() + bytes.size() - 4, &skipped, 4);
    auto owned = std::make_shared<const std::string>(std::move(bytes));
    h.flags |= net::kFlagMembership;
    for (uint32_t r = 0; r < table_->racks(); ++r) {
      if (r != topology_.rack) {
        SendToPeer(r, t, key, h, std::as_bytes(std::span<const char>(*owned)), owned);
      }
    }
    return;
  }
  for (uint32_t r = 0; r < table_->racks(); ++r) {
    if (r != topology_.rack) SendToPeer(r, t, key, h, c.reply_bytes(v), c.reply_owner(v));
  }
}

Verdict RackExchange::CheckAlign(net::Connection& conn, const LaneKey& key, const Chunk& c,
                                 const FrameHeader& h) {
  const uint32_t peer = conn.id().rack;
  if (!(c.multi_rack() || c.rows_across_racks()) || c.home != peer ||
      c.home == topology_.rack) {
    return Reject(conn, WireError::kInvalidArgument,
                  "RACK_ALIGN of chunk " + Num(h.chunk) + " of key '" + key.info.name +
                      "' from a hub that is not its home",
                  h.request_id);
  }
  if (c.table() && h.dtype != net::DType::kFp32) {
    return Reject(conn, WireError::kBadDType,
                  "dtype: RACK_ALIGN of table '" + key.info.name + "' chunk " + Num(h.chunk) +
                      " must carry fp32 rows, got " + net::DTypeName(h.dtype),
                  h.request_id);
  }
  // A table's: row payloads of at most a frame each (OnAlign parses them).
  size_t want = size_t{c.state.elements()} * WireDTypeBytes(key.info.dtype);
  if (c.elastic) want += net::kMembershipSuffixBytes;  // SendAlign
  if (!c.table() && h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "RACK_ALIGN payload_bytes: " + Num(h.payload_bytes) + ", expected " + Num(want),
                  h.request_id);
  }
  // Already there (a round this hub finished with the same values).
  return h.iteration > c.current_version() ? Verdict::kAccept : Verdict::kDiscard;
}

void RackExchange::OnAlign(net::Connection& conn, LaneTenant& t, LaneKey& key, Chunk& c,
                           const FrameHeader& h, std::span<const std::byte> payload) {
  if (h.iteration <= c.current_version()) return;  // checked before a park: checked again
  const uint64_t floor = key.runtime->floor.load(std::memory_order_acquire);
  if (c.table()) {
    // The home's rows, in frames of consecutive rows; the copy is at the
    // agreed version once the range's last row came (a row stage here is left
    // alone: its pushes are of the agreed version).
    aggregation::RowShard& r = *c.rows;
    net::RowsPayload rows;
    if (const Status s = ParseRackRows(r, payload, &rows); !s.ok()) {
      Reject(conn, WireError::kInvalidArgument,
             "RACK_ALIGN of table '" + key.info.name + "' chunk " + Num(h.chunk) + ": " +
                 s.message(),
             h.request_id);
      return;
    }
    std::vector<float> values(rows.ids.size() * r.dim());  // memcpy'd: never read unaligned
    if (!values.empty()) std::memcpy(values.data(), rows.rows, rows.row_bytes);
    r.WriteRows(rows.ids, values.data(), aggregation::ElementType::kFp32);
    if (rows.ids.empty() || rows.ids.back() != r.first_row() + r.row_count() - 1) return;
    r.set_version(h.iteration);
    if (c.index_in_key == 0) RaiseTo(key.runtime->version, h.iteration);
    if (c.AwaitsAlign(topology_.rack, floor)) return;  // an older round's values
    if (!t.armed.empty()) table_->Capture(t, c);
    AnswerRowPulls(t, c);
    return;
  }
  if (!c.state.initialized()) {
    // A from_client chunk whose INIT this hub never got (lost in a cut once
    // the job had moved on): the home's values are its values now.
    c.state.MarkInitialized();
    for (auto& stage : c.stages) {
      if (stage) stage->MarkInitialized();
    }
    host_->ChunkInitialized(t.info.handle, key.info.id, key.info.placement.chunk_count);
  }
  if (c.elastic) {
    // The update that produced the home's parameters (its membership, and
    // the versions skipped since: SendAlign).
    const auto [generation, members] = MembershipSuffixOf(payload);
    uint32_t skipped = 0;
    std::memcpy(&skipped, payload.data() + payload.size() - 4, 4);
    payload = payload.first(payload.size() - net::kMembershipSuffixBytes);
    c.done_generation = static_cast<uint32_t>(generation);
    c.done_members = members;
    t.forming[ChunkTable::ChunkId(c.key_id, c.index_in_key)].produced =
        h.iteration - std::min<uint64_t>(h.iteration, skipped);
  }
  c.version = h.iteration;
  c.replies[c.version & 1].PrepareOverwrite();  // a queued reply of v - 2 keeps its bytes
  std::memcpy(c.replies[c.version & 1].data(), payload.data(), payload.size());
  // A worker of this rack may push the agreed iteration already (its stage
  // is there since this hub's realignment): then the stage is left alone.
  if (auto& stage = c.stages[topology_.rack];
      stage && stage->version() < c.version && stage->contributions() == 0) {
    stage->SkipTo(c.version);
  }
  if (c.index_in_key == 0) RaiseTo(key.runtime->version, c.version);
  if (!t.armed.empty()) table_->Capture(t, c);  // a checkpoint waiting for this version
  // PULLs held for the values (an ALIGN of an older round still leaves the
  // chunk below the key's agreed version: they wait for the next one).
  if (!c.AwaitsAlign(topology_.rack, floor)) AnswerPulls(c, c.version);
}

}  // namespace rackhub::server
