// RackExchange: the lane's part of a cross-rack recovery round
// (rack_recovery.h; docs/cluster.md, "Recovery across racks"): sending the
// hub's RACK_VERSIONS, realigning the chunks to the agreed versions, and the
// homes' RACK_ALIGN frames that bring the other hubs' copies along.
#include <cstring>

#include <spdlog/spdlog.h>

#include "params_reply.h"
#include "rack_exchange.h"
#include "rackhub/common/number.h"
#include "wire_names.h"

namespace rackhub::server {

bool RackExchange::HeldByRecovery(const LaneTenant& t, const FrameHeader& h) {
  return (h.opcode == Opcode::kRackSum || h.opcode == Opcode::kRackParams) && t.runtime &&
         t.runtime->recovering.load(std::memory_order_acquire) > 0;
}

void RackExchange::SendVersions(uint32_t rack, const std::string& payload) {
  if (rack >= links_.size() || rack == topology_.rack) return;
  PeerLink& link = links_[rack];
  if (!link.out || !link.out->open() || !link.ready) {
    Connect(rack);  // RackLinkUp sends the round's report once it is up
    return;
  }
  FrameHeader h;
  h.opcode = Opcode::kRackVersions;
  link.out->SendOwned(h, payload);
}

void RackExchange::Realign(LaneTenant& t, const std::map<uint32_t, uint64_t>& agreed) {
  if (!table_->exchange()) return;
  const uint32_t lanes = table_->lanes(), lane = table_->lane(), self = topology_.rack;
  uint64_t homed = 0, waiting = 0;
  for (const auto& [key_id, v] : agreed) {
    LaneKey* key = table_->FindKey(t, key_id);
    if (!key || key->info.table()) continue;  // tables are not realigned
    const uint32_t chunks = key->info.placement.chunk_count;
    // This lane's chunks of the key: (first_chunk + i) % lanes == lane.
    const uint32_t first =
        static_cast<uint32_t>((lane + lanes - key->info.placement.first_chunk % lanes) % lanes);
    for (uint32_t i = first; i < chunks; i += lanes) {
      Chunk& c = table_->GetChunk(t, *key, i);
      if (!c.multi_rack() || !c.state.initialized()) continue;  // never updated anywhere
      if (auto& stage = c.stages[self]; stage && stage->version() < v) stage->SkipTo(v);
      if (c.home == self) {
        if (c.state.version() < v) c.state.SkipTo(v);
        PublishHomeParams(*key, c);
        const FrameHeader h = c.Header(Opcode::kRackAlign, t.info.handle, v);
        for (uint32_t r = 0; r < table_->racks(); ++r) {
          if (r != self) SendToPeer(r, t, *key, h, c.reply_bytes(v), c.reply_owner(v));
        }
        ++homed;
      } else if (c.version < v) {
        ++waiting;  // PULLs wait for the home's RACK_ALIGN (Chunk::AwaitsAlign)
      }
      if (i == 0) key->runtime->version.store(v, std::memory_order_relaxed);
    }
  }
  spdlog::info("rack recovery: tenant '{}' lane {}: {} chunk(s) homed here skipped to the agreed "
               "versions and sent to the other racks; {} chunk(s) wait for their home's values",
               t.info.name, lane, homed, waiting);
}

Verdict RackExchange::CheckAlign(net::Connection& conn, const LaneKey& key, const Chunk& c,
                                 const FrameHeader& h) {
  const uint32_t peer = conn.id().rack;
  if (c.table() || !c.multi_rack() || c.home != peer || c.home == topology_.rack) {
    return Reject(conn, WireError::kInvalidArgument,
                  "RACK_ALIGN of chunk " + Num(h.chunk) + " of key '" + key.info.name +
                      "' from a hub that is not its home, or of a table",
                  h.request_id);
  }
  const size_t want = size_t{c.state.elements()} * WireDTypeBytes(key.info.dtype);
  if (h.payload_bytes != want) {
    return Reject(conn, WireError::kBadChunk,
                  "RACK_ALIGN payload_bytes: " + Num(h.payload_bytes) + ", expected " + Num(want),
                  h.request_id);
  }
  // Already there (a round this hub finished with the same values).
  return h.iteration > c.version ? Verdict::kAccept : Verdict::kDiscard;
}

void RackExchange::OnAlign(LaneTenant& t, LaneKey& key, Chunk& c, const FrameHeader& h,
                           std::span<const std::byte> payload) {
  if (h.iteration <= c.version) return;  // checked before a park: checked again
  if (!c.state.initialized()) {
    // A from_client chunk whose INIT this hub never got (lost in a cut once
    // the job had moved on): the home's values are its values now.
    c.state.MarkInitialized();
    for (auto& stage : c.stages) {
      if (stage) stage->MarkInitialized();
    }
    host_->ChunkInitialized(t.info.handle, key.info.id, key.info.placement.chunk_count);
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
  if (c.index_in_key == 0) key.runtime->version.store(c.version, std::memory_order_relaxed);
  // PULLs held for the values (an ALIGN of an older round still leaves the
  // chunk below the key's agreed version: they wait for the next one).
  if (!c.AwaitsAlign(topology_.rack, key.runtime->floor.load(std::memory_order_acquire))) {
    AnswerPulls(c, c.version);
  }
}

}  // namespace rackhub::server
