// gradsyncd's /metrics reflect the traffic of real allreduces.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/local_cluster.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;

double Sample(int port, const std::string& series) {
  auto text = HttpGet("127.0.0.1", port, "/metrics");
  if (!text.ok()) return -1;
  auto v = FindSample(*text, series);
  return v.ok() ? *v : -1;
}

// The series' value once it is `want`, or its last value after 20 s: the
// daemon updates the metrics just after it completes an op to the client.
double SampleOnceItIs(int port, const std::string& series, double want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  double v = Sample(port, series);
  while (v != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    v = Sample(port, series);
  }
  return v;
}

TEST(DaemonMetrics, OpsBytesLatencyAndPeersAreExported) {
  LocalClusterOptions o;
  o.daemons = 3;
  o.daemon_flags = {"--metrics_identifying_labels"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const int port0 = (*cluster)->daemon_metrics_port(0);
  ASSERT_GT(port0, 0);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_sessions"), 0);
  auto job = OpenJob(**cluster, "metrics", {0, 1, 2});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(Sample(port0, "gradsync_daemon_sessions"), 1);
  const size_t count = 1 << 18;  // 1 MiB of f32
  OnEveryRank(3, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(count * 4);
    ASSERT_TRUE(b.ok());
    for (int i = 0; i < 5; ++i) {
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.algorithm = "ring";
      spec.name = "m";
      ASSERT_TRUE(s.Run(spec).ok());
    }
    // Mismatched ops fail with invalid_argument on every rank, in the
    // daemons' signature exchange, before an algorithm ran: a small one
    // (oneshot's data ride on that exchange) and a forced ring.
    client::CollectiveSpec bad;
    bad.buffer = b->get();
    bad.count = r == 1 ? 10 : 11;
    bad.name = "mismatch";
    EXPECT_TRUE(absl::IsInvalidArgument(s.Run(bad).status()));
    bad.algorithm = "ring";
    EXPECT_TRUE(absl::IsInvalidArgument(s.Run(bad).status()));
  });
  const std::string ok_series =
      "gradsync_daemon_ops_total{algorithm=\"ring\",collective=\"allreduce\",status=\"ok\"}";
  EXPECT_EQ(Sample(port0, ok_series), 5);
  // Both failed before an algorithm ran ("none").
  EXPECT_EQ(Sample(port0, "gradsync_daemon_ops_total{algorithm=\"none\",collective=\"allreduce\","
                          "status=\"invalid_argument\"}"),
            2);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_op_bytes_total{collective=\"allreduce\"}"), 5.0 * count * 4);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_op_seconds_count{collective=\"allreduce\",size=\"le_1m\"}"), 5);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_queue_depth"), 0);
  EXPECT_GT(Sample(port0, "gradsync_daemon_link_bandwidth_bytes"), 0);
  // Ring over 3 ranks: each rank sends 2*(2/3) of 1 MiB per op to its right neighbour.
  const std::string right = absl::StrCat("127.0.0.1:", (*cluster)->daemon_data_port(1));
  const double sent = Sample(port0, absl::StrCat("gradsync_daemon_peer_sent_bytes_total{peer_daemon=\"",
                                                 right, "\",transport=\"tcp\"}"));
  EXPECT_GE(sent, 5 * 2.0 * count * 4 * 2 / 3) << right;
  EXPECT_EQ(Sample(port0, "gradsync_daemon_arrival_wait_seconds_count"), 5);
  EXPECT_GT(Sample(port0, absl::StrCat("gradsync_daemon_peer_bandwidth_bytes{peer_daemon=\"",
                                       right, "\",transport=\"tcp\"}")),
            0);
  // Per-job series: present while the job has sessions here, gone after.
  EXPECT_EQ(Sample(port0, "gradsync_job_ops_total{gradsync_job=\"metrics\",status=\"ok\"}"), 5);
  EXPECT_EQ(Sample(port0, "gradsync_job_ops_total{gradsync_job=\"metrics\",status=\"error\"}"), 2);
  EXPECT_EQ(Sample(port0, "gradsync_job_bytes_total{gradsync_job=\"metrics\"}"), 5.0 * count * 4);
  EXPECT_EQ(Sample(port0, "gradsync_job_local_ranks{gradsync_job=\"metrics\"}"), 1);
  for (auto& r : *job) ASSERT_TRUE(r.session->Close().ok());
  EXPECT_EQ(Sample(port0, "gradsync_job_local_ranks{gradsync_job=\"metrics\"}"), -1);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_sessions"), 0);
}

