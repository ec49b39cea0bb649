// gradsyncd --transport over RDMA, end to end: separate daemon processes on
// one linked verbs emulation (--rdma_emulation, rdma/verbs_emulation.h) run
// jobs over the RDMA transport bit-exactly, say so (session, log, metrics,
// `gradsync status`), fall back to TCP where a daemon has no RDMA port
// (auto) or refuse (rdma), and a daemon killed mid-op fails the others' op
// naming it. What the emulation cannot show (timing, pinning, RoCE routing,
// GPUDirect) needs a NIC: docs/architecture.md#rdma-transport.
#include <signal.h>

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::OnEveryRank;
using testing::OpenJob;

std::string FreshFabric() {
  static std::atomic<int> n{0};
  // Abstract socket names: unique across concurrent runs (a sandbox repeats pids).
  return absl::StrCat("rdma-cluster-", ::getpid(), "-", absl::ToUnixNanos(absl::Now()), "-", n++);
}

std::vector<std::string> RdmaFlags(const std::string& fabric, const std::string& mode = "rdma") {
  return {"--transport=" + mode, "--rdma_emulation=" + fabric};
}


std::string Status(const LocalCluster& cluster) {
  const TlsConfig& op = cluster.certs().operator_;
  return testing::RunCommand(absl::StrCat("cli/gradsync status --coordinator=",
                                          cluster.coordinator_address(), " --tls_cert=", op.cert,
                                          " --tls_key=", op.key, " --tls_ca=", op.ca, " 2>&1"));
}

