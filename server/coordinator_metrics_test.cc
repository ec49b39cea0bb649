// The coordinator's metrics change as jobs form, run and die: read through
// the registry's text format, and over HTTP from an in-process coordinator.
#include "server/coordinator_metrics.h"

#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/metrics_testing.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"
#include "server/job_registry.h"
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

double Sample(const MetricsRegistry& metrics, const std::string& series) {
  absl::StatusOr<double> v = FindSample(metrics.TextFormat(), series);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.value_or(-1);
}

using job_registry_testing::FakeClock;

v1::JoinJobRequest JoinRequest(const std::string& job, const std::string& member,
                               int64_t timeout_ms = 5000) {
  return job_registry_testing::JoinRequest(job, member, -1, 5000, timeout_ms);
}

TEST(CoordinatorMetrics, EverySeriesIsExportedFromTheStart) {
  MetricsRegistry metrics;
  auto m = CoordinatorMetrics::Create(metrics);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const char* series : {
           "gradsync_coordinator_jobs{state=\"forming\"}",
           "gradsync_coordinator_jobs{state=\"running\"}",
           "gradsync_coordinator_jobs{state=\"aborted\"}",
           "gradsync_coordinator_members",
           "gradsync_coordinator_joins_total{result=\"ok\"}",
           "gradsync_coordinator_joins_total{result=\"timeout\"}",
           "gradsync_coordinator_joins_total{result=\"error\"}",
           "gradsync_coordinator_heartbeats_total",
           "gradsync_coordinator_heartbeat_misses_total",
           "gradsync_coordinator_epoch_aborts_total{cause=\"member_dead\"}",
           "gradsync_coordinator_epoch_aborts_total{cause=\"member_left\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"CreateJob\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"JoinJob\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"Heartbeat\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"LeaveJob\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"GetJobStatus\"}",
           "gradsync_coordinator_rpc_seconds_count{method=\"ListJobs\"}",
       }) {
    EXPECT_EQ(Sample(metrics, series), 0) << series;
  }
  // A second set on the same registry shares the series.
  EXPECT_TRUE(CoordinatorMetrics::Create(metrics).ok());
}

TEST(CoordinatorMetrics, FollowTheRegistryThroughFormingRunningAndDeath) {
  MetricsRegistry metrics;
  auto m = CoordinatorMetrics::Create(metrics);
  ASSERT_TRUE(m.ok()) << m.status();
  FakeClock clock;
  JobRegistry::Options options;
  options.start_liveness_thread = false;
  options.now = [&clock] { return clock.Now(); };
  options.observer = m->get();
  JobRegistry registry(options);

  v1::CreateJobRequest create;
  create.set_job_id("train");
  create.set_world_size(2);
  create.mutable_options()->set_heartbeat_timeout_ms(1000);
  ASSERT_TRUE(registry.CreateJob(create).ok());
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"forming\"}"), 1);

  absl::StatusOr<v1::JoinJobResponse> a = absl::UnknownError("");
  std::thread joiner([&] { a = registry.JoinJob(JoinRequest("train", "a"), {}); });
  while (Sample(metrics, "gradsync_coordinator_members") != 1) absl::SleepFor(absl::Milliseconds(1));
  auto b = registry.JoinJob(JoinRequest("train", "b"), {});
  joiner.join();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"forming\"}"), 0);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"running\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_members"), 2);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_joins_total{result=\"ok\"}"), 2);

  v1::HeartbeatRequest beat;
  beat.set_job_id("train");
  beat.set_epoch(b->epoch());
  beat.set_member_id("b");
  beat.set_member_key(job_registry_testing::MemberKey("b"));
  clock.Advance(absl::Milliseconds(600));
  ASSERT_TRUE(registry.Heartbeat(beat).ok());
  clock.Advance(absl::Milliseconds(600));
  registry.CheckLiveness();  // "a" is dead, the epoch aborted
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_heartbeats_total"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_heartbeat_misses_total"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_epoch_aborts_total{cause=\"member_dead\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"aborted\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_members"), 1);

  clock.Advance(absl::Milliseconds(1100));
  registry.CheckLiveness();  // "b" too: no member left, the job is deleted
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_heartbeat_misses_total"), 2);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_epoch_aborts_total{cause=\"member_dead\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"aborted\"}"), 0);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_members"), 0);

  // A rendezvous that times out, and a join of a missing job.
  ASSERT_TRUE(registry.CreateJob(create).ok());
  EXPECT_FALSE(registry.JoinJob(JoinRequest("train", "c", /*timeout_ms=*/20), {}).ok());
  EXPECT_FALSE(registry.JoinJob(JoinRequest("missing", "c"), {}).ok());
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_joins_total{result=\"timeout\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_joins_total{result=\"error\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_jobs{state=\"forming\"}"), 1);
  EXPECT_EQ(Sample(metrics, "gradsync_coordinator_members"), 0);
}

