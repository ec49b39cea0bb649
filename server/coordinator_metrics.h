// CoordinatorMetrics: the coordinator's Prometheus metrics. It implements
// both observer interfaces (JobRegistryObserver for the state machine,
// RpcObserver for the gRPC edge) on a MetricsRegistry; main() serves that
// registry with a MetricsServer. The metrics are listed in docs/metrics.md.
//
// Every series is created at construction, so all of them are exported (as
// 0) before their first event. Labels have fixed value sets (state, result,
// cause, method); job and member ids never become labels.
//
// Thread-safe; the callbacks are lock-free (prometheus-cpp atomics).
#ifndef GRADSYNC_SERVER_COORDINATOR_METRICS_H_
#define GRADSYNC_SERVER_COORDINATOR_METRICS_H_

#include <array>
#include <memory>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "server/coordinator_service.h"
#include "server/job_registry_observer.h"

namespace gradsync {

class CoordinatorMetrics final : public JobRegistryObserver, public RpcObserver {
 public:
  // Registers the metrics in `registry`, which must outlive this object.
  // Errors come from MetricsRegistry (e.g. a name already taken by another
  // type).
  static absl::StatusOr<std::unique_ptr<CoordinatorMetrics>> Create(MetricsRegistry& registry);

  // JobRegistryObserver
  void OnJobStateChanged(v1::JobState from, v1::JobState to) override;
  void OnAliveMembersChanged(int delta) override;
  void OnJoinFinished(JoinResult result) override;
  void OnHeartbeat() override;
  void OnMemberDead() override;
  void OnEpochAborted(AbortCause cause) override;

  // RpcObserver
  void OnRpcDone(CoordinatorRpc rpc, absl::Duration elapsed) override;

 private:
  CoordinatorMetrics() = default;
  prometheus::Gauge* JobsGauge(v1::JobState state) const;

  // gradsync_coordinator_jobs{state=forming|running|aborted}
  prometheus::Gauge* jobs_forming_ = nullptr;
  prometheus::Gauge* jobs_running_ = nullptr;
  prometheus::Gauge* jobs_aborted_ = nullptr;
  prometheus::Gauge* members_ = nullptr;
  std::array<prometheus::Counter*, 3> joins_{};          // by JoinResult
  prometheus::Counter* heartbeats_ = nullptr;
  prometheus::Counter* heartbeat_misses_ = nullptr;
  std::array<prometheus::Counter*, 2> epoch_aborts_{};   // by AbortCause
  std::array<prometheus::Histogram*, 6> rpc_seconds_{};  // by CoordinatorRpc
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_COORDINATOR_METRICS_H_
