#include "worker/daemon_metrics.h"

#include <cmath>


#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace gradsync {
namespace {

std::string Key(const std::string& name, const prometheus::Labels& labels) {
  std::string k = name;
  for (const auto& [l, v] : labels) absl::StrAppend(&k, "|", l, "=", v);
  return k;
}

std::string CodeName(absl::StatusCode code) {
  std::string s = absl::StatusCodeToString(code);
  return absl::AsciiStrToLower(s);
}

}  // namespace

// Per-job series (label `gradsync_job`). They exist only while the job has a
// session on this daemon, so their number is bounded by the live jobs; they
// are built at scrape time from plain counters.
class DaemonMetrics::JobCollector : public prometheus::Collectable {
 public:
  struct Job {
    int sessions = 0;
    double ops_ok = 0, ops_failed = 0, op_seconds = 0, bytes = 0, arrival_wait = 0;
  };
  void Opened(const std::string& job) {
    absl::MutexLock l(&mu_);
    ++jobs_[job].sessions;
  }
  void Closed(const std::string& job) {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end() && --it->second.sessions <= 0) jobs_.erase(it);
  }
  void Op(const OpRecord& op) {
    Add(op.job_id, op.code, 1, op.run, op.bytes, op.arrival_wait);
  }
  // `ops` finished ops of `job` with `code`; the sums are of the successful ones.
  void Add(absl::string_view job, absl::StatusCode code, uint64_t ops, absl::Duration run,
           uint64_t bytes, absl::Duration arrival_wait) {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    Job& j = it->second;
    if (code == absl::StatusCode::kOk) {
      j.ops_ok += static_cast<double>(ops);
      j.op_seconds += absl::ToDoubleSeconds(run);
      j.bytes += static_cast<double>(bytes);
      j.arrival_wait += absl::ToDoubleSeconds(arrival_wait);
    } else {
      j.ops_failed += static_cast<double>(ops);
    }
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock l(&mu_);
    auto family = [](const char* name, const char* help, prometheus::MetricType type) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      return f;
    };
    auto ops = family("gradsync_job_ops_total",
                      "Collectives of the job finished on this daemon's ranks, by status",
                      prometheus::MetricType::Counter);
    auto secs = family("gradsync_job_op_seconds_total",
                       "Summed run time of the job's successful collectives on this daemon",
                       prometheus::MetricType::Counter);
    auto bytes = family("gradsync_job_bytes_total",
                        "Buffer bytes of the job's successful collectives on this daemon",
                        prometheus::MetricType::Counter);
    auto wait = family("gradsync_job_arrival_wait_seconds_total",
                       "Summed time this daemon's ranks of the job waited for the last rank "
                       "to submit (straggler signal per job)",
                       prometheus::MetricType::Counter);
    auto ranks = family("gradsync_job_local_ranks", "Ranks of the job on this daemon",
                        prometheus::MetricType::Gauge);
    for (const auto& [job, j] : jobs_) {
      auto point = [&](prometheus::MetricFamily& f, double v, const char* status = nullptr) {
        prometheus::ClientMetric m;
        m.label.push_back({"gradsync_job", job});
        if (status != nullptr) m.label.push_back({"status", status});
        if (f.type == prometheus::MetricType::Gauge) {
          m.gauge.value = v;
        } else {
          m.counter.value = v;
        }
        f.metric.push_back(std::move(m));
      };
      point(ops, j.ops_ok, "ok");
      point(ops, j.ops_failed, "error");
      point(secs, j.op_seconds);
      point(bytes, j.bytes);
      point(wait, j.arrival_wait);
      point(ranks, j.sessions);
    }
    return {ops, secs, bytes, wait, ranks};
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, Job, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
};

const char* DaemonMetrics::SizeClass(uint64_t bytes) {
  if (bytes <= (4u << 10)) return "le_4k";
  if (bytes <= (64u << 10)) return "le_64k";
  if (bytes <= (1u << 20)) return "le_1m";
  if (bytes <= (16u << 20)) return "le_16m";
  if (bytes <= (256u << 20)) return "le_256m";
  return "gt_256m";
}

