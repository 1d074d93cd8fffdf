// Test support: the reference model of a row-sparse table (issue 16), for
// row_shard_test and table_test. Dense rows and optimizer state, updated from
// one iteration's pushes the way the contract of aggregation/row_shard.h
// says, written out independently of RowShard: each rank's duplicates summed
// in push order (first occurrence copied, the next ones added), each touched
// row summed over the ranks in rank order (from the lowest rank that touched
// it), the optimizer applied to touched rows only (ApplyOptimizer, the dense
// keys' kernel, on the row for the per-element optimizers; row-wise AdaGrad
// written out below), untouched rows and their state left alone.
//
// Pushed rows are given as the hub receives them (already narrowed for
// fp16/bf16 keys). Plain value type; single-threaded.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::testing {

struct TablePush {
  std::vector<uint64_t> ids;
  std::vector<float> rows;  // ids.size() * dim
};

struct TableReference {
  aggregation::OptimizerConfig cfg;
  uint32_t workers = 1;
  uint64_t first = 0;  // first row id
  uint64_t rows = 0;
  uint32_t dim = 0;
  std::vector<float> values, s0, s1, row_acc;
  uint64_t t = 0;  // updates applied (Adam's bias correction)

  TableReference(const aggregation::OptimizerConfig& c, uint32_t w, uint64_t first_row,
                 uint64_t row_count, uint32_t d)
      : cfg(c), workers(w), first(first_row), rows(row_count), dim(d),
        values(row_count * d, 0.0f), s0(row_count * d, 0.0f), s1(row_count * d, 0.0f),
        row_acc(row_count, static_cast<float>(c.initial_accumulator)) {}

  const float* Row(uint64_t id) const { return values.data() + (id - first) * dim; }

  void Update(const std::vector<TablePush>& by_rank) { Apply(RankOrderSums(by_rank)); }

  // A table spanning racks (by_rack[rack][rank]; `workers` = every rack's
  // workers, the mean's divisor): each rack's pushes summed per row as Update
  // sums the ranks, then the racks' sums per row in rack order (from the
  // lowest rack that touched it), then the optimizer.
  void UpdateAcrossRacks(const std::vector<std::vector<TablePush>>& by_rack) {
    std::vector<TablePush> rack_sums(by_rack.size());
    for (size_t r = 0; r < by_rack.size(); ++r) {
      for (const auto& [id, row] : RankOrderSums(by_rack[r])) {
        rack_sums[r].ids.push_back(id);
        rack_sums[r].rows.insert(rack_sums[r].rows.end(), row.begin(), row.end());
      }
    }
    Apply(RankOrderSums(rack_sums));
  }

  // Each touched row summed over the pushes in order (duplicates within a
  // push first, in push order).
  std::map<uint64_t, std::vector<float>> RankOrderSums(const std::vector<TablePush>& by_rank) const {
    std::vector<std::map<uint64_t, std::vector<float>>> mine(by_rank.size());
    for (size_t r = 0; r < by_rank.size(); ++r) {
      for (size_t i = 0; i < by_rank[r].ids.size(); ++i) {
        const float* row = by_rank[r].rows.data() + i * dim;
        auto [it, fresh] = mine[r].try_emplace(by_rank[r].ids[i], row, row + dim);
        if (!fresh) {
          for (uint32_t j = 0; j < dim; ++j) it->second[j] = it->second[j] + row[j];
        }
      }
    }
    std::map<uint64_t, std::vector<float>> sums;  // rank order
    for (size_t r = 0; r < by_rank.size(); ++r) {
      for (const auto& [id, row] : mine[r]) {
        auto [it, fresh] = sums.try_emplace(id, row);
        if (!fresh) {
          for (uint32_t j = 0; j < dim; ++j) it->second[j] = it->second[j] + row[j];
        }
      }
    }
    return sums;
  }

  // The optimizer on the touched rows (`sums`), one update.
  void Apply(const std::map<uint64_t, std::vector<float>>& sums) {
    ++t;
    const float scale = cfg.reduction == aggregation::Reduction::kMean
                            ? static_cast<float>(1.0 / workers)
                            : 1.0f;
    std::vector<float> d(dim), out(dim);
    for (const auto& [id, sum] : sums) {
      const size_t r = id - first;
      float* p = values.data() + r * dim;
      if (cfg.type == aggregation::OptimizerType::kAdaGrad) {
        const float lr = static_cast<float>(cfg.learning_rate);
        const float wd = static_cast<float>(cfg.weight_decay);
        const float eps = static_cast<float>(cfg.epsilon);
        float squares = 0.0f;
        for (uint32_t j = 0; j < dim; ++j) {
          const float g = sum[j] * scale;
          const float decay = wd * p[j];
          d[j] = g + decay;
          const float sq = d[j] * d[j];
          squares = squares + sq;
        }
        row_acc[r] = row_acc[r] + squares / static_cast<float>(dim);
        const float denom = std::sqrt(row_acc[r]) + eps;
        for (uint32_t j = 0; j < dim; ++j) {
          const float step = lr * d[j];
          p[j] = p[j] - step / denom;
        }
        continue;
      }
      aggregation::ApplyOptimizer(cfg, aggregation::OptimizerStep{scale, t}, sum.data(), p,
                                  out.data(), s0.data() + r * dim, s1.data() + r * dim, dim);
      std::memcpy(p, out.data(), dim * sizeof(float));
    }
  }
};

}  // namespace rackhub::testing
