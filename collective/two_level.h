// An allreduce among daemons that share hosts, in two levels: the daemons of
// each host reduce to the first of them over the host's loopback, those
// leaders allreduce across the hosts, and each leader broadcasts the result
// to its host's daemons. Across hosts it sends what a flat allreduce among
// one daemon per host sends (a ring: 2(H-1)/H of the buffer each way per
// host), where a flat ring over every daemon sends 2(N-1)/N: with 2 hosts of
// 2 daemons, 1x the buffer each way across the link instead of 1.5x.
//
// The executor takes it (worker/op_runner.cc) for an allreduce of at least
// PlannerSettings::two_level_min_bytes with one rank per daemon when the
// daemons' data endpoints (JobPlacement::node_names, "host:port") name at
// least 2 hosts with the same number (>= 2) of daemons each, and no
// algorithm was forced. Every daemon decides alike from the placement and the
// op. Reduction order: each host's daemons in order, then the hosts in the
// inter-host algorithm's order; avg sums and divides once by the world size
// on the leaders, before the broadcast, so every rank gets the same bits.
#ifndef GRADSYNC_COLLECTIVE_TWO_LEVEL_H_
#define GRADSYNC_COLLECTIVE_TWO_LEVEL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "collective/algorithm.h"
#include "collective/collectives.h"
#include "transport/transport.h"

namespace gradsync {

// The daemons (node indices) of each host, hosts in order of first
// appearance; the host of "host:port" is what precedes the last ':' (a
// name without one is its whole host name, never equal to a "host:port" one).
struct HostGroups {
  std::vector<std::vector<int>> nodes_of_host;
  std::vector<int> host_of_node;

  int hosts() const { return static_cast<int>(nodes_of_host.size()); }
  // At least 2 hosts, each with the same number (>= 2) of daemons.
  bool two_level() const;
};
HostGroups GroupByHost(const std::vector<std::string>& node_names);

// The allreduce `call` (kind allreduce; `call.seq` and the three seqs after
// it, with the top byte set, tag its stages' messages) among every rank of
// `ctx`, whose rank r is node r of `hosts`, which must be two_level().
// `across` runs the stage among the hosts' leaders. Errors name the stage.
absl::Status RunTwoLevelAllreduce(transport::Context& ctx, const HostGroups& hosts,
                                  const CollectiveCall& call, Algorithm across,
                                  transport::Scratch* scratch);

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_TWO_LEVEL_H_
