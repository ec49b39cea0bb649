// Members are judged from the rendezvous on, so their daemons heartbeat for
// them while the epoch sets up (connections and link probe), not only once
// the session exists. On a slow data network — here the test's own network
// namespace, whose loopback carries everything but the coordinator's port
// through a 200 Mbit/s htb class — setting up takes longer than the job's heartbeat
// timeout; before, every member was declared dead exactly one timeout after
// the rendezvous and the job never ran an op. Needs root (a network
// namespace and tc); skipped otherwise.
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/metrics_testing.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

// Heartbeat calls the coordinator received (gradsync_coordinator_heartbeats_total),
// -1 if its metrics cannot be read.
double Heartbeats(const LocalCluster& cluster) {
  auto text = HttpGet("127.0.0.1", cluster.coordinator_metrics_port(), "/metrics");
  if (!text.ok()) return -1;
  return FindSample(*text, "gradsync_coordinator_heartbeats_total").value_or(-1);
}

TEST(SetupLiveness, MembersStayAliveWhileASlowEpochSetsUp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace and tc";
  if (::unshare(CLONE_NEWNET) != 0) GTEST_SKIP() << "cannot unshare the network namespace";
  // ip and tc live in /usr/sbin, which a test's PATH may lack.
  const std::string path = "PATH=$PATH:/usr/sbin:/sbin ";
  ASSERT_EQ(std::system((path + "ip link set lo up").c_str()), 0);
  auto cluster = testing::StartCluster(2);
  ASSERT_NE(cluster, nullptr);
  const std::vector<std::string> hp = absl::StrSplit(cluster->coordinator_address(), ':');
  ASSERT_EQ(hp.size(), 2u);
  const std::string port = hp[1];
  // Every packet at 200 Mbit/s (htb class 1:30) but the coordinator's (1:10).
  const std::string tc = absl::StrCat(
      path, "tc qdisc add dev lo root handle 1: htb default 30 && ",  //
      path, "tc class add dev lo parent 1: classid 1:10 htb rate 10gbit quantum 60000 && ",
      path, "tc class add dev lo parent 1: classid 1:30 htb rate 200mbit quantum 60000 && ",
      path, "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport ", port,
      " 0xffff flowid 1:10 && ",  //
      path, "tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport ", port,
      " 0xffff flowid 1:10");
  ASSERT_EQ(std::system(tc.c_str()), 0) << tc;

  const absl::Time start = absl::Now();
  auto job = testing::OpenJob(*cluster, "slow-setup", {0, 1}, /*op_timeout_ms=*/60000,
                              /*heartbeat_timeout_ms=*/1500);
  const absl::Duration setup = absl::Now() - start;
  std::fprintf(stderr, "opening the job (rendezvous, connections, link probe): %s\n",
               absl::FormatDuration(setup).c_str());
  ASSERT_TRUE(job.ok()) << job.status();
  // The point of the test: setting up took longer than the heartbeat timeout.
  EXPECT_GT(setup, absl::Milliseconds(1500));
  // An allreduce now, and one after a few heartbeat intervals: before, the
  // first ran (the data plane was up) and the coordinator had already
  // deleted the job, so the daemons failed the epoch at their next heartbeat.
  for (const char* name : {"after-slow-setup", "a-while-later"}) {
    std::vector<absl::Status> results(2);
    testing::OnEveryRank(2, [&](int r) {
      client::Session& s = *(*job)[r].session;
      auto buf = s.AllocateBuffer(1024 * sizeof(float));
      if (!buf.ok()) return void(results[r] = buf.status());
      auto* v = static_cast<float*>((*buf)->data());
      for (int i = 0; i < 1024; ++i) v[i] = static_cast<float>(i * (r + 1));
      client::CollectiveSpec spec;
      spec.buffer = buf->get();
      spec.count = 1024;
      spec.name = name;
      auto res = s.Run(spec);
      if (!res.ok()) return void(results[r] = res.status());
      for (int i = 0; i < 1024; ++i) {
        if (v[i] != static_cast<float>(3 * i)) {
          return void(results[r] = absl::InternalError(
                          absl::StrCat("element ", i, " is ", v[i], ", want ", 3 * i)));
        }
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(results[r].ok()) << name << ", rank " << r << ": " << results[r];
    }
    // Three heartbeat rounds (500 ms each) from both daemons reach the
    // coordinator, each one a chance for it to judge a member dead.
    const double beats = Heartbeats(*cluster);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (Heartbeats(*cluster) < beats + 6 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_GE(Heartbeats(*cluster), beats + 6) << "the daemons stopped heartbeating";
  }
  for (auto& r : *job) (void)r.session->Close();
  EXPECT_EQ(cluster->StopAll(), absl::OkStatus());
}

}  // namespace
}  // namespace gradsync
