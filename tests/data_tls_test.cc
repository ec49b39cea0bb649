// gradsyncd --data_tls end to end: the jobs of daemons run with it move their
// data over TLS (said in the daemon's log; PS shards count their TLS
// connections) and reduce bit-exactly; a daemon
// that requires it refuses a job created without it, naming the cause; a
// daemon without the flag follows a TLS job; --data_tls without certificates
// does not start.
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

// Members the coordinator counts (joined a job, also while it forms); -1 if
// its metrics cannot be read.
double CoordinatorMembers(LocalCluster& cluster) {
  auto text = HttpGet("127.0.0.1", cluster.coordinator_metrics_port(), "/metrics");
  if (!text.ok()) return -1;
  return FindSample(*text, "gradsync_coordinator_members").value_or(-1);
}

// Waits until the coordinator counts `n` members.
void AwaitMembers(LocalCluster& cluster, double n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (CoordinatorMembers(cluster) != n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(CoordinatorMembers(cluster), n);
}

TEST(DataTls, JobsOfDaemonsWithItAreEncryptedAndExact) {
  LocalClusterOptions o;
  o.daemons = 3;
  o.daemon_flags = {"--data_tls", "--tcp_streams=2"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto ranks = testing::OpenJob(**cluster, "secret", {0, 1, 2});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (const std::string algo : {"ring", "rhd", "tree"}) testing::ExpectAllreduceExact(*ranks, 3 << 20, algo);
  for (int d = 0; d < 3; ++d) {
    EXPECT_TRUE(absl::StrContains(testing::ReadTextFile((*cluster)->daemon_log(d)), "data TLS 1.3")) << "daemon " << d;
  }
}

TEST(DataTls, PsJobsRunItToTheShardsToo) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.ps_shards = 2;
  o.daemon_flags = {"--data_tls"};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto ranks = testing::OpenJob(**cluster, "ps-secret", {0, 1}, 30000, 0, /*ps_shards=*/2);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  testing::ExpectAllreduceExact(*ranks, 1 << 20, "ps");
  for (int k = 0; k < 2; ++k) {  // each shard took both workers' connections over TLS
    auto text = HttpGet("127.0.0.1", (*cluster)->ps_metrics_port(k), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(FindSample(*text, "gradsync_ps_tls_connections_total").value_or(-1), 2) << "shard " << k;
  }
}

TEST(DataTls, ADaemonThatRequiresItRefusesAPlaintextJobAndOneWithoutFollowsATlsJob) {
  LocalClusterOptions o;
  o.daemons = 2;
  o.per_daemon_flags = {{"--data_tls"}, {}};
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Daemon 1 (no --data_tls) creates the job; daemon 0 refuses to join it.
  auto c1 = client::Client::Connect((*cluster)->daemon_target(1));
  ASSERT_TRUE(c1.ok());
  client::SessionOptions so;
  so.job_id = "plain";
  so.world_size = 2;
  so.rank = 1;
  so.timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<client::Session>> waiting;
  std::thread t([&, so] { waiting = (*c1)->OpenSession(so); });  // a copy: `so` changes below
  AwaitMembers(**cluster, 1);  // rank 1 waits in the rendezvous
  auto c0 = client::Client::Connect((*cluster)->daemon_target(0));
  ASSERT_TRUE(c0.ok());
  so.rank = 0;
  auto refused = (*c0)->OpenSession(so);
  t.join();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "runs without TLS on the data plane"))
      << refused.status();
  EXPECT_FALSE(waiting.ok());  // its partner left: it does not hang
  // The other way round: daemon 0 creates a TLS job, daemon 1 follows it.
  so.job_id = "tls";
  so.timeout = absl::Seconds(20);
  so.rank = 0;
  absl::StatusOr<std::unique_ptr<client::Session>> first;
  const double members = CoordinatorMembers(**cluster);
  ASSERT_GE(members, 0);
  std::thread t0([&, so] { first = (*c0)->OpenSession(so); });
  AwaitMembers(**cluster, members + 1);  // rank 0 waits in the rendezvous
  so.rank = 1;
  auto second = (*c1)->OpenSession(so);
  t0.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  std::vector<testing::RankHandle> ranks(2);
  ranks[0].session = std::move(*first);
  ranks[1].session = std::move(*second);
  testing::ExpectAllreduceExact(ranks, 1 << 20, "ring");
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile((*cluster)->daemon_log(1)), "data TLS 1.3"));
}

TEST(DataTls, NeedsCertificates) {
  const std::string out = testing::RunCommand(
      FindBinary("gradsyncd") + " --insecure --data_tls --listen=unix-abstract:gs-data-tls-x 2>&1; echo rc=$?");
  EXPECT_TRUE(absl::StrContains(out, "--data_tls needs this node's certificate")) << out;
  EXPECT_TRUE(absl::StrContains(out, "rc=2")) << out;
}

}  // namespace
}  // namespace gradsync
