#include "rackhub/aggregation/chunk_state.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace rackhub::aggregation {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "ChunkState: %s\n", what);
  std::abort();
}

}  // namespace

namespace {

// Heap bytes of one block of `bytes` from operator new: whole 64-byte lines
// (AlignedBuffer), plus what the allocator keeps beside an aligned block
// (glibc: a 16-byte header and up to one alignment of slack).
constexpr uint64_t kBlockOverheadBytes = 16 + kChunkAlignment;
uint64_t BlockBytes(uint64_t bytes) {
  const uint64_t lines = std::max<uint64_t>(1, (bytes + kChunkAlignment - 1) / kChunkAlignment);
  return lines * kChunkAlignment + kBlockOverheadBytes;
}

}  // namespace

uint64_t ChunkState::MemoryBytes(uint32_t elements, uint32_t workers, OptimizerType optimizer,
                                 ElementType wire_type) {
  const uint64_t master = BlockBytes(uint64_t{elements} * kMasterElementBytes);
  const uint64_t wire = BlockBytes(uint64_t{elements} * ElementBytes(wire_type));
  const uint64_t w = std::max<uint32_t>(workers, 1);
  uint64_t total = 2 * master;                                   // parameters, double-buffered
  if (wire_type != ElementType::kFp32) total += 2 * wire;        // their wire copies
  total += master;                                               // accumulator
  total += uint64_t(OptimizerStateSlots(optimizer)) * master;    // optimizer state
  total += (w - 1) * wire;                                       // parked contributions
  // Per rank: contributed_ (1 byte) and spare_of_rank_ (4), sized once;
  // free_spares_ (4), spares_ (16) and inputs_ (8) grow by push_back, so up
  // to twice that. Each vector is one block.
  total += w * (1 + 4 + 2 * (4 + sizeof(AlignedBuffer<std::byte>) + sizeof(const void*))) +
           5 * kBlockOverheadBytes;
  return total;
}

ChunkState::ChunkState(uint32_t elements, uint32_t workers, const OptimizerConfig& optimizer,
                       ElementType wire_type)
    : elements_(elements),
      workers_(workers),
      wire_type_(wire_type),
      optimizer_(optimizer),
      params_{SharedAlignedBuffer<float>(elements), SharedAlignedBuffer<float>(elements)},
      accumulator_(elements),
      contributed_(workers, 0),
      spare_of_rank_(workers, kNoSpare) {
  if (workers == 0) Die("workers must be >= 1");
  expected_ = workers;
  if (!IsValidElementType(static_cast<uint8_t>(wire_type))) Die("invalid wire type");
  if (wire_type != ElementType::kFp32) {
    wire_[0] = SharedAlignedBuffer<std::byte>(wire_bytes());
    wire_[1] = SharedAlignedBuffer<std::byte>(wire_bytes());
  }
  EnsureOptimizerState();
}

float* ChunkState::writable_params(uint64_t v) {
  params_[v & 1].PrepareOverwrite();
  return params_[v & 1].data();
}

std::byte* ChunkState::writable_wire(uint64_t v) {
  wire_[v & 1].PrepareOverwrite();
  return wire_[v & 1].data();
}

void ChunkState::EnsureOptimizerState() {
  const int slots = OptimizerStateSlots(optimizer_.type);
  for (int s = 0; s < slots; ++s) {
    if (!state_[s].empty()) continue;
    state_[s] = AlignedBuffer<float>(elements_);
    if (s == 0 && optimizer_.type == OptimizerType::kAdaGrad) {
      std::fill_n(state_[0].data(), elements_, static_cast<float>(optimizer_.initial_accumulator));
    }
  }
}

ChunkState::AddResult ChunkState::Contribute(uint32_t rank, std::span<const std::byte> payload) {
  if (rank >= workers_) return AddResult::kBadRank;
  if (!is_member(rank)) return AddResult::kNotMember;
  if (payload.size() != wire_bytes()) return AddResult::kBadSize;
  if (contributed_[rank] == kContributed) return AddResult::kDuplicate;

  if (rank == next_rank_) {
    FoldInOrder(payload.data(), rank);
  } else {
    // A lower rank is still missing: park the payload until it arrives.
    uint32_t slot;
    if (!free_spares_.empty()) {
      slot = free_spares_.back();
      free_spares_.pop_back();
    } else {
      slot = static_cast<uint32_t>(spares_.size());
      spares_.emplace_back(wire_bytes());
    }
    std::memcpy(spares_[slot].data(), payload.data(), payload.size());
    spare_of_rank_[rank] = slot;
  }
  contributed_[rank] = kContributed;
  ++contributions_;
  return contributions_ == expected_ ? AddResult::kComplete : AddResult::kAccepted;
}