TEST(RdmaCluster, DaemonsRunEveryAlgorithmOverEmulatedRdmaBitExactAndSaySo) {
  auto cluster = testing::StartCluster(3, RdmaFlags(FreshFabric()));
  ASSERT_NE(cluster, nullptr);
  // Two ranks on daemon 2: the hierarchical path combines them first.
  auto ranks = OpenJob(*cluster, "over-rdma", {0, 1, 2, 2});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (const auto& r : *ranks) {
    EXPECT_TRUE(absl::StartsWith(r.session->transport(), "rdma: emu_ib0 port 1: InfiniBand"))
        << r.session->transport();
  }
  for (const std::string algo : {"ring", "rhd", "tree", "hier", "auto"}) {
    testing::ExpectAllreduceExact(*ranks, (1 << 20) + 3, algo);
  }
  testing::ExpectAllreduceExact(*ranks, 5, "ring");  // fewer elements than ranks' chunks
  for (int d = 0; d < 3; ++d) {
    const std::string log = testing::ReadTextFile(cluster->daemon_log(d));
    EXPECT_TRUE(absl::StrContains(log, "RDMA: emu_ib0 port 1")) << "daemon " << d;
    EXPECT_TRUE(absl::StrContains(log, "over rdma (emu_ib0 port 1")) << "daemon " << d;
    auto text = HttpGet("127.0.0.1", cluster->daemon_metrics_port(d), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(FindSample(*text, "gradsync_daemon_rdma_up").value_or(-1), 1) << "daemon " << d;
    // Summed over peers: no peer addresses as labels by default.
    const std::string series = "gradsync_daemon_peer_sent_bytes_total{transport=\"rdma\"}";
    EXPECT_GT(FindSample(*text, series).value_or(0), 1 << 20) << "daemon " << d << ": " << series;
  }
  const std::string status = Status(*cluster);
  EXPECT_TRUE(absl::StrContains(status, "data plane: rdma: emu_ib0 port 1")) << status;
}

TEST(RdmaCluster, ParameterServerShardsServeWorkersOverRdma) {
  const std::string fabric = FreshFabric();
  LocalClusterOptions o;
  o.daemons = 2;
  o.ps_shards = 2;
  o.daemon_flags = RdmaFlags(fabric, "auto");
  o.ps_flags = {"--rdma_emulation=" + fabric};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto ranks = OpenJob(**cluster, "ps-rdma", {0, 1}, 30000, 0, /*ps_shards=*/2);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  testing::ExpectAllreduceExact(*ranks, (1 << 20) + 7, "ps");
  testing::ExpectAllreduceExact(*ranks, 3, "ps");
  for (int k = 0; k < 2; ++k) {  // both workers' connections, over RDMA
    auto text = HttpGet("127.0.0.1", (*cluster)->ps_metrics_port(k), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(FindSample(*text, "gradsync_ps_rdma_connections_total").value_or(-1), 2) << "shard " << k;
    EXPECT_EQ(FindSample(*text, "gradsync_ps_rdma_up").value_or(-1), 1) << "shard " << k;
  }
  for (int d = 0; d < 2; ++d) {
    EXPECT_TRUE(absl::StrContains(testing::ReadTextFile((*cluster)->daemon_log(d)),
                                  "its 2 ps shard(s) over rdma"))
        << "daemon " << d;
  }
}

TEST(RdmaCluster, ShardsWithoutRdmaServeWorkersWithItOverTcp) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.ps_shards = 1;
  o.daemon_flags = RdmaFlags(FreshFabric(), "auto");
  o.ps_flags = {"--transport=tcp"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto ranks = OpenJob(**cluster, "ps-tcp", {0, 1}, 30000, 0, /*ps_shards=*/1);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_TRUE(absl::StartsWith((*ranks)[0].session->transport(), "rdma: "));  // between daemons
  testing::ExpectAllreduceExact(*ranks, 1 << 18, "ps");
  auto text = HttpGet("127.0.0.1", (*cluster)->ps_metrics_port(0), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(FindSample(*text, "gradsync_ps_rdma_connections_total").value_or(-1), 0);
  EXPECT_EQ(FindSample(*text, "gradsync_ps_connections_total").value_or(-1), 2);
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile((*cluster)->daemon_log(0)),
                                "its 1 ps shard(s) over tcp (not RDMA: ps shard 0 (127.0.0.1:"));
}

TEST(RdmaCluster, AutoFallsBackToTcpWhereADaemonHasNoRdmaAndSaysWhy) {
  const std::string fabric = FreshFabric();
  LocalClusterOptions o;
  o.daemons = 3;
  o.per_daemon_flags = {RdmaFlags(fabric, "auto"), RdmaFlags(fabric, "auto"), {"--transport=tcp"}};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto mixed = OpenJob(**cluster, "mixed", {0, 1, 2});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  const std::string why = absl::StrCat("tcp: 2 TCP stream(s) per peer; not RDMA: daemon 2 (127.0.0.1:",
                                       (*cluster)->daemon_data_port(2), ") has no RDMA port");
  EXPECT_EQ((*mixed)[0].session->transport(), why);
  EXPECT_EQ((*mixed)[1].session->transport(), why);
  EXPECT_EQ((*mixed)[2].session->transport(), "tcp: 2 TCP stream(s) per peer");  // its own choice
  testing::ExpectAllreduceExact(*mixed, 1 << 18, "ring");
  // The two daemons with RDMA use it between themselves.
  auto pair = OpenJob(**cluster, "pair", {0, 1});
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_TRUE(absl::StartsWith((*pair)[1].session->transport(), "rdma: emu_ib0")) << (*pair)[1].session->transport();
  testing::ExpectAllreduceExact(*pair, 1 << 18, "ring");
  // A job of one daemon moves nothing between daemons.
  auto alone = OpenJob(**cluster, "alone", {1, 1});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ((*alone)[0].session->transport(), "local: every rank of the job on this daemon");
}

TEST(RdmaCluster, RdmaModeRefusesAJobWithADaemonWithoutRdmaNamingIt) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.per_daemon_flags = {RdmaFlags(FreshFabric()), {"--transport=tcp"}};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<absl::Status> st(2);
  OnEveryRank(2, [&](int r) {
    auto c = client::Client::Connect((*cluster)->daemon_target(r));
    ASSERT_TRUE(c.ok());
    client::SessionOptions so;
    so.job_id = "needs-rdma";
    so.world_size = 2;
    so.rank = r;
    so.timeout = absl::Seconds(20);
    const absl::Time start = absl::Now();
    st[r] = (*c)->OpenSession(so).status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "rank " << r;
  });
  // Both fail at once, with the same words.
  const std::string want = absl::StrCat(
      "job 'needs-rdma' cannot run over RDMA: daemon 1 (127.0.0.1:", (*cluster)->daemon_data_port(1),
      ") has no RDMA port; daemon 0 (127.0.0.1:", (*cluster)->daemon_data_port(0),
      ") runs --transport=rdma");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kFailedPrecondition) << st[r];
    EXPECT_TRUE(absl::StrContains(st[r].message(), want)) << "rank " << r << ": " << st[r];
  }
}

