// Member keys: a member's id is public (status, events), its key is not. A
// retried join, a heartbeat and a leave act on a member only with the key it
// joined with — the requests an attacker built from ListJobs/WatchJob before
// (taking over a rank's endpoint, killing a job with one LeaveJob, keeping a
// dead rank alive with forged heartbeats) are refused and change nothing.
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "server/job_registry_testing.h"

namespace gradsync {
namespace {

using job_registry_testing::JobRegistryTest;
using job_registry_testing::JoinRequest;

class MemberKeyTest : public JobRegistryTest {};

TEST_F(MemberKeyTest, AJoinWithoutAKeyOfTheRightLengthIsRefused) {
  Create("j", 2);
  v1::JoinJobRequest req = JoinRequest("j", "a", -1, 5000);
  req.clear_member_key();
  auto none = registry_.JoinJob(req, {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            "join of job 'j' by member 'a': member_key must be 16..64 bytes (got 0)");
  req.set_member_key(std::string(65, 'k'));
  EXPECT_EQ(registry_.JoinJob(req, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// While the job forms, a join that reuses a waiting member's id with another
// key (and the attacker's endpoint) is refused; the member keeps its
// endpoint, and the real retry still works.
TEST_F(MemberKeyTest, AForgedRetryDoesNotTakeOverAFormingMember) {
  Create("j", 2);
  std::thread victim([&] {
    auto r = Join("j", "victim", 0, 5000, 5000);
    EXPECT_TRUE(r.ok()) << r.status();
  });
  AwaitJoined("j", 1);
  v1::JoinJobRequest forged = JoinRequest("j", "victim", 0, 6666, 100);
  forged.set_member_key("attacker-key-0123456789");
  auto r = registry_.JoinJob(forged, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message(),
            "member 'victim' of job 'j' epoch 1 joined with another member key; a retried join "
            "must come from the daemon that joined it");
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->members_size(), 1);
  EXPECT_EQ(st->members(0).data_endpoint().port(), 5000);
  auto other = Join("j", "other", 1, 5001);
  ASSERT_TRUE(other.ok()) << other.status();
  victim.join();
  EXPECT_EQ(other->members(0).data_endpoint().port(), 5000);
  // Once running, the same forgery is refused as well.
  EXPECT_EQ(registry_.JoinJob(forged, {}).status().code(), absl::StatusCode::kPermissionDenied);
}

// LeaveJob names a member by rank (or id) and must carry its key: a leave
// built from ListJobs alone does not abort a running job.
TEST_F(MemberKeyTest, ALeaveWithoutTheKeyDoesNotAbortTheJob) {
  Create("j", 2);
  auto joined = JoinAll("j", {"a", "b"}, {0, 1});
  ASSERT_TRUE(joined[0].ok() && joined[1].ok());
  const int64_t epoch = joined[0]->epoch();
  v1::LeaveJobRequest forged = job_registry_testing::LeaveRequest("j", 1, epoch, "");
  forged.clear_member_key();
  absl::Status s = registry_.LeaveJob(forged);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "leave of rank 1 of job 'j' epoch 1 does not carry that member's key");
  EXPECT_EQ(registry_.GetJobStatus("j")->state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Leave("j", 1, epoch, "b").ok());  // the member itself
  EXPECT_EQ(registry_.GetJobStatus("j")->state(), v1::JOB_STATE_ABORTED);
}

// Forged heartbeats for a member that stopped do not keep it alive.
TEST_F(MemberKeyTest, ForgedHeartbeatsDoNotKeepAMemberAlive) {
  Create("j", 2, /*heartbeat_timeout_ms=*/1000);
  auto joined = JoinAll("j", {"a", "b"}, {0, 1});
  ASSERT_TRUE(joined[0].ok() && joined[1].ok());
  const int64_t epoch = joined[0]->epoch();
  v1::HeartbeatRequest forged = job_registry_testing::HeartbeatRequest("j", 1, epoch, "b");
  forged.set_member_key("not-the-key-of-b-at-all");
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Milliseconds(400));
    ASSERT_TRUE(Beat("j", 0, epoch, "a").ok());
    auto r = registry_.Heartbeat(forged);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
    registry_.CheckLiveness();
  }
  auto st = registry_.GetJobStatus("j");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->state(), v1::JOB_STATE_ABORTED);
  EXPECT_NE(st->abort_reason().find("rank 1 (member 'b') missed heartbeats"), std::string::npos)
      << st->abort_reason();
}

// Every member of a job gets the job's key (32 random bytes, the same for
// all), and another job has another; the data-plane handshake proves it.
TEST_F(MemberKeyTest, EveryMemberGetsTheJobKeyAndJobsDiffer) {
  Create("j", 2);
  Create("k", 1);
  auto joined = JoinAll("j", {"a", "b"}, {0, 1});
  ASSERT_TRUE(joined[0].ok() && joined[1].ok());
  EXPECT_EQ(joined[0]->job_key().size(), 32u);
  EXPECT_EQ(joined[0]->job_key(), joined[1]->job_key());
  auto other = Join("k", "c", 0, 5002);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->job_key().size(), 32u);
  EXPECT_NE(other->job_key(), joined[0]->job_key());
}

}  // namespace
}  // namespace gradsync
