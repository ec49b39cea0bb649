// Test helpers: deterministic inputs and the allreduce reference computed in
// the ring's own reduction order (so float results can be compared bit-exact).
#ifndef GRADSYNC_COLLECTIVE_REFERENCE_H_
#define GRADSYNC_COLLECTIVE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "common/types.h"

namespace gradsync::testing {

// Pseudo-random values for `rank` (floats in [-3, 3), full-range integers).
std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed);

// The ring allreduce result: chunk c = [c*count/n, (c+1)*count/n) accumulates
// ranks c, c+1, ..., c+n-1 (mod n), each step dst = that rank's element,
// src = the running value; avg divides once at the end.
std::vector<char> RingOrderReference(const std::vector<std::vector<char>>& inputs, DType t,
                                     ReduceOp op, size_t count);

}  // namespace gradsync::testing

#endif  // GRADSYNC_COLLECTIVE_REFERENCE_H_
