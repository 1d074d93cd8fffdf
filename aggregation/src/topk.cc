// Top-k sparsification with error feedback (topk.h).
//
// Keys: the magnitude of an fp32 x is key(x) = bits(x) & 0x7fffffff, compared
// as an unsigned integer; the order of the selection is (key descending, index
// ascending). Steps of one call (n entries, k to keep, 0 < k < n):
//   1. Estimate: S sample keys, one at a pseudo-random position in each of S
//      equal strides (S = n/256 clamped to [256, 8192]; the positions change
//      from call to call). With m = k*S/n, the expected number of samples at
//      or above the true threshold, T = the r-th largest sample key,
//      r = ceil(m + 3 sqrt(m) + 2): a lower quantile than k/n, so that fewer
//      than k entries reach T only rarely (about 1e-3 per call).
//   2. Collect: one pass writes the index and the bits of every entry with
//      key >= T to the candidate arrays, in ascending index order, and with
//      error feedback does residual += grad in the same pass (kernel paths:
//      AVX-512, AVX2, portable; ActiveKernelPath()). The arrays have room for
//      4 standard deviations above the expected count (the share of entries
//      at or above T is Beta(r, S - r + 1)); a pass that would overflow them
//      stops collecting and only accumulates.
//   3. If at least k entries were collected, every entry of the top k is
//      among them (everything else is below T, so below the k-th largest
//      key). An exact radix select among the candidates (digits over the key
//      range actually present, finished with nth_element once few entries
//      are left) gives the k-th largest key K and how many entries equal to
//      K belong to the top k (`ties`); a pass over the candidates in index
//      order writes those with key > K and the first `ties` with key == K:
//      idx comes out ascending, with no sort.
//   4. An estimate of T = 0 (mostly zeros) collects the nonzero entries; if
//      there are fewer than k of them, the answer is all of them plus the
//      lowest-index zeros (one pass). Otherwise (fewer than k candidates,
//      overflow, n < 4096, k above about 16-24 % of n), the same exact select and
//      emission run over all n entries.
// Only step 2 reads all of a large input in the common case; the steps after
// it work on the candidates (a few times k entries).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC PR105593
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>

#include "rackhub/aggregation/kernels.h"
#include "rackhub/aggregation/topk.h"

