// JobRegistryObserver: what the coordinator's state machine reports to
// monitoring, as plain callbacks, so JobRegistry stays free of any metrics
// library (CoordinatorMetrics implements it on prometheus-cpp; tests count).
//
// Threading: callbacks run on the registry's callers' threads and on its
// liveness thread, often with the registry's mutex held. Implementations must
// be thread-safe, cheap and non-blocking, and must not call into the registry.
#ifndef GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_
#define GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_

#include <cstdint>
#include <string>
#include <vector>

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
  // Epoch `epoch` of job `job_id` (the registry's id: TENANT/JOB with
  // tenants) failed: a member was declared dead. (An epoch a member left may
  // still finish its last op without it; it ends with the job or the next
  // epoch.)
  virtual void OnEpochFailed(const std::string& /*job_id*/, int64_t /*epoch*/) {}
  // Job `job_id` is gone: deleted, its first rendezvous expired, or no member
  // of its epoch is left.
  virtual void OnJobRemoved(const std::string& /*job_id*/) {}
};

// Tells each of several observers (not owned; they outlive this), in order:
// the coordinator's metrics and its shard registry both follow the registry.
class JobRegistryObserverList final : public JobRegistryObserver {
 public:
  explicit JobRegistryObserverList(std::vector<JobRegistryObserver*> observers)
      : observers_(std::move(observers)) {}
  void OnJobStateChanged(v1::JobState from, v1::JobState to) override {
    for (auto* o : observers_) o->OnJobStateChanged(from, to);
  }
  void OnAliveMembersChanged(int delta) override {
    for (auto* o : observers_) o->OnAliveMembersChanged(delta);
  }
  void OnJoinFinished(JoinResult result) override {
    for (auto* o : observers_) o->OnJoinFinished(result);
  }
  void OnHeartbeat() override {
    for (auto* o : observers_) o->OnHeartbeat();
  }
  void OnMemberDead() override {
    for (auto* o : observers_) o->OnMemberDead();
  }
  void OnEpochAborted(AbortCause cause) override {
    for (auto* o : observers_) o->OnEpochAborted(cause);
  }
  void OnEpochFailed(const std::string& job_id, int64_t epoch) override {
    for (auto* o : observers_) o->OnEpochFailed(job_id, epoch);
  }
  void OnJobRemoved(const std::string& job_id) override {
    for (auto* o : observers_) o->OnJobRemoved(job_id);
  }

 private:
  const std::vector<JobRegistryObserver*> observers_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_JOB_REGISTRY_OBSERVER_H_
