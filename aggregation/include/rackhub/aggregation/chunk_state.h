// The state a hub lane keeps for one chunk (docs/architecture.md, The data
// path): the accumulator of the update being formed, the fp32 master
// parameters (double-buffered), their wire-type copy, and the optimizer state.
//
// Ownership and threads: a ChunkState belongs to the lane that owns the chunk
// (g % lanes) and is only touched by that lane's thread. No locks, no atomics;
// it is movable so lanes can keep them in containers, not copyable.
//
// Reproducibility: contributions are summed in rank order whatever their
// arrival order (rank 0's copied into the accumulator, rank 1's added, ...),
// so the parameters are bitwise identical for every arrival order. An
// in-order contribution and the parked ones that follow it in rank order are
// folded into the accumulator in one pass (SumInto / AccumulateInto, same bits
// as adding them one by one). With Reduction kMin, kMax or kProduct the same
// happens with that element-wise operation in place of the addition
// (ReduceInto / ReduceAccumulateInto); such chunks take no sparse
// contributions (kBadSparse).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "rackhub/aggregation/chunk_layout.h"
#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/optimizer_config.h"

namespace rackhub::aggregation {

// An owning, zero-initialized array of trivially copyable T whose first element
// is aligned to kChunkAlignment (64) bytes. The allocation is rounded up to a
// whole number of 64-byte lines so vector loops may touch the tail line.
template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) : size_(count) {
    size_t bytes = count * sizeof(T);
    bytes = (bytes + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
    if (bytes == 0) bytes = kChunkAlignment;
    void* raw = ::operator new(bytes, std::align_val_t{kChunkAlignment});
    std::memset(raw, 0, bytes);
    data_.reset(static_cast<T*>(raw));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  std::span<T> span() { return {data_.get(), size_}; }
  std::span<const T> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t{kChunkAlignment}); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

// A zero-initialized aligned array (as AlignedBuffer) whose memory readers
// may hold on to: Share() returns a reference that keeps the memory alive
// after the buffer let go of it (destroyed, or moved to fresh memory), so
// bytes handed to a transport stay valid until it is done with them, whatever
// happens to the chunk meanwhile. Memory a reader holds is never written
// again: a writer calls PrepareOverwrite() before overwriting the whole
// buffer, which moves the buffer to fresh (zeroed) memory if a reader still
// holds the current one (copy-on-write without the copy; every write of
// these buffers overwrites them entirely).
//
// Threads: the buffer is used by one thread; references may be dropped on
// any thread (shared_ptr's count is atomic). A count read as "shared" that
// is being dropped elsewhere only costs one allocation.
template <typename T>
class SharedAlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SharedAlignedBuffer() = default;
  explicit SharedAlignedBuffer(size_t count) : size_(count) { Allocate(); }

  T* data() { return data_.get(); }  // for writing: PrepareOverwrite() first
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return data_ == nullptr; }
  // A reference keeping the current memory alive and unchanged.
  std::shared_ptr<const void> Share() const { return data_; }
  // True while a reader holds the current memory.
  bool shared() const { return data_.use_count() > 1; }
  // Before overwriting every element: fresh memory if a reader holds this.
  // Returns true if it moved.
  bool PrepareOverwrite() {
    if (!shared()) return false;
    Allocate();
    return true;
  }

 private:
  void Allocate() {
    size_t bytes = size_ * sizeof(T);
    bytes = (bytes + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
    if (bytes == 0) bytes = kChunkAlignment;
    void* raw = ::operator new(bytes, std::align_val_t{kChunkAlignment});
    std::memset(raw, 0, bytes);
    data_ = std::shared_ptr<T>(static_cast<T*>(raw), [](T* p) {
      ::operator delete(p, std::align_val_t{kChunkAlignment});
    });
  }
  std::shared_ptr<T> data_;
  size_t size_ = 0;
};

class ChunkState {
 public:
  enum class AddResult {
    kAccepted,   // stored; more contributions missing
    kComplete,   // stored; it was the last missing one: call Update()
    kDuplicate,  // this rank already contributed to the update being formed
    kBadRank,    // rank >= workers()
    kBadSize,    // payload is not elements() * ElementBytes(wire_type()) bytes
    kBadSparse,  // sparse: indices not strictly ascending / out of range, sizes
    kNotMember,  // rank is not one of the members (SetMembers)
  };

