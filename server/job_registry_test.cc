#include "server/job_registry.h"

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

using job_registry_testing::CountingObserver;
using job_registry_testing::FakeClock;
using job_registry_testing::JobRegistryTest;
using v1::JobEvent;

TEST_F(JobRegistryTest, CreateJobIsIdempotentForSameWorldSize) {
  v1::CreateJobRequest req;
  req.set_job_id("train-1.a_b");
  req.set_world_size(4);
  auto first = registry_.CreateJob(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created());
  EXPECT_EQ(first->options().heartbeat_timeout_ms(), 3000);
  EXPECT_EQ(first->options().op_timeout_ms(), 60000);

  req.mutable_options()->set_heartbeat_timeout_ms(999);  // ignored: job exists
  auto second = registry_.CreateJob(req);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created());
  EXPECT_EQ(second->options().heartbeat_timeout_ms(), 3000);

  req.set_world_size(8);
  auto third = registry_.CreateJob(req);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(third.status().message(),
            "job 'train-1.a_b' already exists with world size 4; requested world size 8");
}

TEST_F(JobRegistryTest, CreateJobRejectsBadIdsAndWorldSizes) {
  auto create = [&](const std::string& id, int ws) {
    v1::CreateJobRequest req;
    req.set_job_id(id);
    req.set_world_size(ws);
    return registry_.CreateJob(req).status();
  };
  EXPECT_EQ(create("", 2).message(), "job id must not be empty");
  EXPECT_EQ(create("a b", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(create("a b", 2).message().find("contains ' '"), absl::string_view::npos);
  // One tenant namespace in front is allowed (the service adds it), no more.
  EXPECT_TRUE(create("a/b", 2).ok());
  EXPECT_EQ(create("a/b/c", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create("/b", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(std::string(33, 't') + "/b", 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create(std::string(32, 't') + "/" + std::string(128, 'x'), 2).ok());
  EXPECT_EQ(create(std::string(129, 'x'), 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create(std::string(128, 'x'), 2).ok());
  EXPECT_EQ(create("j", 0).message(), "world size 0 of job 'j' is out of range (1..4096)");
  EXPECT_EQ(create("j", 4097).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create("j", 4096).ok());
  v1::CreateJobRequest neg;
  neg.set_job_id("n");
  neg.set_world_size(1);
  neg.mutable_options()->set_op_timeout_ms(-1);
  EXPECT_EQ(registry_.CreateJob(neg).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every option has a documented range; an out-of-range value (a 2^62 ms
// heartbeat timeout that would keep a dead member alive forever, a 1 ms one
// that kills a job at once) is refused naming the field and the range.
TEST_F(JobRegistryTest, CreateJobRejectsOptionsOutOfRange) {
  auto create = [&](auto set) {
    v1::CreateJobRequest req;
    req.set_job_id("opts");
    req.set_world_size(2);
    set(req.mutable_options());
    return registry_.CreateJob(req).status();
  };
  absl::Status s = create([](v1::JobOptions* o) { o->set_heartbeat_timeout_ms(int64_t{1} << 62); });
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "job 'opts': heartbeat_timeout_ms 4611686018427387904 is out of range "
                         "(100..3600000, or 0 for the default)");
  s = create([](v1::JobOptions* o) { o->set_heartbeat_timeout_ms(1); });
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = create([](v1::JobOptions* o) { o->set_op_timeout_ms(kMaxOpTimeoutMs + 1); });
  EXPECT_NE(s.message().find("op_timeout_ms"), absl::string_view::npos) << s;
  s = create([](v1::JobOptions* o) { o->set_tcp_streams(17); });
  EXPECT_NE(s.message().find("tcp_streams 17 is out of range (1..16"), absl::string_view::npos)
      << s;
  s = create([](v1::JobOptions* o) { o->set_ps_shards(-1); });
  EXPECT_NE(s.message().find("ps_shards -1"), absl::string_view::npos) << s;
  s = create([](v1::JobOptions* o) { o->set_algorithm(std::string(65, 'r')); });
  EXPECT_NE(s.message().find("algorithm name of 65 characters"), absl::string_view::npos) << s;
  // The bounds themselves are accepted.
  EXPECT_TRUE(create([](v1::JobOptions* o) {
                o->set_heartbeat_timeout_ms(kMinHeartbeatTimeoutMs);
                o->set_op_timeout_ms(kMaxOpTimeoutMs);
                o->set_tcp_streams(kMaxJobTcpStreams);
              }).ok());
}

TEST_F(JobRegistryTest, FourJoinersRendezvousWithDistinctRanksAndEndpoints) {
  Create("j", 4);
  auto replies = JoinAll("j", {"a", "b", "c", "d"});
  std::vector<bool> seen(4, false);
  for (size_t i = 0; i < replies.size(); ++i) {
    ASSERT_TRUE(replies[i].ok()) << replies[i].status();
    const v1::JoinJobResponse& r = *replies[i];
    EXPECT_EQ(r.world_size(), 4);
    EXPECT_EQ(r.epoch(), 1);
    EXPECT_EQ(r.options().heartbeat_timeout_ms(), 3000);
    ASSERT_GE(r.rank(), 0);
    ASSERT_LT(r.rank(), 4);
    EXPECT_FALSE(seen[r.rank()]) << "rank " << r.rank() << " assigned twice";
    seen[r.rank()] = true;
    ASSERT_EQ(r.members_size(), 4);
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(r.members(k).rank(), k);
      EXPECT_TRUE(r.members(k).alive());
    }
    // This member's own entry carries its endpoint.
    EXPECT_EQ(r.members(r.rank()).member_id(), std::string(1, static_cast<char>('a' + i)));
    EXPECT_EQ(r.members(r.rank()).data_endpoint().host(), "127.0.0.1");
    EXPECT_EQ(r.members(r.rank()).data_endpoint().port(), 5000 + static_cast<int>(i));
  }
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobRegistryTest, RequestedRanksAreHonouredAndConflictsNamed) {
  Create("j", 3);
  std::thread t([&] {
    auto r = Join("j", "x", 2, 6000);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->rank(), 2);
  });
  AwaitJoined("j", 1);
  auto taken = Join("j", "y", 2, 6001);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(taken.status().message(), "rank 2 of job 'j' is already taken by member 'x'");
  auto out_of_range = Join("j", "y", 3, 6001);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range.status().message(),
            "requested rank 3 is out of range for job 'j' (world size 3; -1 takes any free rank)");
  EXPECT_EQ(Join("j", "y", -2, 6001).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Join("nope", "y", -1, 6001).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Join("j", "", -1, 6001).status().code(), absl::StatusCode::kInvalidArgument);

  auto rest = JoinAll("j", {"y", "z"});  // lowest free ranks: 0, 1
  t.join();
  ASSERT_TRUE(rest[0].ok() && rest[1].ok());
  EXPECT_EQ(rest[0]->rank() + rest[1]->rank(), 1);
}

TEST_F(JobRegistryTest, TimeoutNamesMissingAndJoinedRanksAndFreesTheRank) {
  Create("j", 4);
  absl::StatusOr<v1::JoinJobResponse> a_reply = absl::UnknownError("not run");
  std::thread a([&] { a_reply = Join("j", "a", 0, 5000, /*timeout_ms=*/10000); });
  AwaitJoined("j", 1);

  const absl::Time start = absl::Now();
  auto c = Join("j", "c", 2, 5002, /*timeout_ms=*/200);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c.status().message(),
            "job 'j' epoch 1: rendezvous timed out after 200 ms: 2 of 4 ranks missing "
            "(ranks 1, 3); joined: rank 0 (member 'a' at 127.0.0.1:5000), "
            "rank 2 (member 'c' at 127.0.0.1:5002)");
  EXPECT_GE(took, absl::Milliseconds(200));
  EXPECT_LT(took, absl::Milliseconds(1500));

  // c was removed so it (or anyone) can take rank 2 again.
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->members_size(), 1);
  EXPECT_EQ(st->members(0).member_id(), "a");

  auto rest = JoinAll("j", {"b", "c", "d"}, {1, 2, 3});
  a.join();
  for (auto& r : rest) EXPECT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(a_reply.ok()) << a_reply.status();
  EXPECT_EQ(a_reply->rank(), 0);
  EXPECT_EQ(a_reply->members(2).member_id(), "c");
}

TEST_F(JobRegistryTest, RetriedJoinGetsSameRankWhileFormingAndAfterRunning) {
  Create("j", 2);
  absl::StatusOr<v1::JoinJobResponse> first = absl::UnknownError("not run");
  absl::StatusOr<v1::JoinJobResponse> retry = absl::UnknownError("not run");
  std::thread t1([&] { first = Join("j", "a", -1, 5000); });
  AwaitJoined("j", 1);
  // The same member again, still forming: StartJoin returns once the retry
  // waits in the registry (JoinJob is StartJoin and a wait for the answer).
  absl::Notification retried;
  const uint64_t pending = registry_.StartJoin(
      job_registry_testing::JoinRequest("j", "a", -1, 5000, 5000), absl::InfiniteFuture(),
      [&](absl::StatusOr<v1::JoinJobResponse> r) {
        retry = std::move(r);
        retried.Notify();
      });
  EXPECT_NE(pending, 0u) << "the retry was answered at once";
  auto b = Join("j", "b", -1, 5001);
  t1.join();
  if (!retried.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    registry_.CancelJoin(pending);
    retried.WaitForNotification();  // `done` writes `retry` and `retried`
    FAIL() << "the retried join was never answered";
  }
  ASSERT_TRUE(first.ok() && retry.ok() && b.ok());
  EXPECT_EQ(first->rank(), 0);
  EXPECT_EQ(retry->rank(), 0);
  EXPECT_EQ(b->rank(), 1);

  // A retry after the rendezvous (its reply was lost) returns at once.
  auto again = Join("j", "a", -1, 5000, /*timeout_ms=*/50);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->rank(), 0);
  EXPECT_EQ(again->epoch(), 1);
  EXPECT_EQ(again->members_size(), 2);
  EXPECT_EQ(Join("j", "a", 1, 5000).status().code(), absl::StatusCode::kAlreadyExists);

  auto newcomer = Join("j", "z", -1, 5009);
  EXPECT_EQ(newcomer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(newcomer.status().message(),
            "job 'j' epoch 1 is already running with all 2 ranks; member 'z' can join only "
            "after the epoch is aborted");
}

TEST_F(JobRegistryTest, TimedOutRetryDoesNotEvictAStillWaitingCall) {
  Create("j", 2);
  absl::StatusOr<v1::JoinJobResponse> patient = absl::UnknownError("not run");
  std::thread t([&] { patient = Join("j", "a", -1, 5000, 10000); });
  AwaitJoined("j", 1);
  EXPECT_EQ(Join("j", "a", -1, 5000, 50).status().code(), absl::StatusCode::kDeadlineExceeded);
  AwaitJoined("j", 1);  // still a member: the first call is waiting
  ASSERT_TRUE(Join("j", "b", -1, 5001).ok());
  t.join();
  ASSERT_TRUE(patient.ok()) << patient.status();
}

TEST_F(JobRegistryTest, CancelledJoinReturnsCancelledAndLeaves) {
  Create("j", 2);
  std::atomic<bool> cancel{false};
  JobRegistry::WaitControl wait;
  wait.is_cancelled = [&] { return cancel.load(); };
  absl::StatusOr<v1::JoinJobResponse> r = absl::UnknownError("not run");
  std::thread t([&] { r = registry_.JoinJob(job_registry_testing::JoinRequest("j", "a", -1, 5000), wait); });
  AwaitJoined("j", 1);
  cancel = true;
  t.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  AwaitJoined("j", 0);
}

}  // namespace
}  // namespace gradsync