prometheus::Labels DaemonMetrics::PeerLabels(const std::string& peer,
                                             const std::string& transport) const {
  prometheus::Labels labels;
  if (identifying_labels_) labels["peer_daemon"] = peer;
  if (!transport.empty()) labels["transport"] = transport;
  return labels;
}

absl::StatusOr<std::unique_ptr<DaemonMetrics>> DaemonMetrics::Create(MetricsRegistry& registry,
                                                                     bool identifying_labels) {
  std::unique_ptr<DaemonMetrics> m(new DaemonMetrics(registry, identifying_labels));
  auto q = registry.AddGauge("gradsync_daemon_queue_depth",
                             "Ops submitted to this daemon and not finished yet");
  if (!q.ok()) return q.status();
  m->queue_depth_ = *q;
  auto s = registry.AddGauge("gradsync_daemon_sessions", "Open client sessions");
  if (!s.ok()) return s.status();
  m->sessions_ = *s;
  auto h = registry.AddCounter("gradsync_daemon_heartbeat_failures_total",
                               "Heartbeats to the coordinator that failed");
  if (!h.ok()) return h.status();
  m->heartbeat_failures_ = *h;
  auto up = registry.AddGauge("gradsync_daemon_coordinator_up",
                              "1 while the coordinator answers this daemon's health checks, else 0");
  if (!up.ok()) return up.status();
  m->coordinator_up_ = *up;
  auto cf = registry.AddCounter("gradsync_daemon_coordinator_check_failures_total",
                                "Health checks of the coordinator that failed (retried with back-off)");
  if (!cf.ok()) return cf.status();
  m->coordinator_check_failures_ = *cf;
  auto w = registry.AddHistogram(
      "gradsync_daemon_arrival_wait_seconds",
      "Per op: how long this rank waited for the last rank to submit (straggler signal)",
      LatencyBuckets());
  if (!w.ok()) return w.status();
  m->arrival_wait_ = *w;
  auto lat = registry.AddGauge("gradsync_daemon_link_latency_seconds",
                               "Per-message latency measured by the last link probe");
  if (!lat.ok()) return lat.status();
  m->link_latency_ = *lat;
  auto bw = registry.AddGauge("gradsync_daemon_link_bandwidth_bytes",
                              "Link bandwidth (bytes per second) measured by the last link probe");
  if (!bw.ok()) return bw.status();
  m->link_bandwidth_ = *bw;
  auto rb = registry.AddGauge("gradsync_daemon_reduce_bandwidth_bytes",
                              "Local reduction speed (bytes per second) measured by the last probe");
  if (!rb.ok()) return rb.status();
  m->reduce_bandwidth_ = *rb;
  auto fb = registry.AddGauge("gradsync_daemon_error_feedback_bytes",
                              "Memory of the error-feedback state top-k ops keep here (all jobs)");
  if (!fb.ok()) return fb.status();
  m->feedback_bytes_ = *fb;
  auto fn = registry.AddGauge(
      "gradsync_daemon_error_feedback_residual_norm",
      "Euclidean norm of every residual top-k ops kept here still owe (all jobs)");
  if (!fn.ok()) return fn.status();
  m->feedback_norm_ = *fn;
  m->feedback_refusals_ = m->Counter(
      "gradsync_daemon_error_feedback_refusals_total",
      "Top-k ops that ran without error feedback because the session's quota refused it", {});
  // Series that exist from start-up, so dashboards show 0 rather than nothing.
  m->Counter("gradsync_daemon_ops_total", "Collectives finished, by type, algorithm and status",
             {{"collective", "allreduce"}, {"algorithm", "ring"}, {"status", "ok"}});
  m->Counter("gradsync_daemon_epoch_failures_total", "Job epochs that failed here, by cause",
             {{"cause", "peer_lost"}});
  if (identifying_labels) {
    m->jobs_ = std::make_shared<JobCollector>();
    registry.AddCollectable(m->jobs_);
  }
  return m;
}