  // A sparse (top-k) contribution as it sits in a payload: `count` u32
  // little-endian indices, strictly ascending and < elements(), then `count`
  // values of wire_type(); any alignment (docs/compression.md).
  struct SparseView {
    uint32_t count = 0;
    const std::byte* indices = nullptr;
    const std::byte* values = nullptr;
  };

  // `elements` of this chunk (<= chunk size), `workers` contributions per
  // update. Parameters start at zero, optimizer state at zero (AdaGrad:
  // initial_accumulator), initialized() false.
  // REQUIRES: workers >= 1; `optimizer` normalized (NormalizeOptimizer);
  // wire_type a valid ElementType. Violations abort.
  ChunkState(uint32_t elements, uint32_t workers, const OptimizerConfig& optimizer,
             ElementType wire_type);

  // An upper bound of the heap bytes a ChunkState of these parameters holds
  // at its largest (what hub memory quotas count; docs/architecture.md,
  // Memory a key holds): two fp32 parameter buffers (double buffering), two
  // wire copies unless wire_type is fp32, the accumulator, the optimizer's
  // state slots (OptimizerStateSlots), a parked contribution (wire bytes) for
  // every rank but one, each rounded up to whole 64-byte lines plus the
  // allocator's per-block overhead, and the per-rank bookkeeping vectors.
  // Not included: sizeof(ChunkState) itself (the owner's).
  static uint64_t MemoryBytes(uint32_t elements, uint32_t workers, OptimizerType optimizer,
                              ElementType wire_type);

  ChunkState(ChunkState&&) = default;
  ChunkState& operator=(ChunkState&&) = default;
  ChunkState(const ChunkState&) = delete;
  ChunkState& operator=(const ChunkState&) = delete;

  uint32_t elements() const { return elements_; }
  uint32_t workers() const { return workers_; }
  // Reduction::kMean divides the sum by this instead of workers() (0 =
  // workers()). A hub adding R rack sums of W workers each divides by R*W.
  void set_mean_divisor(uint32_t divisor) { mean_divisor_ = divisor; }
  ElementType wire_type() const { return wire_type_; }
  size_t wire_bytes() const { return elements_ * ElementBytes(wire_type_); }
  // Updates applied so far (starts at 0).
  uint64_t version() const { return version_; }
  // False until SetInitial() or MarkInitialized(). The server holds pushes of
  // a key until it is initialized; Contribute() does not check it.
  bool initialized() const { return initialized_; }

  // Adds rank's gradient (payload in wire_type(), exactly wire_bytes() bytes,
  // any alignment) to the update being formed. In-order contributions go
  // straight into the accumulator; one that arrives while a lower rank is
  // missing is copied into a spare buffer (allocated on demand, reused
  // afterwards) and folded in once all lower ranks are in. Checks, in order:
  // kBadRank, kBadSize, kDuplicate; a rejected call changes nothing.
  AddResult Contribute(uint32_t rank, std::span<const std::byte> payload);
  // The same for a sparse contribution: entries not listed are zero. Summed
  // in rank order with the others (dense or sparse): rank 0's values are
  // written into a zeroed accumulator, later ranks' added to the listed
  // entries only, so with every index listed the bits equal Contribute()'s.
  // A sparse contribution that arrives early is copied (its own bytes, at
  // most the payload) until the lower ranks are in. Checks: kBadRank,
  // kBadSparse (count > elements(), indices), kDuplicate.
  AddResult ContributeSparse(uint32_t rank, const SparseView& sparse);

