// gradsyncd's Prometheus metrics (listed in docs/metrics.md).
#ifndef GRADSYNC_WORKER_DAEMON_METRICS_H_
#define GRADSYNC_WORKER_DAEMON_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "worker/daemon_observer.h"

namespace gradsync {

class DaemonMetrics final : public DaemonObserver {
 public:
  // Registers every metric in `registry` (which must outlive this object).
  // The metrics endpoint is unauthenticated: only with `identifying_labels`
  // (gradsyncd --metrics_identifying_labels) do series carry job ids (with
  // their tenant) or peer addresses: the per-job series, and the peer series
  // by `peer_daemon`. Without it the peer counters are summed over peers and
  // the per-peer bandwidth gauge is not exported.
  static absl::StatusOr<std::unique_ptr<DaemonMetrics>> Create(MetricsRegistry& registry,
                                                               bool identifying_labels = false);

  void OnOpQueued() override;
  void OnOpDone(const OpRecord& op) override;
  void OnSessionOpened(const std::string& job_id) override;
  void OnSessionClosed(const std::string& job_id) override;
  void OnPeerBytes(const std::string& peer, const std::string& transport, uint64_t sent,
                   uint64_t received) override;
  void OnPeerRetransmits(const std::string& peer, uint64_t retransmits) override;
  void OnPeerBandwidth(const std::string& peer, const std::string& transport,
                       double bytes_per_second) override;
  void OnEpochFailed(const std::string& cause) override;
  void OnHeartbeatFailed() override;
  void OnCoordinatorCheck(bool reachable) override;
  void OnFdRegistration(absl::StatusCode code) override;
  void OnFdFetch(absl::StatusCode code) override;
  void OnAuthFailure(absl::string_view port, absl::string_view reason) override;
  void OnLinkProbe(const LinkParams& link) override;
  void OnErrorFeedback(const std::string& job_id, int64_t epoch, uint64_t bytes,
                       double residual_norm, uint64_t refusals, bool ended) override;

  // Size classes used as the `size` label (bounded): "le_4k", "le_64k",
  // "le_1m", "le_16m", "le_256m", "gt_256m".
  static const char* SizeClass(uint64_t bytes);

 private:
  DaemonMetrics(MetricsRegistry& registry, bool identifying_labels)
      : registry_(registry), identifying_labels_(identifying_labels) {}
  // `peer_daemon` (only with identifying labels) and `transport` if given.
  prometheus::Labels PeerLabels(const std::string& peer, const std::string& transport) const;
  class JobCollector;
  prometheus::Counter* Counter(const std::string& name, const std::string& help,
                               const prometheus::Labels& labels);
  prometheus::Histogram* Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets,
                                   const prometheus::Labels& labels);

  // The series one finished op touches, found once per (collective,
  // algorithm, status, size class) and then reused: no label maps per op.
  struct OpSeries {
    prometheus::Counter* ops = nullptr;
    prometheus::Histogram* run = nullptr;    // successful ops only
    prometheus::Histogram* queue = nullptr;  // successful ops only
    prometheus::Counter* bytes = nullptr;    // successful ops only
    prometheus::Counter* codec_ops = nullptr;  // successful compressed ops only
    prometheus::Counter* codec_input = nullptr;  // their buffer bytes
    prometheus::Counter* codec_wire = nullptr;   // and those times their wire ratio
  };
  const OpSeries& SeriesFor(const OpRecord& op);

  MetricsRegistry& registry_;
  absl::Mutex mu_;
  struct SeriesKey {
    CollectiveKind kind;
    std::string algorithm;
    absl::StatusCode code;
    const char* size;  // SizeClass's static strings, compared by address
  };
  // Entries are never removed; OpSeries stay put (returned by reference).
  std::vector<std::pair<SeriesKey, std::unique_ptr<OpSeries>>> op_series_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Counter*> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Histogram*> histograms_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Gauge*> gauges_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* sessions_ = nullptr;
  prometheus::Counter* heartbeat_failures_ = nullptr;
  prometheus::Gauge* coordinator_up_ = nullptr;
  prometheus::Counter* coordinator_check_failures_ = nullptr;
  prometheus::Histogram* arrival_wait_ = nullptr;
  prometheus::Gauge* link_latency_ = nullptr;
  prometheus::Gauge* link_bandwidth_ = nullptr;
  prometheus::Gauge* reduce_bandwidth_ = nullptr;
  prometheus::Gauge* feedback_bytes_ = nullptr;
  prometheus::Gauge* feedback_norm_ = nullptr;
  prometheus::Counter* feedback_refusals_ = nullptr;
  struct Feedback {
    uint64_t bytes = 0;
    double norm = 0;
    uint64_t refusals = 0;
  };
  // By (job, epoch): what OnErrorFeedback last said; the gauges are the sums.
  std::map<std::pair<std::string, int64_t>, Feedback> feedback_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Gauge*> peer_bandwidth_ ABSL_GUARDED_BY(mu_);
  // peer -> its sent and received byte counters
  std::map<std::string, std::pair<prometheus::Counter*, prometheus::Counter*>> peer_bytes_
      ABSL_GUARDED_BY(mu_);
  const bool identifying_labels_;
  // per-job series, only for jobs with a session here; null without identifying labels
  std::shared_ptr<JobCollector> jobs_;
};

}  // namespace gradsync

#endif  // GRADSYNC_WORKER_DAEMON_METRICS_H_
