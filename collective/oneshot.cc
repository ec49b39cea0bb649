// oneshot: one round in which every rank sends its whole buffer to every
// other rank; each rank then combines the n contributions itself, in rank
// order ((x0 OP x1) OP x2 ...), so every rank computes the same bits with no
// second round. n-1 messages each way per rank, one latency, (n-1)·B bytes
// in: the latency-optimal allreduce for small buffers (kOneShotMaxBytes caps
// it). The daemon sends the data with the op's signature
// (collective/op_signature.h), which makes a small op one round trip in all;
// run through RunCollective it is a round of its own.
//
// barrier: the same round with empty messages.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collective/algorithms.h"
#include "collective/exchange.h"
#include "common/status_macros.h"

namespace gradsync {

void ReduceInRankOrder(DType dtype, ReduceOp op, void* data, size_t count, int me,
                       const std::vector<const char*>& peers, void* own_copy,
                       const Reducer* reducer) {
  const Reducer& red = reducer != nullptr ? *reducer : CpuReducer();
  const int n = static_cast<int>(peers.size());
  if (n <= 1 || count == 0) return;
  const size_t bytes = count * DTypeSize(dtype);
  const ReduceOp combine = CombineOp(op);
  const char* own = static_cast<const char*>(data);
  if (me != 0) {  // data becomes the accumulator: keep this rank's contribution aside
    red.Copy(own_copy, data, bytes);
    own = static_cast<const char*>(own_copy);
    red.Copy(data, peers[0], bytes);
  }
  for (int r = 1; r < n; ++r) red.Reduce(dtype, combine, data, r == me ? own : peers[r], count);
  if (op == ReduceOp::kAvg) red.Divide(dtype, data, count, n);
}

namespace internal {

absl::Status OneShotAllreduce(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch) {
  const int n = ctx.size();
  const int me = ctx.rank();
  if (n == 1 || call.count == 0) return absl::OkStatus();
  const size_t bytes = call.count * DTypeSize(call.dtype);
  // Slot p holds rank p's contribution; slot `me` is where ReduceInRankOrder
  // keeps this rank's own (its scratch argument).
  ASSIGN_OR_RETURN(const transport::MemoryRegion* in_mr,
                   scratch->ReserveRegistered(ctx, bytes * n));
  ASSIGN_OR_RETURN(auto data_mr, CallRegion(ctx, call, bytes));
  Exchange ex(ctx, call.seq, call.dtype, 0, call.ring.segment_bytes);
  std::vector<const char*> peers(n, nullptr);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ex.Recv(p, *in_mr, p * bytes, call.count, 0);
    ex.Send(p, *data_mr, 0, call.count, 0);
    peers[p] = in_mr->data() + p * bytes;
  }
  RETURN_IF_ERROR(ex.Run(call.deadline, "oneshot allreduce"));
  ReduceInRankOrder(call.dtype, call.op, call.data(), call.count, me, peers,
                    in_mr->data() + me * bytes, &call.reduce());
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace gradsync
