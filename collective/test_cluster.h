// Test helper: a cluster of TcpContexts on loopback, one per rank, connected
// exactly as daemons connect (each rank with its own data-plane listener).
#ifndef GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_
#define GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "transport/tcp_context.h"
#include "transport/tcp_listener.h"

namespace gradsync::testing {

struct Cluster {
  std::vector<std::unique_ptr<transport::TcpListener>> listeners;
  std::vector<std::unique_ptr<transport::TcpContext>> contexts;
  int size() const { return static_cast<int>(contexts.size()); }
};

// Connects `world` ranks of job `job` (epoch 1) on 127.0.0.1, one thread per
// rank. Fails the calling test (gtest) if a rank cannot connect.
Cluster MakeCluster(int world, const std::string& job);

// Runs fn(rank) for rank 0..world-1, each on its own thread, and returns their
// statuses by rank.
std::vector<absl::Status> RunOnRanks(int world, const std::function<absl::Status(int)>& fn);

}  // namespace gradsync::testing

#endif  // GRADSYNC_COLLECTIVE_TEST_CLUSTER_H_