// Compressed ops: counted by codec, with their input and wire bytes (the
// compression ratio); top-k's error feedback shows its memory and what it
// still owes; a session quota too small for the residual refuses it (the
// op still runs, without kept state) and the refusal is counted.
TEST(DaemonMetrics, CodecRatiosAndErrorFeedbackAreExported) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.daemon_flags = {"--session_memory_limit_mb=3"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const int port0 = (*cluster)->daemon_metrics_port(0);
  auto job = OpenJob(**cluster, "codec-metrics", {0, 1});
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t count = 1 << 18;  // 1 MiB of f32
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(count * 4);
    ASSERT_TRUE(b.ok());
    float* x = reinterpret_cast<float*>(b->get()->data());
    for (int i = 0; i < 3; ++i) {
      for (size_t j = 0; j < count; ++j) x[j] = static_cast<float>((j * 7 + r) % 1000) - 500;
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.name = "m";
      spec.codec = i == 0 ? "int8" : "topk:0.01";
      auto res = s.Run(spec);
      ASSERT_TRUE(res.ok()) << res.status();
    }
    // Another name: its residual (1 MiB) would pass the 3 MiB quota with
    // the buffer and the first residual; a third does not fit.
    for (const char* name : {"n", "o"}) {
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.name = name;
      spec.codec = "topk:0.01";
      auto res = s.Run(spec);
      ASSERT_TRUE(res.ok()) << name << ": " << res.status();
    }
  });
  auto series = [](const char* name, const char* codec) {
    return absl::StrCat(name, "{codec=\"", codec, "\",collective=\"allreduce\"}");
  };
  EXPECT_EQ(SampleOnceItIs(port0, series("gradsync_daemon_codec_ops_total", "int8"), 1), 1);
  EXPECT_EQ(SampleOnceItIs(port0, series("gradsync_daemon_codec_ops_total", "topk"), 4), 4);
  // int8: a byte per value and a scale per 4096 values.
  // The input bytes are updated last of an op's series.
  const double int8_in =
      SampleOnceItIs(port0, series("gradsync_daemon_codec_input_bytes_total", "int8"), count * 4.0);
  const double int8_wire = Sample(port0, series("gradsync_daemon_codec_wire_bytes_total", "int8"));
  EXPECT_EQ(int8_in, count * 4.0);
  EXPECT_NEAR(int8_wire / int8_in, 0.25 + 1.0 / 4096, 1e-6);
  // topk 1% on 2 daemons: n k / count, k = floor(count / 100).
  const double topk_in = SampleOnceItIs(
      port0, series("gradsync_daemon_codec_input_bytes_total", "topk"), 4 * count * 4.0);
  const double topk_wire = Sample(port0, series("gradsync_daemon_codec_wire_bytes_total", "topk"));
  EXPECT_EQ(topk_in, 4 * count * 4.0);
  EXPECT_NEAR(topk_wire / topk_in, 2.0 * (count / 100) / count, 1e-9);
  // Residuals kept for "m" and "n" (1 MiB each); "o" was refused.
  EXPECT_EQ(SampleOnceItIs(port0, "gradsync_daemon_error_feedback_refusals_total", 1), 1);
  EXPECT_EQ(Sample(port0, "gradsync_daemon_error_feedback_bytes"), 2.0 * count * 4);
  EXPECT_GT(Sample(port0, "gradsync_daemon_error_feedback_residual_norm"), 0);
  for (auto& r : *job) ASSERT_TRUE(r.session->Close().ok());
}

