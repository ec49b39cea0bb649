// Every collective, several algorithms each, behind one entry point.
//
// All collectives work IN PLACE on one buffer per rank (like NCCL's in-place
// variants) over a transport::Context (rank and world size come from it).
// `count` is the number of elements per rank-block as defined below; n is the
// world size, r this rank.
//
//   allreduce(data, count)       every rank ends with the reduction over all
//                                ranks of its `count` elements.
//   reduce_scatter(data, count)  the buffer holds n*count elements; on return
//                                block r = [r*count, (r+1)*count) holds the
//                                reduction of every rank's block r. The other
//                                blocks are unspecified.
//   allgather(data, count)       the buffer holds n*count elements; on entry
//                                block r is valid, on return every block j
//                                holds rank j's block j.
//   broadcast(data, count, root) every rank ends with root's `count` elements.
//   reduce(data, count, root)    root ends with the reduction; the buffers of
//                                the other ranks are left unchanged (the
//                                algorithms accumulate in `scratch`).
//   alltoall(data, count)        the buffer holds n*count elements; block j of
//                                rank i goes to block i of rank j.
//   gather(data, count, root)    the buffer holds n*count elements (the layout
//                                of allgather); on entry block r is valid, on
//                                return the root's block j holds rank j's
//                                block j. The other ranks' buffers are left
//                                unchanged (they read only their block r).
//   scatter(data, count, root)   the buffer holds n*count elements; on return
//                                block r of rank r holds the root's block r.
//                                The root's buffer and the other blocks of
//                                every rank are left unchanged.
//   barrier()                    returns on each rank only after every rank
//                                entered it (data, count, dtype are ignored).
//
// Reduction: ReduceInto/DivideBy from kernels/cpu_reduce.h. kAvg sums, then
// divides by n exactly once per element, on the rank that finalizes it; every
// other rank receives those bytes, so every rank ends with identical bits
// (also for floats, and for min/max with NaNs or signed zeros). Every
// algorithm reduces each element in a fixed order that depends only on
// (algorithm, n, count, root), never on timing; the ring orders are documented
// in ring_allreduce.h and ring_collectives.cc.
//
// Which algorithm implements which collective: algorithm.h. Every algorithm
// works for every world size (powers of two or not: recursive halving and
// doubling fold the extra ranks in first and out at the end, as MPICH and
// Rabenseifner do) and every count including 0 and counts not divisible by n.
//
// Wire use: every message of an op carries MessageTag{op_seq = seq, slot = a
// message index defined by the algorithm (distinct per message of the op on
// each sending rank), dtype, offset = the byte offset of the payload within the
// op's buffer}. Receivers post the exact tag they expect, so a message of
// another op, slot or offset fails the context with DataLoss. Messages larger
// than RingOptions::segment_bytes are cut into pieces that travel as separate
// messages (pipelined: a piece is reduced or forwarded as soon as it lands).
//
// Errors: the transport's, returned as they are (Unavailable, Aborted,
// DataLoss, ...); DeadlineExceeded when `deadline` passes, naming the rank(s)
// this rank was waiting for; InvalidArgument (before any data moves, so the
// streams stay aligned) for an algorithm that does not implement the
// collective, a root out of range, or a null buffer with count > 0.
//
// Threading: like the Context, one call at a time per context. `scratch` is
// grown as needed and reused between calls; the largest need is a copy of the
// op's buffer (alltoall, rhd/rd staging, tree/ring reduce accumulators).
#ifndef GRADSYNC_COLLECTIVE_COLLECTIVES_H_
#define GRADSYNC_COLLECTIVE_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/algorithm.h"
#include "collective/op_signature.h"
#include "collective/reducer.h"
#include "collective/ring_allreduce.h"
#include "common/types.h"
#include "kernels/codec.h"
#include "kernels/topk.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync {

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  // The op's buffer: at least CollectiveBufferBytes, of the memory kind it
  // lives in (the context registers it as such).
  transport::Buffer buffer;
  // A registration on the context that covers `buffer` (a RegistrationCache
  // entry, made when the buffer was first used); null: the algorithms
  // register the buffer for this call.
  const transport::MemoryRegion* region = nullptr;
  size_t count = 0;  // elements per rank-block
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // reducing collectives only
  int root = 0;                  // broadcast, reduce, gather and scatter only
  uint64_t seq = 0;              // MessageTag.op_seq of every message
  absl::Time deadline = absl::InfiniteFuture();
  RingOptions ring;  // segment size and in-flight bound (every algorithm uses the segment size)
  // What reduces the buffer's memory (null: the CPU reducer, host memory).
  const Reducer* reducer = nullptr;
  // The wire codec of an f32 ring allreduce or reduce_scatter on host
  // memory (collective/compressed_ring.h); kNone: the values as they are.
  CodecId codec = CodecId::kNone;
  // With `codec`: this rank's error feedback (null: none kept). Its residual
  // joins the input, and what this rank's quantizations lose becomes the
  // next residual (collective/compressed_ring.h).
  ErrorFeedback* codec_feedback = nullptr;
  // Top-k sparsification of an f32 allreduce on host memory
  // (collective/sparse_allreduce.h), with this rank's error-feedback state;
  // spec off: dense (or `codec`).
  SparseStage sparse;

  char* data() const { return buffer.bytes(); }
  const Reducer& reduce() const { return reducer != nullptr ? *reducer : CpuReducer(); }
};

// Bytes of the op's buffer on each rank: count*elem for allreduce, broadcast
// and reduce; n*count*elem for reduce_scatter, allgather, alltoall, gather and
// scatter (every rank, root or not: one layout, as allgather's); 0 for
// barrier. This is the `bytes` the cost model takes.
size_t CollectiveBufferBytes(CollectiveKind kind, size_t count, DType dtype, int world);

// Runs `call` with `algo` on this rank. Every rank of the context must make the
// same call (same kind, count, dtype, op, root, seq, algorithm and ring
// options: the signature check in op_signature.h covers all but the last two).
absl::Status RunCollective(transport::Context& ctx, const CollectiveCall& call, Algorithm algo,
                           transport::Scratch* scratch);

// oneshot's local step (oneshot.cc), shared with the daemon's fused signature
// exchange: `data` holds this rank's `count` elements on entry and, on
// return, (x0 OP x1 OP ... OP x_{n-1}) combined left to right in rank order,
// where x_me is `data` and x_p (p != me) is `peers[p]` (peers.size() = n;
// peers[me] is ignored); avg sums, then divides once by n. `own_copy` (count
// elements, unused when me = 0) keeps this rank's contribution while `data`
// accumulates. `reducer`: null, the CPU's.
void ReduceInRankOrder(DType dtype, ReduceOp op, void* data, size_t count, int me,
                       const std::vector<const char*>& peers, void* own_copy,
                       const Reducer* reducer = nullptr);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_COLLECTIVES_H_
