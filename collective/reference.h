// Test helpers: deterministic inputs and reduction references computed in the
// algorithms' own orders (so float results can be compared bit-exact).
#ifndef GRADSYNC_COLLECTIVE_REFERENCE_H_
#define GRADSYNC_COLLECTIVE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "collective/algorithm.h"
#include "common/types.h"

namespace gradsync::testing {

// Pseudo-random values for `rank` (floats in [-3, 3), full-range integers).
std::vector<char> RandomData(DType t, size_t count, int rank, uint32_t seed);

// Values that every reduction order over at most 8 ranks combines to the same
// bits: floats are small integers (in [-4, 4] for sum/avg/min/max, in
// {-2, -1, 1, 2} for prod), so every partial sum and product is exact even in
// f16/bf16; integer types are full-range (wrapping sum and prod are
// associative and commutative).
std::vector<char> IntegerValuedData(DType t, size_t count, int rank, uint32_t seed, ReduceOp op);

// Elements [begin, begin+count) of every rank reduced in ring order from rank
// `first`: acc = x_first, then acc = x_r OP acc (x_r the first operand) for
// r = first+1, first+2, ... (mod n); avg divides by n once at the end.
std::vector<char> RingOrderReduce(const std::vector<std::vector<char>>& inputs, DType t,
                                  ReduceOp op, size_t begin, size_t count, int first);

// The ring allreduce result: chunk c = [c*count/n, (c+1)*count/n) is
// RingOrderReduce from rank c.
std::vector<char> RingOrderReference(const std::vector<std::vector<char>>& inputs, DType t,
                                     ReduceOp op, size_t count);

// A small allreduce whose data ride on the signature exchange (oneshot in
// the daemon, collective/op_signature.h): with `pattern` all-to-all, rank
// order ((x0 OP x1) OP x2 ...); with recursive doubling, ranks p.. (p the
// largest power of two <= n) first fold into 0.. (x_r OP x_{r+p}), then
// blocks of 1, 2, 4 ... ranks combine, the lower block as the first operand.
// avg divides by n once at the end.
std::vector<char> SignaturePatternReference(SignaturePattern pattern,
                                            const std::vector<std::vector<char>>& inputs, DType t,
                                            ReduceOp op, size_t count);

}  // namespace gradsync::testing

#endif  // GRADSYNC_COLLECTIVE_REFERENCE_H_
