// `gradsync status` names the rank that is hanging a job.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace gradsync {
namespace {

using testing::RunCommand;

TEST(Status, NamesTheRankThatHasNotSubmittedTheOpOthersWaitFor) {
  LocalClusterOptions o;
  o.daemons = 3;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto job = testing::OpenJob(**cluster, "stalled", {0, 1, 2}, /*op_timeout_ms=*/60000);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs(3);
  testing::OnEveryRank(3, [&](int r) {
    auto b = (*job)[r].session->AllocateBuffer(4096);
    ASSERT_TRUE(b.ok());
    bufs[r] = std::move(*b);
    ASSERT_TRUE((*job)[r].session->Allreduce(*bufs[r], 0, 1024, DType::kF32, ReduceOp::kSum, "w").ok());
  });
  // Op 2: ranks 0 and 1 submit, rank 2 stalls.
  std::vector<client::OpHandle> handles;
  for (int r : {0, 1}) {
    auto h = (*job)[r].session->AllreduceAsync(*bufs[r], 0, 1024, DType::kF32, ReduceOp::kSum, "w");
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  absl::SleepFor(absl::Milliseconds(1200));
  const std::string out = RunCommand(absl::StrCat(
      "cli/gradsync status --coordinator=", (*cluster)->coordinator_address(), " 2>&1"));
  EXPECT_NE(out.find("job 'stalled' epoch 1 RUNNING, 3 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("op 2 negotiating for"), std::string::npos) << out;
  EXPECT_NE(out.find("(waiting for rank 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("has been waiting"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 has not submitted it (last completed op 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 has not submitted"), std::string::npos) << out;
  // Rank 2 catches up; the op completes.
  ASSERT_TRUE((*job)[2].session->Allreduce(*bufs[2], 0, 1024, DType::kF32, ReduceOp::kSum, "w").ok());
  for (int i = 0; i < 2; ++i) EXPECT_TRUE((*job)[i].session->Wait(handles[i], absl::Seconds(10)).ok());
  const std::string after = RunCommand(absl::StrCat(
      "cli/gradsync status --coordinator=", (*cluster)->coordinator_address(), " --job=stalled 2>&1"));
  EXPECT_EQ(after.find("has been waiting"), std::string::npos) << after;
  EXPECT_NE(after.find("(op 2): OK"), std::string::npos) << after;
}

// The same for a node-local job, whose clients run small ops themselves in
// the job's arena: the daemon reads who has published what from the arena.
TEST(Status, NamesTheStalledRankOfANodeLocalJobFromTheArena) {
  LocalClusterOptions o;
  o.daemons = 1;
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto job = testing::OpenJob(**cluster, "stalled-local", {0, 0, 0}, /*op_timeout_ms=*/60000);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::unique_ptr<client::Buffer>> bufs(3);
  testing::OnEveryRank(3, [&](int r) {
    auto b = (*job)[r].session->AllocateBuffer(4096);
    ASSERT_TRUE(b.ok());
    bufs[r] = std::move(*b);
    auto res = (*job)[r].session->Allreduce(*bufs[r], 0, 16, DType::kF32, ReduceOp::kSum, "w");
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->algorithm, "local");
  });
  std::vector<client::OpHandle> handles;
  for (int r : {0, 1}) {
    auto h = (*job)[r].session->AllreduceAsync(*bufs[r], 0, 16, DType::kF32, ReduceOp::kSum, "w");
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  absl::SleepFor(absl::Milliseconds(1200));
  const std::string out = RunCommand(absl::StrCat(
      "cli/gradsync status --coordinator=", (*cluster)->coordinator_address(), " 2>&1"));
  EXPECT_NE(out.find("job 'stalled-local' epoch 1 RUNNING, 3 ranks"), std::string::npos) << out;
  EXPECT_NE(out.find("op 2 negotiating for"), std::string::npos) << out;
  EXPECT_NE(out.find("(waiting for rank 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("allreduce 'w' f32[16] sum (op 2) has been waiting"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 has not submitted it (last completed op 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 has not submitted"), std::string::npos) << out;
  ASSERT_TRUE((*job)[2].session->Allreduce(*bufs[2], 0, 16, DType::kF32, ReduceOp::kSum, "w").ok());
  for (int i = 0; i < 2; ++i) EXPECT_TRUE((*job)[i].session->Wait(handles[i], absl::Seconds(10)).ok());
  const std::string after = RunCommand(absl::StrCat(
      "cli/gradsync status --coordinator=", (*cluster)->coordinator_address(),
      " --job=stalled-local 2>&1"));
  EXPECT_EQ(after.find("has been waiting"), std::string::npos) << after;
  EXPECT_NE(after.find("allreduce 'w' f32[16] sum (op 2): OK"), std::string::npos) << after;
  // A local op that fails (a mismatch: the job goes on) shows its outcome.
  testing::OnEveryRank(3, [&](int r) {
    auto res = (*job)[r].session->Allreduce(*bufs[r], 0, r == 1 ? 8 : 16, DType::kF32,
                                            ReduceOp::kSum, "w");
    EXPECT_TRUE(absl::IsInvalidArgument(res.status())) << res.status();
  });
  const std::string failed = RunCommand(absl::StrCat(
      "cli/gradsync status --coordinator=", (*cluster)->coordinator_address(),
      " --job=stalled-local 2>&1"));
  EXPECT_NE(failed.find("allreduce 'w' f32[8] sum (op 3): INVALID_ARGUMENT"), std::string::npos)
      << failed;
  EXPECT_NE(failed.find("allreduce 'w' f32[16] sum (op 3): INVALID_ARGUMENT"), std::string::npos)
      << failed;
}

}  // namespace
}  // namespace gradsync
