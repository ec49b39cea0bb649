// Collectives of the ranks that share one daemon (the hierarchical path of
// collective/planner.h), run by the job's executor (worker/job_executor.h)
// on their buffers, all mapped in this process.
//
// All ranks on this daemon (RunInMemory): the whole collective is memory
// copies and reductions, in rank order. Several daemons (RunAcrossNodes):
// the local ranks are combined in memory, one exchange among the daemons
// carries the daemon's share on the node context (one rank per daemon), and
// the result is copied back out:
//   allreduce       local reduce (rank order) -> node allreduce -> copy
//   reduce_scatter  local reduce of every block -> node allreduce of all the
//                   blocks (twice the bytes of a flat reduce_scatter) -> each
//                   rank keeps its block
//   allgather       each daemon sends its ranks' blocks to every other
//   alltoall        each daemon sends every other the blocks its ranks
//                   address to that daemon's ranks; local pairs swap in place
//   broadcast       node broadcast from the root's daemon -> copy
//   reduce          local reduce -> node reduce to the root's daemon -> the
//                   root's buffer (the others' buffers are left as they were)
//   gather          each other daemon sends the root's daemon its ranks' own
//                   blocks in one message; local ranks' blocks are copied
//                   into the root's buffer
//   scatter         the root's daemon sends each other daemon the root's
//                   blocks of that daemon's ranks in one message; local
//                   ranks' blocks are copied from the root's buffer
// (All ranks on this daemon: gather and scatter are block copies between the
// root's buffer and the others'.)
//   barrier         nothing (the signature exchange was the barrier)
// Every element is combined in a fixed order (local ranks ascending, then the
// node algorithm's order), so every rank gets the same bits. avg sums and
// divides once by the world size at the end.
//
// Memory: every reduction and copy goes through the op's Reducer (the CPU's
// for host buffers), and staging comes from the executor's Scratch of the
// buffers' memory kind; nothing here touches the bytes itself.
#ifndef GRADSYNC_COLLECTIVE_HIERARCHICAL_H_
#define GRADSYNC_COLLECTIVE_HIERARCHICAL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collective/algorithm.h"
#include "collective/reducer.h"
#include "collective/ring_allreduce.h"
#include "collective/topology.h"
#include "common/slice_pool.h"
#include "common/types.h"
#include "kernels/codec.h"
#include "kernels/topk.h"
#include "transport/memory.h"
#include "transport/transport.h"

namespace gradsync {

// One op on this daemon's ranks: their buffers by local index (ranks
// ascending; null for a buffer-less barrier).
struct LocalCollective {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // per block for the blocked collectives
  int root = 0;      // a job rank
  std::vector<char*> bufs;
  // What reduces and copies the buffers' memory (null: the CPU's; host).
  const Reducer* reducer = nullptr;
  // bufs[0]'s registration on the node context (null: registered per op).
  const transport::MemoryRegion* region0 = nullptr;
  // The codec of the allreduce among the daemons (allreduce and
  // reduce_scatter; collective/compressed_ring.h).
  CodecId codec = CodecId::kNone;
  // With `codec`: this daemon's error feedback (null: none kept).
  ErrorFeedback* codec_feedback = nullptr;
  // Top-k sparsification of the allreduce among the daemons (allreduce
  // only; collective/sparse_allreduce.h), with this daemon's state.
  SparseStage sparse;
  // Where RunAcrossNodes writes how long the allreduce among the daemons
  // took (allreduce and reduce_scatter; null: not measured).
  absl::Duration* between_time = nullptr;

  const Reducer& reduce() const { return reducer != nullptr ? *reducer : CpuReducer(); }
};

// Large in-memory allreduce passes run in slices of at least `min_bytes`
// (from twice that size) on `pool`; every element is still combined in rank
// order. No pool or min_bytes 0: on the calling thread alone. The planner
// decides min_bytes (Plan::slice_min_bytes).
struct Slicing {
  SlicePool* pool = nullptr;
  size_t min_bytes = 0;
};

// Every rank of the job is on this daemon.
// `scratch` must be of the buffers' memory kind.
absl::Status RunInMemory(const JobPlacement& placement, const LocalCollective& c,
                         transport::Scratch* scratch, Slicing slicing = {});

// Several daemons: `node_ctx` connects them (rank = node index);
// `node_algo` runs the node stage where one runs (it must implement the
// stage's collective: allreduce for allreduce and reduce_scatter, broadcast,
// reduce; allgather, alltoall, gather and scatter move their blocks in one
// message per pair of daemons that exchange any and ignore it). Errors name
// the stage.
absl::Status RunAcrossNodes(transport::Context& node_ctx, const JobPlacement& placement,
                            const LocalCollective& c, Algorithm node_algo, uint64_t seq,
                            absl::Time deadline, const RingOptions& ring,
                            transport::Scratch* scratch, transport::Scratch* algo_scratch,
                            Slicing slicing = {});

// An allreduce's local stages around any stage among the daemons (the node
// collective of RunAcrossNodes, the parameter server's push and pull):
// ReduceLocalShare combines bufs[1..] into bufs[0] in rank order (avg:
// summed); SpreadLocalResult divides bufs[0] by `world` (avg) and copies it
// to the other buffers.
void ReduceLocalShare(const LocalCollective& c, Slicing slicing);
void SpreadLocalResult(const LocalCollective& c, int world, Slicing slicing);

// Combines bufs[1..] into bufs[0] in order with `op` (avg: sum), `count`
// elements; then, for avg and `divide_by` > 0, divides bufs[0] by it.
void ReduceInOrder(const Reducer& red, const std::vector<char*>& bufs, size_t count, DType dtype,
                   ReduceOp op, int divide_by);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_HIERARCHICAL_H_
