// Top-k sparsification with error feedback (Deep Gradient Compression, Lin
// et al., ICLR 2018): each rank sends only the k values of largest magnitude
// of its gradient plus what it has not sent before, as (index, value) pairs,
// and keeps the rest as a residual that joins its next gradient of the same
// op, so that every value is sent eventually.
//
// One step of one rank (n values x, ratio r, k = max(1, floor(r n))):
//
//   with momentum correction m (DGC's, optional):
//       u = m u + x;  v = v + u       (u, v: the state, f32, kept between ops)
//   without:
//       v = v + x
//   select   the k indices of largest |v| (non-finite values first, so a
//            loss scaler still sees an overflow), by DGC's sampled threshold
//   send     (index, v[index]) for each selected index, ascending
//   clear    v[index] = 0 (and u[index] = 0: DGC's momentum factor masking)
//
// The threshold: the magnitudes of a sample of the values (every s-th, at
// least 1024 of them) give the one above which a fraction r of the sample
// lies; the values at or above it are the candidates. More than k: the k
// largest of them (by magnitude, then by lower index). Fewer than k: those
// only, and the message is padded (index kSparsePad): DGC's rule, which
// costs no second pass; the residual keeps what was not sent. Where the
// sample cannot say (fewer than 1024 values) the selection is exact.
//
// Every step is deterministic: the same state and input give the same
// selection on every machine.
#ifndef GRADSYNC_KERNELS_TOPK_H_
#define GRADSYNC_KERNELS_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

// What a top-k op sends per rank: a fixed-size message of k entries.
struct SparseEntry {
  uint32_t index;  // kSparsePad: an unused entry
  float value;
};
static_assert(sizeof(SparseEntry) == 8, "the wire entry");
inline constexpr uint32_t kSparsePad = 0xffffffffu;
// Indices are 32-bit: an op has at most this many values.
inline constexpr uint64_t kMaxSparseCount = kSparsePad - 1;

// The parameters of `topk:RATIO[,warmup=N][,momentum=M]` (its text form).
struct SparseSpec {
  uint32_t ratio_ppm = 0;       // r in millionths, 1 .. 1000000; 0: not sparse
  uint32_t warmup = 0;          // the first N ops of each key run dense
  uint16_t momentum_milli = 0;  // m in thousandths, 0 .. 999; 0: no momentum correction

  bool on() const { return ratio_ppm != 0; }
  double ratio() const { return ratio_ppm * 1e-6; }
  double momentum() const { return momentum_milli * 1e-3; }
  // k of an op of n values.
  size_t K(size_t n) const;
  // Packed for an op signature (compared across ranks); 0 when off.
  uint64_t Code() const;
  static SparseSpec FromCode(uint64_t code);
  // "topk:0.01", "topk:0.001,warmup=100,momentum=0.9".
  std::string ToString() const;
  bool operator==(const SparseSpec& o) const { return Code() == o.Code(); }
};

// Parses what follows "topk:" ("0.01,warmup=100,momentum=0.9"):
// InvalidArgument naming the part that is wrong and what is allowed.
absl::StatusOr<SparseSpec> ParseSparseSpec(absl::string_view text);

// The state one rank keeps for one op key between ops.
struct ErrorFeedback {
  std::vector<float> residual;  // v
  std::vector<float> momentum;  // u (empty without momentum correction)
  uint64_t ops = 0;             // ops of this key run so far (dense warm-up ones too)

  size_t bytes() const { return (residual.capacity() + momentum.capacity()) * sizeof(float); }
  // The Euclidean norm of the residual (what has not been sent yet).
  double ResidualNorm() const;
};

// A top-k op's parameters and the state it updates (null: none kept).
struct SparseStage {
  SparseSpec spec;
  ErrorFeedback* feedback = nullptr;
};

// Reusable memory of SelectTopK.
struct TopkWork {
  std::vector<float> sample;
  std::vector<uint64_t> keys;  // candidates: magnitude and index in one ordered integer
  std::vector<uint32_t> selected;
};

// Steps above for `n` values `x` and state `ef` (sized to n here when empty;
// momentum kept when spec.momentum_milli > 0): writes exactly spec.K(n)
// entries to `out` (selected ones by ascending index, then padding) and
// returns how many were selected. x is not changed.
size_t SparsifyWithFeedback(const float* x, size_t n, const SparseSpec& spec, ErrorFeedback* ef,
                            SparseEntry* out, TopkWork* work);

// The selection alone: the indices of up to k of v's n values, ascending
// (the threshold rule above).
void SelectTopK(const float* v, size_t n, size_t k, TopkWork* work,
                std::vector<uint32_t>* selected);

// out[e.index] += e.value for each entry not padding (indices below n).
void ScatterAdd(const SparseEntry* entries, size_t k, float* out, size_t n);

}  // namespace gradsync

#endif  // GRADSYNC_KERNELS_TOPK_H_
