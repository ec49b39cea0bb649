// The algorithm implementations behind RunCollective (internal to
// //collective). Each function assumes RunCollective validated the call
// (root in range, buffer present) and handles every world size and count.
#ifndef GRADSYNC_COLLECTIVE_ALGORITHMS_H_
#define GRADSYNC_COLLECTIVE_ALGORITHMS_H_

#include <vector>

#include "absl/status/status.h"
#include "collective/collectives.h"
#include "transport/transport.h"

namespace gradsync::internal {

// ring_collectives.cc (allreduce is RingAllreduce, ring_allreduce.h)
absl::Status RingReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                               std::vector<char>* scratch);
absl::Status RingAllgather(transport::Context& ctx, const CollectiveCall& call,
                           std::vector<char>* scratch);
absl::Status RingBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           std::vector<char>* scratch);
absl::Status RingReduce(transport::Context& ctx, const CollectiveCall& call,
                        std::vector<char>* scratch);

// halving_doubling.cc
absl::Status RhdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                          std::vector<char>* scratch);
absl::Status RhdReduceScatter(transport::Context& ctx, const CollectiveCall& call,
                              std::vector<char>* scratch);
absl::Status RhdAllgather(transport::Context& ctx, const CollectiveCall& call,
                          std::vector<char>* scratch);
absl::Status RdAllreduce(transport::Context& ctx, const CollectiveCall& call,
                         std::vector<char>* scratch);
absl::Status RdAllgather(transport::Context& ctx, const CollectiveCall& call,
                         std::vector<char>* scratch);
absl::Status DisseminationBarrier(transport::Context& ctx, const CollectiveCall& call);

// tree.cc
absl::Status TreeBroadcast(transport::Context& ctx, const CollectiveCall& call,
                           std::vector<char>* scratch);
absl::Status TreeReduce(transport::Context& ctx, const CollectiveCall& call,
                        std::vector<char>* scratch);
absl::Status TreeAllreduce(transport::Context& ctx, const CollectiveCall& call,
                           std::vector<char>* scratch);
absl::Status TreeBarrier(transport::Context& ctx, const CollectiveCall& call);

// pairwise.cc
absl::Status PairwiseAlltoall(transport::Context& ctx, const CollectiveCall& call,
                              std::vector<char>* scratch);
absl::Status PairwiseBarrier(transport::Context& ctx, const CollectiveCall& call);

// oneshot.cc (barrier: PairwiseBarrier, the same single round)
absl::Status OneShotAllreduce(transport::Context& ctx, const CollectiveCall& call,
                              std::vector<char>* scratch);

}  // namespace gradsync::internal

#endif  // GRADSYNC_COLLECTIVE_ALGORITHMS_H_