// The whole path: gRPC calls into an in-process coordinator, metrics scraped
// over HTTP from a MetricsServer, death detected by the real liveness thread.
TEST(CoordinatorMetrics, ScrapedOverHttpFromARunningCoordinator) {
  MetricsRegistry metrics;
  ASSERT_TRUE(metrics.AddProcessMetrics().ok());
  auto m = CoordinatorMetrics::Create(metrics);
  ASSERT_TRUE(m.ok()) << m.status();
  auto http = MetricsServer::Start("127.0.0.1:0", metrics);
  ASSERT_TRUE(http.ok()) << http.status();
  CoordinatorServerOptions options;
  options.registry.liveness_interval = absl::Milliseconds(20);
  options.registry.observer = m->get();
  options.rpc_observer = m->get();
  auto server = CoordinatorServer::Start(std::move(options));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));

  auto scrape = [&](const std::string& series) {
    absl::StatusOr<std::string> body = HttpGet("127.0.0.1", (*http)->port(), "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    absl::StatusOr<double> v = FindSample(body.value_or(""), series);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.value_or(-1);
  };

  {
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.set_job_id("j");
    req.set_world_size(2);
    req.mutable_options()->set_heartbeat_timeout_ms(300);
    v1::CreateJobResponse resp;
    ASSERT_TRUE(stub->CreateJob(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(scrape("gradsync_coordinator_rpc_seconds_count{method=\"CreateJob\"}"), 1);
  EXPECT_EQ(scrape("gradsync_coordinator_jobs{state=\"forming\"}"), 1);
  EXPECT_EQ(scrape(absl::StrCat("gradsync_build_info{version=\"", kGradsyncVersion, "\"}")), 1);

  std::vector<std::thread> joiners;
  for (const char* member : {"a", "b"}) {
    joiners.emplace_back([&, member] {
      grpc::ClientContext ctx;
      v1::JoinJobResponse resp;
      EXPECT_TRUE(stub->JoinJob(&ctx, JoinRequest("j", member), &resp).ok());
    });
  }
  for (auto& t : joiners) t.join();
  EXPECT_EQ(scrape("gradsync_coordinator_jobs{state=\"running\"}"), 1);
  EXPECT_EQ(scrape("gradsync_coordinator_members"), 2);
  EXPECT_EQ(scrape("gradsync_coordinator_rpc_seconds_count{method=\"JoinJob\"}"), 2);

  // Nobody heartbeats: both members die within ~300 ms, the job is deleted.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (scrape("gradsync_coordinator_heartbeat_misses_total") < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(scrape("gradsync_coordinator_heartbeat_misses_total"), 2);
  EXPECT_EQ(scrape("gradsync_coordinator_epoch_aborts_total{cause=\"member_dead\"}"), 1);
  EXPECT_EQ(scrape("gradsync_coordinator_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(scrape("gradsync_coordinator_jobs{state=\"aborted\"}"), 0);
  EXPECT_EQ(scrape("gradsync_coordinator_members"), 0);
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace gradsync
