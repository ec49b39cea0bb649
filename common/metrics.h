// Prometheus metrics for gradsync binaries, in two separate parts (as in
// Seastar): registration (MetricsRegistry: what a component measures) and
// export (MetricsServer: an HTTP /metrics endpoint). Components only see a
// MetricsRegistry; main() decides whether and where it is served.
//
//   MetricsRegistry metrics;
//   RETURN_IF_ERROR(metrics.AddProcessMetrics());        // build info, CPU, memory, fds
//   ASSIGN_OR_RETURN(prometheus::Counter* joins,
//                    metrics.AddCounter("gradsync_coordinator_joins_total",
//                                       "JoinJob calls by result", {{"result", "ok"}}));
//   ASSIGN_OR_RETURN(auto server, MetricsServer::Start("0.0.0.0:9470", metrics));
//   joins->Increment();                                  // thread-safe, lock-free
//
// Names are checked against the Prometheus conventions when a metric is added
// (see ValidateMetricName), so a bad name is an error at start-up, not a
// confusing series in production. Labels must have a small, fixed set of
// values: never put job ids, member ids, ranks or addresses in a label.
//
// prometheus-cpp reports errors with exceptions; nothing in this API lets one
// escape: every failure is an absl::Status.
#ifndef GRADSYNC_COMMON_METRICS_H_
#define GRADSYNC_COMMON_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "common/build_info.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace gradsync {

// The version every binary reports in gradsync_build_info.

// Histogram buckets in base units.
// Latencies: 100 µs .. 300 s, about 3 buckets per decade (20 buckets).
prometheus::Histogram::BucketBoundaries LatencyBuckets();
// Sizes: 256 B .. 4 GiB, powers of 4 (13 buckets).
prometheus::Histogram::BucketBoundaries SizeBuckets();

// OK if `name` follows the project's conventions for a metric of `type`:
//   - [a-z][a-z0-9_]*, starting with "gradsync_";
//   - counters end in "_total", other types do not;
//   - histograms end in a base unit: "_seconds" or "_bytes";
//   - no non-base units ("_ms", "_milliseconds", "_us", "_kb", "_mb", ...).
// INVALID_ARGUMENT naming the rule otherwise.
absl::Status ValidateMetricName(absl::string_view name, prometheus::MetricType type);

// OK if every label name is a valid Prometheus label name, does not start
// with "__", and is not one Prometheus attaches itself or that is unbounded
// by nature ("job", "instance", "job_id", "member", "member_id", "rank",
// "host", "address", "le", "quantile"). INVALID_ARGUMENT naming the label.
absl::Status ValidateLabels(const prometheus::Labels& labels);

// Owns a prometheus::Registry plus extra collectables (process metrics).
// Thread-safe. The returned metric pointers are owned by the registry and
// stay valid for its lifetime; updating them is lock-free.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the series `name{labels}`, creating its family (with `help`) and
  // the series on first use; later calls with the same name and labels return
  // the same object. Add every series a component can produce at start-up,
  // so it is exported as 0 before its first event.
  // INVALID_ARGUMENT: bad name or labels (see ValidateMetricName,
  // ValidateLabels); ALREADY_EXISTS: the name is taken by another type.
  absl::StatusOr<prometheus::Counter*> AddCounter(absl::string_view name, absl::string_view help,
                                                  const prometheus::Labels& labels = {});
  absl::StatusOr<prometheus::Gauge*> AddGauge(absl::string_view name, absl::string_view help,
                                              const prometheus::Labels& labels = {});
  // `buckets`: strictly increasing upper bounds (+Inf is implicit), e.g.
  // LatencyBuckets(). INVALID_ARGUMENT if empty or not increasing.
  absl::StatusOr<prometheus::Histogram*> AddHistogram(
      absl::string_view name, absl::string_view help,
      const prometheus::Histogram::BucketBoundaries& buckets,
      const prometheus::Labels& labels = {});

  // Exports `collectable` together with the registry's own metrics (for
  // values computed at scrape time). Its names are not checked.
  void AddCollectable(std::shared_ptr<prometheus::Collectable> collectable);

  // Everything this registry exports, and the same in the Prometheus text
  // exposition format (what /metrics serves, minus the exporter's own
  // metrics). For tests, `gradsync status` and debugging.
  std::vector<prometheus::MetricFamily> Collect() const;
  std::string TextFormat() const;

  // Adds the metrics every gradsync binary exports:
  //   gradsync_build_info{version}   gauge, always 1;
  //   process_start_time_seconds, process_cpu_seconds_total,
  //   process_resident_memory_bytes, process_virtual_memory_bytes,
  //   process_open_fds, process_max_fds   (the standard names every
  //   Prometheus client library uses, read from /proc at scrape time).
  // Idempotent.
  absl::Status AddProcessMetrics(absl::string_view version = kGradsyncVersion);

  // What MetricsServer registers with its prometheus::Exposer.
  std::weak_ptr<prometheus::Collectable> collectable() const;

 private:
  class Exported;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Exported> exported_;
};

// An HTTP server that serves a MetricsRegistry at /metrics (prometheus-cpp's
// Exposer, on civetweb, with kThreads threads). It holds only a weak reference to the
// registry: destroying the registry first is safe (scrapes then return no
// gradsync metrics). The Exposer adds its own exposer_* metrics.
class MetricsServer {
 public:
  // Starts serving. `address` is "IPv4:port" or "[IPv6]:port"; port 0 picks a
  // free port (see port()). INVALID_ARGUMENT: malformed address;
  // UNAVAILABLE: cannot listen (address in use, not local, ...). The message
  // names the address.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view address,
                                                              const MetricsRegistry& registry);
  ~MetricsServer();  // stops serving; waits for running scrapes
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port, and "host:port" with it.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Server threads, and how long a connection may take to send its request:
  // a connection that sends nothing holds a thread at most that long, so
  // idle connections delay a scrape by seconds, not block it.
  static constexpr int kThreads = 4;
  static constexpr int kRequestTimeoutMs = 2000;

 private:
  MetricsServer() = default;

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
  std::string address_;
  std::string wake_host_;  // an address of the listener to connect to
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_METRICS_H_