// Folds `payload` of `rank` (== next_rank_) and the parked contributions that
// follow it in rank order into the accumulator.
void ChunkState::FoldInOrder(const std::byte* payload, uint32_t rank) {
  ++next_rank_;
  SkipAbsent();
  FoldRun(payload, rank == first_rank_);
}

// Folds `dense` (null: none; the rank just before next_rank_) and then the
// parked contributions from next_rank_ on while they are there, in rank
// order: runs of dense ones in one pass each (SumInto / AccumulateInto, the
// bits of adding them one by one), sparse ones entry by entry. `first`:
// the accumulator holds nothing of this update yet.
void ChunkState::FoldRun(const std::byte* dense, bool first) {
  inputs_.clear();
  if (dense) inputs_.push_back(dense);
  auto flush = [&] {
    if (inputs_.empty()) return;
    const Reduction reduction = optimizer_.reduction;
    if (first) {
      ReduceInto(accumulator_.data(), inputs_, elements_, wire_type_, reduction);
    } else {
      ReduceAccumulateInto(accumulator_.data(), inputs_, elements_, wire_type_, reduction);
    }
    first = false;
    inputs_.clear();
  };
  while (next_rank_ < workers_ && spare_of_rank_[next_rank_] != kNoSpare) {
    const uint32_t slot = spare_of_rank_[next_rank_];
    spare_of_rank_[next_rank_] = kNoSpare;
    if (slot == kSparseSpare) {
      flush();
      std::vector<std::byte>& bytes = sparse_spares_[next_rank_];
      const uint32_t count = sparse_count_[next_rank_];
      FoldSparse(SparseView{count, bytes.data(), bytes.data() + size_t{count} * 4}, first);
      first = false;
      bytes.clear();  // keeps its capacity for the next early arrival
    } else {
      inputs_.push_back(spares_[slot].data());
      free_spares_.push_back(slot);  // read by flush(), before any reuse
    }
    ++next_rank_;
    SkipAbsent();
  }
  flush();
}

bool ChunkState::SparseValid(const SparseView& sparse) const {
  // Sparse pushes leave out zeros of a sum; min/max/product have no such
  // zeros (keys with those reductions refuse top-k when declared).
  if (IsElementwiseReduction(optimizer_.reduction)) return false;
  if (sparse.count > elements_) return false;
  if (sparse.count > 0 && (sparse.indices == nullptr || sparse.values == nullptr)) return false;
  uint32_t prev = 0;
  for (uint32_t j = 0; j < sparse.count; ++j) {
    uint32_t i;
    std::memcpy(&i, sparse.indices + size_t{j} * 4, 4);
    if (i >= elements_ || (j > 0 && i <= prev)) return false;
    prev = i;
  }
  return true;
}

void ChunkState::FoldSparse(const SparseView& sparse, bool first) {
  float* acc = accumulator_.data();
  if (first) std::memset(acc, 0, size_t{elements_} * sizeof(float));
  const size_t vb = ElementBytes(wire_type_);
  for (uint32_t j = 0; j < sparse.count; ++j) {
    uint32_t i;
    std::memcpy(&i, sparse.indices + size_t{j} * 4, 4);
    float v;
    CopyIn(&v, sparse.values + j * vb, 1, wire_type_);
    if (first) {
      acc[i] = v;
    } else {
      acc[i] += v;
    }
  }
}

bool ChunkState::ApplyAlone(std::span<const std::byte> payload) {
  if (contributions_ != 0 || payload.size() != wire_bytes()) return false;
  const void* in[1] = {payload.data()};
  SumInto(accumulator_.data(), in, elements_, wire_type_);
  const OptimizerStep step = BeginUpdate();
  ApplyOptimizer(optimizer_, step, accumulator_.data(), param_buffer(version_),
                 writable_params(version_ + 1), state_[0].data(), state_[1].data(), elements_);
  FinishUpdate();
  return true;
}

bool ChunkState::ApplyAloneSparse(const SparseView& sparse) {
  if (contributions_ != 0 || !SparseValid(sparse)) return false;
  FoldSparse(sparse, true);
  const OptimizerStep step = BeginUpdate();
  ApplyOptimizer(optimizer_, step, accumulator_.data(), param_buffer(version_),
                 writable_params(version_ + 1), state_[0].data(), state_[1].data(), elements_);
  FinishUpdate();
  return true;
}

