// Worker-side top-k sparsification of gradients, with error feedback:
// TopKCount (how many entries a ratio keeps), SelectTopK (the indices of the k
// largest-magnitude entries) and CompressTopK (error feedback: accumulate the
// gradient into a residual kept on the worker, send its top k, keep the rest
// for the next step; Stich et al., "Sparsified SGD with memory", 2018).
//
// Selection is exact and fully deterministic: the result equals sorting all
// entries by (magnitude descending, index ascending), taking the first k and
// sorting their indices ascending. Magnitude is the total order of the IEEE
// bits with the sign cleared (bits & 0x7fffffff as an unsigned integer), so
// NaN > inf > every finite value, larger NaN payloads rank higher, and
// -0.0 == +0.0 (a tie, broken by index like any other).
//
// How (topk.cc): the threshold is estimated from a sample of the magnitudes,
// one vectorized pass (AVX-512 / AVX2 / portable, chosen like the kernels of
// kernels.h: ActiveKernelPath) collects the entries at or above it, and an
// exact radix select among those candidates finds the k-th largest magnitude;
// the indices come out ascending without a sort. When the estimate leaves
// fewer than k candidates (or far too many), an exact radix select over all
// entries is used instead. The result never depends on the estimate, the
// kernel path or the scratch's history; only the speed does.
//
// Ownership and threads: plain functions over memory the caller owns; no
// global state besides the kernel path choice. A TopKScratch holds the
// scratch memory of one call at a time: use one per thread (it is not
// synchronized). It grows to the largest call it served (candidate arrays of
// a few times k entries of 8 bytes, 32 KiB of histograms) and is reused
// without allocating afterwards.
//
// Sizes: x.size() / grad.size() must be < 2^32 (indices are uint32_t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace rackhub::aggregation {

namespace internal {
struct TopKScratchAccess;
}

// Entries topk(ratio) keeps of n: ceil(ratio * n), at least 1 when n > 0, at
// most n (0 when n == 0). ratio in (0, 1]; computed in double, and a product
// within a few ulps above an integer counts as that integer (0.1 * 30 keeps 3,
// not 4). Out-of-range ratios are clamped: <= 0 or NaN keeps 1, >= 1 keeps n.
uint32_t TopKCount(double ratio, uint32_t n);

// Reusable scratch memory for SelectTopK / CompressTopK (no allocation per
// call once grown). One call at a time; movable, not copyable. Besides memory
// it only keeps a call counter that varies the sample positions.
class TopKScratch {
 public:
  TopKScratch() = default;
  TopKScratch(const TopKScratch&) = delete;
  TopKScratch& operator=(const TopKScratch&) = delete;
  TopKScratch(TopKScratch&&) noexcept = default;
  TopKScratch& operator=(TopKScratch&&) noexcept = default;

  // Bytes of scratch memory held now.
  size_t bytes() const;

 private:
  friend struct internal::TopKScratchAccess;
  std::vector<uint32_t> cand_index_;  // candidate indices, ascending
  std::vector<uint32_t> cand_bits_;   // their float bits
  std::vector<uint32_t> keys_;        // sample keys; radix-select compaction
  std::vector<uint32_t> hist_;        // radix-select histograms
  uint64_t calls_ = 0;                // varies the sample positions from call to call
};

// Writes into idx[0..k) the indices of the k entries of x with the largest
// magnitude, in ascending index order. Magnitude order is the total order of
// the IEEE bits with the sign cleared (so NaN > inf > finite; -0 == +0); ties
// at the threshold are broken by taking the lowest indices (fully
// deterministic). REQUIRES k <= x.size(); idx has room for k entries.
void SelectTopK(std::span<const float> x, uint32_t k, uint32_t* idx, TopKScratch& scratch);

// Error feedback (Stich et al., "Sparsified SGD with memory"; the residual is
// kept on the worker): residual[i] += grad[i] for all i (residual becomes the
// corrected gradient), then selects its top k (as SelectTopK), writes
// idx[0..k) ascending and values[j] = residual[idx[j]], and sets
// residual[idx[j]] = +0.0f. So after the call, the sent values plus the
// residual reconstruct the corrected gradient exactly (bit for bit).
// Without error feedback (error_feedback=false) the residual is not used for
// accumulation: selection is over grad itself, values from grad, and the
// residual is left all zeros: a non-empty residual is filled with +0.0f (so a
// later call with error feedback starts from nothing); the caller may pass an
// empty span instead.
// The additions are IEEE fp32 (residual[i] + grad[i], no FMA, no
// reassociation), identical on every kernel path, except that when both
// operands are NaN which NaN payload survives may differ between paths (as
// for the kernels of kernels.h).
// REQUIRES grad.size() == residual.size() (when error_feedback, or when the
// residual is not empty), k <= grad.size(); idx and values have room for k
// entries; the buffers do not overlap.
void CompressTopK(std::span<const float> grad, std::span<float> residual, uint32_t k,
                  bool error_feedback, uint32_t* idx, float* values, TopKScratch& scratch);

}  // namespace rackhub::aggregation
