#include "collective/ring_allreduce.h"

#include "collective/ring_pipeline.h"
#include "collective/ring_plan.h"

namespace gradsync {

absl::Status RingAllreduce(transport::Context& ctx, const transport::Buffer& data, size_t count,
                           DType dtype, ReduceOp op, uint64_t seq, absl::Time deadline,
                           const RingOptions& options, transport::Scratch* scratch,
                           RingStats* stats, const Reducer* reducer,
                           const transport::MemoryRegion* region) {
  const int n = ctx.size();
  if (n == 1 || count == 0) return absl::OkStatus();  // avg over one rank is the identity
  const size_t esize = DTypeSize(dtype);
  // Pipeline at least a few segments per chunk for mid-size messages.
  const size_t chunk_bytes = (count + n - 1) / n * esize;
  const RingPlan plan(count, n, ctx.rank(), esize,
                      internal::RingSegmentBytes(chunk_bytes, options));
  internal::RingPass pass;
  pass.plan = &plan;
  pass.first_step = 0;
  pass.steps = 2 * (n - 1);
  pass.chunk_shift = 0;
  pass.label = "ring";
  pass.reducer = reducer;
  pass.region = region;
  return internal::RunRingPass(ctx, data.Slice(0, count * esize), dtype, op, seq, deadline,
                               options, pass, scratch, stats);
}

}  // namespace gradsync