ChunkState::AddResult ChunkState::ContributeSparse(uint32_t rank, const SparseView& sparse) {
  if (rank >= workers_) return AddResult::kBadRank;
  if (!is_member(rank)) return AddResult::kNotMember;
  if (!SparseValid(sparse)) return AddResult::kBadSparse;
  if (contributed_[rank] == kContributed) return AddResult::kDuplicate;
  if (rank == next_rank_) {
    FoldSparse(sparse, rank == first_rank_);
    ++next_rank_;
    SkipAbsent();
    FoldRun(nullptr, false);
  } else {
    if (sparse_spares_.empty()) {
      sparse_spares_.resize(workers_);
      sparse_count_.assign(workers_, 0);
    }
    const size_t vb = ElementBytes(wire_type_);
    std::vector<std::byte>& bytes = sparse_spares_[rank];
    bytes.resize(size_t{sparse.count} * (4 + vb));
    if (sparse.count > 0) {
      std::memcpy(bytes.data(), sparse.indices, size_t{sparse.count} * 4);
      std::memcpy(bytes.data() + size_t{sparse.count} * 4, sparse.values,
                  size_t{sparse.count} * vb);
    }
    sparse_count_[rank] = sparse.count;
    spare_of_rank_[rank] = kSparseSpare;
  }
  contributed_[rank] = kContributed;
  ++contributions_;
  return contributions_ == expected_ ? AddResult::kComplete : AddResult::kAccepted;
}

void ChunkState::ClearContributions() {
  for (uint32_t r = 0; r < workers_; ++r) {
    if (spare_of_rank_[r] == kSparseSpare) {
      sparse_spares_[r].clear();
    } else if (spare_of_rank_[r] != kNoSpare) {
      free_spares_.push_back(spare_of_rank_[r]);
    }
    spare_of_rank_[r] = kNoSpare;
  }
  for (uint8_t& c : contributed_) {
    if (c == kContributed) c = kNotYet;
  }
  contributions_ = 0;
  next_rank_ = first_rank_;
}

bool ChunkState::SetMembers(std::span<const uint8_t> member) {
  if (contributions_ != 0 || member.size() > workers_) return false;
  uint32_t count = 0, first = workers_;
  for (uint32_t r = 0; r < member.size(); ++r) {
    if (!member[r]) continue;
    ++count;
    first = std::min(first, r);
  }
  if (count == 0) return false;
  for (uint32_t r = 0; r < workers_; ++r) {
    contributed_[r] = r < member.size() && member[r] ? kNotYet : kAbsent;
  }
  expected_ = count;
  first_rank_ = first;
  next_rank_ = first;
  return true;
}

void ChunkState::DiscardPending() { ClearContributions(); }

OptimizerStep ChunkState::BeginUpdate() {
  const uint64_t t = version_ + 1;
  if (pending_optimizer_ && t >= pending_optimizer_->from_update) {
    optimizer_ = pending_optimizer_->config;
    pending_optimizer_.reset();
    EnsureOptimizerState();
  }
  return OptimizerStep{
      optimizer_.reduction == Reduction::kMean
          ? static_cast<float>(1.0 / (mean_divisor_ ? mean_divisor_ : expected_))
          : 1.0f,
      t};
}

// The new parameters are in params_[(version_ + 1) & 1].
void ChunkState::FinishUpdate() {
  const uint64_t next = version_ + 1;
  if (wire_type_ != ElementType::kFp32) {
    CopyOut(writable_wire(next), params_[next & 1].data(), elements_, wire_type_);
  }
  version_ = next;
  updated_version_ = next;
  ClearContributions();
}

void ChunkState::Update() {
  if (contributions_ != expected_ || next_rank_ != workers_) {
    Die("Update() before all contributions are in");
  }
  const OptimizerStep step = BeginUpdate();
  ApplyOptimizer(optimizer_, step, accumulator_.data(), param_buffer(version_),
                 writable_params(version_ + 1), state_[0].data(), state_[1].data(), elements_);
  FinishUpdate();
}