namespace rackhub::aggregation {
namespace internal {

struct TopKScratchAccess {
  static std::vector<uint32_t>& CandIndex(TopKScratch& s) { return s.cand_index_; }
  static std::vector<uint32_t>& CandBits(TopKScratch& s) { return s.cand_bits_; }
  static std::vector<uint32_t>& Keys(TopKScratch& s) { return s.keys_; }
  static std::vector<uint32_t>& Hist(TopKScratch& s) { return s.hist_; }
  static uint64_t NextSeed(TopKScratch& s) { return s.calls_++; }
};

}  // namespace internal

namespace {

using internal::TopKScratchAccess;

constexpr uint32_t kMagnitude = 0x7fffffffu;
// The collect pass works in blocks of this many entries (overflow checks).
constexpr size_t kBlock = 4096;
// Below this many entries the threshold is not estimated: exact select.
constexpr size_t kMinSampled = 4096;
// Up to this rank the threshold estimate keeps the top r samples by insertion
// instead of nth_element over all of them.
constexpr size_t kSmallRank = 32;

inline uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Grows v to at least `n` entries (never shrinks).
uint32_t* Reserve(std::vector<uint32_t>& v, size_t n) {
  if (v.size() < n) v.resize(std::max(n, v.size() + v.size() / 2));
  return v.data();
}

// ---- Step 2: the collect pass, per kernel path ----
// Over [begin, end): with kEf, r = res[i] + grad[i] is stored to res[i] and
// is the value; otherwise x[i] is. Writes index and bits of the entries with
// key >= t to ci[0..), cb[0..) in ascending order and returns how many; raises
// max_key to at least the largest key collected. Writes stay within
// ci[0 .. end-begin), cb[0 .. end-begin).

template <bool kEf>
inline size_t CollectTail(const float* x, float* res, const float* grad, size_t i, size_t end,
                          uint32_t t, uint32_t* ci, uint32_t* cb, uint32_t& max_key) {
  size_t c = 0;
  for (; i < end; ++i) {
    float v;
    if constexpr (kEf) {
      v = res[i] + grad[i];
      res[i] = v;
    } else {
      v = x[i];
    }
    const uint32_t b = Bits(v);
    ci[c] = static_cast<uint32_t>(i);
    cb[c] = b;
    c += (b & kMagnitude) >= t;
    max_key = std::max(max_key, b & kMagnitude);
  }
  return c;
}

// Portable, in two passes over each run of up to kPortableRun entries: first
// a flat loop GCC vectorizes (residual += grad with kEf, and a hit byte per
// entry from an int32 compare: keys are < 2^31, and SSE2 has no unsigned
// compare), then a branch-free scalar pass over the 16-entry groups that have
// a hit.
constexpr size_t kPortableRun = 1024;

template <bool kEf>
void PortableHits(const float* x, float* res, const float* grad, size_t i, size_t len,
                  int32_t below, uint8_t* hit) {
  for (size_t j = 0; j < len; ++j) {
    float v;
    if constexpr (kEf) {
      v = res[i + j] + grad[i + j];
      res[i + j] = v;
    } else {
      v = x[i + j];
    }
    hit[j] = (std::bit_cast<int32_t>(v) & static_cast<int32_t>(kMagnitude)) > below;
  }
}

// The low bits of 8 hit bytes as an 8-bit mask (byte i -> bit i): the
// multiplication moves bit 8i to bit 56 + i without carries.
inline uint32_t HitMask8(uint64_t bytes) {
  return static_cast<uint32_t>(((bytes & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

template <bool kEf>
size_t CollectPortable(const float* x, float* res, const float* grad, size_t begin, size_t end,
                       uint32_t t, uint32_t* ci, uint32_t* cb, uint32_t& max_key) {
  const float* values = kEf ? res : x;
  size_t c = 0;
  uint8_t hit[kPortableRun];
  size_t i = begin;
  for (; i + 16 <= end; i += kPortableRun) {
    const size_t len = std::min(kPortableRun, end - i) / 16 * 16;
    PortableHits<kEf>(x, res, grad, i, len, static_cast<int32_t>(t) - 1, hit);
    for (size_t g = 0; g < len; g += 16) {
      uint64_t half[2];
      std::memcpy(half, hit + g, sizeof half);
      if ((half[0] | half[1]) == 0) continue;
      uint32_t m = HitMask8(half[0]) | HitMask8(half[1]) << 8;
      while (m != 0) {
        const size_t j = i + g + static_cast<size_t>(std::countr_zero(m));
        const uint32_t b = Bits(values[j]);
        ci[c] = static_cast<uint32_t>(j);
        cb[c] = b;
        ++c;
        max_key = std::max(max_key, b & kMagnitude);
        m &= m - 1;
      }
    }
    if (len < kPortableRun) {
      i += len;
      break;
    }
  }
  return c + CollectTail<kEf>(x, res, grad, i, end, t, ci + c, cb + c, max_key);
}

// AVX2 and AVX-512: the compare masks of 64 entries (8 or 4 vectors) make one
// 64-bit mask whose set bits are then written out one by one (tzcnt, clear
// lowest bit). At the densities this runs at (about 0.3 to 12 % of the
// entries) that beats compressing every vector into both arrays (AVX-512
// vpcompressd: 2 compresses and 2 unaligned stores per 16 entries), and leaves
// the loads free to stream. A group's hits are written out after the next
// group's vectors: with kEf its residual stores have left the store buffer by
// then (reading a value back right after its vector store stalls on store
// forwarding). Prefetching 4 KiB ahead helps one core pull data from DRAM.
constexpr size_t kPrefetchAhead = 1024;  // floats

template <bool kEf>
inline void WriteHits(uint64_t hits, size_t at, const float* values, uint32_t* ci, uint32_t* cb,
                      size_t& c) {
  while (hits != 0) {
    const size_t j = at + static_cast<size_t>(std::countr_zero(hits));
    ci[c] = static_cast<uint32_t>(j);
    cb[c] = Bits(values[j]);
    ++c;
    hits &= hits - 1;
  }
}

template <bool kEf>
__attribute__((target("avx2,popcnt"))) size_t CollectAvx2(const float* x, float* res,
                                                          const float* grad, size_t begin,
                                                          size_t end, uint32_t t, uint32_t* ci,
                                                          uint32_t* cb, uint32_t& max_key) {
  const __m256i magnitude = _mm256_set1_epi32(static_cast<int>(kMagnitude));
  // Keys are < 2^31, so a signed compare with t - 1 (>= -1) is key >= t.
  const __m256i below = _mm256_set1_epi32(static_cast<int>(t) - 1);
  __m256i max_vec = _mm256_setzero_si256();
  const float* values = kEf ? res : x;
  size_t c = 0;
  size_t i = begin;
  uint64_t pending = 0;
  size_t pending_at = begin;
  for (; i + 64 <= end; i += 64) {
    uint64_t m = 0;
    for (size_t v = 0; v < 8; ++v) {
      const size_t at = i + 8 * v;
      __m256i b;
      if constexpr (kEf) {
        if (v % 2 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(res + at + kPrefetchAhead), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(grad + at + kPrefetchAhead), _MM_HINT_T0);
        }
        const __m256 r = _mm256_add_ps(_mm256_loadu_ps(res + at), _mm256_loadu_ps(grad + at));
        _mm256_storeu_ps(res + at, r);
        b = _mm256_castps_si256(r);
      } else {
        if (v % 2 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(x + at + kPrefetchAhead), _MM_HINT_T0);
        }
        b = _mm256_castps_si256(_mm256_loadu_ps(x + at));
      }
      const __m256i key = _mm256_and_si256(b, magnitude);
      max_vec = _mm256_max_epi32(max_vec, key);
      const __m256i hit = _mm256_cmpgt_epi32(key, below);
      m |=
          static_cast<uint64_t>(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit))))
          << (8 * v);
    }
    WriteHits<kEf>(pending, pending_at, values, ci, cb, c);
    pending = m;
    pending_at = i;
  }
  WriteHits<kEf>(pending, pending_at, values, ci, cb, c);
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), max_vec);
  for (uint32_t lane : lanes) max_key = std::max(max_key, lane);
  return c + CollectTail<kEf>(x, res, grad, i, end, t, ci + c, cb + c, max_key);
}

