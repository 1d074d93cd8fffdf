// What a key holds in hub memory at most: the figure the tenant quota
// `max_parameter_bytes` counts (docs/architecture.md, Memory a key holds).
// A chunk's state is allocated by its lane the first time the chunk is used;
// the registry reserves the whole key's bound when the key is created, so
// lanes never allocate beyond a tenant's quota.
//
// Pure functions, no state: any thread.
#pragma once

#include <cstdint>

#include "config.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::server {

// The shape of the topology, as far as a chunk's memory depends on it.
struct MemoryModel {
  uint32_t racks = 1;         // racks of the topology (cross-rack stage inputs)
  uint32_t local_stages = 0;  // per-rack sum stages this hub runs (0: single rack)
  static MemoryModel Of(const TopologyConfig& topology);
};

// Per chunk besides its buffers: the Chunk object, its map entries (chunk
// table, pending set) and allocator headers; per worker rank: the waiting
// pushes and pulls (grown by push_back).
inline constexpr uint64_t kChunkBookkeepingBytes = 1024;
inline constexpr uint64_t kBookkeepingBytesPerRank = 96;

// One chunk of `elements` of a key of a tenant with `workers_per_rack`.
// Single rack: aggregation::ChunkState::MemoryBytes (parameters x2, wire
// copies, accumulator, optimizer state, parked contributions) + bookkeeping.
// Several racks: also one sum-only stage per rack served here and the
// cross-rack state (racks fp32 inputs) with two reply buffers.
uint64_t ChunkMemoryBytes(uint32_t elements, uint32_t workers_per_rack,
                          aggregation::OptimizerType optimizer, aggregation::ElementType wire,
                          const MemoryModel& model);

// Every chunk of a key of `elements` cut into chunks of `chunk_elements`.
uint64_t KeyMemoryBytes(uint64_t elements, uint32_t chunk_elements, uint32_t workers_per_rack,
                        aggregation::OptimizerType optimizer, aggregation::ElementType wire,
                        const MemoryModel& model);

// An elastic tenant's commit copies of a key with a hub optimizer
// (server/lanes/chunk_commit.cc; docs/elastic.md, "Hub optimizers"): per
// chunk, fp32 parameters and the optimizer state slots in std::vectors,
// and the copy's map entry. 0 for sum-only keys (nothing is copied).
uint64_t CommitCopyBytes(uint64_t elements, uint32_t chunk_elements,
                         aggregation::OptimizerType optimizer);

// A row-sparse table of rows x dim cut into `chunks` row ranges: fp32 rows,
// the optimizer state (per element; row-wise AdaGrad: one value per row) and
// bookkeeping per chunk. One iteration's contributions are not counted: a
// rank keeps at most one row per distinct id of the range (duplicates are
// summed on arrival), so they are bounded by workers x the range, and freed
// by the update or an abort (docs/architecture.md, Row-sparse tables).
uint64_t TableMemoryBytes(uint64_t rows, uint32_t dim, uint64_t chunks,
                          aggregation::OptimizerType optimizer);

}  // namespace rackhub::server
