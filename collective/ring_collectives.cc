// Ring reduce_scatter and allgather, and the pipelined chains for broadcast
// and reduce.
//
// reduce_scatter / allgather: the two halves of the ring allreduce
// (ring_pipeline.h), run on the n*count-element buffer whose n chunks are
// exactly the n blocks, with the chunk indices rotated by -1 so that rank r
// ends reduce-scatter owning block r (allreduce leaves chunk r+1 at rank r).
// Same segments, same in-flight bound, same staging: each half costs exactly
// what the matching half of the allreduce costs. In reduce_scatter block c
// accumulates ranks c+1, c+2, ..., c (mod n), each step computing
// dst = (the next rank's element) OP (the running value); avg divides once on
// rank c.
//
// broadcast: a chain root -> root+1 -> ... -> root-1. The buffer is cut into
// pieces (RingSegmentBytes: at least 4 when it is large); every rank forwards
// a piece to its right neighbour as soon as it has landed in its buffer.
//
// reduce: a chain root+1 -> root+2 -> ... -> root, pipelined the same way.
// The first rank sends its buffer as is; every later rank receives the
// running value into scratch, computes (own element) OP (running value) into
// that scratch piece and forwards it; the root reduces into its buffer and,
// for avg, divides. Non-root buffers are never written. Every element thus
// accumulates ranks root+1, root+2, ..., root, in that order.
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/exchange.h"
#include "collective/ring_pipeline.h"
#include "collective/ring_plan.h"
#include "common/status_macros.h"

namespace gradsync::internal {
namespace {

absl::Status RingHalf(transport::Context& ctx, const CollectiveCall& call, bool reduce_scatter,
                      transport::Scratch* scratch) {
  const int n = ctx.size();
  if (n == 1 || call.count == 0) return absl::OkStatus();  // avg over one rank is the identity
  const size_t esize = DTypeSize(call.dtype);
  const RingPlan plan(n * call.count, n, ctx.rank(), esize,
                      RingSegmentBytes(call.count * esize, call.ring));
  RingPass pass;
  pass.plan = &plan;
  pass.first_step = reduce_scatter ? 0 : n - 1;
  pass.steps = n - 1;
  pass.chunk_shift = -1;
  pass.label = reduce_scatter ? "ring reduce_scatter" : "ring allgather";
  pass.reducer = &call.reduce();
  pass.region = call.region;
  return RunRingPass(ctx, call.buffer.Slice(0, n * call.count * esize), call.dtype, call.op,
                     call.seq, call.deadline, call.ring, pass, scratch, /*stats=*/nullptr);
}

}  // namespace

absl::Status RingReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                               transport::Scratch* scratch) {
  return RingHalf(ctx, call, /*reduce_scatter=*/true, scratch);
}

absl::Status RingAllgather(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch) {
  return RingHalf(ctx, call, /*reduce_scatter=*/false, scratch);
}

absl::Status RingBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* /*scratch*/) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const size_t bytes = call.count * DTypeSize(call.dtype);
  const int pos = (me - call.root + n) % n;  // 0 = root, n-1 = end of the chain
  ASSIGN_OR_RETURN(auto mr, CallRegion(ctx, call, bytes));
  Exchange ex(ctx, call.seq, call.dtype, /*step=*/0, RingSegmentBytes(bytes, call.ring));
  int in = -1;
  if (pos > 0) in = ex.Recv((me - 1 + n) % n, *mr, 0, call.count, 0);
  if (pos < n - 1) ex.Send((me + 1) % n, *mr, 0, call.count, 0, /*forward_of=*/in);
  return ex.Run(call.deadline, absl::StrCat("ring broadcast from root ", call.root));
}

absl::Status RingReduce(transport::Context& ctx, const CollectiveCall& call,
                        transport::Scratch* scratch) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const DType t = call.dtype;
  const ReduceOp op = call.op;
  const size_t esize = DTypeSize(t);
  const size_t bytes = call.count * esize;
  const int pos = (me - call.root - 1 + 2 * n) % n;  // 0 = first rank, n-1 = root
  char* data = call.data();
  const Reducer* red = &call.reduce();
  ASSIGN_OR_RETURN(const transport::MemoryRegion* s,
                   scratch->ReserveRegistered(ctx, pos > 0 ? bytes : 0));
  char* acc = s->data();
  ASSIGN_OR_RETURN(auto data_mr, CallRegion(ctx, call, bytes));
  const transport::RegionView acc_view(*s, 0, pos > 0 ? bytes : 0);
  const transport::MemoryRegion* acc_mr = &acc_view;
  Exchange ex(ctx, call.seq, t, /*step=*/0, RingSegmentBytes(bytes, call.ring));
  const int left = (me - 1 + n) % n;
  const int right = (me + 1) % n;
  if (pos == 0) {
    ex.Send(right, *data_mr, 0, call.count, 0);
  } else if (pos < n - 1) {
    const int in = ex.Recv(left, *acc_mr, 0, call.count, 0, [=](size_t b, size_t c) {
      red->Combine(t, op, acc + b * esize, data + b * esize, acc + b * esize, c);
    });
    ex.Send(right, *acc_mr, 0, call.count, 0, /*forward_of=*/in);
  } else {
    ex.Recv(left, *acc_mr, 0, call.count, 0, [=](size_t b, size_t c) {
      red->Reduce(t, op, data + b * esize, acc + b * esize, c);
      if (op == ReduceOp::kAvg) red->Divide(t, data + b * esize, c, n);
    });
  }
  return ex.Run(call.deadline, absl::StrCat("ring reduce to root ", call.root));
}

}  // namespace gradsync::internal
