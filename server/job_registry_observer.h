// JobRegistryObserver: what the coordinator's state machine reports to
// monitoring, as plain callbacks, so JobRegistry stays free of any metrics
// library (CoordinatorMetrics implements it on prometheus-cpp; tests count).
//
// Threading: callbacks run on the registry's callers' threads and on its
// liveness thread, often with the registry's mutex held. Implementations must
// be thread-safe, cheap and non-blocking, and must not call into the registry.
#ifndef GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_
#define GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_

#include "proto/coordinator.pb.h"

namespace gradsync {

class JobRegistryObserver {
 public:
  enum class JoinResult {
    kOk,       // the member got its rank (also an idempotent retry)
    kTimeout,  // DEADLINE_EXCEEDED: the rendezvous did not complete in time
    kError,    // every other error (bad request, conflict, cancelled, shutdown, ...)
  };
  enum class AbortCause {
    kMemberDead,  // a member missed its heartbeats
    kMemberLeft,  // a member called LeaveJob while the epoch was running
  };

  virtual ~JobRegistryObserver() = default;

  // A job entered state `to` from state `from` (the state of its current
  // epoch). Created: from = JOB_STATE_UNSPECIFIED, to = FORMING. Deleted:
  // to = JOB_STATE_UNSPECIFIED. A new epoch: ABORTED -> FORMING.
  virtual void OnJobStateChanged(v1::JobState /*from*/, v1::JobState /*to*/) {}
  // The number of alive members changed by `delta`. Alive: joined the current
  // epoch of a job (also while the rendezvous is forming), not declared dead,
  // not left.
  virtual void OnAliveMembersChanged(int /*delta*/) {}
  // A JoinJob call returned.
  virtual void OnJoinFinished(JoinResult /*result*/) {}
  // A Heartbeat call reached the registry (whatever its outcome).
  virtual void OnHeartbeat() {}
  // A member was declared dead (missed heartbeats).
  virtual void OnMemberDead() {}
  // A RUNNING epoch was aborted.
  virtual void OnEpochAborted(AbortCause /*cause*/) {}
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_