  // Bounded/async consistency (docs/consistency.md): applies one
  // contribution (dense payload, or sparse when `sparse` is set) as an
  // update of its own: the optimizer step sees it as the whole sum (scaled
  // by 1 / mean divisor under Reduction::kMean), version() + 1. Returns
  // false, changing nothing, while a rank-order update is being formed or
  // when the payload is malformed (size, indices).
  bool ApplyAlone(std::span<const std::byte> payload);
  bool ApplyAloneSparse(const SparseView& sparse);
  // Elastic tenants (docs/elastic.md): the ranks the updates from now on sum
  // (member[r] != 0 for r < workers(); ranks beyond member.size() are not
  // members), at least one. Summed in rank order over the members only;
  // Reduction::kMean divides by their count (unless set_mean_divisor). The
  // default is every rank. Returns false, changing nothing, while a
  // contribution is pending, with no member or member.size() > workers().
  bool SetMembers(std::span<const uint8_t> member);
  // Contributions an update waits for (the members' count).
  uint32_t expected() const { return expected_; }
  bool is_member(uint32_t rank) const {
    return rank < workers_ && contributed_[rank] != kAbsent;
  }
  bool has_contributed(uint32_t rank) const {
    return rank < workers_ && contributed_[rank] == kContributed;
  }
  uint32_t contributions() const { return contributions_; }
  // The version the newest update (Update, ReduceAndUpdate, ApplyAlone)
  // produced, 0 once SkipTo or Restore moved the version without one. While
  // it equals version(), the current parameters hold a contribution of
  // every member of that update.
  uint64_t updated_version() const { return updated_version_; }

  // REQUIRES: contributions() == expected() (aborts otherwise). Applies the
  // optimizer (fused, t = version() + 1) writing the new parameters into the
  // other of the two parameter buffers, refreshes the wire copy, increments
  // version() and clears the contributions. The buffers of version v stay
  // valid and unchanged until version v + 2 is computed.
  void Update();

  // The one-pass fast path for a caller that holds all workers() payloads at
  // once (e.g. in receive buffers): payloads[r] is rank r's gradient in
  // wire_type(), wire_bytes() bytes each, any alignment. Sums them in rank
  // order and applies the optimizer in the same pass (SumAndApplyOptimizer),
  // without the accumulator; the result is bitwise identical to
  // Contribute(r, payloads[r]) for every r followed by Update(). Returns
  // false and changes nothing when a contribution is pending, the count is
  // not workers() or a size is wrong.
  bool ReduceAndUpdate(std::span<const std::span<const std::byte>> payloads);

  // Parameters of version v in fp32, and the same in the wire type (for fp32
  // the same memory, else the converted copy made by Update()/SetInitial()).
  // v must be version() or version() - 1 (>= 0); otherwise an empty span.
  // The spans stay valid and unchanged until version v + 2 is computed (or the
  // ChunkState is destroyed, or SkipTo() / Restore() / SetInitial() rewrite
  // the buffers).
  std::span<const float> params(uint64_t v) const;
  std::span<const std::byte> wire_params(uint64_t v) const;
  // References that keep the memory of params(v) / wire_params(v) alive and
  // unchanged for as long as they are held, whatever happens to the chunk
  // (later updates, SkipTo, Restore, SetInitial write into fresh memory, and
  // the memory outlives the ChunkState): what a queued reply holds.
  // Null where the span would be empty.
  std::shared_ptr<const void> params_ref(uint64_t v) const;
  std::shared_ptr<const void> wire_params_ref(uint64_t v) const;

  // Initial values, payload in wire_type() (wire_bytes() bytes) or fp32
  // (elements() floats). Allowed only while version() == 0 and no
  // contribution is pending; returns false (and changes nothing) otherwise or
  // when the size is wrong. Marks initialized().
  bool SetInitial(std::span<const std::byte> payload);
  bool SetInitial(std::span<const float> values);
  // For keys that start at zeros (the constructor's values).
  void MarkInitialized() { initialized_ = true; }

  // Discards the contributions of the update being formed (a worker was
  // lost); the same ranks may contribute again.
  void DiscardPending();

  // Durable state (checkpoints, recovery after a lost worker).
  // Optimizer state slots in use (0..2) and their values for version().
  int state_slots() const;
  std::span<const float> optimizer_state(int slot) const;
  // A skipped step: brings the chunk to `version` (>= version()) without an
  // update; parameters and optimizer state keep their values, and both
  // parameter buffers hold them (versions `version` and `version` - 1 read
  // the same). Returns false, changing nothing, while a contribution is
  // pending or if `version` < version().
  bool SkipTo(uint64_t version);
  // Replaces version, parameters (fp32, elements() floats) and optimizer
  // state (state_slots() spans of elements() floats) with a checkpoint's;
  // both parameter buffers hold them. Marks initialized(). Returns false,
  // changing nothing, on a size or slot-count mismatch or while a
  // contribution is pending.
  bool Restore(uint64_t version, std::span<const float> params,
               std::span<const std::span<const float>> state);

