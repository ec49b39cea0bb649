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
#include "absl/time/time.h"

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

  // What MetricsServer serves (it holds only this weak reference).
  std::weak_ptr<prometheus::Collectable> collectable() const;

 private:
  class Exported;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Exported> exported_;
};

// An HTTP/1.x server that serves a MetricsRegistry at /metrics, in the
// Prometheus text format (version 0.0.4). One thread ("gs-metrics") runs a
// poll(2) loop over non-blocking sockets, so a connection costs a slot, not a
// thread: idle or slow connections never delay another connection's scrape.
//
//   - GET (and HEAD) /metrics: 200 with the registry's metrics plus the
//     server's own gradsync_metrics_* series; any query string is ignored.
//     Other paths: 404; other methods: 405; a malformed request: 400;
//     request headers over kMaxRequestBytes: 431. Every reply closes the
//     connection ("Connection: close"; no keep-alive, no gzip).
//   - A connection must send its whole request within kRequestTimeoutMs of
//     being accepted and take its reply within kReplyTimeoutMs; otherwise it
//     is closed (408 if it sent part of a request).
//   - At most kMaxConnections connections in all and kMaxConnectionsPerSource
//     per source (an IPv4 address; an IPv6 /64). A newcomer from a source at
//     its limit is closed at once. When every slot is taken, a newcomer from a
//     source holding fewer connections than the biggest holder takes the slot
//     of that holder's oldest connection still sending its request; otherwise
//     the newcomer is closed. So one host cannot lock out another, and several
//     hosts together cannot lock out a host with fewer connections.
//
// It holds only a weak reference to the registry: destroying the registry
// first is safe (scrapes then return no gradsync metrics but the server's).
class MetricsServer {
 public:
  static constexpr int kRequestTimeoutMs = 2000;
  static constexpr int kReplyTimeoutMs = 10000;
  static constexpr int kMaxConnections = 1024;
  static constexpr int kMaxConnectionsPerSource = 128;
  static constexpr int kMaxRequestBytes = 8192;

  // The limits above; tests shrink or stretch them.
  struct Options {
    int max_connections = kMaxConnections;
    int max_connections_per_source = kMaxConnectionsPerSource;
    absl::Duration request_timeout = absl::Milliseconds(kRequestTimeoutMs);
    absl::Duration reply_timeout = absl::Milliseconds(kReplyTimeoutMs);
    int max_request_bytes = kMaxRequestBytes;
  };

  // Starts serving. `address` is "IPv4:port" or "[IPv6]:port"; port 0 picks a
  // free port (see port()). INVALID_ARGUMENT: malformed address or options;
  // UNAVAILABLE: cannot listen (address in use, not local, ...). The message
  // names the address.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view address,
                                                              const MetricsRegistry& registry);
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view address,
                                                              const MetricsRegistry& registry,
                                                              const Options& options);
  ~MetricsServer();  // stops serving and closes every connection; waits for a running scrape
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound port, and "host:port" with it.
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Connections open now (accepted and not yet closed). Thread-safe; for
  // tests and debugging (the same value is exported as
  // gradsync_metrics_connections).
  int open_connections() const;

 private:
  class Loop;  // the serving thread and its connections (metrics_server.cc)
  MetricsServer() = default;

  std::unique_ptr<Loop> loop_;
  int port_ = 0;
  std::string address_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_METRICS_H_
