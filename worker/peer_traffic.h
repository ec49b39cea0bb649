// Peer statistics: what this daemon's node context moved to and from each
// other daemon of the job, reported to the DaemonObserver
// (worker/daemon_observer.h) as differences since the last report.
//
//   * Account(bytes, run, end), after an op finished (its clients told):
//     an op of at least 1 MiB, or the first op after a 100 ms period, flushes
//     the byte counters at once (OnPeerBytes; OnPeerBandwidth for a peer sent
//     at least 1 MiB since the last flush, over the op's run time); smaller
//     ops only mark them dirty, and the executor flushes them (FlushIfDirty)
//     before it sleeps. TCP retransmissions (a getsockopt per connection) are
//     sampled at most once a second (OnPeerRetransmits).
//   * Without a node context (every rank here) or an observer, nothing is
//     reported.
//
// Threading: the executor's thread only. Never fails.
#ifndef GRADSYNC_WORKER_PEER_TRAFFIC_H_
#define GRADSYNC_WORKER_PEER_TRAFFIC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "collective/topology.h"
#include "transport/transport.h"
#include "worker/daemon_observer.h"

namespace gradsync {

class PeerTraffic {
 public:
  // Peers are named by placement.node_names; `transport` ("tcp", "rdma")
  // labels the bytes. `node_ctx` and `observer` are not owned; either may be
  // null (then nothing is reported). `placement` must outlive this.
  PeerTraffic(const JobPlacement& placement, std::string transport, transport::Context* node_ctx,
              DaemonObserver* observer);

  // An op that moved `bytes` (its buffer) ran for `run` and ended at `end`.
  void Account(size_t bytes, absl::Duration run, absl::Time end);
  // Reports the byte counters' growth since the last flush; `op_run`: how
  // long the op just finished ran (bandwidth; zero: none reported).
  void Flush(absl::Duration op_run, absl::Time now);
  // Flush(zero, now) if an op since the last flush was not reported.
  void FlushIfDirty(absl::Time now);
  bool dirty() const { return dirty_; }

  static constexpr uint64_t kBandwidthMinBytes = 1u << 20;
  static constexpr absl::Duration kBytesPeriod = absl::Milliseconds(100);

 private:
  const JobPlacement& place_;
  const std::string transport_;
  transport::Context* const node_ctx_;
  DaemonObserver* const observer_;
  std::vector<uint64_t> sent_, received_, retrans_;  // by node
  absl::Time next_flush_ = absl::InfinitePast();
  absl::Time next_retrans_sample_ = absl::InfinitePast();
  bool dirty_ = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_PEER_TRAFFIC_H_