  // New hyperparameters, applied from the first update with t (1-based, i.e.
  // version() + 1 at Update()) >= from_update; from_update <= version() + 1
  // means the next update. A later call replaces an earlier pending one.
  // REQUIRES: optimizer normalized; the caller keeps the type (if it does
  // change, missing state slots are created as at construction).
  void SetOptimizer(const OptimizerConfig& optimizer, uint64_t from_update);
  // The hyperparameters the last (or, before any update, the next) update used.
  const OptimizerConfig& optimizer() const { return optimizer_; }
  bool has_pending_optimizer() const { return pending_optimizer_.has_value(); }

 private:
  static constexpr uint32_t kNoSpare = UINT32_MAX;
  static constexpr uint32_t kSparseSpare = UINT32_MAX - 1;  // in sparse_spares_[rank]
  bool SparseValid(const SparseView& sparse) const;
  // Rank order: rank 0 assigns (into zeros), later ranks add.
  void FoldSparse(const SparseView& sparse, bool first);
  void FoldRun(const std::byte* dense, bool first);

  void EnsureOptimizerState();
  void FoldInOrder(const std::byte* payload, uint32_t rank);
  OptimizerStep BeginUpdate();
  void FinishUpdate();
  void ClearContributions();
  const float* param_buffer(uint64_t v) const { return params_[v & 1].data(); }
  bool readable(uint64_t v) const {
    return v == version_ || (version_ > 0 && v == version_ - 1);
  }
  // The buffers version v will be written into, moved off memory a reader holds.
  float* writable_params(uint64_t v);
  std::byte* writable_wire(uint64_t v);

  // Moves next_rank_ past ranks that are not members.
  void SkipAbsent() {
    while (next_rank_ < workers_ && contributed_[next_rank_] == kAbsent) ++next_rank_;
  }
  // contributed_[rank]: not yet / contributed to the update being formed /
  // not a member (SetMembers).
  static constexpr uint8_t kNotYet = 0, kContributed = 1, kAbsent = 2;

  uint32_t elements_;
  uint32_t workers_;
  uint32_t mean_divisor_ = 0;
  // SetMembers: the members' count and the lowest member (the first in rank
  // order); non-members are kAbsent in contributed_.
  uint32_t expected_ = 0;
  uint32_t first_rank_ = 0;
  ElementType wire_type_;
  OptimizerConfig optimizer_;
  struct PendingOptimizer {
    OptimizerConfig config;
    uint64_t from_update;
  };
  std::optional<PendingOptimizer> pending_optimizer_;

  uint64_t version_ = 0;
  uint64_t updated_version_ = 0;
  bool initialized_ = false;

  // Version v lives in params_[v & 1] (and wire_[v & 1] unless fp32).
  // Shared with queued replies (params_ref / wire_params_ref): every write
  // below calls PrepareOverwrite() first.
  SharedAlignedBuffer<float> params_[2];
  SharedAlignedBuffer<std::byte> wire_[2];
  AlignedBuffer<float> accumulator_;
  AlignedBuffer<float> state_[2];

  // The update being formed. Ranks < next_rank_ are summed into
  // accumulator_; a later rank that arrived early sits in
  // spares_[spare_of_rank_[rank]] (raw wire bytes).
  std::vector<uint8_t> contributed_;
  std::vector<uint32_t> spare_of_rank_;
  uint32_t contributions_ = 0;
  uint32_t next_rank_ = 0;
  std::vector<AlignedBuffer<std::byte>> spares_;
  // Sparse contributions that arrived early, by rank: indices then values.
  std::vector<std::vector<std::byte>> sparse_spares_;
  std::vector<uint32_t> sparse_count_;
  std::vector<uint32_t> free_spares_;
  // Input pointers handed to the multi-input kernels (reused, no allocation
  // on the data path once grown to workers_ entries).
  std::vector<const void*> inputs_;
};

}  // namespace rackhub::aggregation