// Four ranks on one daemon: the daemon combines them in memory ("hier"),
// small and large ops and barriers alike, and counts every rank's op in the daemon-wide
// and the per-job series; a mismatch fails on every rank before an
// algorithm ran ("none").
TEST(DaemonMetrics, NodeLocalOpsAreCountedPerRank) {
  LocalClusterOptions o;
  o.daemons = 1;
  o.daemon_flags = {"--metrics_identifying_labels"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const int port = (*cluster)->daemon_metrics_port(0);
  ASSERT_GT(port, 0);
  auto job = OpenJob(**cluster, "node-metrics", {0, 0, 0, 0});
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t large = (2 << 20) / 4 + 1;  // f32 elements: reduced in slices (common/slice_pool.h)
  OnEveryRank(4, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(large * 4);
    ASSERT_TRUE(b.ok());
    client::CollectiveSpec spec;
    spec.buffer = b->get();
    spec.name = "small";
    spec.count = 16;
    for (int i = 0; i < 10; ++i) {
      auto res = s.Run(spec);
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_EQ(res->algorithm, "hier");
    }
    client::CollectiveSpec barrier;
    barrier.kind = CollectiveKind::kBarrier;
    barrier.name = "b";
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(s.Run(barrier).ok());
    spec.name = "large";
    spec.count = large;
    auto res = s.Run(spec);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->algorithm, "hier");
    spec.name = "mismatch";
    spec.count = r == 3 ? 8 : 16;
    EXPECT_TRUE(absl::IsInvalidArgument(s.Run(spec).status()));
  });
  auto ops = [](const char* algo, const char* kind, const char* status) {
    return absl::StrCat("gradsync_daemon_ops_total{algorithm=\"", algo, "\",collective=\"", kind,
                        "\",status=\"", status, "\"}");
  };
  EXPECT_EQ(Sample(port, ops("hier", "allreduce", "ok")), 4 * 11);
  EXPECT_EQ(Sample(port, ops("hier", "barrier", "ok")), 4 * 2);
  EXPECT_EQ(Sample(port, ops("none", "allreduce", "invalid_argument")), 4);
  EXPECT_EQ(Sample(port, "gradsync_daemon_op_bytes_total{collective=\"allreduce\"}"),
            4 * (10 * 16 * 4 + large * 4));
  EXPECT_EQ(Sample(port, "gradsync_job_ops_total{gradsync_job=\"node-metrics\",status=\"ok\"}"),
            4 * 13);
  EXPECT_EQ(Sample(port, "gradsync_job_ops_total{gradsync_job=\"node-metrics\",status=\"error\"}"), 4);
  EXPECT_GT(Sample(port, "gradsync_job_op_seconds_total{gradsync_job=\"node-metrics\"}"), 0);
  EXPECT_EQ(Sample(port, "gradsync_job_local_ranks{gradsync_job=\"node-metrics\"}"), 4);
  for (auto& r : *job) ASSERT_TRUE(r.session->Close().ok());
}

// The metrics endpoints have no authentication: by default neither a
// daemon's nor a PS shard's series name a job, its tenant or a peer daemon's
// address; the peer traffic is summed over peers.
TEST(DaemonMetrics, NoJobIdsOrPeerAddressesWithoutTheOptIn) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.ps_shards = 1;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string job_id = "confidential-job-7";
  auto job = OpenJob(**cluster, job_id, {0, 1}, 30000, 0, /*ps_shards=*/1);
  ASSERT_TRUE(job.ok()) << job.status();
  const size_t count = 1 << 18;
  OnEveryRank(2, [&](int r) {
    auto& s = *(*job)[r].session;
    auto b = s.AllocateBuffer(count * 4);
    ASSERT_TRUE(b.ok());
    for (const char* algorithm : {"ring", "ps"}) {
      client::CollectiveSpec spec;
      spec.buffer = b->get();
      spec.count = count;
      spec.algorithm = algorithm;
      spec.name = algorithm;
      auto res = s.Run(spec);
      ASSERT_TRUE(res.ok()) << algorithm << ": " << res.status();
    }
  });
  const std::string peer = absl::StrCat("127.0.0.1:", (*cluster)->daemon_data_port(1));
  auto daemon = HttpGet("127.0.0.1", (*cluster)->daemon_metrics_port(0), "/metrics");
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto ps = HttpGet("127.0.0.1", (*cluster)->ps_metrics_port(0), "/metrics");
  ASSERT_TRUE(ps.ok()) << ps.status();
  for (const std::string* text : {&*daemon, &*ps}) {
    EXPECT_EQ(text->find(job_id), std::string::npos) << *text;
    EXPECT_EQ(text->find("gradsync_job"), std::string::npos) << *text;
    EXPECT_EQ(text->find("peer_daemon"), std::string::npos) << *text;
    EXPECT_EQ(text->find(peer), std::string::npos) << *text;
  }
  // Still counted, without the labels.
  auto sent = FindSample(*daemon, "gradsync_daemon_peer_sent_bytes_total{transport=\"tcp\"}");
  ASSERT_TRUE(sent.ok()) << sent.status() << "\n" << *daemon;
  EXPECT_GE(*sent, count * 4 / 2.0);
  auto pushed = FindSample(*ps, "gradsync_ps_pushed_bytes_total");
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_GT(*pushed, 0);
  for (auto& r : *job) ASSERT_TRUE(r.session->Close().ok());
}

}  // namespace
}  // namespace gradsync
