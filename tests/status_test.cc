// `gradsync status` names the rank that is hanging a job.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::RunCommand;

// A 3-rank job on `daemons` whose op 2 (`count` floats) ranks 0 and 1 submit
// while rank 2 stalls for a while, then catches up.
struct StalledJob {
  std::unique_ptr<LocalCluster> cluster;
  std::vector<testing::RankHandle> ranks;
  std::vector<std::unique_ptr<client::Buffer>> bufs;
  std::string during;  // `gradsync status` while rank 2 stalls
  std::string after;   // `gradsync status --job` once op 2 completed
};

std::string Status(const LocalCluster& cluster, const std::string& args) {
  const TlsConfig& op = cluster.certs().operator_;
  return RunCommand(absl::StrCat("cli/gradsync status --coordinator=",
                                 cluster.coordinator_address(), " --tls_cert=", op.cert,
                                 " --tls_key=", op.key, " --tls_ca=", op.ca, args, " 2>&1"));
}

// Whether `gradsync status` shows ranks 0 and 1 waiting in op 2 for rank 2.
bool RankTwoNamed(const std::string& out) {
  return absl::StrContains(out, "op 2 negotiating for") &&
         absl::StrContains(out, "(waiting for rank 2)") &&
         absl::StrContains(out, "has been waiting") &&
         absl::StrContains(out, "rank 2 has not submitted it (last completed op 1") &&
         !absl::StrContains(out, "rank 0 has not submitted") &&
         !absl::StrContains(out, "rank 1 has not submitted");
}

// `op1_algorithm`: what op 1 must have run ("" = anything).
void RunStalledJob(int daemons, const std::string& job, const std::vector<int>& layout,
                   uint64_t count, const std::string& op1_algorithm, StalledJob* out) {
  LocalClusterOptions o;
  o.daemons = daemons;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  out->cluster = std::move(*cluster);
  auto ranks = testing::OpenJob(*out->cluster, job, layout, /*op_timeout_ms=*/60000);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  out->ranks = std::move(*ranks);
  out->bufs.resize(3);
  testing::OnEveryRank(3, [&](int r) {
    auto b = out->ranks[r].session->AllocateBuffer(4096);
    ASSERT_TRUE(b.ok());
    out->bufs[r] = std::move(*b);
    auto res = out->ranks[r].session->Allreduce(*out->bufs[r], 0, count, DType::kF32,
                                                ReduceOp::kSum, "w");
    ASSERT_TRUE(res.ok()) << res.status();
    if (!op1_algorithm.empty()) EXPECT_EQ(res->algorithm, op1_algorithm);
  });
  // Op 2: ranks 0 and 1 submit, rank 2 stalls.
  std::vector<client::OpHandle> handles;
  for (int r : {0, 1}) {
    auto h = out->ranks[r].session->AllreduceAsync(*out->bufs[r], 0, count, DType::kF32,
                                                   ReduceOp::kSum, "w");
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  // Until the daemons negotiate op 2 for ranks 0 and 1 and name rank 2 as
  // the one they wait for.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    out->during = Status(*out->cluster, "");
  } while (!RankTwoNamed(out->during) && absl::Now() < deadline);
  // Rank 2 catches up; the op completes.
  ASSERT_TRUE(out->ranks[2].session->Allreduce(*out->bufs[2], 0, count, DType::kF32,
                                               ReduceOp::kSum, "w").ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(out->ranks[i].session->Wait(handles[i], absl::Seconds(10)).ok());
  }
  out->after = Status(*out->cluster, " --job=" + job);
}

// Every line `gradsync status` prints for rank 2 stalling op 2 of `job`.
void ExpectRankTwoNamed(const std::string& out, const std::string& job) {
  EXPECT_NE(out.find("job '" + job + "' epoch 1 RUNNING, 3 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("op 2 negotiating for"), std::string::npos) << out;
  EXPECT_NE(out.find("(waiting for rank 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("has been waiting"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 has not submitted it (last completed op 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 has not submitted"), std::string::npos) << out;
}

// Ranks on three daemons: the daemons negotiate op 2 and know which rank
// they wait for. (Op 1 runs whatever the cost model picks from the link
// probe: oneshot, or rd on a slow probe.)
TEST(Status, NamesTheRankThatHasNotSubmittedTheOpOthersWaitFor) {
  StalledJob j;
  RunStalledJob(3, "stalled", {0, 1, 2}, 1024, "", &j);
  ExpectRankTwoNamed(j.during, "stalled");
  EXPECT_NE(j.during.find("allreduce 'w' f32[1024] sum (op 2) has been waiting"),
            std::string::npos)
      << j.during;
  EXPECT_EQ(j.after.find("has been waiting"), std::string::npos) << j.after;
  EXPECT_NE(j.after.find("allreduce 'w' f32[1024] sum (op 2): OK"), std::string::npos) << j.after;
}

// The same for a node-local job, whose ranks the daemon combines in memory.
TEST(Status, NamesTheStalledRankOfANodeLocalJob) {
  StalledJob j;
  RunStalledJob(1, "stalled-local", {0, 0, 0}, 16, "hier", &j);
  ExpectRankTwoNamed(j.during, "stalled-local");
  EXPECT_NE(j.during.find("allreduce 'w' f32[16] sum (op 2) has been waiting"), std::string::npos)
      << j.during;
  EXPECT_EQ(j.after.find("has been waiting"), std::string::npos) << j.after;
  EXPECT_NE(j.after.find("allreduce 'w' f32[16] sum (op 2): OK"), std::string::npos) << j.after;
  // An op that fails (a mismatch: the job goes on) shows its outcome.
  testing::OnEveryRank(3, [&](int r) {
    auto res = j.ranks[r].session->Allreduce(*j.bufs[r], 0, r == 1 ? 8 : 16, DType::kF32,
                                             ReduceOp::kSum, "w");
    EXPECT_TRUE(absl::IsInvalidArgument(res.status())) << res.status();
  });
  const std::string failed = Status(*j.cluster, " --job=stalled-local");
  EXPECT_NE(failed.find("allreduce 'w' f32[8] sum (op 3): INVALID_ARGUMENT"), std::string::npos)
      << failed;
  EXPECT_NE(failed.find("allreduce 'w' f32[16] sum (op 3): INVALID_ARGUMENT"), std::string::npos)
      << failed;
}

}  // namespace
}  // namespace gradsync
