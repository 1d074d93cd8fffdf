#include "rackhub/aggregation/row_sums.h"

#include <algorithm>
#include <cstring>

namespace rackhub::aggregation {

RowSums::RowSums(uint32_t contributors, uint32_t dim) : dim_(dim), pending_(contributors) {}

void RowSums::Contribute(uint32_t c, std::span<const uint64_t> ids, const void* rows,
                         ElementType type) {
  Pending& p = pending_[c];
  p.in = true;
  ++count_;
  const size_t row_bytes = dim_ * ElementBytes(type);
  const auto* src = static_cast<const std::byte*>(rows);
  for (size_t i = 0; i < ids.size(); ++i, src += row_bytes) {
    const auto [it, fresh] = p.index.try_emplace(ids[i], static_cast<uint32_t>(p.ids.size()));
    if (fresh) {
      p.ids.push_back(ids[i]);
      p.rows.resize(p.rows.size() + dim_);
      CopyIn(p.rows.data() + p.rows.size() - dim_, src, dim_, type);
    } else {
      AddIn(p.rows.data() + static_cast<size_t>(it->second) * dim_, src, dim_, type);
    }
  }
}

void RowSums::Discard() {
  for (Pending& p : pending_) p = Pending{};
  count_ = 0;
}

uint64_t RowSums::touched_rows() const {
  std::vector<uint64_t> touched;
  for (const Pending& p : pending_) touched.insert(touched.end(), p.ids.begin(), p.ids.end());
  std::sort(touched.begin(), touched.end());
  return static_cast<uint64_t>(std::unique(touched.begin(), touched.end()) - touched.begin());
}

std::vector<uint64_t> RowSums::Take(std::vector<float>* sums) {
  std::vector<uint64_t> touched;
  for (const Pending& p : pending_) touched.insert(touched.end(), p.ids.begin(), p.ids.end());
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  sums->assign(touched.size() * dim_, 0.0f);
  float* sum = sums->data();
  for (const uint64_t id : touched) {
    bool first = true;
    for (const Pending& p : pending_) {  // contributor order
      const auto it = p.index.find(id);
      if (it == p.index.end()) continue;
      const float* row = p.rows.data() + static_cast<size_t>(it->second) * dim_;
      if (first) {
        std::memcpy(sum, row, dim_ * sizeof(float));
        first = false;
      } else {
        AddIn(sum, row, dim_, ElementType::kFp32);
      }
    }
    sum += dim_;
  }
  Discard();
  return touched;
}

size_t RowSums::memory_bytes() const {
  size_t bytes = 0;
  for (const Pending& p : pending_) {
    bytes += p.rows.capacity() * sizeof(float) + p.ids.capacity() * sizeof(uint64_t) +
             p.index.size() * (sizeof(uint64_t) + sizeof(uint32_t) + 2 * sizeof(void*));
  }
  return bytes;
}

}  // namespace rackhub::aggregation