prometheus::Counter* DaemonMetrics::Counter(const std::string& name, const std::string& help,
                                            const prometheus::Labels& labels) {
  const std::string key = Key(name, labels);
  absl::MutexLock l(&mu_);
  auto it = counters_.find(key);
  if (it != counters_.end()) return it->second;
  auto c = registry_.AddCounter(name, help, labels);
  if (!c.ok()) {
    GS_LOG(WARNING) << "metric " << name << ": " << c.status().message();
    return nullptr;
  }
  counters_[key] = *c;
  return *c;
}

prometheus::Histogram* DaemonMetrics::Histogram(
    const std::string& name, const std::string& help,
    const prometheus::Histogram::BucketBoundaries& buckets, const prometheus::Labels& labels) {
  const std::string key = Key(name, labels);
  absl::MutexLock l(&mu_);
  auto it = histograms_.find(key);
  if (it != histograms_.end()) return it->second;
  auto h = registry_.AddHistogram(name, help, buckets, labels);
  if (!h.ok()) {
    GS_LOG(WARNING) << "metric " << name << ": " << h.status().message();
    return nullptr;
  }
  histograms_[key] = *h;
  return *h;
}

void DaemonMetrics::OnOpQueued() { queue_depth_->Increment(); }

const DaemonMetrics::OpSeries& DaemonMetrics::SeriesFor(const OpRecord& op) {
  const char* size = SizeClass(op.bytes);
  {
    // A daemon sees a few dozen combinations at most: a scan of small keys
    // (the algorithm compared last) beats a map keyed by strings.
    absl::MutexLock l(&mu_);
    for (const auto& [key, series] : op_series_) {
      if (key.kind == op.kind && key.code == op.code && key.size == size &&
          key.algorithm == op.algorithm) {
        return *series;
      }
    }
  }
  const std::string kind = CollectiveName(op.kind);
  const std::string algo = op.algorithm.empty() ? "none" : std::string(op.algorithm);
  OpSeries s;
  s.ops = Counter("gradsync_daemon_ops_total",
                  "Collectives finished, by type, algorithm and status",
                  {{"collective", kind}, {"algorithm", algo}, {"status", CodeName(op.code)}});
  if (op.code == absl::StatusCode::kOk) {
    s.run = Histogram("gradsync_daemon_op_seconds",
                      "Time from start to completion of successful collectives",
                      LatencyBuckets(), {{"collective", kind}, {"size", size}});
    s.queue = Histogram("gradsync_daemon_op_queue_seconds",
                        "Time successful collectives waited in the session queue",
                        LatencyBuckets(), {{"collective", kind}});
    s.bytes = Counter("gradsync_daemon_op_bytes_total",
                      "Buffer bytes of successful collectives on this daemon's ranks",
                      {{"collective", kind}});
    // A compressed op's plan is "ring+bf16": the codec follows the '+'.
    const size_t plus = algo.find('+');
    if (plus != std::string::npos) {
      const prometheus::Labels labels{{"collective", kind}, {"codec", algo.substr(plus + 1)}};
      s.codec_ops = Counter("gradsync_daemon_codec_ops_total",
                            "Collectives finished whose messages went through a wire codec",
                            labels);
      s.codec_input = Counter("gradsync_daemon_codec_input_bytes_total",
                              "Buffer bytes of compressed collectives on this daemon's ranks",
                              labels);
      s.codec_wire = Counter(
          "gradsync_daemon_codec_wire_bytes_total",
          "Those bytes times the op's wire ratio (what its stage among the daemons sent over "
          "what the dense ring would have sent): wire / input is the compression ratio",
          labels);
    }
  }
  absl::MutexLock l(&mu_);
  for (const auto& [key, series] : op_series_) {  // another thread added it meanwhile
    if (key.kind == op.kind && key.code == op.code && key.size == size &&
        key.algorithm == op.algorithm) {
      return *series;
    }
  }
  op_series_.emplace_back(SeriesKey{op.kind, std::string(op.algorithm), op.code, size},
                          std::make_unique<OpSeries>(s));
  return *op_series_.back().second;
}