template <bool kEf>
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt,bmi,bmi2"))) size_t CollectAvx512(
    const float* x, float* res, const float* grad, size_t begin, size_t end, uint32_t t,
    uint32_t* ci, uint32_t* cb, uint32_t& max_key) {
  const __m512i magnitude = _mm512_set1_epi32(static_cast<int>(kMagnitude));
  const __m512i threshold = _mm512_set1_epi32(static_cast<int>(t));
  __m512i max_vec = _mm512_setzero_si512();
  const float* values = kEf ? res : x;
  size_t c = 0;
  size_t i = begin;
  uint64_t pending = 0;  // hits of the group at pending_at, not written yet
  size_t pending_at = begin;
  for (; i + 64 <= end; i += 64) {
    uint64_t m = 0;
    for (size_t v = 0; v < 4; ++v) {
      const size_t at = i + 16 * v;
      __m512i b;
      if constexpr (kEf) {
        _mm_prefetch(reinterpret_cast<const char*>(res + at + kPrefetchAhead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(grad + at + kPrefetchAhead), _MM_HINT_T0);
        const __m512 r = _mm512_add_ps(_mm512_loadu_ps(res + at), _mm512_loadu_ps(grad + at));
        _mm512_storeu_ps(res + at, r);
        b = _mm512_castps_si512(r);
      } else {
        _mm_prefetch(reinterpret_cast<const char*>(x + at + kPrefetchAhead), _MM_HINT_T0);
        b = _mm512_castps_si512(_mm512_loadu_ps(x + at));
      }
      const __m512i key = _mm512_and_si512(b, magnitude);
      max_vec = _mm512_max_epu32(max_vec, key);
      const __mmask16 hit = _mm512_cmpge_epu32_mask(key, threshold);
      m |= static_cast<uint64_t>(hit) << (16 * v);
    }
    WriteHits<kEf>(pending, pending_at, values, ci, cb, c);
    pending = m;
    pending_at = i;
  }
  WriteHits<kEf>(pending, pending_at, values, ci, cb, c);
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, max_vec);
  for (uint32_t lane : lanes) max_key = std::max(max_key, lane);
  return c + CollectTail<kEf>(x, res, grad, i, end, t, ci + c, cb + c, max_key);
}

