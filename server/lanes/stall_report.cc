#include "stall_report.h"

#include "chunk_table.h"

namespace rackhub::server {
namespace {

void ReportStage(ChunkTable& table, LaneTenant& t, const Chunk& c, uint32_t rack,
                 const aggregation::ChunkState& stage, std::chrono::nanoseconds waiting,
                 bool cross_rack, std::vector<StallEntry>* out) {
  if (stage.contributions() == 0) return;
  StallEntry e;
  e.tenant = t.info.name;
  const auto key = t.keys.find(c.key_id);
  e.key = key != t.keys.end() ? key->second.info.name : "#" + std::to_string(c.key_id);
  e.chunk = c.index_in_key;
  e.update = c.current_version() + 1;
  e.lane = table.lane();
  e.rack = rack;
  e.waiting = waiting;
  e.cross_rack = cross_rack;
  for (uint32_t r = 0; r < stage.workers(); ++r) {
    if (stage.has_contributed(r)) {
      e.pushed.push_back(r);
      continue;
    }
    if (!stage.is_member(r)) continue;  // not a participant of the key
    e.missing.push_back(r);
    if (!cross_rack && !t.conns.count(rack * t.info.workers_per_rack + r)) {
      e.disconnected.push_back(r);
    }
  }
  out->push_back(std::move(e));
}

}  // namespace

void ReportStalls(ChunkTable& table, uint32_t handle, std::chrono::nanoseconds min_wait,
                  std::vector<StallEntry>* out) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [h, t] : table.tenants()) {
    if (handle != 0 && h != handle) continue;
    for (uint64_t id : t.pending) {
      const auto it = t.chunks.find(id);
      if (it == t.chunks.end()) continue;
      const Chunk& c = *it->second;
      const auto waiting = now - c.first_contribution;
      if (waiting < min_wait) continue;
      if (!c.multi_rack()) {
        ReportStage(table, t, c, table.self_rack(), c.state, waiting, false, out);
        continue;
      }
      for (uint32_t rack = 0; rack < c.stages.size(); ++rack) {
        if (c.stages[rack]) ReportStage(table, t, c, rack, *c.stages[rack], waiting, false, out);
      }
      // At the chunk's home: the rack sums that have and have not arrived.
      if (c.home == table.self_rack()) {
        ReportStage(table, t, c, table.self_rack(), c.state, waiting, true, out);
      }
    }
  }
}

}  // namespace rackhub::server
