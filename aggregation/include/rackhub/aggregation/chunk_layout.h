// Chunk layout of a tenant: how keys map onto the tenant-wide chunk index
// space and chunks onto lanes (docs/architecture.md, Concepts).
//
// A tenant's keys are laid out in registration order in one index space
// g = 0, 1, 2, ...; a key of n elements with chunk size c elements takes
// ceil(n / c) consecutive indices. Chunk g lives on lane g % lanes. Indices of
// deleted keys are never reused, so the layout of a live key never changes.
//
// Plain values; no synchronization. Callers guard shared instances.
#pragma once

#include <cstdint>
#include <vector>

namespace rackhub::aggregation {

// Chunks are aligned to this many bytes in hub memory (cache line, and the
// widest SIMD register we use).
inline constexpr uint32_t kChunkAlignment = 64;
inline constexpr uint32_t kDefaultChunkBytes = 32 * 1024;
inline constexpr uint32_t kMinChunkBytes = 1024;
inline constexpr uint32_t kMaxChunkBytes = 64u * 1024 * 1024;
// Master parameters and accumulators are fp32.
inline constexpr uint32_t kMasterElementBytes = 4;

struct ChunkSpan {
  uint64_t index = 0;          // tenant-wide chunk index g
  uint32_t lane = 0;           // g % lanes
  uint64_t first_element = 0;  // offset in the key, in elements
  uint32_t elements = 0;       // the last chunk of a key may be short
};

// Where one key sits in its tenant's chunk index space.
struct KeyPlacement {
  uint64_t first_chunk = 0;
  uint64_t chunk_count = 0;
};

class ChunkLayout {
 public:
  // REQUIRES: chunk_bytes is a multiple of kChunkAlignment within
  // [kMinChunkBytes, kMaxChunkBytes]; lanes >= 1. Violations abort: callers
  // validate user input first (see IsValidChunkBytes).
  ChunkLayout(uint32_t chunk_bytes, uint32_t lanes);

  static bool IsValidChunkBytes(uint64_t chunk_bytes);

  uint32_t chunk_bytes() const { return chunk_bytes_; }
  uint32_t chunk_elements() const { return chunk_bytes_ / kMasterElementBytes; }
  uint32_t lanes() const { return lanes_; }
  uint64_t next_chunk() const { return next_chunk_; }

  // Number of chunks a key of `elements` elements needs.
  uint64_t ChunksFor(uint64_t elements) const;
  // Reserves the next indices for a key; never fails (indices are 64-bit).
  KeyPlacement Allocate(uint64_t elements);
  uint32_t LaneOf(uint64_t chunk_index) const {
    return static_cast<uint32_t>(chunk_index % lanes_);
  }
  // The chunks of a placed key, in order: all of them, or `count` from the
  // key's chunk `from` (clipped to the key).
  std::vector<ChunkSpan> Chunks(const KeyPlacement& placement, uint64_t elements,
                                uint64_t from = 0, uint64_t count = UINT64_MAX) const;

  // Row-sparse tables (rows x dim) are cut by whole rows, not by chunk size:
  // TableRowsPerChunk = ceil(rows / lanes) rows per chunk, TableChunkCount =
  // ceil(rows / that) chunks (at most `lanes`, so a lane owns at most one
  // range of each table). Chunk c holds rows [c * per, min(rows, (c + 1) *
  // per)); its ChunkSpan counts elements (first_element = first row * dim).
  // `per` is fixed when the table is created (a hub restarted with another
  // lane count keeps it: TableChunks takes it, not the lanes).
  static uint64_t TableRowsPerChunk(uint64_t rows, uint32_t lanes);
  static uint64_t TableChunkCount(uint64_t rows, uint32_t lanes);
  KeyPlacement AllocateTable(uint64_t rows);
  std::vector<ChunkSpan> TableChunks(const KeyPlacement& placement, uint64_t rows, uint32_t dim,
                                     uint64_t rows_per_chunk, uint64_t from = 0,
                                     uint64_t count = UINT64_MAX) const;

 private:
  uint32_t chunk_bytes_;
  uint32_t lanes_;
  uint64_t next_chunk_ = 0;
};

}  // namespace rackhub::aggregation
