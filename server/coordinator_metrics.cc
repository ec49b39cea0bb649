#include "server/coordinator_metrics.h"

#include "common/status_macros.h"

namespace gradsync {

absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> CoordinatorMetrics::Create(
    MetricsRegistry& registry) {
  std::unique_ptr<CoordinatorMetrics> m(new CoordinatorMetrics());
  constexpr char kJobsHelp[] = "Jobs by the state of their current epoch.";
  ASSIGN_OR_RETURN(m->jobs_forming_, registry.AddGauge("gradsync_coordinator_jobs", kJobsHelp,
                                                       {{"state", "forming"}}));
  ASSIGN_OR_RETURN(m->jobs_running_, registry.AddGauge("gradsync_coordinator_jobs", kJobsHelp,
                                                       {{"state", "running"}}));
  ASSIGN_OR_RETURN(m->jobs_aborted_, registry.AddGauge("gradsync_coordinator_jobs", kJobsHelp,
                                                       {{"state", "aborted"}}));
  ASSIGN_OR_RETURN(m->members_,
                   registry.AddGauge("gradsync_coordinator_members",
                                     "Alive members: joined the current epoch of a job (also "
                                     "while it forms), not declared dead, not left."));
  constexpr char kJoinsHelp[] = "JoinJob calls by result (timeout: the rendezvous timed out).";
  ASSIGN_OR_RETURN(m->joins_[static_cast<int>(JoinResult::kOk)],
                   registry.AddCounter("gradsync_coordinator_joins_total", kJoinsHelp,
                                       {{"result", "ok"}}));
  ASSIGN_OR_RETURN(m->joins_[static_cast<int>(JoinResult::kTimeout)],
                   registry.AddCounter("gradsync_coordinator_joins_total", kJoinsHelp,
                                       {{"result", "timeout"}}));
  ASSIGN_OR_RETURN(m->joins_[static_cast<int>(JoinResult::kError)],
                   registry.AddCounter("gradsync_coordinator_joins_total", kJoinsHelp,
                                       {{"result", "error"}}));
  ASSIGN_OR_RETURN(m->heartbeats_, registry.AddCounter("gradsync_coordinator_heartbeats_total",
                                                       "Heartbeat calls received."));
  ASSIGN_OR_RETURN(m->heartbeat_misses_,
                   registry.AddCounter("gradsync_coordinator_heartbeat_misses_total",
                                       "Members declared dead because they missed heartbeats."));
  constexpr char kAbortsHelp[] = "Running epochs aborted, by cause.";
  ASSIGN_OR_RETURN(m->epoch_aborts_[static_cast<int>(AbortCause::kMemberDead)],
                   registry.AddCounter("gradsync_coordinator_epoch_aborts_total", kAbortsHelp,
                                       {{"cause", "member_dead"}}));
  ASSIGN_OR_RETURN(m->epoch_aborts_[static_cast<int>(AbortCause::kMemberLeft)],
                   registry.AddCounter("gradsync_coordinator_epoch_aborts_total", kAbortsHelp,
                                       {{"cause", "member_left"}}));
  static_assert(sizeof(kAllCoordinatorRpcs) / sizeof(kAllCoordinatorRpcs[0]) ==
                    std::tuple_size<decltype(rpc_seconds_)>::value,
                "one histogram per unary method");
  for (CoordinatorRpc rpc : kAllCoordinatorRpcs) {
    ASSIGN_OR_RETURN(
        m->rpc_seconds_[static_cast<int>(rpc)],
        registry.AddHistogram("gradsync_coordinator_rpc_seconds",
                              "Time to handle a unary gRPC call, by method (JoinJob includes "
                              "the wait for the rendezvous).",
                              LatencyBuckets(), {{"method", CoordinatorRpcName(rpc)}}));
  }
  return m;
}

prometheus::Gauge* CoordinatorMetrics::JobsGauge(v1::JobState state) const {
  switch (state) {
    case v1::JOB_STATE_FORMING:
      return jobs_forming_;
    case v1::JOB_STATE_RUNNING:
      return jobs_running_;
    case v1::JOB_STATE_ABORTED:
      return jobs_aborted_;
    default:
      return nullptr;  // UNSPECIFIED: created from / deleted to nothing
  }
}

void CoordinatorMetrics::OnJobStateChanged(v1::JobState from, v1::JobState to) {
  if (prometheus::Gauge* g = JobsGauge(from)) g->Decrement();
  if (prometheus::Gauge* g = JobsGauge(to)) g->Increment();
}

void CoordinatorMetrics::OnAliveMembersChanged(int delta) { members_->Increment(delta); }

void CoordinatorMetrics::OnJoinFinished(JoinResult result) {
  joins_[static_cast<int>(result)]->Increment();
}

void CoordinatorMetrics::OnHeartbeat() { heartbeats_->Increment(); }

void CoordinatorMetrics::OnMemberDead() { heartbeat_misses_->Increment(); }

void CoordinatorMetrics::OnEpochAborted(AbortCause cause) {
  epoch_aborts_[static_cast<int>(cause)]->Increment();
}

void CoordinatorMetrics::OnRpcDone(CoordinatorRpc rpc, absl::Duration elapsed) {
  rpc_seconds_[static_cast<int>(rpc)]->Observe(absl::ToDoubleSeconds(elapsed));
}

}  // namespace gradsync