template <bool kEf>
size_t Collect(KernelPath path, const float* x, float* res, const float* grad, size_t begin,
               size_t end, uint32_t t, uint32_t* ci, uint32_t* cb, uint32_t& max_key) {
  switch (path) {
    case KernelPath::kAvx512:
      return CollectAvx512<kEf>(x, res, grad, begin, end, t, ci, cb, max_key);
    case KernelPath::kAvx2:
      return CollectAvx2<kEf>(x, res, grad, begin, end, t, ci, cb, max_key);
    case KernelPath::kPortable:
      break;
  }
  return CollectPortable<kEf>(x, res, grad, begin, end, t, ci, cb, max_key);
}

// ---- Step 3/4: exact select ----

// Take every entry with key > key, and the first `ties` (in index order) with
// key == key.
struct Threshold {
  uint32_t key;
  uint32_t ties;
};

// Radix digits of at most 11 bits.
constexpr int kDigitBits = 11;
constexpr size_t kBins = size_t{1} << kDigitBits;
// A bin left with at most this many entries is finished with nth_element.
constexpr size_t kSmallBin = 256;

// The digit (<= top) whose bin holds the rank-th largest (1-based) counted
// key; rank becomes the rank inside that bin. REQUIRES 1 <= rank <= sum of
// hist[0..top].
uint32_t PickBin(const uint32_t* hist, uint32_t top, uint64_t& rank) {
  uint64_t above = 0;
  for (uint32_t d = top;; --d) {
    if (above + hist[d] >= rank || d == 0) {
      rank -= above;
      return d;
    }
    above += hist[d];
  }
}

// Counts digit_at(i) for i < c into hist[0..bins), returned. digit_at returns
// `bins` for an entry to leave out. Four interleaved copies of the histogram
// (in `space`, 4 * (bins + 1) entries), so that runs of equal digits do not
// serialize on one counter.
template <class DigitAt>
uint32_t* Histogram(size_t c, uint32_t bins, DigitAt digit_at, uint32_t* space) {
  const size_t stride = size_t{bins} + 1;
  uint32_t* h0 = space;
  uint32_t* h1 = space + stride;
  uint32_t* h2 = space + 2 * stride;
  uint32_t* h3 = space + 3 * stride;
  std::fill_n(space, 4 * stride, 0u);
  size_t i = 0;
  for (; i + 4 <= c; i += 4) {
    ++h0[digit_at(i)];
    ++h1[digit_at(i + 1)];
    ++h2[digit_at(i + 2)];
    ++h3[digit_at(i + 3)];
  }
  for (; i < c; ++i) ++h0[digit_at(i)];
  for (size_t d = 0; d < bins; ++d) h0[d] += h1[d] + h2[d] + h3[d];
  return h0;
}

