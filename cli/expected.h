// Deterministic inputs and expected outputs for checked runs (demo, bench).
// Inputs are small integers, so every partial sum is exact in every dtype and
// the expected result does not depend on the algorithm's reduction order.
#ifndef GRADSYNC_CLI_EXPECTED_H_
#define GRADSYNC_CLI_EXPECTED_H_

#include <cstdint>

#include "common/types.h"

namespace gradsync {

// Input element `i` (index within the whole buffer) of rank `r`.
int InputValue(int r, uint64_t i, DType t);
void StoreValue(DType t, char* p, double v);

// Fills rank r's buffer (`count` elements per block, layout of `kind`) with inputs.
void FillInput(CollectiveKind kind, DType t, int r, int n, uint64_t count, char* data);

// Writes the expected element `i` of rank `r`'s buffer after the collective
// into `out` (DTypeSize(t) bytes). Returns false where the content is
// unspecified (e.g. reduce_scatter's other blocks).
bool ExpectedValue(CollectiveKind kind, DType t, ReduceOp op, int root, int r, int n,
                   uint64_t count, uint64_t i, char* out);

// Elements of rank r's buffer that differ from the expectation; with
// `tolerance` > 0 (f32 only: a lossy codec), by more than it.
uint64_t CountWrong(CollectiveKind kind, DType t, ReduceOp op, int root, int r, int n,
                    uint64_t count, const char* data, double tolerance = 0);

// The largest |input| (InputValue) of dtype `t`.
inline constexpr int kMaxInputMagnitude = 8;

// Elements the buffer of `kind` holds for a per-rank count.
inline uint64_t BufferElements(CollectiveKind kind, int n, uint64_t count) {
  return IsBlockedCollective(kind) ? count * static_cast<uint64_t>(n) : count;
}

}  // namespace gradsync

#endif  // GRADSYNC_CLI_EXPECTED_H_
