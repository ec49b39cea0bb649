// gradsyncd and its coordinator link (issue: daemon start-up, liveness after a
// coordinator restart): a daemon started without a reachable coordinator
// says so at once and keeps retrying; a session opened while the coordinator
// is down waits for it (and says why when it gives up); when a coordinator
// comes back on the same address new jobs form at once, and a rank that was
// waiting in the rendezvous when the coordinator died joins the new one.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

// Polls until `pred` holds or `timeout` passes.
bool Eventually(const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return pred();
}

double CoordinatorUp(LocalCluster& cluster, int daemon) {
  auto text = HttpGet("127.0.0.1", cluster.daemon_metrics_port(daemon), "/metrics");
  if (!text.ok()) return -1;
  auto v = FindSample(*text, "gradsync_daemon_coordinator_up");
  return v.ok() ? *v : -1;
}

// Sums `n` ranks' i32 buffers (value r+1 at rank r) and checks the result.
void AllreduceIsExact(std::vector<testing::RankHandle>& ranks, const std::string& name) {
  const int n = static_cast<int>(ranks.size());
  testing::OnEveryRank(n, [&](int r) {
    auto buf = ranks[r].session->AllocateBuffer(4096 * 4);
    ASSERT_TRUE(buf.ok()) << buf.status();
    auto* v = static_cast<int32_t*>((*buf)->data());
    for (int k = 0; k < 4096; ++k) v[k] = (r + 1) * k;
    client::CollectiveSpec spec;
    spec.buffer = buf->get();
    spec.count = 4096;
    spec.dtype = DType::kI32;
    spec.name = name;
    auto res = ranks[r].session->Run(spec);
    ASSERT_TRUE(res.ok()) << "rank " << r << ": " << res.status();
    for (int k = 0; k < 4096; ++k) ASSERT_EQ(v[k], n * (n + 1) / 2 * k) << "rank " << r << " element " << k;
  });
}

TEST(CoordinatorLink, ADaemonWithoutItsCoordinatorSaysSoAtStartAndServesAnyway) {
  // A port nobody listens on.
  auto listener = TcpListen(HostPort{"127.0.0.1", 0});
  ASSERT_TRUE(listener.ok());
  const int port = *LocalPort(listener->get());
  listener->Reset();
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/lonely");
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/gradsyncd.log", port_file = dir + "/port";
  const std::string bin = FindBinary("gradsyncd");
  // Abstract socket names are shared by every test on the machine (pids in
  // sandboxes repeat): a random name.
  const std::string listen =
      absl::StrCat("--listen=unix-abstract:gradsync-lonely-", std::random_device{}(), "-",
                   absl::ToUnixNanos(absl::Now()));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string coordinator = absl::StrCat("--coordinator=127.0.0.1:", port);
    const std::string pf = "--port_file=" + port_file;
    ::freopen(log.c_str(), "w", stderr);
    ::execl(bin.c_str(), bin.c_str(), listen.c_str(), coordinator.c_str(), "--insecure",
            "--data_listen=127.0.0.1:0", "--status_listen=", "--metrics_listen=127.0.0.1:0",
            pf.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const absl::Time started = absl::Now();
  // It serves its clients (port file written) and says what is wrong, within seconds.
  EXPECT_TRUE(Eventually([&] { return std::filesystem::exists(port_file); }, absl::Seconds(10)))
      << testing::ReadTextFile(log);
  const std::string unreachable = absl::StrCat("coordinator 127.0.0.1:", port, " unreachable");
  EXPECT_TRUE(Eventually([&] { return absl::StrContains(testing::ReadTextFile(log), unreachable); }, absl::Seconds(5)))
      << testing::ReadTextFile(log);
  std::printf("the daemon said the coordinator is unreachable %.2f s after it started\n",
              absl::ToDoubleSeconds(absl::Now() - started));
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile(log), "Connection refused") ||
              absl::StrContains(testing::ReadTextFile(log), "failed to connect"))
      << "the log should carry gRPC's cause: " << testing::ReadTextFile(log);
  // The metric, from the port file's second line.
  std::ifstream pf(port_file);
  int data_port = 0, metrics_port = 0;
  pf >> data_port >> metrics_port;
  auto text = HttpGet("127.0.0.1", metrics_port, "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*FindSample(*text, "gradsync_daemon_coordinator_up"), 0);
  EXPECT_TRUE(Eventually(
      [&] {
        auto t = HttpGet("127.0.0.1", metrics_port, "/metrics");
        auto v = t.ok() ? FindSample(*t, "gradsync_daemon_coordinator_check_failures_total")
                        : absl::StatusOr<double>(0.0);
        return v.ok() && *v >= 3;  // it keeps retrying
      },
      absl::Seconds(10)));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << testing::ReadTextFile(log);
}