// The k-th largest of key_at(0..c) and the number of entries equal to it that
// belong to the top k. REQUIRES 1 <= k <= c, base <= every key <= max_key.
// Radix select on v = key - base, most significant digit first: the first
// digit is the top bits of the span max_key - base (so the bins spread over
// the keys actually present), then digits of up to 11 bits. After the first
// digit, the entries of the chosen bin are copied out and refined (finished
// with nth_element once few are left), or, when that bin holds a large share
// of everything (e.g. many equal values), counted again from the source.
template <class KeyAt>
Threshold ExactThreshold(size_t c, uint64_t k, KeyAt key_at, uint32_t base, uint32_t max_key,
                         TopKScratch& scratch) {
  const uint32_t span = max_key - base;
  if (span == 0) return {base, static_cast<uint32_t>(k)};
  uint32_t* space = Reserve(TopKScratchAccess::Hist(scratch), 4 * (kBins + 1));
  // First digit: about c/8 bins (clearing, merging and walking the bins
  // costs like the entries), at most 2^11.
  const int first_bits = std::clamp(static_cast<int>(std::bit_width(c)) - 3, 4, kDigitBits);
  int shift = std::max(0, static_cast<int>(std::bit_width(span)) - first_bits);
  const uint32_t top = span >> shift;
  const uint32_t* hist = Histogram(
      c, top + 1, [&](size_t i) { return (key_at(i) - base) >> shift; }, space);
  uint64_t rank = k;
  uint32_t prefix = PickBin(hist, top, rank);  // of v >> shift
  if (shift == 0) return {base + prefix, static_cast<uint32_t>(rank)};
  const size_t in_bin = hist[prefix];
  if (in_bin <= std::max<size_t>(4096, c / 8)) {
    uint32_t* t = Reserve(TopKScratchAccess::Keys(scratch), in_bin + 1);
    // v is in the bin iff v - low < width (unsigned): no variable shift.
    const uint32_t low = prefix << shift;
    const uint32_t width = 1u << shift;
    size_t m = 0;
    if (in_bin * 16 < c) {
      // Rare hits: a well-predicted branch beats a store per entry.
      for (size_t i = 0; i < c; ++i) {
        const uint32_t v = key_at(i) - base;
        if (v - low < width) t[m++] = v;
      }
    } else {
      for (size_t i = 0; i < c; ++i) {
        const uint32_t v = key_at(i) - base;
        t[m] = v;
        m += v - low < width;
      }
    }
    for (;;) {
      if (m <= kSmallBin) {
        // Few left: the rank-th largest directly.
        std::nth_element(t, t + (rank - 1), t + m, std::greater<uint32_t>());
        const uint32_t v = t[rank - 1];
        const auto greater =
            static_cast<uint64_t>(std::count_if(t, t + m, [v](uint32_t x) { return x > v; }));
        return {base + v, static_cast<uint32_t>(rank - greater)};
      }
      const int next = std::max(0, shift - kDigitBits);
      const uint32_t digit_top = (1u << (shift - next)) - 1;
      hist = Histogram(
          m, digit_top + 1, [&](size_t j) { return (t[j] >> next) & digit_top; }, space);
      prefix = (prefix << (shift - next)) | PickBin(hist, digit_top, rank);
      shift = next;
      if (shift == 0) break;
      const uint32_t next_low = prefix << shift;
      const uint32_t next_width = 1u << shift;
      size_t kept = 0;
      for (size_t j = 0; j < m; ++j) {
        const uint32_t v = t[j];
        t[kept] = v;
        kept += v - next_low < next_width;
      }
      m = kept;
    }
  } else {
    while (shift > 0) {
      const int next = std::max(0, shift - kDigitBits);
      const uint32_t digit_top = (1u << (shift - next)) - 1;
      hist = Histogram(
          c, digit_top + 1,
          [&](size_t i) {
            const uint32_t v = key_at(i) - base;
            return (v >> shift) == prefix ? (v >> next) & digit_top : digit_top + 1;
          },
          space);
      prefix = (prefix << (shift - next)) | PickBin(hist, digit_top, rank);
      shift = next;
    }
  }
  return {base + prefix, static_cast<uint32_t>(rank)};
}

// Walks a source in ascending index order and writes the k entries of the
// top k (key > th.key, or == th.key among the first th.ties): idx ascending,
// values[o] = the entry's float (kValues). Continues from `state` (source
// position j, entries written o, ties left), e.g. after a vector prefix.
struct EmitState {
  size_t j = 0;
  uint32_t o = 0;
  uint32_t ties = 0;
};

template <bool kValues, class BitsAt, class IndexAt>
__attribute__((noinline)) void Emit(uint32_t k, Threshold th, EmitState state, BitsAt bits_at,
                                    IndexAt index_at, uint32_t* idx, float* values) {
  uint32_t o = state.o;
  uint32_t ties = state.ties;
  for (size_t j = state.j; o < k; ++j) {
    const uint32_t b = bits_at(j);
    const uint32_t key = b & kMagnitude;
    const bool tie = key == th.key && ties > 0;
    const bool take = key > th.key || tie;
    ties -= tie;
    idx[o] = index_at(j);
    if constexpr (kValues) values[o] = std::bit_cast<float>(b);
    o += take;
  }
}