bool ChunkState::ReduceAndUpdate(std::span<const std::span<const std::byte>> payloads) {
  if (contributions_ != 0 || payloads.size() != workers_ || expected_ != workers_) return false;
  for (const auto& p : payloads) {
    if (p.size() != wire_bytes()) return false;
  }
  inputs_.clear();
  for (const auto& p : payloads) inputs_.push_back(p.data());
  const OptimizerStep step = BeginUpdate();
  if (IsElementwiseReduction(optimizer_.reduction)) {
    ReduceInto(accumulator_.data(), inputs_, elements_, wire_type_, optimizer_.reduction);
    ApplyOptimizer(optimizer_, step, accumulator_.data(), param_buffer(version_),
                   writable_params(version_ + 1), state_[0].data(), state_[1].data(), elements_);
  } else {
    SumAndApplyOptimizer(optimizer_, step, inputs_, param_buffer(version_),
                         writable_params(version_ + 1), state_[0].data(), state_[1].data(),
                         elements_, wire_type_);
  }
  FinishUpdate();
  return true;
}

std::span<const float> ChunkState::params(uint64_t v) const {
  if (!readable(v)) return {};
  return {param_buffer(v), elements_};
}

std::span<const std::byte> ChunkState::wire_params(uint64_t v) const {
  if (wire_type_ == ElementType::kFp32) return std::as_bytes(params(v));
  if (!readable(v)) return {};
  return {wire_[v & 1].data(), wire_bytes()};
}

std::shared_ptr<const void> ChunkState::params_ref(uint64_t v) const {
  if (!readable(v)) return nullptr;
  return params_[v & 1].Share();
}

std::shared_ptr<const void> ChunkState::wire_params_ref(uint64_t v) const {
  if (wire_type_ == ElementType::kFp32) return params_ref(v);
  if (!readable(v)) return nullptr;
  return wire_[v & 1].Share();
}

bool ChunkState::SetInitial(std::span<const std::byte> payload) {
  if (version_ != 0 || contributions_ != 0 || payload.size() != wire_bytes()) return false;
  CopyIn(writable_params(0), payload.data(), elements_, wire_type_);
  if (wire_type_ != ElementType::kFp32) {
    CopyOut(writable_wire(0), params_[0].data(), elements_, wire_type_);
  }
  initialized_ = true;
  return true;
}

bool ChunkState::SetInitial(std::span<const float> values) {
  if (version_ != 0 || contributions_ != 0 || values.size() != elements_) return false;
  std::copy(values.begin(), values.end(), writable_params(0));
  if (wire_type_ != ElementType::kFp32) {
    CopyOut(writable_wire(0), params_[0].data(), elements_, wire_type_);
  }
  initialized_ = true;
  return true;
}

int ChunkState::state_slots() const { return OptimizerStateSlots(optimizer_.type); }

std::span<const float> ChunkState::optimizer_state(int slot) const {
  if (slot < 0 || slot >= state_slots()) return {};
  return {state_[slot].data(), elements_};
}

bool ChunkState::SkipTo(uint64_t version) {
  if (contributions_ != 0 || version < version_) return false;
  if (version == version_) return true;
  // The other buffer may hold a queued reply of version() - 1: it moves to
  // fresh memory rather than being overwritten.
  const float* current = params_[version_ & 1].data();
  float* other = writable_params(version_ + 1);
  std::copy_n(current, elements_, other);
  if (wire_type_ != ElementType::kFp32) {
    const std::byte* current_wire = wire_[version_ & 1].data();
    std::copy_n(current_wire, wire_bytes(), writable_wire(version_ + 1));
  }
  version_ = version;
  updated_version_ = 0;
  return true;
}

bool ChunkState::Restore(uint64_t version, std::span<const float> params,
                         std::span<const std::span<const float>> state) {
  if (contributions_ != 0 || params.size() != elements_) return false;
  if (state.size() != static_cast<size_t>(state_slots())) return false;
  for (const auto& s : state) {
    if (s.size() != elements_) return false;
  }
  for (int b = 0; b < 2; ++b) {
    // Replies still queued keep the old values (fresh memory if shared).
    std::copy(params.begin(), params.end(), writable_params(b));
    if (wire_type_ != ElementType::kFp32) {
      CopyOut(writable_wire(b), params_[b].data(), elements_, wire_type_);
    }
  }
  for (size_t s = 0; s < state.size(); ++s) {
    std::copy(state[s].begin(), state[s].end(), state_[s].data());
  }
  version_ = version;
  updated_version_ = 0;
  initialized_ = true;
  return true;
}

void ChunkState::SetOptimizer(const OptimizerConfig& optimizer, uint64_t from_update) {
  pending_optimizer_ = PendingOptimizer{optimizer, from_update};
}

}  // namespace rackhub::aggregation