TEST(CoordinatorLink, NewJobsFormAtOnceWhenTheCoordinatorIsBack) {
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  EXPECT_TRUE(Eventually([&] { return CoordinatorUp(*cluster, 0) == 1; }, absl::Seconds(5)));
  {
    auto ranks = testing::OpenJob(*cluster, "before", {0, 1});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    AllreduceIsExact(*ranks, "before");
  }
  cluster->KillCoordinator();
  EXPECT_TRUE(Eventually([&] { return CoordinatorUp(*cluster, 0) == 0; }, absl::Seconds(5)));
  EXPECT_TRUE(Eventually(
      [&] { return absl::StrContains(testing::ReadTextFile(cluster->daemon_log(1)), "unreachable"); },
      absl::Seconds(5)));
  // A session opened while it is down fails within the daemon's 2 s grace,
  // naming it (it waited out its whole timeout before).
  {
    auto c = client::Client::Connect(cluster->daemon_target(0), absl::Seconds(5));
    ASSERT_TRUE(c.ok());
    client::SessionOptions so;
    so.job_id = "while-down";
    so.timeout = absl::Seconds(60);
    const absl::Time t0 = absl::Now();
    auto s = (*c)->OpenSession(so);
    const absl::Duration took = absl::Now() - t0;
    ASSERT_FALSE(s.ok());
    EXPECT_LT(took, absl::Seconds(5)) << took;
    EXPECT_TRUE(absl::IsUnavailable(s.status())) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(),
                                  absl::StrCat("create job 'while-down': coordinator ",
                                               cluster->coordinator_address(), " unreachable for")))
        << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(),
                                  "no job can be created or joined until it answers"))
        << s.status();
  }
  ASSERT_TRUE(cluster->RestartCoordinator().ok());
  const absl::Time back = absl::Now();
  auto ranks = testing::OpenJob(*cluster, "after", {0, 1});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const absl::Duration took = absl::Now() - back;
  std::printf("a 2-rank job formed %.2f s after the coordinator was back\n", absl::ToDoubleSeconds(took));
  EXPECT_LT(took, absl::Seconds(5));
  AllreduceIsExact(*ranks, "after");
  // Each daemon's watch notices on its next check: at most its 5 s back-off after the restart.
  for (int d = 0; d < 2; ++d) {
    EXPECT_TRUE(Eventually([&] { return CoordinatorUp(*cluster, d) == 1; }, absl::Seconds(10))) << d;
    EXPECT_TRUE(Eventually(
        [&] { return absl::StrContains(testing::ReadTextFile(cluster->daemon_log(d)), "reachable again after"); },
        absl::Seconds(5)))
        << "daemon " << d;
  }
}

