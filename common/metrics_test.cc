#include "common/metrics.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"

namespace gradsync {
namespace {

using prometheus::MetricType;

TEST(ValidateMetricName, AcceptsConventionalNames) {
  EXPECT_TRUE(ValidateMetricName("gradsync_coordinator_joins_total", MetricType::Counter).ok());
  EXPECT_TRUE(ValidateMetricName("gradsync_coordinator_jobs", MetricType::Gauge).ok());
  EXPECT_TRUE(ValidateMetricName("gradsync_op_seconds", MetricType::Histogram).ok());
  EXPECT_TRUE(ValidateMetricName("gradsync_op_bytes", MetricType::Histogram).ok());
  EXPECT_TRUE(ValidateMetricName("gradsync_sent_bytes_total", MetricType::Counter).ok());
}

TEST(ValidateMetricName, RejectsNamesAgainstTheConventionsAndSaysWhy) {
  struct Case {
    const char* name;
    MetricType type;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"coordinator_jobs", MetricType::Gauge, "must start with 'gradsync_'"},
           {"gradsync_", MetricType::Gauge, "must start with 'gradsync_'"},
           {"gradsync_Jobs", MetricType::Gauge, "lowercase"},
           {"gradsync_jobs-x", MetricType::Gauge, "lowercase"},
           {"gradsync_joins", MetricType::Counter, "must end in '_total'"},
           {"gradsync_jobs_total", MetricType::Gauge, "only counters"},
           {"gradsync_op_ms", MetricType::Gauge, "unit 'ms'"},
           {"gradsync_sent_kb_total", MetricType::Counter, "unit 'kb'"},
           {"gradsync_op_latency", MetricType::Histogram, "'_seconds' or '_bytes'"},
           {"gradsync__x", MetricType::Gauge, "'__'"},
       }) {
    absl::Status s = ValidateMetricName(c.name, c.type);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(absl::StrContains(s.message(), c.why)) << c.name << ": " << s.message();
    EXPECT_TRUE(absl::StrContains(s.message(), c.name)) << s.message();
  }
}

