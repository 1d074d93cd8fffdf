// Stall inspector: the updates a lane has waited on for a while, with the
// workers that have and have not contributed (rackhubctl stalls, the admin
// StatsService.ListStalls). Read-only: reporting changes nothing.
//
// Threading: ReportStalls runs on the lane's thread (DataPlane::Stalls posts
// it to every lane and gathers the entries).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rackhub::server {

class ChunkTable;

// One update of one chunk that has some but not all of its contributions
// (for a tenant spanning racks: one rack's stage of it).
struct StallEntry {
  std::string tenant;
  std::string key;
  uint32_t chunk = 0;   // index within the key
  uint64_t update = 0;  // the version it will make (the iteration being pushed + 1)
  uint32_t lane = 0;
  uint32_t rack = 0;
  std::chrono::nanoseconds waiting{0};  // since its first contribution
  std::vector<uint32_t> pushed;         // ranks of `rack`
  std::vector<uint32_t> missing;        // ranks of `rack` not pushed yet
  // Of `missing`: ranks without a connection to this lane (gone or not
  // started), as opposed to connected but late.
  std::vector<uint32_t> disconnected;
  // The cross-rack stage at the chunk's home hub: `pushed` and `missing` are
  // racks whose sums did and did not arrive (`rack` is this hub's).
  bool cross_rack = false;
};

// Appends the stalls of tenant `handle` (0: every tenant) on this lane that
// have waited at least `min_wait`.
void ReportStalls(ChunkTable& table, uint32_t handle, std::chrono::nanoseconds min_wait,
                  std::vector<StallEntry>* out);

}  // namespace rackhub::server