// What docs/operations.md says of a coordinator that dies under running jobs:
// they end within the heartbeat timeout plus two intervals (the daemon cannot
// tell its death from a partition), every rank naming the coordinator.
TEST(CoordinatorLink, RunningJobsEndWithinTheHeartbeatTimeoutWhenTheCoordinatorDies) {
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  auto ranks = testing::OpenJob(*cluster, "orphaned", {0, 1});
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  AllreduceIsExact(*ranks, "before");
  cluster->KillCoordinator();
  const absl::Time killed = absl::Now();
  std::vector<absl::Status> failed(2);
  std::vector<absl::Duration> after(2);
  testing::OnEveryRank(2, [&](int r) {
    auto buf = (*ranks)[r].session->AllocateBuffer(1024);
    ASSERT_TRUE(buf.ok()) << buf.status();
    while (absl::Now() - killed < absl::Seconds(30)) {
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = 256;
      spec.dtype = DType::kI32;
      spec.name = "during";
      auto res = (*ranks)[r].session->Run(spec);
      if (!res.ok()) {
        failed[r] = res.status();
        after[r] = absl::Now() - killed;
        return;
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d failed %.2f s after the coordinator died\n", r,
                absl::ToDoubleSeconds(after[r]));
    ASSERT_FALSE(failed[r].ok()) << "rank " << r << " never failed";
    // 3 s heartbeat timeout + 2 x 0.5 s, and a heartbeat round.
    EXPECT_LT(after[r], absl::Seconds(8)) << "rank " << r;
    EXPECT_GT(after[r], absl::Seconds(3)) << "rank " << r;
    EXPECT_TRUE(absl::StrContains(failed[r].message(),
                                  absl::StrCat("no heartbeat answer from coordinator ",
                                               cluster->coordinator_address())))
        << "rank " << r << ": " << failed[r];
  }
}

TEST(CoordinatorLink, ARankWaitingInTheRendezvousJoinsTheRestartedCoordinator) {
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  std::vector<testing::RankHandle> ranks(2);
  absl::Status first;
  std::thread waiting([&] {
    auto c = client::Client::Connect(cluster->daemon_target(0), absl::Seconds(5));
    if (!c.ok()) return void(first = c.status());
    ranks[0].client = std::move(*c);
    client::SessionOptions so;
    so.job_id = "across";
    so.world_size = 2;
    so.rank = 0;
    so.timeout = absl::Seconds(30);
    auto s = ranks[0].client->OpenSession(so);
    if (!s.ok()) return void(first = s.status());
    ranks[0].session = std::move(*s);
  });
  // Rank 0 waits in JoinJob: the coordinator counts it as a member of the
  // forming job.
  ASSERT_TRUE(Eventually(
      [&] {
        auto text = HttpGet("127.0.0.1", cluster->coordinator_metrics_port(), "/metrics");
        return text.ok() && FindSample(*text, "gradsync_coordinator_members").value_or(0) == 1;
      },
      absl::Seconds(20)))
      << "rank 0 never joined";
  cluster->KillCoordinator();
  // Daemon 0 saw its join cut off by the dead coordinator, and retries.
  ASSERT_TRUE(Eventually(
      [&] {
        return absl::StrContains(testing::ReadTextFile(cluster->daemon_log(0)), "joining again");
      },
      absl::Seconds(20)))
      << testing::ReadTextFile(cluster->daemon_log(0));
  ASSERT_TRUE(cluster->RestartCoordinator().ok());
  const absl::Time back = absl::Now();
  auto c = client::Client::Connect(cluster->daemon_target(1), absl::Seconds(5));
  ASSERT_TRUE(c.ok());
  ranks[1].client = std::move(*c);
  client::SessionOptions so;
  so.job_id = "across";
  so.world_size = 2;
  so.rank = 1;
  so.timeout = absl::Seconds(30);
  auto s = ranks[1].client->OpenSession(so);
  waiting.join();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(first.ok()) << "rank 0: " << first;
  ranks[1].session = std::move(*s);
  std::printf("the job formed %.2f s after the coordinator was back\n",
              absl::ToDoubleSeconds(absl::Now() - back));
  EXPECT_LT(absl::Now() - back, absl::Seconds(10));
  AllreduceIsExact(ranks, "across");
  EXPECT_TRUE(absl::StrContains(testing::ReadTextFile(cluster->daemon_log(0)), "joining again"));
}

}  // namespace
}  // namespace gradsync
