// RowShard: the rows of a row-sparse table key (an embedding table, rows x
// dim) that one hub lane owns, a contiguous range of whole rows, with their
// fp32 master values, the optimizer state and the contributions of the
// iteration being formed (issue 16; docs/architecture.md, "Row-sparse
// tables").
//
// One iteration: every one of `workers` ranks contributes (row ids, one
// gradient row per id); then Update() sums each touched row over the ranks
// in rank order and applies the optimizer to the touched rows only.
//   - Row ids may come in any order. Duplicates inside one contribution are
//     summed first, in the order given (the row's first occurrence is
//     copied, the next ones added). An empty contribution is valid.
//   - A row's sum starts from the lowest rank that touched it and adds the
//     others in rank order (ranks that did not touch it add nothing, not
//     +0.0): bitwise identical whatever the order contributions arrive in.
//   - Reduction kMean scales by 1/workers (all workers, not only the ranks
//     that touched the row), kSum by 1: as for dense keys.
//   - Optimizers, on touched rows only ("lazy"): every type ApplyOptimizer
//     knows (SGD, momentum, Nesterov, Adam, AdamW: per-element state, Adam's
//     bias correction with the table's update count t, as torch's SparseAdam),
//     except kAdaGrad, which is ROW-WISE here (as DLRM/FBGEMM): one
//     accumulator per row, s += mean over the row of d*d (d = g + wd*p, summed
//     left to right), p -= lr * d / (sqrt(s) + eps). Untouched rows keep their
//     values and their state.
// Rows start at +0.0, or at TableInitValues (InitRandom); WriteRows sets
// them (checkpoint restore).
//
// Validation: Check*() return OK or INVALID_ARGUMENT naming the problem; the
// mutating calls REQUIRE a checked input, so a bad contribution changes
// nothing.
//
// Ownership and threads: owned by one lane and used by its thread only; no
// locks. Movable, not copyable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "rackhub/aggregation/chunk_state.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"
#include "rackhub/aggregation/row_sums.h"
#include "rackhub/common/status.h"

namespace rackhub::aggregation {

// The initial value of row `row`, column `col` of a table initialized with
// (seed, scale): x = M(M(seed) + row * dim + col) (mod 2^64), M SplitMix64's
// output function (so neighbouring seeds give unrelated values); u = (x >>
// 40) in [0, 2^24); value = float(u * 2^-23 - 1) * scale (one fp32
// rounding), uniform in [-scale, scale). Layout-independent. Fills `out` with
// rows [first_row, first_row + rows) of `dim` columns.
void TableInitValues(uint64_t seed, float scale, uint64_t first_row, uint64_t rows,
                     uint32_t dim, float* out);

class RowShard {
 public:
  // Rows [first_row, first_row + row_count) of a table of `dim` columns.
  // REQUIRES: row_count >= 1, dim >= 1, workers >= 1, `optimizer` normalized
  // (NormalizeOptimizer returned OK).
  RowShard(uint64_t first_row, uint64_t row_count, uint32_t dim, uint32_t workers,
           const OptimizerConfig& optimizer);
  RowShard(RowShard&&) noexcept = default;
  RowShard& operator=(RowShard&&) noexcept = default;

  uint64_t first_row() const { return first_; }
  uint64_t row_count() const { return count_; }
  uint32_t dim() const { return dim_; }
  uint64_t version() const { return version_; }  // updates applied
  const OptimizerConfig& optimizer() const { return cfg_; }

