#include "rackhub/aggregation/row_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace rackhub::aggregation {

void TableInitValues(uint64_t seed, float scale, uint64_t first_row, uint64_t rows,
                     uint32_t dim, float* out) {
  const auto mix = [](uint64_t z) {  // SplitMix64's output function
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  // The seed is mixed first, so seeds s and s + 1 are unrelated streams.
  uint64_t n = mix(seed) + first_row * dim;
  const uint64_t total = rows * dim;
  for (uint64_t i = 0; i < total; ++i, ++n) {
    const uint64_t z = mix(n);
    const double u = static_cast<double>(z >> 40) * (1.0 / 8388608.0) - 1.0;  // exact
    out[i] = static_cast<float>(u) * scale;
  }
}

RowShard::RowShard(uint64_t first_row, uint64_t row_count, uint32_t dim, uint32_t workers,
                   const OptimizerConfig& optimizer)
    : first_(first_row),
      count_(row_count),
      dim_(dim),
      workers_(workers),
      cfg_(optimizer),
      row_wise_(optimizer.type == OptimizerType::kAdaGrad),
      values_(row_count * dim),
      mean_divisor_(workers),
      sums_(workers, dim),
      scratch_(static_cast<size_t>(dim)) {
  if (row_wise_) {
    state0_ = AlignedBuffer<float>(row_count);
    std::fill_n(state0_.data(), row_count, static_cast<float>(cfg_.initial_accumulator));
    return;
  }
  const int slots = OptimizerStateSlots(cfg_.type);
  if (slots >= 1) state0_ = AlignedBuffer<float>(row_count * dim);
  if (slots >= 2) state1_ = AlignedBuffer<float>(row_count * dim);
}

Status RowShard::CheckRows(std::span<const uint64_t> ids) const {
  for (const uint64_t id : ids) {
    if (id < first_ || id - first_ >= count_) {
      return InvalidArgument("row id " + std::to_string(id) + " is not in [" +
                             std::to_string(first_) + ", " + std::to_string(first_ + count_) + ")");
    }
  }
  return Status::Ok();
}

Status RowShard::CheckContribution(uint32_t rank, std::span<const uint64_t> ids,
                                   size_t payload_bytes, ElementType type) const {
  if (rank >= workers_) {
    return InvalidArgument("rank " + std::to_string(rank) + " is not in [0, " +
                           std::to_string(workers_) + ")");
  }
  if (sums_.contributed(rank)) {
    return InvalidArgument("rank " + std::to_string(rank) + " already contributed to update " +
                           std::to_string(version_ + 1));
  }
  const size_t want = ids.size() * dim_ * ElementBytes(type);
  if (payload_bytes != want) {
    return InvalidArgument(std::to_string(ids.size()) + " row ids need " + std::to_string(want) +
                           " bytes of " + ElementTypeName(type) + " rows of " +
                           std::to_string(dim_) + ", got " + std::to_string(payload_bytes));
  }
  return CheckRows(ids);
}

void RowShard::Contribute(uint32_t rank, std::span<const uint64_t> ids, const void* rows,
                          ElementType type) {
  sums_.Contribute(rank, ids, rows, type);
}

void RowShard::Discard() { sums_.Discard(); }

void RowShard::InitRandom(uint64_t seed, float scale) {
  TableInitValues(seed, scale, first_, count_, dim_, values_.data());
}

void RowShard::SetOptimizer(const OptimizerConfig& optimizer, uint64_t from_update) {
  next_cfg_ = optimizer;
  next_from_ = std::max<uint64_t>(from_update, version_ + 1);
}

std::vector<uint64_t> RowShard::Update() {
  if (next_from_ != 0 && version_ + 1 >= next_from_) {
    cfg_ = next_cfg_;
    next_from_ = 0;
  }
  std::vector<uint64_t> touched = sums_.Take(&row_sums_);
  const OptimizerStep step{
      cfg_.reduction == Reduction::kMean ? static_cast<float>(1.0 / mean_divisor_) : 1.0f,
      version_ + 1};
  for (size_t i = 0; i < touched.size(); ++i) {
    ApplyRow(touched[i], row_sums_.data() + i * dim_, step);
  }
  ++version_;
  return touched;
}

void RowShard::ApplyRow(uint64_t id, const float* sum, const OptimizerStep& step) {
  float* p = RowPtr(id);
  const size_t r = id - first_;
  if (!row_wise_) {
    float* out = scratch_.data();
    float* s0 = state0_.empty() ? nullptr : state0_.data() + r * dim_;
    float* s1 = state1_.empty() ? nullptr : state1_.data() + r * dim_;
    ApplyOptimizer(cfg_, step, sum, p, out, s0, s1, dim_);
    std::memcpy(p, out, dim_ * sizeof(float));
    return;
  }
  // Row-wise AdaGrad, all in fp32 in index order (built with
  // -ffp-contract=off: no fused multiply-add).
  const float lr = static_cast<float>(cfg_.learning_rate);
  const float wd = static_cast<float>(cfg_.weight_decay);
  const float eps = static_cast<float>(cfg_.epsilon);
  float* d = scratch_.data();
  float squares = 0.0f;
  for (uint32_t j = 0; j < dim_; ++j) {
    d[j] = sum[j] * step.grad_scale + wd * p[j];
    squares += d[j] * d[j];
  }
  float& s = state0_.data()[r];
  s = s + squares / static_cast<float>(dim_);
  const float denom = std::sqrt(s) + eps;
  for (uint32_t j = 0; j < dim_; ++j) p[j] = p[j] - lr * d[j] / denom;
}

void RowShard::ReadRows(std::span<const uint64_t> ids, void* out, ElementType type) const {
  const size_t row_bytes = dim_ * ElementBytes(type);
  auto* dst = static_cast<std::byte*>(out);
  for (const uint64_t id : ids) {
    CopyOut(dst, values_.data() + (id - first_) * dim_, dim_, type);
    dst += row_bytes;
  }
}

void RowShard::WriteRows(std::span<const uint64_t> ids, const void* rows, ElementType type) {
  const size_t row_bytes = dim_ * ElementBytes(type);
  const auto* src = static_cast<const std::byte*>(rows);
  for (const uint64_t id : ids) {
    CopyIn(RowPtr(id), src, dim_, type);
    src += row_bytes;
  }
}

std::span<const float> RowShard::row(uint64_t id) const {
  return {values_.data() + (id - first_) * dim_, dim_};
}

std::span<const float> RowShard::state(int slot) const {
  const AlignedBuffer<float>& b = slot == 0 ? state0_ : state1_;
  return b.span();
}

size_t RowShard::memory_bytes() const {
  return (values_.size() + state0_.size() + state1_.size()) * sizeof(float) +
         sums_.memory_bytes();
}

}  // namespace rackhub::aggregation
