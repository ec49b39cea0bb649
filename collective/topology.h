// Where a job's ranks live: which daemon (node) hosts each rank. The planner
// (collective/planner.h) and the hierarchical collectives
// (collective/hierarchical.h) read it; the daemon builds it when a job's
// epoch forms (worker/daemon.cc), the same on every daemon of the job.
#ifndef GRADSYNC_COLLECTIVE_TOPOLOGY_H_
#define GRADSYNC_COLLECTIVE_TOPOLOGY_H_

#include <string>
#include <vector>

namespace gradsync {

struct JobPlacement {
  int world = 1;
  int node_index = 0;                           // this daemon
  std::vector<int> node_of_rank;                // by rank
  std::vector<std::vector<int>> ranks_of_node;  // by node (daemon), ascending
  std::vector<std::string> node_names;          // each daemon's data endpoint, "host:port"

  int nodes() const { return static_cast<int>(ranks_of_node.size()); }
  const std::vector<int>& local_ranks() const { return ranks_of_node[node_index]; }
  // Every daemon hosts one rank (no in-memory stage).
  bool one_rank_per_node() const { return nodes() == world; }
};

}  // namespace gradsync

#endif  // GRADSYNC_COLLECTIVE_TOPOLOGY_H_