  // OK if every id is in this shard's range, else INVALID_ARGUMENT "row id X
  // is not in [a, b)".
  Status CheckRows(std::span<const uint64_t> ids) const;
  // OK if `rank` may contribute `ids` with `payload_bytes` bytes of rows of
  // `type` (ids.size() * dim elements) now, else INVALID_ARGUMENT saying why.
  Status CheckContribution(uint32_t rank, std::span<const uint64_t> ids, size_t payload_bytes,
                           ElementType type) const;
  // Keeps rank's rows for this iteration (duplicates summed). REQUIRES:
  // CheckContribution(...) returned OK.
  void Contribute(uint32_t rank, std::span<const uint64_t> ids, const void* rows, ElementType type);
  bool contributed(uint32_t rank) const { return sums_.contributed(rank); }
  bool ready() const { return sums_.ready(); }
  // The contributions being formed (RowSums), for a caller that sums them
  // itself (a table spanning racks: the rack's sums go to the rows' home).
  RowSums& sums() { return sums_; }
  // kMean divides the sums by `divisor` instead of `workers` (a table
  // spanning racks: the home's contributors are the racks, the mean is over
  // every rack's workers). REQUIRES: divisor >= 1.
  void set_mean_divisor(uint32_t divisor) { mean_divisor_ = divisor; }

  // Drops this iteration's contributions (an update aborted for a straggler
  // or a lost worker); values, state and version() are unchanged.
  void Discard();
  bool pending() const { return sums_.pending(); }
  // Sets every row to TableInitValues(seed, scale, ...) of its row.
  void InitRandom(uint64_t seed, float scale);
  // New hyperparameters (same type) from update `from_update` (1-based; 0:
  // the next update) on, as ChunkState::SetOptimizer.
  void SetOptimizer(const OptimizerConfig& optimizer, uint64_t from_update);
  // Restore / a skipped step: the update count (Adam's t follows it).
  void set_version(uint64_t v) { version_ = v; }
  // Mutable fp32 values (rows x dim) and optimizer state (as state()), for
  // checkpoint restore. REQUIRES: no contribution pending.
  std::span<float> mutable_values() { return values_.span(); }
  std::span<float> mutable_state(int slot) { return (slot == 0 ? state0_ : state1_).span(); }

  // REQUIRES: ready(). Sums and applies the optimizer to the touched rows,
  // clears the contributions, version() + 1. Returns the touched row ids,
  // ascending.
  std::vector<uint64_t> Update();

  // Rows `ids` (REQUIRES: CheckRows(ids) is OK) converted to `type`, row
  // after row, into `out` (ids.size() * dim elements).
  void ReadRows(std::span<const uint64_t> ids, void* out, ElementType type) const;
  // Sets rows `ids` (checked) to `rows` (ids.size() * dim elements of `type`);
  // their optimizer state is kept.
  void WriteRows(std::span<const uint64_t> ids, const void* rows, ElementType type);

  // The row's fp32 values and optimizer state, for checkpoints and tests:
  // slot 0/1 as ApplyOptimizer's state0/state1 (dim values per row), or the
  // row-wise AdaGrad accumulator (one value per row) as slot 0.
  std::span<const float> row(uint64_t id) const;
  std::span<const float> values() const { return values_.span(); }  // rows x dim
  std::span<const float> state(int slot) const;
  // Bytes of hub memory the shard holds now (values, state, contributions).
  size_t memory_bytes() const;

 private:
  float* RowPtr(uint64_t id) { return values_.data() + (id - first_) * dim_; }
  void ApplyRow(uint64_t id, const float* sum, const OptimizerStep& step);

  uint64_t first_ = 0;
  uint64_t count_ = 0;
  uint32_t dim_ = 0;
  uint32_t workers_ = 0;
  OptimizerConfig cfg_;
  bool row_wise_ = false;  // kAdaGrad: one accumulator per row
  OptimizerConfig next_cfg_;  // SetOptimizer's, from update next_from_
  uint64_t next_from_ = 0;    // 0: none pending
  uint64_t version_ = 0;
  AlignedBuffer<float> values_;
  AlignedBuffer<float> state0_;
  AlignedBuffer<float> state1_;
  uint32_t mean_divisor_ = 0;     // kMean scales by 1 / this (workers by default)
  RowSums sums_;                  // this iteration's contributions, by rank
  std::vector<float> scratch_;    // dim: a row's new values
  std::vector<float> row_sums_;   // Update's sums of the touched rows
};

}  // namespace rackhub::aggregation
