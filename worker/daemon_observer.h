// What gradsyncd reports about itself, as events; worker/daemon_metrics.h
// turns them into Prometheus metrics. Kept free of Prometheus so the core
// stays testable (tests may pass a recording observer or none).
// Thread-safety: implementations are called from many threads at once.
#ifndef GRADSYNC_WORKER_DAEMON_OBSERVER_H_
#define GRADSYNC_WORKER_DAEMON_OBSERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "collective/cost_model.h"
#include "common/types.h"

namespace gradsync {

// The strings are views, valid during the OnOpDone call.
struct OpRecord {
  absl::string_view job_id;
  CollectiveKind kind = CollectiveKind::kAllreduce;
  absl::string_view algorithm;  // "ring", "hier", ... ("" if it never ran)
  absl::StatusCode code = absl::StatusCode::kOk;
  uint64_t bytes = 0;  // the op's buffer on this rank
  int world = 1;
  absl::Duration queued;        // submission to start
  absl::Duration run;           // start to completion
  absl::Duration arrival_wait;  // waiting for the last rank to submit (signature check)
  // A compressed op: the bytes its stage among the daemons sent over what
  // the dense ring would have sent (0: dense).
  double wire_ratio = 0;
};

class DaemonObserver {
 public:
  virtual ~DaemonObserver() = default;
  virtual void OnOpQueued() {}
  virtual void OnOpDone(const OpRecord& op) { (void)op; }
  virtual void OnSessionOpened(const std::string& job_id) { (void)job_id; }
  virtual void OnSessionClosed(const std::string& job_id) { (void)job_id; }
  // Bytes moved to/from one peer daemon ("host:port") over `transport`
  // ("tcp", "rdma") since the last call.
  virtual void OnPeerBytes(const std::string& peer, const std::string& transport, uint64_t sent,
                           uint64_t received) {
    (void)peer; (void)transport; (void)sent; (void)received;
  }
  // TCP retransmissions on the connections to a peer daemon since the last call.
  virtual void OnPeerRetransmits(const std::string& peer, uint64_t retransmits) {
    (void)peer; (void)retransmits;
  }
  // Bytes/s this rank sent to a peer daemon during the last op that sent it
  // at least 1 MiB (achieved per-link bandwidth).
  virtual void OnPeerBandwidth(const std::string& peer, const std::string& transport,
                               double bytes_per_second) {
    (void)peer; (void)transport; (void)bytes_per_second;
  }
  // An epoch failed (cause: "peer_lost", "protocol", "timeout", "peer_abort",
  // "coordinator", "closed", "other").
  virtual void OnEpochFailed(const std::string& cause) { (void)cause; }
  virtual void OnHeartbeatFailed() {}
  // A health check of the coordinator answered (true) or failed (false).
  virtual void OnCoordinatorCheck(bool reachable) { (void)reachable; }
  // A registration on the fd socket ended with `code` (kOk: registered).
  virtual void OnFdRegistration(absl::StatusCode code) { (void)code; }
  // A connection on `port` ("data") was refused because its peer did not
  // prove the job key (`reason`: "bad_proof", "no_proof").
  virtual void OnAuthFailure(absl::string_view port, absl::string_view reason) {
    (void)port;
    (void)reason;
  }
  // A segment fetch on the fd socket ended with `code` (kOk: handed out).
  virtual void OnFdFetch(absl::StatusCode code) { (void)code; }
  virtual void OnLinkProbe(const LinkParams& link) { (void)link; }
  // The error feedback one job's epoch keeps here (worker/error_feedback_store.h),
  // after a top-k op; `ended`: the epoch is over and its state dropped.
  // `refusals`: the epoch's quota refusals so far.
  virtual void OnErrorFeedback(const std::string& job_id, int64_t epoch, uint64_t bytes,
                               double residual_norm, uint64_t refusals, bool ended) {
    (void)job_id; (void)epoch; (void)bytes; (void)residual_norm; (void)refusals; (void)ended;
  }
};

// Classifies an epoch-breaking error for OnEpochFailed.
std::string EpochFailureCause(const absl::Status& s);

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DAEMON_OBSERVER_H_
