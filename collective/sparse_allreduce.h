// Allreduce of f32 values by top-k sparsification with error feedback
// (kernels/topk.h): each rank selects its k values (its gradient plus its
// residual), the ranks allgather their fixed-size messages of k (index,
// value) entries on the ring, and every rank adds all n messages into zeros
// in rank order, so every rank ends with the same bits: the sum of the
// ranks' selections (avg: divided by n once).
//
// Why an allgather of (index, value) pairs rather than a shared-seed
// chunked selection: each rank keeps what matters in its own gradient (the
// selections differ, which is what DGC's accuracy results rest on), the
// message size is fixed (k entries, padded), so the allgather is the dense
// ring's with no size exchange, and the traffic, n k 8 bytes received per
// rank, is below the dense ring's 2 (n-1)/n 4 count while n k < count
// (ratio 0.01 below 100 ranks). A shared index set would let the sums
// travel on a reduce-scatter, but the indices chosen by one rule for all
// ranks miss each rank's largest values.
#ifndef GRADSYNC_COLLECTIVE_SPARSE_ALLREDUCE_H_
#define GRADSYNC_COLLECTIVE_SPARSE_ALLREDUCE_H_

#include "absl/status/status.h"
#include "collective/collectives.h"
#include "kernels/topk.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync::internal {

// Whether a top-k op applies: InvalidArgument naming what does not (a
// collective other than allreduce, a dtype other than f32, a reduction
// other than sum, avg and premul_sum, device memory, more than
// kMaxSparseCount values).
absl::Status CheckSparseApplies(CollectiveKind kind, DType dtype, ReduceOp op, size_t count,
                                transport::MemKind memory);

// Runs `call` (call.sparse.spec.on(); CheckSparseApplies passed). The state
// in call.sparse.feedback (null: a residual for this op only) is updated;
// when the exchange fails, the values this rank selected go back into its
// residual.
absl::Status SparseAllreduce(transport::Context& ctx, const CollectiveCall& call,
                             transport::Scratch* scratch);

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_SPARSE_ALLREDUCE_H_