// The same over candidate arrays, 16 at a time (vpcompressd), while a whole
// vector of output still fits in idx[0..k); Emit finishes.
template <bool kValues>
__attribute__((target("avx512f,avx512bw,avx512vl,popcnt,bmi,bmi2"))) EmitState EmitAvx512(
    uint32_t k, Threshold th, const uint32_t* ci, const uint32_t* cb, size_t c, uint32_t* idx,
    float* values) {
  const __m512i magnitude = _mm512_set1_epi32(static_cast<int>(kMagnitude));
  const __m512i key_k = _mm512_set1_epi32(static_cast<int>(th.key));
  EmitState s;
  s.ties = th.ties;
  for (; s.j + 16 <= c && s.o + 16 <= k; s.j += 16) {
    const __m512i b = _mm512_loadu_si512(cb + s.j);
    const __m512i key = _mm512_and_si512(b, magnitude);
    unsigned take = _mm512_cmpgt_epu32_mask(key, key_k);
    unsigned eq = _mm512_cmpeq_epu32_mask(key, key_k);
    while (eq != 0 && s.ties > 0) {  // the first `ties` equal keys, lowest lane first
      take |= eq & (0u - eq);
      eq &= eq - 1;
      --s.ties;
    }
    const __mmask16 m = static_cast<__mmask16>(take);
    _mm512_storeu_si512(idx + s.o, _mm512_maskz_compress_epi32(m, _mm512_loadu_si512(ci + s.j)));
    if constexpr (kValues) _mm512_storeu_si512(values + s.o, _mm512_maskz_compress_epi32(m, b));
    s.o += static_cast<uint32_t>(std::popcount(take));
  }
  return s;
}

// 8-lane left-packing table for AVX2: entry m lists, in bytes, the lanes set
// in m (lowest first); vpermd with it moves them to the front.
constexpr std::array<uint64_t, 256> MakeCompressTable() {
  std::array<uint64_t, 256> table{};
  for (unsigned m = 0; m < 256; ++m) {
    uint64_t entry = 0;
    unsigned out = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      if (m & (1u << lane)) entry |= static_cast<uint64_t>(lane) << (8 * out++);
    }
    table[m] = entry;
  }
  return table;
}
constexpr std::array<uint64_t, 256> kCompressTable = MakeCompressTable();

// EmitAvx512 with 8 lanes (keys < 2^31: signed compares order them).
template <bool kValues>
__attribute__((target("avx2,popcnt"))) EmitState EmitAvx2(uint32_t k, Threshold th,
                                                          const uint32_t* ci, const uint32_t* cb,
                                                          size_t c, uint32_t* idx, float* values) {
  const __m256i magnitude = _mm256_set1_epi32(static_cast<int>(kMagnitude));
  const __m256i key_k = _mm256_set1_epi32(static_cast<int>(th.key));
  EmitState s;
  s.ties = th.ties;
  for (; s.j + 8 <= c && s.o + 8 <= k; s.j += 8) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + s.j));
    const __m256i key = _mm256_and_si256(b, magnitude);
    unsigned take = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, key_k))));
    unsigned eq = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(key, key_k))));
    while (eq != 0 && s.ties > 0) {
      take |= eq & (0u - eq);
      eq &= eq - 1;
      --s.ties;
    }
    const __m256i perm =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kCompressTable[take])));
    const __m256i index = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ci + s.j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + s.o),
                        _mm256_permutevar8x32_epi32(index, perm));
    if constexpr (kValues) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + s.o),
                          _mm256_permutevar8x32_epi32(b, perm));
    }
    s.o += static_cast<uint32_t>(std::popcount(take));
  }
  return s;
}