void DaemonMetrics::OnOpDone(const OpRecord& op) {
  queue_depth_->Decrement();
  if (jobs_ != nullptr) jobs_->Op(op);
  const OpSeries& series = SeriesFor(op);
  if (series.ops != nullptr) series.ops->Increment();
  if (series.codec_ops != nullptr) series.codec_ops->Increment();
  if (op.code != absl::StatusCode::kOk) return;
  if (series.run != nullptr) series.run->Observe(absl::ToDoubleSeconds(op.run));
  if (series.queue != nullptr) series.queue->Observe(absl::ToDoubleSeconds(op.queued));
  if (series.bytes != nullptr) series.bytes->Increment(static_cast<double>(op.bytes));
  if (series.codec_input != nullptr && op.wire_ratio > 0) {
    series.codec_wire->Increment(static_cast<double>(op.bytes) * op.wire_ratio);
    series.codec_input->Increment(static_cast<double>(op.bytes));  // last: see daemon_metrics_test
  }
  arrival_wait_->Observe(absl::ToDoubleSeconds(op.arrival_wait));
  // Achieved bus bandwidth (nccl-tests definition), as a histogram of bytes/s.
  double factor = 1.0;
  const double n = op.world;
  switch (op.kind) {
    case CollectiveKind::kAllreduce: factor = n > 1 ? 2 * (n - 1) / n : 1; break;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: factor = n > 1 ? (n - 1) / n : 1; break;
    default: break;
  }
  const double secs = absl::ToDoubleSeconds(op.run);
  if (op.bytes >= (64u << 10) && secs > 0 && op.kind != CollectiveKind::kBarrier) {
    // Large ops only: the lookup is negligible next to them.
    static const prometheus::Histogram::BucketBoundaries kBw = {
        1e7, 3e7, 1e8, 3e8, 1e9, 2e9, 4e9, 8e9, 16e9, 32e9, 64e9, 128e9};
    if (auto* h = Histogram("gradsync_daemon_busbw_bytes",
                            "Achieved bus bandwidth (bytes per second, nccl-tests definition) of "
                            "collectives of at least 64 KiB",
                            kBw, {{"collective", CollectiveName(op.kind)}})) {
      h->Observe(op.bytes * factor / secs);
    }
  }
}

void DaemonMetrics::OnSessionOpened(const std::string& job_id) {
  sessions_->Increment();
  if (jobs_ != nullptr) jobs_->Opened(job_id);
}
void DaemonMetrics::OnSessionClosed(const std::string& job_id) {
  sessions_->Decrement();
  if (jobs_ != nullptr) jobs_->Closed(job_id);
}

void DaemonMetrics::OnPeerRetransmits(const std::string& peer, uint64_t retransmits) {
  if (auto* c = Counter("gradsync_daemon_peer_retransmits_total",
                        "TCP segments retransmitted on the connections to each peer daemon",
                        PeerLabels(peer, ""))) {
    c->Increment(static_cast<double>(retransmits));
  }
}

void DaemonMetrics::OnPeerBandwidth(const std::string& peer, const std::string& transport,
                                    double bytes_per_second) {
  if (!identifying_labels_) return;  // a per-link gauge means nothing summed over peers
  const std::string key = absl::StrCat(peer, " ", transport);
  prometheus::Gauge* g = nullptr;
  {
    absl::MutexLock l(&mu_);
    auto it = peer_bandwidth_.find(key);
    if (it != peer_bandwidth_.end()) g = it->second;
  }
  if (g == nullptr) {
    auto made = registry_.AddGauge(
        "gradsync_daemon_peer_bandwidth_bytes",
        "Bytes/s sent to each peer daemon during the last op that sent it at least 1 MiB",
        {{"peer_daemon", peer}, {"transport", transport}});
    if (!made.ok()) return;
    g = *made;
    absl::MutexLock l(&mu_);
    peer_bandwidth_[key] = g;
  }
  g->Set(bytes_per_second);
}

