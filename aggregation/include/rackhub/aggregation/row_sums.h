// RowSums: the contributions of one iteration to a range of table rows, by
// contributor, and their per-row sums in contributor order (docs/
// architecture.md, "Row-sparse tables"). RowShard keeps one for its ranks;
// a hub serving a rack of a table that spans racks keeps one per rack
// (contributors = that rack's ranks) whose sums go to the row range's home,
// where they are the contributions (contributors = racks) of its RowShard.
//
//   - Row ids may come in any order. Duplicates inside one contribution are
//     summed first, in the order given (the row's first occurrence is
//     copied, the next ones added). An empty contribution is valid.
//   - A row's sum starts from the lowest contributor that touched it and
//     adds the others in contributor order (those that did not touch it add
//     nothing, not +0.0): bitwise identical whatever the order contributions
//     arrive in.
//
// Inputs are checked by the owner (RowShard::CheckRows, payload sizes).
// Ownership and threads: owned by one lane and used by its thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "rackhub/aggregation/kernels.h"

namespace rackhub::aggregation {

class RowSums {
 public:
  RowSums(uint32_t contributors, uint32_t dim);

  uint32_t contributors() const { return static_cast<uint32_t>(pending_.size()); }
  bool contributed(uint32_t c) const { return pending_[c].in; }
  bool ready() const { return count_ == pending_.size(); }
  bool pending() const { return count_ > 0; }

  // Keeps contributor c's rows (ids.size() rows of dim elements of `type`).
  // REQUIRES: c < contributors(), !contributed(c).
  void Contribute(uint32_t c, std::span<const uint64_t> ids, const void* rows, ElementType type);
  // Drops this iteration's contributions.
  void Discard();
  // REQUIRES: ready(). The touched row ids, ascending; `sums` gets their
  // sums (ids.size() * dim fp32, row after row). Clears the contributions.
  std::vector<uint64_t> Take(std::vector<float>* sums);
  // How many distinct rows the contributions so far touch (what Take would
  // return, counted).
  uint64_t touched_rows() const;
  size_t memory_bytes() const;

 private:
  // One contributor's distinct rows in first-seen order.
  struct Pending {
    bool in = false;
    std::vector<uint64_t> ids;
    std::vector<float> rows;  // ids.size() * dim
    std::unordered_map<uint64_t, uint32_t> index;  // id -> position in ids
  };
  uint32_t dim_;
  std::vector<Pending> pending_;  // by contributor
  uint32_t count_ = 0;
};

}  // namespace rackhub::aggregation
