// `gradsync cluster`: an embedded local cluster (1 coordinator, N daemons,
// optional PS shards) that stays up until SIGINT/SIGTERM or --duration_s,
// for trying the SDK, the Python package or a training script against real
// daemons on one machine. It writes where everything listens as shell
// variables (stdout, and --env_file if given):
//   GRADSYNC_COORDINATOR=127.0.0.1:PORT
//   GRADSYNC_DAEMONS=unix-abstract:...,unix-abstract:...   (one per daemon)
//   GRADSYNC_DAEMON_0=unix-abstract:...                     (and so on)
// Its children never outlive it (PR_SET_PDEATHSIG).
#ifndef GRADSYNC_CLI_CLUSTER_H_
#define GRADSYNC_CLI_CLUSTER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace gradsync {

struct ClusterOptions {
  int daemons = 2;
  int ps_shards = 0;
  std::string env_file;                               // "" : stdout only
  absl::Duration duration = absl::InfiniteDuration();  // then it stops by itself
  bool keep_logs = false;
};

// Runs until a signal or the duration; OK after a clean stop.
absl::Status RunCluster(const ClusterOptions& options);

}  // namespace gradsync

#endif  // GRADSYNC_CLI_CLUSTER_H_