TEST(ValidateLabels, RejectsReservedAndUnboundedLabels) {
  EXPECT_TRUE(ValidateLabels({{"state", "running"}, {"result", "ok"}}).ok());
  for (const char* key : {"job", "instance", "le", "job_id", "rank", "member_id", "__x", "1a"}) {
    absl::Status s = ValidateLabels({{key, "x"}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(absl::StrContains(s.message(), key)) << s.message();
  }
}

TEST(MetricsRegistry, SameNameAndLabelsReturnTheSameSeries) {
  MetricsRegistry registry;
  auto a = registry.AddCounter("gradsync_things_total", "things", {{"result", "ok"}});
  auto b = registry.AddCounter("gradsync_things_total", "things", {{"result", "ok"}});
  auto c = registry.AddCounter("gradsync_things_total", "things", {{"result", "error"}});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  (*a)->Increment(2);
  (*c)->Increment();
  const std::string text = registry.TextFormat();
  EXPECT_EQ(FindSample(text, "gradsync_things_total{result=\"ok\"}").value(), 2);
  EXPECT_EQ(FindSample(text, "gradsync_things_total{result=\"error\"}").value(), 1);
  EXPECT_TRUE(absl::StrContains(text, "# TYPE gradsync_things_total counter")) << text;
  EXPECT_TRUE(absl::StrContains(text, "# HELP gradsync_things_total things")) << text;
}

TEST(MetricsRegistry, ErrorsInsteadOfExceptions) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddGauge("gradsync_x", "x").ok());
  // The same name as another type: prometheus-cpp throws; we return a status.
  EXPECT_EQ(registry.AddHistogram("gradsync_x_seconds", "x", {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no buckets
  EXPECT_EQ(registry.AddHistogram("gradsync_x_seconds", "x", {1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);  // not increasing
  ASSERT_TRUE(registry.AddHistogram("gradsync_y_seconds", "y", LatencyBuckets()).ok());
  ASSERT_TRUE(registry.AddGauge("gradsync_z_seconds", "z").ok());
  auto clash = registry.AddHistogram("gradsync_z_seconds", "z", LatencyBuckets());
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists) << clash.status();
  EXPECT_TRUE(absl::StrContains(clash.status().message(), "gradsync_z_seconds"));
  EXPECT_EQ(registry.AddGauge("gradsync_w", "w", {{"job_id", "j"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsRegistry, HistogramBuckets) {
  MetricsRegistry registry;
  auto h = registry.AddHistogram("gradsync_op_seconds", "op latency", {0.1, 1},
                                 {{"collective", "allreduce"}});
  ASSERT_TRUE(h.ok()) << h.status();
  (*h)->Observe(0.05);
  (*h)->Observe(0.5);
  (*h)->Observe(5);
  const std::string text = registry.TextFormat();
  EXPECT_EQ(FindSample(text, "gradsync_op_seconds_count{collective=\"allreduce\"}").value(), 3);
  EXPECT_EQ(
      FindSample(text, "gradsync_op_seconds_bucket{collective=\"allreduce\",le=\"0.1\"}").value(),
      1);
  EXPECT_EQ(
      FindSample(text, "gradsync_op_seconds_bucket{collective=\"allreduce\",le=\"1\"}").value(), 2);
  EXPECT_EQ(
      FindSample(text, "gradsync_op_seconds_bucket{collective=\"allreduce\",le=\"+Inf\"}").value(),
      3);
  EXPECT_DOUBLE_EQ(FindSample(text, "gradsync_op_seconds_sum{collective=\"allreduce\"}").value(),
                   5.55);
  EXPECT_EQ(LatencyBuckets().size(), 20u);
  EXPECT_EQ(SizeBuckets().front(), 256);
  EXPECT_EQ(SizeBuckets().back(), 4.0 * 1024 * 1024 * 1024);
}

TEST(MetricsRegistry, ProcessMetrics) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddProcessMetrics("1.2.3").ok());
  ASSERT_TRUE(registry.AddProcessMetrics("1.2.3").ok());  // idempotent
  const std::string text = registry.TextFormat();
  EXPECT_EQ(FindSample(text, "gradsync_build_info{version=\"1.2.3\"}").value(), 1);
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double start = FindSample(text, "process_start_time_seconds").value();
  EXPECT_GT(start, now - 3600);
  EXPECT_LE(start, now + 1);
  EXPECT_GT(FindSample(text, "process_resident_memory_bytes").value(), 1 << 20);
  EXPECT_GT(FindSample(text, "process_open_fds").value(), 2);
  EXPECT_GE(FindSample(text, "process_cpu_seconds_total").value(), 0);
  EXPECT_GT(FindSample(text, "process_max_fds").value(), 0);
  // Once only, also when called twice.
  EXPECT_EQ(text.find("# TYPE process_start_time_seconds"),
            text.rfind("# TYPE process_start_time_seconds"));
}

TEST(MetricsServer, ServesTheRegistryOverHttp) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddProcessMetrics().ok());
  auto requests = registry.AddCounter("gradsync_test_requests_total", "requests",
                                      {{"method", "get"}});
  ASSERT_TRUE(requests.ok());
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), absl::StrCat("127.0.0.1:", (*server)->port()));

  (*requests)->Increment();
  (*requests)->Increment();
  auto body = HttpGet("127.0.0.1", (*server)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(FindSample(*body, "gradsync_test_requests_total{method=\"get\"}").value(), 2);
  EXPECT_EQ(FindSample(*body, absl::StrCat("gradsync_build_info{version=\"", kGradsyncVersion,
                                           "\"}"))
                .value(),
            1);
  EXPECT_TRUE(FindSample(*body, "process_start_time_seconds").ok());

  // Values are read at scrape time.
  (*requests)->Increment();
  body = HttpGet("127.0.0.1", (*server)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(FindSample(*body, "gradsync_test_requests_total{method=\"get\"}").value(), 3);

  EXPECT_FALSE(HttpGet("127.0.0.1", (*server)->port(), "/nothing").ok());
}

TEST(MetricsServer, ConcurrentScrapesAndUpdates) {
  MetricsRegistry registry;
  auto c = registry.AddCounter("gradsync_test_events_total", "events");
  ASSERT_TRUE(c.ok());
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  std::thread writer([&] {
    for (int i = 0; i < 100000; ++i) (*c)->Increment();
  });
  for (int i = 0; i < 5; ++i) {
    auto body = HttpGet("127.0.0.1", (*server)->port(), "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_TRUE(FindSample(*body, "gradsync_test_events_total").ok());
  }
  writer.join();
  auto body = HttpGet("127.0.0.1", (*server)->port(), "/metrics");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(FindSample(*body, "gradsync_test_events_total").value(), 100000);
}

TEST(MetricsServer, PortInUseIsAnErrorNamingTheAddress) {
  MetricsRegistry registry;
  auto first = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->address();
  auto second = MetricsServer::Start(taken, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), taken)) << second.status();
}

TEST(MetricsServer, MalformedAddressesAreInvalidArguments) {
  MetricsRegistry registry;
  for (const char* address : {"", "9470", "localhost:9470", "127.0.0.1:", "127.0.0.1:99999",
                              "127.0.0.1:94x", "127.0.0.1:9470s", "[::1:9470", "1.2.3:80",
                              "127.0.0.1:9470,127.0.0.1:9471"}) {
    auto s = MetricsServer::Start(address, registry);
    ASSERT_FALSE(s.ok()) << address;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_TRUE(absl::StrContains(s.status().message(), absl::StrCat("'", address, "'")))
        << s.status();
  }
}

TEST(MetricsServer, OutlivingTheRegistryIsSafe) {
  auto registry = std::make_unique<MetricsRegistry>();
  ASSERT_TRUE(registry->AddGauge("gradsync_test_gauge", "g").ok());
  auto server = MetricsServer::Start("127.0.0.1:0", *registry);
  ASSERT_TRUE(server.ok()) << server.status();
  registry.reset();
  auto body = HttpGet("127.0.0.1", (*server)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_FALSE(absl::StrContains(*body, "gradsync_test_gauge"));
}

}  // namespace
}  // namespace gradsync
