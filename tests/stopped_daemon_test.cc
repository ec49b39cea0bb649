// A gradsyncd that stops (SIGSTOP: hung, swapped out, stuck in the kernel):
// its clients notice within the documented 3 s, whatever they were doing —
// waiting for an op, submitting, allocating or freeing a buffer, closing —
// with an error that says the daemon stopped answering; and the other ranks
// of its job fail within the coordinator's heartbeat timeout naming it.
#include <signal.h>

#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

const absl::Duration kNoticeWithin = absl::Seconds(5);  // the documented 3 s + scheduling slack

// SIGSTOPs daemon i and returns once the kernel shows it stopped (kill(2)
// returns before the signal takes effect).
void StopDaemon(LocalCluster& cluster, int i) {
  cluster.SignalDaemon(i, SIGSTOP);
  const std::string stat = absl::StrCat("/proc/", cluster.daemon_pid(i), "/stat");
  for (int tries = 0; tries < 200; ++tries) {
    std::ifstream in(stat);
    std::string pid, comm, state;
    in >> pid >> comm >> state;
    if (state == "T") return;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ADD_FAILURE() << "daemon " << i << " did not stop";
}

client::CollectiveSpec Spec(const client::Buffer* buf, const std::string& name) {
  return testing::AllreduceSpec(buf, 1024, name);
}

class StoppedDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = testing::StartCluster(2);
    ASSERT_NE(cluster_, nullptr);
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      for (int d = 0; d < 2; ++d) cluster_->SignalDaemon(d, SIGCONT);
    }
  }
  std::unique_ptr<LocalCluster> cluster_;
};

// Each call on its own session, the daemon stopped right before it.
TEST_F(StoppedDaemon, EveryClientCallFailsWithinThreeSeconds) {
  struct Call {
    const char* what;
    std::function<absl::Status(client::Session&, std::unique_ptr<client::Buffer>&)> run;
  };
  const std::vector<Call> calls = {
      {"Run", [](client::Session& s, auto& buf) { return s.Run(Spec(buf.get(), "stopped")).status(); }},
      {"AllocateBuffer", [](client::Session& s, auto&) { return s.AllocateBuffer(4096).status(); }},
      {"FreeBuffer", [](client::Session& s, auto& buf) { return s.FreeBuffer(std::move(buf)); }},
      {"Close", [](client::Session& s, auto&) { return s.Close(); }},
  };
  for (const Call& c : calls) {
    auto ranks = testing::OpenJob(*cluster_, absl::StrCat("alone-", c.what), {0});
    ASSERT_TRUE(ranks.ok()) << ranks.status();
    client::Session& s = *(*ranks)[0].session;
    auto buf = s.AllocateBuffer(4096);
    ASSERT_TRUE(buf.ok());
    ASSERT_TRUE(s.Run(Spec(buf->get(), "warm")).ok());
    StopDaemon(*cluster_, 0);
    const absl::Time t0 = absl::Now();
    absl::Status st = c.run(s, *buf);
    const absl::Duration took = absl::Now() - t0;
    cluster_->SignalDaemon(0, SIGCONT);
    std::printf("%s on a stopped daemon: %s after %.2f s\n", c.what, st.ToString().c_str(),
                absl::ToDoubleSeconds(took));
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << c.what << ": " << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "stopped answering")) << c.what << ": " << st;
    EXPECT_LT(took, kNoticeWithin) << c.what;
  }
}

TEST_F(StoppedDaemon, TheOtherRanksFailNamingTheStoppedRank) {
  auto ranks = testing::OpenJob(*cluster_, "pair", {0, 1}, /*op_timeout_ms=*/60000,
                                /*heartbeat_timeout_ms=*/3000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs = testing::AllocateOnEveryRank(*ranks, 4096);
  ASSERT_EQ(bufs.size(), 2u);
  testing::OnEveryRank(2, [&](int r) { ASSERT_TRUE((*ranks)[r].session->Run(Spec(bufs[r].get(), "ok")).ok()); });
  // Rank 0 waits in an op that rank 1 never submits: its daemon stops.
  StopDaemon(*cluster_, 1);
  const absl::Time t0 = absl::Now();
  std::vector<absl::Status> st(2);
  testing::OnEveryRank(2, [&](int r) {
    st[r] = (*ranks)[r].session->Run(Spec(bufs[r].get(), "after-stop")).status();
  });
  const absl::Duration took = absl::Now() - t0;
  std::printf("rank 0: %s\nrank 1: %s\nboth failed after %.2f s\n", st[0].ToString().c_str(),
              st[1].ToString().c_str(), absl::ToDoubleSeconds(took));
  EXPECT_FALSE(st[0].ok());
  EXPECT_TRUE(absl::StrContains(st[0].message(), "rank 1")) << st[0];
  EXPECT_TRUE(absl::StrContains(st[1].message(), "stopped answering")) << st[1];
  // The coordinator's heartbeat timeout (3 s) plus a heartbeat reply to the healthy daemon.
  EXPECT_LT(took, absl::Seconds(8));
}

// A daemon that does not stop on SIGTERM is killed after the grace period,
// and the error names it and shows the end of its log (what it last did).
TEST_F(StoppedDaemon, AnUncleanStopNamesTheDaemonAndShowsItsLog) {
  StopDaemon(*cluster_, 1);
  const absl::Status st = cluster_->StopAll(absl::Seconds(1));
  EXPECT_TRUE(absl::IsInternal(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "gradsyncd #1 ignored SIGTERM for 1s;")) << st;
  EXPECT_FALSE(absl::StrContains(st.message(), "gradsyncd #0")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "\n    | ")) << st;
}

}  // namespace
}  // namespace gradsync
