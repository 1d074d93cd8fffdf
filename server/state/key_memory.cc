#include "key_memory.h"

#include "rackhub/aggregation/chunk_state.h"

namespace rackhub::server {

using aggregation::ChunkState;
using aggregation::ElementType;
using aggregation::OptimizerType;

namespace {

// A ChunkState held by unique_ptr (multi-rack stages): the object and its
// allocator header.
constexpr uint64_t kChunkStateObjectBytes = 640;
static_assert(sizeof(ChunkState) + 32 <= kChunkStateObjectBytes);

// A commit copy's entry: the CommitCopy object in its unordered_map node
// (three vector headers, version, suffix), the node and bucket.
constexpr uint64_t kCommitCopyEntryBytes = 160;

// A std::vector<std::byte> of `bytes` (reply buffers): the block and its header.
uint64_t VectorBytes(uint64_t bytes) { return (bytes + 15) / 16 * 16 + 16; }

}  // namespace

MemoryModel MemoryModel::Of(const TopologyConfig& topology) {
  MemoryModel m;
  m.racks = topology.rack_count();
  if (m.racks > 1) m.local_stages = topology.multi_rack_exchange() ? 1 : m.racks;
  return m;
}

uint64_t ChunkMemoryBytes(uint32_t elements, uint32_t workers_per_rack, OptimizerType optimizer,
                          ElementType wire, const MemoryModel& model) {
  const uint64_t bookkeeping =
      kChunkBookkeepingBytes + uint64_t{workers_per_rack} * kBookkeepingBytesPerRank;
  if (model.racks <= 1) {
    return ChunkState::MemoryBytes(elements, workers_per_rack, optimizer, wire) + bookkeeping;
  }
  // chunk_table.cc, InitMultiRackChunk: the local sum stages (sum-only, the
  // key's wire type), the cross-rack state (one fp32 input per rack, the
  // key's optimizer) and the replies of two versions in the wire type.
  const uint64_t stage =
      ChunkState::MemoryBytes(elements, workers_per_rack, OptimizerType::kSumOnly, wire) +
      kChunkStateObjectBytes;
  const uint64_t cross =
      ChunkState::MemoryBytes(elements, model.racks, optimizer, ElementType::kFp32);
  const uint64_t replies = 2 * VectorBytes(uint64_t{elements} * aggregation::ElementBytes(wire));
  return model.local_stages * stage + cross + replies + bookkeeping + 16 * model.racks;
}

uint64_t KeyMemoryBytes(uint64_t elements, uint32_t chunk_elements, uint32_t workers_per_rack,
                        OptimizerType optimizer, ElementType wire, const MemoryModel& model) {
  if (chunk_elements == 0 || elements == 0) return 0;
  const uint64_t full = elements / chunk_elements;
  const uint32_t last = static_cast<uint32_t>(elements % chunk_elements);
  uint64_t total = 0;
  if (full > 0) {
    total += full * ChunkMemoryBytes(chunk_elements, workers_per_rack, optimizer, wire, model);
  }
  if (last > 0) total += ChunkMemoryBytes(last, workers_per_rack, optimizer, wire, model);
  return total;
}

uint64_t CommitCopyBytes(uint64_t elements, uint32_t chunk_elements, OptimizerType optimizer) {
  if (optimizer == OptimizerType::kSumOnly || chunk_elements == 0 || elements == 0) return 0;
  const uint64_t vectors = 1 + static_cast<uint64_t>(OptimizerStateSlots(optimizer));
  const uint64_t chunks = (elements + chunk_elements - 1) / chunk_elements;
  const uint64_t last = elements - (chunks - 1) * chunk_elements;
  const uint64_t per_full = vectors * VectorBytes(uint64_t{chunk_elements} * sizeof(float));
  const uint64_t per_last = vectors * VectorBytes(last * sizeof(float));
  return (chunks - 1) * per_full + per_last + chunks * kCommitCopyEntryBytes;
}

uint64_t TableMemoryBytes(uint64_t rows, uint32_t dim, uint64_t chunks, OptimizerType optimizer) {
  const uint64_t elements = rows * dim;
  const uint64_t state = optimizer == OptimizerType::kAdaGrad
                             ? rows
                             : elements * static_cast<uint64_t>(OptimizerStateSlots(optimizer));
  return (elements + state) * sizeof(float) + chunks * kChunkBookkeepingBytes;
}

}  // namespace rackhub::server