template <bool kValues>
void SelectExact(const float* src, size_t n, uint32_t k, uint32_t* idx, float* values,
                 TopKScratch& scratch) {
  // The key range first (a vectorizable pass; keys are < 2^31, so as int32
  // they order the same): radix digits over it only, and nothing to do when
  // all keys are equal.
  int32_t lo = INT32_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto key = static_cast<int32_t>(Bits(src[i]) & kMagnitude);
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  const Threshold th = ExactThreshold(
      n, k, [src](size_t i) { return Bits(src[i]) & kMagnitude; }, static_cast<uint32_t>(lo),
      static_cast<uint32_t>(hi), scratch);
  EmitState state;
  state.ties = th.ties;
  Emit<kValues>(
      k, th, state, [src](size_t i) { return Bits(src[i]); },
      [](size_t i) { return static_cast<uint32_t>(i); }, idx, values);
}

// Candidates: keys >= t.
template <bool kValues>
void SelectCandidates(KernelPath path, const uint32_t* ci, const uint32_t* cb, size_t c, uint32_t t,
                      uint32_t max_key, uint32_t k, uint32_t* idx, float* values,
                      TopKScratch& scratch) {
  const Threshold th = ExactThreshold(
      c, k, [cb](size_t j) { return cb[j] & kMagnitude; }, t, max_key, scratch);
  EmitState state;
  state.ties = th.ties;
  if (path == KernelPath::kAvx512) state = EmitAvx512<kValues>(k, th, ci, cb, c, idx, values);
  if (path == KernelPath::kAvx2) state = EmitAvx2<kValues>(k, th, ci, cb, c, idx, values);
  Emit<kValues>(
      k, th, state, [cb](size_t j) { return cb[j]; }, [ci](size_t j) { return ci[j]; }, idx,
      values);
}

// The whole operation. kEf: residual += grad first, select over the residual,
// values from it, sent entries zeroed. Otherwise select over grad (res unused),
// values from grad when kValues.
template <bool kEf, bool kValues>
void TopK(const float* grad, float* res, size_t n, uint32_t k, uint32_t* idx, float* values,
          TopKScratch& scratch) {
  if (n == 0) return;
  if (k == 0) {
    if constexpr (kEf) AddIn(res, grad, n, ElementType::kFp32);
    return;
  }
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
    if constexpr (kEf) {
      for (size_t i = 0; i < n; ++i) {
        values[i] = res[i] + grad[i];
        res[i] = 0.0f;
      }
    } else if constexpr (kValues) {
      std::memcpy(values, grad, n * sizeof(float));
    }
    return;
  }
  const float* src = kEf ? res : grad;  // the values selected from
  bool accumulated = !kEf;              // res holds grad + old residual
  bool done = false;
  if (n >= kMinSampled) {
    const size_t samples = std::clamp<size_t>(n / 256, 256, 8192);
    const double m = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
    const size_t r = static_cast<size_t>(std::ceil(m + 3.0 * std::sqrt(m) + 2.0));
    if (r * 4 <= samples) {
      // Step 1: threshold estimate.
      uint32_t* keys = Reserve(TopKScratchAccess::Keys(scratch), samples);
      const auto sample_key = [&](size_t p) {
        const float v = kEf ? res[p] + grad[p] : grad[p];
        return Bits(v) & kMagnitude;
      };
      const size_t stride = n / samples;
      // One pseudo-random position in each stride, different in every call:
      // a lattice in the data (a row length, a period of the model) does not
      // bias the sample, and neither does a persistent per-coordinate pattern
      // (as error feedback builds up) bias every call the same way.
      const uint64_t seed = TopKScratchAccess::NextSeed(scratch) * samples;
      const auto position = [&](size_t j) {
        return j * stride + (((seed + j) * 0x9e3779b97f4a7c15ull) >> 32) % stride;
      };
      uint32_t estimate;
      if (r <= kSmallRank) {
        // The r largest so far, descending, by insertion: few samples get in.
        uint32_t best[kSmallRank];
        std::fill_n(best, r, 0u);
        for (size_t j = 0; j < samples; ++j) {
          uint32_t key = sample_key(position(j));
          if (key <= best[r - 1]) continue;
          for (size_t q = 0; q < r; ++q) {
            if (key > best[q]) std::swap(key, best[q]);
          }
        }
        estimate = best[r - 1];
      } else {
        for (size_t j = 0; j < samples; ++j) keys[j] = sample_key(position(j));
        std::nth_element(keys, keys + (r - 1), keys + samples, std::greater<uint32_t>());
        estimate = keys[r - 1];
      }
      // An estimate of 0 (mostly zeros) collects the nonzero entries.
      const uint32_t t = std::max<uint32_t>(estimate, 1);
      // Step 2: collect, in blocks, into room for a generous estimate.
      // The share of entries at or above the r-th largest of S samples is
      // Beta(r, S - r + 1) distributed: room for 4 standard deviations over
      // the mean (r / S), plus a block (the overflow check is per block).
      const double high = (static_cast<double>(r) + 4.0 * std::sqrt(static_cast<double>(r)) + 4.0) /
                          static_cast<double>(samples);
      const size_t cap = std::min(static_cast<size_t>(high * static_cast<double>(n)) + kBlock, n);
      uint32_t* ci = Reserve(TopKScratchAccess::CandIndex(scratch), cap);
      uint32_t* cb = Reserve(TopKScratchAccess::CandBits(scratch), cap);
      const KernelPath path = ActiveKernelPath();
      size_t c = 0;
      uint32_t max_key = 0;  // >= every collected key
      bool overflow = false;
      for (size_t b = 0; b < n; b += kBlock) {
        const size_t e = std::min(n, b + kBlock);
        if (!overflow && c + (e - b) > cap) overflow = true;
        if (overflow) {
          if constexpr (!kEf) break;
          AddIn(res + b, grad + b, e - b, ElementType::kFp32);
          continue;
        }
        c += Collect<kEf>(path, grad, res, grad, b, e, t, ci + c, cb + c, max_key);
      }
      accumulated = true;
      if (!overflow && c >= k) {
        // Step 3.
        SelectCandidates<kValues>(path, ci, cb, c, t, max_key, k, idx, values, scratch);
        done = true;
      } else if (!overflow && t == 1) {
        // Fewer than k nonzero entries: all of them, and the lowest-index
        // zeros for the rest.
        EmitState state;
        state.ties = static_cast<uint32_t>(k - c);
        Emit<kValues>(
            k, Threshold{0, state.ties}, state, [src](size_t i) { return Bits(src[i]); },
            [](size_t i) { return static_cast<uint32_t>(i); }, idx, values);
        done = true;
      }
    }
  }
  if (!done) {
    // Step 4.
    if (!accumulated) AddIn(res, grad, n, ElementType::kFp32);
    SelectExact<kValues>(src, n, k, idx, values, scratch);
  }
  if constexpr (kEf) {
    for (uint32_t j = 0; j < k; ++j) res[idx[j]] = 0.0f;
  }
}

}  // namespace

