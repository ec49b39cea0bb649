// Blocked JoinJob calls hold no thread each (500 waiting joins held 516
// threads of the coordinator when each blocked a synchronous handler): 500
// joins wait in one in-process coordinator while its thread count stays flat,
// and all get their ranks once the last rank joins; a cancelled or timed-out
// waiting join frees its rank.
#include <dirent.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

using job_registry_testing::JoinRequest;

int ThreadCount() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (struct dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// One JoinJob in flight on a completion queue.
struct AsyncJoin {
  grpc::ClientContext ctx;
  v1::JoinJobResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::JoinJobResponse>> rpc;
};

class JoinThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions options;
    auto server = CoordinatorServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  void CreateJob(const std::string& id, int world) {
    grpc::ClientContext ctx;
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(world);
    v1::CreateJobResponse resp;
    ASSERT_TRUE(stub_->CreateJob(&ctx, req, &resp).ok());
  }

  std::unique_ptr<AsyncJoin> StartJoin(const v1::JoinJobRequest& req, int tag) {
    auto j = std::make_unique<AsyncJoin>();
    j->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    j->rpc = stub_->PrepareAsyncJoinJob(&j->ctx, req, &cq_);
    j->rpc->StartCall();
    j->rpc->Finish(&j->response, &j->status, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
    return j;
  }

  // Waits for `n` completions; returns their tags.
  std::vector<int> Collect(int n, absl::Duration timeout) {
    std::vector<int> tags;
    const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
    while (static_cast<int>(tags.size()) < n) {
      void* tag = nullptr;
      bool ok = false;
      if (cq_.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) break;
      tags.push_back(static_cast<int>(reinterpret_cast<intptr_t>(tag)));
    }
    return tags;
  }

  int JoinedCount(const std::string& job) {
    auto st = server_->registry().GetJobStatus(job);
    if (!st.ok()) return -1;
    int n = 0;
    for (const auto& m : st->members()) n += !m.member_id().empty();
    return n;
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::CompletionQueue cq_;
};

TEST_F(JoinThreads, FiveHundredWaitingJoinsHoldNoThreadEach) {
  constexpr int kWaiting = 500;
  CreateJob("wide", kWaiting + 1);
  const int before = ThreadCount();
  std::vector<std::unique_ptr<AsyncJoin>> joins;
  for (int i = 0; i < kWaiting; ++i) {
    joins.push_back(StartJoin(JoinRequest("wide", absl::StrCat("m", i), -1, 7000 + i, 60000), i));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (JoinedCount("wide") < kWaiting && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(JoinedCount("wide"), kWaiting);
  const int waiting = ThreadCount();
  std::fprintf(stderr, "threads: %d before, %d with %d joins waiting\n", before, waiting, kWaiting);
  // gRPC's own pools may grow by a few; a thread per join would be +500.
  EXPECT_LT(waiting - before, 50) << before << " threads before, " << waiting << " with "
                                  << kWaiting << " joins waiting";

  joins.push_back(StartJoin(JoinRequest("wide", "last", -1, 9000, 60000), kWaiting));
  const std::vector<int> done = Collect(kWaiting + 1, absl::Seconds(30));
  ASSERT_EQ(done.size(), static_cast<size_t>(kWaiting + 1));
  std::set<int> ranks;
  for (const auto& j : joins) {
    ASSERT_TRUE(j->status.ok()) << j->status.error_message();
    EXPECT_EQ(j->response.world_size(), kWaiting + 1);
    ASSERT_EQ(j->response.members_size(), kWaiting + 1);
    ranks.insert(j->response.rank());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kWaiting + 1));  // every rank once
}

TEST_F(JoinThreads, ACancelledOrTimedOutJoinFreesItsRank) {
  CreateJob("pair", 2);
  auto cancelled = StartJoin(JoinRequest("pair", "a", 0, 7000, 60000), 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (JoinedCount("pair") < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(JoinedCount("pair"), 1);
  cancelled->ctx.TryCancel();
  ASSERT_EQ(Collect(1, absl::Seconds(10)).size(), 1u);
  EXPECT_EQ(cancelled->status.error_code(), grpc::StatusCode::CANCELLED);
  while (JoinedCount("pair") > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(JoinedCount("pair"), 0);  // the registry saw the cancellation

  // A join whose own timeout passes: DEADLINE_EXCEEDED naming the missing rank.
  auto timed_out = StartJoin(JoinRequest("pair", "b", 0, 7001, 300), 2);
  ASSERT_EQ(Collect(1, absl::Seconds(10)).size(), 1u);
  EXPECT_EQ(timed_out->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(timed_out->status.error_message().find("1 of 2 ranks missing (rank 1)"),
            std::string::npos)
      << timed_out->status.error_message();
  EXPECT_EQ(JoinedCount("pair"), 0);

  // Rank 0 is free again: a pair completes.
  auto a = StartJoin(JoinRequest("pair", "c", 0, 7002, 10000), 3);
  auto b = StartJoin(JoinRequest("pair", "d", 1, 7003, 10000), 4);
  ASSERT_EQ(Collect(2, absl::Seconds(10)).size(), 2u);
  EXPECT_TRUE(a->status.ok()) << a->status.error_message();
  EXPECT_TRUE(b->status.ok()) << b->status.error_message();
  EXPECT_EQ(a->response.rank(), 0);
}

TEST_F(JoinThreads, ShutdownAnswersWaitingJoins) {
  CreateJob("alone", 2);
  auto j = StartJoin(JoinRequest("alone", "a", -1, 7000, 60000), 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (JoinedCount("alone") < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  server_->Shutdown(absl::Seconds(5));
  ASSERT_EQ(Collect(1, absl::Seconds(10)).size(), 1u);
  EXPECT_EQ(j->status.error_code(), grpc::StatusCode::UNAVAILABLE) << j->status.error_message();
}

}  // namespace
}  // namespace gradsync