TEST(RdmaCluster, RdmaModeWithoutAPortDoesNotStartAndAutoSaysWhyItUsesTcp) {
  std::string out = testing::RunCommand(
      FindBinary("gradsyncd") +
      " --insecure --transport=rdma --listen=unix-abstract:gs-rdma-none --data_listen=127.0.0.1:0"
      " --status_listen= --metrics_listen= 2>&1; echo rc=$?");
  EXPECT_TRUE(absl::StrContains(out, "cannot start: --transport=rdma: no usable RDMA port: "))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "rc=1")) << out;
  out = testing::RunCommand(FindBinary("gradsyncd") + " --insecure --transport=verbs 2>&1; echo rc=$?");
  EXPECT_TRUE(absl::StrContains(out, "--transport 'verbs': expected auto, tcp or rdma")) << out;
  EXPECT_TRUE(absl::StrContains(out, "rc=2")) << out;
}

TEST(RdmaCluster, ADaemonKilledMidOpFailsTheOthersOpNamingItWithinSeconds) {
  auto cluster = testing::StartCluster(3, RdmaFlags(FreshFabric()));
  ASSERT_NE(cluster, nullptr);
  auto ranks = OpenJob(*cluster, "rdma-victim", {0, 1, 2}, /*op_timeout_ms=*/60000,
                       /*heartbeat_timeout_ms=*/2000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::atomic<int> started[3] = {0, 0, 0};  // ops each rank submitted
  absl::Mutex mu;
  absl::Time killed_at = absl::InfiniteFuture();
  std::vector<absl::Status> st(3);
  std::vector<absl::Time> failed_at(3, absl::InfiniteFuture());
  std::thread killer([&] {
    // Every rank finished an op and is in the next one: data is moving.
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while ((started[0] < 2 || started[1] < 2 || started[2] < 2) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(started[0] >= 2 && started[1] >= 2 && started[2] >= 2);
    absl::MutexLock l(&mu);
    killed_at = absl::Now();
    cluster->SignalDaemon(2, SIGKILL);
  });
  OnEveryRank(3, [&](int r) {
    auto& s = *(*ranks)[r].session;
    const size_t count = 2 << 20;
    auto b = s.AllocateBuffer(count * sizeof(float));
    ASSERT_TRUE(b.ok()) << b.status();
    for (int it = 0; it < 100000; ++it) {
      ++started[r];
      auto res = s.Allreduce(**b, 0, count, DType::kF32, ReduceOp::kSum, "big");
      if (!res.ok()) {
        st[r] = res.status();
        failed_at[r] = absl::Now();
        return;
      }
    }
  });
  killer.join();
  for (int r : {0, 1}) {
    EXPECT_FALSE(st[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(st[r].message(), "rank 2")) << "rank " << r << ": " << st[r];
    absl::MutexLock l(&mu);
    EXPECT_LT(failed_at[r] - killed_at, absl::Seconds(10)) << "rank " << r;
  }
  for (int d : {0, 1}) EXPECT_TRUE(cluster->DaemonAlive(d)) << "daemon " << d;
  // The survivors form a new job over RDMA at once.
  auto again = OpenJob(*cluster, "after-kill", {0, 1});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(absl::StartsWith((*again)[0].session->transport(), "rdma: ")) << (*again)[0].session->transport();
  testing::ExpectAllreduceExact(*again, 1 << 16, "ring");
}

}  // namespace
}  // namespace gradsync