size_t TopKScratch::bytes() const {
  return (cand_index_.capacity() + cand_bits_.capacity() + keys_.capacity() + hist_.capacity()) *
         sizeof(uint32_t);
}

uint32_t TopKCount(double ratio, uint32_t n) {
  if (n == 0) return 0;
  if (!(ratio > 0.0)) return 1;
  if (ratio >= 1.0) return n;
  // A product a few ulps above an integer (0.1 * 30 = 3.0000000000000004)
  // is that integer.
  const double v = ratio * static_cast<double>(n) * (1.0 - 8 * DBL_EPSILON);
  const double c = std::ceil(v);
  if (c <= 1.0) return 1;
  if (c >= static_cast<double>(n)) return n;
  return static_cast<uint32_t>(c);
}

void SelectTopK(std::span<const float> x, uint32_t k, uint32_t* idx, TopKScratch& scratch) {
  TopK<false, false>(x.data(), nullptr, x.size(), k, idx, nullptr, scratch);
}

void CompressTopK(std::span<const float> grad, std::span<float> residual, uint32_t k,
                  bool error_feedback, uint32_t* idx, float* values, TopKScratch& scratch) {
  if (error_feedback) {
    TopK<true, true>(grad.data(), residual.data(), grad.size(), k, idx, values, scratch);
    return;
  }
  TopK<false, true>(grad.data(), nullptr, grad.size(), k, idx, values, scratch);
  std::fill(residual.begin(), residual.end(), 0.0f);
}

}  // namespace rackhub::aggregation
