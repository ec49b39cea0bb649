// The algorithm implementations behind RunCollective (internal to
// //collective). Each function assumes RunCollective validated the call
// (root in range, buffer present) and handles every world size and count.
#ifndef GRADSYNC_COLLECTIVE_ALGORITHMS_H_
#define GRADSYNC_COLLECTIVE_ALGORITHMS_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "collective/collectives.h"
#include "transport/transport.h"

namespace gradsync::internal {

// The first `bytes` of the call's buffer as a region: a view of call.region
// when it covers them, else registered for this call.
inline absl::StatusOr<std::unique_ptr<transport::MemoryRegion>> CallRegion(
    transport::Context& ctx, const CollectiveCall& call, size_t bytes) {
  return transport::RegionFor(ctx, call.buffer.Slice(0, bytes), call.region);
}

// ring_collectives.cc (allreduce is RingAllreduce, ring_allreduce.h)
absl::Status RingReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                               transport::Scratch* scratch);
absl::Status RingAllgather(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch);
absl::Status RingBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch);
absl::Status RingReduce(transport::Context& ctx, const CollectiveCall& call,
                        transport::Scratch* scratch);

// halving_doubling.cc
absl::Status RhdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                          transport::Scratch* scratch);
absl::Status RhdReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch);
absl::Status RhdAllgather(transport::Context& ctx, const CollectiveCall& call,
                          transport::Scratch* scratch);
absl::Status RdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                         transport::Scratch* scratch);
absl::Status RdAllgather(transport::Context& ctx, const CollectiveCall& call,
                         transport::Scratch* scratch);
absl::Status DisseminationBarrier(transport::Context& ctx, const CollectiveCall& call);

// tree.cc
absl::Status TreeBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch);
absl::Status TreeReduce(transport::Context& ctx, const CollectiveCall& call,
                        transport::Scratch* scratch);
absl::Status TreeAllreduce(transport::Context& ctx, const CollectiveCall& call,
                           transport::Scratch* scratch);
absl::Status TreeBarrier(transport::Context& ctx, const CollectiveCall& call);

// pairwise.cc
absl::Status PairwiseAlltoall(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch);
absl::Status PairwiseBarrier(transport::Context& ctx, const CollectiveCall& call);
// Linear gather and scatter ("pairwise": every message between the root and
// one peer), in place, no scratch.
absl::Status LinearGather(transport::Context& ctx, const CollectiveCall& call);
absl::Status LinearScatter(transport::Context& ctx, const CollectiveCall& call);

// oneshot.cc (barrier: PairwiseBarrier, the same single round)
absl::Status OneShotAllreduce(transport::Context& ctx, const CollectiveCall& call,
                              transport::Scratch* scratch);

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_ALGORITHMS_H_