void DaemonMetrics::OnPeerBytes(const std::string& peer, const std::string& transport,
                                uint64_t sent, uint64_t received) {
  // Called after every op for every peer it moved bytes with: the two series
  // are found once per peer (or, without identifying labels, once) and transport.
  const prometheus::Labels labels = PeerLabels(peer, transport);
  const std::string key = Key("", labels);
  std::pair<prometheus::Counter*, prometheus::Counter*> series{nullptr, nullptr};
  {
    absl::MutexLock l(&mu_);
    auto it = peer_bytes_.find(key);
    if (it != peer_bytes_.end()) series = it->second;
  }
  if (series.first == nullptr || series.second == nullptr) {
    series.first = Counter("gradsync_daemon_peer_sent_bytes_total",
                           "Data-plane bytes sent to each peer daemon", labels);
    series.second = Counter("gradsync_daemon_peer_received_bytes_total",
                            "Data-plane bytes received from each peer daemon", labels);
    absl::MutexLock l(&mu_);
    peer_bytes_[key] = series;
  }
  if (sent > 0 && series.first != nullptr) series.first->Increment(static_cast<double>(sent));
  if (received > 0 && series.second != nullptr) {
    series.second->Increment(static_cast<double>(received));
  }
}

void DaemonMetrics::OnEpochFailed(const std::string& cause) {
  if (auto* c = Counter("gradsync_daemon_epoch_failures_total",
                        "Job epochs that failed here, by cause", {{"cause", cause}})) {
    c->Increment();
  }
}

void DaemonMetrics::OnHeartbeatFailed() { heartbeat_failures_->Increment(); }

void DaemonMetrics::OnCoordinatorCheck(bool reachable) {
  coordinator_up_->Set(reachable ? 1 : 0);
  if (!reachable) coordinator_check_failures_->Increment();
}

namespace {
std::string ResultLabel(absl::StatusCode code) {
  return code == absl::StatusCode::kOk ? "ok"
                                       : absl::AsciiStrToLower(absl::StatusCodeToString(code));
}
}  // namespace

void DaemonMetrics::OnFdRegistration(absl::StatusCode code) {
  if (auto* c = Counter("gradsync_daemon_fd_registrations_total",
                        "Memory registrations on the fd socket, by result",
                        {{"result", ResultLabel(code)}})) {
    c->Increment();
  }
}

void DaemonMetrics::OnAuthFailure(absl::string_view port, absl::string_view reason) {
  if (auto* c = Counter("gradsync_auth_failures_total",
                        "Connections refused because the peer did not prove the job key, by port "
                        "and reason",
                        {{"port", std::string(port)}, {"reason", std::string(reason)}})) {
    c->Increment();
  }
}

void DaemonMetrics::OnFdFetch(absl::StatusCode code) {
  if (auto* c = Counter("gradsync_daemon_fd_fetches_total",
                        "Descriptors of daemon-made segments (buffers, op queues) handed to "
                        "clients on the fd socket, by result",
                        {{"result", ResultLabel(code)}})) {
    c->Increment();
  }
}

void DaemonMetrics::OnLinkProbe(const LinkParams& link) {
  link_latency_->Set(link.alpha_us * 1e-6);
  if (link.beta_us_per_byte > 0) link_bandwidth_->Set(1e6 / link.beta_us_per_byte);
  if (link.reduce_us_per_byte > 0) reduce_bandwidth_->Set(1e6 / link.reduce_us_per_byte);
}

void DaemonMetrics::OnErrorFeedback(const std::string& job_id, int64_t epoch, uint64_t bytes,
                                    double residual_norm, uint64_t refusals, bool ended) {
  absl::MutexLock l(&mu_);
  Feedback& f = feedback_[{job_id, epoch}];
  if (refusals > f.refusals && feedback_refusals_ != nullptr) {
    feedback_refusals_->Increment(static_cast<double>(refusals - f.refusals));
  }
  f = Feedback{bytes, residual_norm, refusals};
  if (ended) feedback_.erase({job_id, epoch});
  uint64_t total = 0;
  double squares = 0;
  for (const auto& [key, e] : feedback_) {
    total += e.bytes;
    squares += e.norm * e.norm;
  }
  feedback_bytes_->Set(static_cast<double>(total));
  feedback_norm_->Set(std::sqrt(squares));
}

}  // namespace gradsync
