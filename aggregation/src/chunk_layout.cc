#include "rackhub/aggregation/chunk_layout.h"

#include <cstdlib>
#include <cstdio>

namespace rackhub::aggregation {

bool ChunkLayout::IsValidChunkBytes(uint64_t chunk_bytes) {
  return chunk_bytes >= kMinChunkBytes && chunk_bytes <= kMaxChunkBytes &&
         chunk_bytes % kChunkAlignment == 0;
}

ChunkLayout::ChunkLayout(uint32_t chunk_bytes, uint32_t lanes)
    : chunk_bytes_(chunk_bytes), lanes_(lanes) {
  if (!IsValidChunkBytes(chunk_bytes) || lanes == 0) {
    std::fprintf(stderr, "ChunkLayout: invalid chunk_bytes=%u lanes=%u\n", chunk_bytes, lanes);
    std::abort();
  }
}

uint64_t ChunkLayout::ChunksFor(uint64_t elements) const {
  const uint64_t per = chunk_elements();
  // Not (elements + per - 1) / per: that wraps for elements near 2^64.
  return elements / per + (elements % per != 0 ? 1 : 0);
}

KeyPlacement ChunkLayout::Allocate(uint64_t elements) {
  KeyPlacement p{next_chunk_, ChunksFor(elements)};
  next_chunk_ += p.chunk_count;
  return p;
}

namespace {

// The chunk indices [from, end) of a key of `chunk_count` chunks that
// Chunks(.., from, count) lists.
uint64_t PageEnd(uint64_t chunk_count, uint64_t from, uint64_t count) {
  if (from >= chunk_count) return from;
  return count >= chunk_count - from ? chunk_count : from + count;
}

}  // namespace

std::vector<ChunkSpan> ChunkLayout::Chunks(const KeyPlacement& placement, uint64_t elements,
                                           uint64_t from, uint64_t count) const {
  std::vector<ChunkSpan> out;
  const uint64_t end = PageEnd(placement.chunk_count, from, count);
  out.reserve(end - from);
  const uint64_t per = chunk_elements();
  for (uint64_t i = from; i < end; ++i) {
    const uint64_t first = i * per;
    const uint64_t n = elements - first < per ? elements - first : per;
    const uint64_t g = placement.first_chunk + i;
    out.push_back(ChunkSpan{g, LaneOf(g), first, static_cast<uint32_t>(n)});
  }
  return out;
}

uint64_t ChunkLayout::TableRowsPerChunk(uint64_t rows, uint32_t lanes) {
  return rows / lanes + (rows % lanes != 0 ? 1 : 0);
}

uint64_t ChunkLayout::TableChunkCount(uint64_t rows, uint32_t lanes) {
  const uint64_t per = TableRowsPerChunk(rows, lanes);
  return per == 0 ? 0 : rows / per + (rows % per != 0 ? 1 : 0);
}

KeyPlacement ChunkLayout::AllocateTable(uint64_t rows) {
  KeyPlacement p{next_chunk_, TableChunkCount(rows, lanes_)};
  next_chunk_ += p.chunk_count;
  return p;
}

std::vector<ChunkSpan> ChunkLayout::TableChunks(const KeyPlacement& placement, uint64_t rows,
                                                uint32_t dim, uint64_t per, uint64_t from,
                                                uint64_t count) const {
  std::vector<ChunkSpan> out;
  const uint64_t end = PageEnd(placement.chunk_count, from, count);
  for (uint64_t i = from; i < end; ++i) {
    const uint64_t first = i * per;
    const uint64_t n = rows - first < per ? rows - first : per;
    const uint64_t g = placement.first_chunk + i;
    out.push_back(ChunkSpan{g, LaneOf(g), first * dim, static_cast<uint32_t>(n * dim)});
  }
  return out;
}

}  // namespace rackhub::aggregation
